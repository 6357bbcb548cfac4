"""Split-count sweep of the CUDA MLA kernel at the verify bench's MLA points: graph-replayed p50
per split count next to the count ``cuda_mla.choose_splits`` picks (the heuristic models a
split's cost as whole waves of CTAs only: no per-CTA prologue, no merge).

    python3 tools/gpu/mla_splits.py [--points h16:131072:65,...] [--splits 7,8,15,23] [--out DIR]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env, write_dicts
from kdtree.bench.timing import time_cuda
from kdtree.bench.verify_attention import (
    LAYOUTS,
    Workload,
    _cuda_mla_fn,
    _graphed,
    make_tree_inputs,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="h16:131072:65,h16:262144:65,h8:131072:65,h16:65536:65")
    ap.add_argument("--splits", default="4,7,8,11,15,16,22,23,30")
    ap.add_argument("--kernel", default="seesaw")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    rows = []
    for spec in a.points.split(","):
        h, length, t = spec.split(":")
        wl = Workload(
            LAYOUTS[f"mla_{h}"], 1, int(length), int(t), 16, torch.bfloat16,
            torch.device("cuda"), seed=0,
        )  # fmt: skip
        ti = make_tree_inputs(wl, int(t), seed=0)
        _, chosen = _cuda_mla_fn(wl, ti, kernel=a.kernel)
        counts = sorted({chosen, *(int(x) for x in a.splits.split(","))})
        for splits in counts:
            fn, _ = _cuda_mla_fn(wl, ti, kernel=a.kernel, num_splits=splits)
            replay, per = _graphed(fn, wl.n_rot, wl.device)
            ms = time_cuda(lambda replay=replay: replay(0)).p50 / per
            mark = " (chosen)" if splits == chosen else ""
            print(f"{spec} splits={splits:3d}: {ms * 1e3:8.1f} us{mark}", flush=True)
            rows.append({"point": spec, "kernel": a.kernel, "splits": splits,
                         "chosen": splits == chosen, "ms": ms, **env})  # fmt: skip
        del wl, ti
        torch.cuda.empty_cache()
    if a.out:
        write_dicts(Path(a.out) / "mla_splits.csv", rows)


if __name__ == "__main__":
    main()
