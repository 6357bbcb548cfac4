"""Refit the MLA split rule's fixed cost on the committed split sweeps (CPU only).

    python3 tools/fit_mla_splits.py [--fixed 0,256,512,768,1024,1536,2048]

For each candidate ``cuda_mla._FIXED_KEYS`` it runs ``cuda_mla.choose_splits`` itself (132 SMs,
the bench's page table of L + 257 keys in 16-token pages) at every point of session 26's batch-8
/ 32 sweep (``data/bench/logs/splits_session26_callc.csv.gz``) and session 10's batch-1 sweep
(``mla_splits_session10.csv.gz``), and prints the total regret (sum of log(time at the picked count /
best measured time)) over the points whose picked count was measured, the worst point, and the
points whose pick the sweep did not measure. Session 26 shipped 512, the candidate with the least
regret.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from kdtree.kernels import cuda_mla

LOGS = Path(__file__).resolve().parents[1] / "data" / "bench" / "logs"


def sweeps() -> pd.DataFrame:
    """Both sweeps' MLA rows: layout, batch, L, T, splits, ms."""
    new = pd.read_csv(LOGS / "splits_session26_callc.csv.gz")
    old = pd.read_csv(LOGS / "mla_splits_session10.csv.gz")
    parts = old["point"].str.split(":", expand=True)
    old = old.assign(layout="mla_" + parts[0], L=parts[1].astype(int), T=parts[2].astype(int),
                     batch=1)  # fmt: skip
    cols = ["point", "layout", "batch", "L", "T", "splits", "ms"]
    both = pd.concat([new[cols], old[cols]], ignore_index=True)
    return both[both["layout"].str.startswith("mla_")].dropna(subset=["ms"])


def regret(rows: pd.DataFrame, fixed: int) -> tuple[float, tuple[float, str], list[str]]:
    """(total log regret, (worst ratio, its point), points whose pick was not measured)."""
    saved = cuda_mla._FIXED_KEYS
    cuda_mla._FIXED_KEYS = fixed
    try:
        total, worst, unmeasured = 0.0, (1.0, ""), []
        for point, g in rows.groupby("point"):
            r = g.iloc[0]
            heads = int(str(r["layout"]).split("_h")[1])
            cap = -(-(int(r["L"]) + 257) // 16) * 16
            pick = cuda_mla.choose_splits(int(r["batch"]), heads * int(r["T"]), cap, 132)
            times = dict(zip(g["splits"].astype(int), g["ms"], strict=True))
            if pick not in times:
                unmeasured.append(f"{point} -> {pick}")
                continue
            ratio = times[pick] / min(times.values())
            total += math.log(ratio)
            worst = max(worst, (ratio, str(point)))
        return total, worst, unmeasured
    finally:
        cuda_mla._FIXED_KEYS = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixed", default="0,256,512,768,1024,1536,2048")
    a = ap.parse_args()
    rows = sweeps()
    print(f"{rows['point'].nunique()} points, {len(rows)} timings")
    for fixed in (int(x) for x in a.fixed.split(",")):
        total, (ratio, point), unmeasured = regret(rows, fixed)
        print(f"fixed {fixed:5d}: regret {total:.3f}, worst {ratio:.3f} at {point}; "
              f"unmeasured picks: {', '.join(unmeasured) or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
