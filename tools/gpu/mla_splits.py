"""Split-count sweep of the CUDA MLA and GQA kernels at verify bench points: graph-replayed p50
per split count next to the count ``choose_splits`` picks (``cuda_mla.choose_splits``: whole waves
of CTAs, with a split's fixed keys where the blocks fill more than half the SMs from 16k;
``cuda_gqa.choose_splits``: waves x (keys + 256), from 16k in each count's own row layout).

    python3 tools/gpu/mla_splits.py [--points h16:131072:65,gqa_8q1kv_d128:131072:65:8,...]
        [--splits 7,8,15,23] [--min-keys 256] [--out DIR]

A point is ``layout:length:tree[:batch]`` (batch 1 when left out); ``h8`` / ``h16`` are short
for ``mla_h8`` / ``mla_h16``. A GQA row also records the launch each split count gets
(``cuda_gqa.plan_launch``: head groups, warpgroups, tail, CTAs). A split count that fails (its
workspace does not fit, say) becomes a row with ``error`` set; the CSV is rewritten after each
point, so a stage cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env, write_dicts
from kdtree.bench.timing import time_cuda
from kdtree.bench.verify_attention import (
    LAYOUTS,
    Workload,
    _cuda_gqa_fn,
    _cuda_mla_fn,
    _gqa_plan,
    _graphed,
    make_tree_inputs,
)


def parse_point(spec: str) -> tuple[str, int, int, int]:
    """``"h16:131072:65:8"`` -> ``("mla_h16", 131072, 65, 8)`` (batch 1 when left out)."""
    parts = spec.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(f"point {spec!r}: expected layout:length:tree[:batch]")
    name = parts[0] if parts[0] in LAYOUTS else f"mla_{parts[0]}"
    if name not in LAYOUTS:
        raise ValueError(f"point {spec!r}: unknown layout; expected one of {sorted(LAYOUTS)}")
    batch = int(parts[3]) if len(parts) == 4 else 1
    return name, int(parts[1]), int(parts[2]), batch


def launch_info(wl: Workload, ti, splits: int) -> dict:
    """What the launch at ``splits`` looks like: GQA's plan (head groups, warpgroups, tail
    blocks, split tail, CTAs of the split grid), MLA's CTAs (64-row blocks x splits)."""
    lay = wl.layout
    if lay.kind == "mla":
        ctas = wl.batch * math.ceil(lay.hq * ti.t / 64) * splits
        return {"ctas": ctas}
    from kdtree.kernels import cuda_gqa

    p = _gqa_plan(wl, ti, splits)
    grid_x = 2 if p.split == 2 else cuda_gqa.row_ctas(p.rows, p.wgs, p.tail_blocks)
    return {"q_groups": p.q_groups, "wgs": p.wgs, "tail_blocks": p.tail_blocks,
            "split_tail": p.split, "merge": p.merge,
            "ctas": wl.batch * p.heads * grid_x * p.num_splits}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="h16:131072:65,h16:262144:65,h8:131072:65,h16:65536:65")
    ap.add_argument("--splits", default="4,7,8,11,15,16,22,23,30")
    ap.add_argument("--kernel", default="seesaw")
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--min-keys", type=int, default=256,
        help="skip split counts that leave a split fewer prefix keys (choose_splits' bound: 256)",
    )  # fmt: skip
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    rows = []
    for spec in a.points.split(","):
        name, length, t, batch = parse_point(spec)
        layout = LAYOUTS[name]
        wl = Workload(
            layout, batch, length, t, 16, torch.bfloat16, torch.device("cuda"), seed=0,
        )  # fmt: skip
        ti = make_tree_inputs(wl, t, seed=0)
        kernel = a.kernel if layout.kind == "mla" else "gqa_sm90"

        def make(splits=None, wl=wl, ti=ti, layout=layout):
            if layout.kind == "mla":
                return _cuda_mla_fn(wl, ti, kernel=a.kernel, num_splits=splits)
            return _cuda_gqa_fn(wl, ti, num_splits=splits)

        _, chosen = make()
        counts = sorted({chosen, *(int(x) for x in a.splits.split(","))})
        for splits in counts:
            if splits > 1 and length // splits < a.min_keys:
                continue
            row = {"point": spec, "layout": name, "L": length, "T": t, "batch": batch,
                   "kernel": kernel, "splits": splits, "chosen": splits == chosen}  # fmt: skip
            try:
                row.update(launch_info(wl, ti, splits))
                fn, _ = make(splits)
                replay, per = _graphed(fn, wl.n_rot, wl.device)
                ms = time_cuda(lambda replay=replay: replay(0)).p50 / per
                row.update(ms=ms, error="")
                mark = " (chosen)" if splits == chosen else ""
                print(f"{spec} splits={splits:3d}: {ms * 1e3:9.1f} us{mark}", flush=True)
            except Exception as exc:  # (one split count's failure, e.g. its workspace)
                row.update(ms=float("nan"), error=f"{type(exc).__name__}: {str(exc)[:200]}")
                print(f"{spec} splits={splits:3d}: failed: {row['error']}", flush=True)
                torch.cuda.synchronize()
            rows.append({**row, **env})
            fn = replay = None
            torch.cuda.empty_cache()
        del wl, ti
        torch.cuda.empty_cache()
        if a.out and rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))  # (MLA and GQA rows)
            write_dicts(
                Path(a.out) / "mla_splits.csv", [{k: r.get(k, "") for k in keys} for r in rows]
            )


if __name__ == "__main__":
    main()
