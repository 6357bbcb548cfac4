"""Split-count sweep of the CUDA MLA and GQA kernels at verify bench points: graph-replayed p50
per split count next to the count ``choose_splits`` picks (``cuda_mla.choose_splits`` models a
split's cost as whole waves of CTAs only; ``cuda_gqa.choose_splits`` adds 256 keys' worth of
fixed cost a CTA).

    python3 tools/gpu/mla_splits.py [--points h16:131072:65,gqa_8q1kv_d128:131072:65,...]
        [--splits 7,8,15,23] [--out DIR]

A point is ``layout:length:tree``; ``h8`` / ``h16`` are short for ``mla_h8`` / ``mla_h16``.
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
    _cuda_gqa_fn,
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
        name, length, t = spec.split(":")
        layout = LAYOUTS[name if name in LAYOUTS else f"mla_{name}"]
        wl = Workload(
            layout, 1, int(length), int(t), 16, torch.bfloat16, torch.device("cuda"), seed=0,
        )  # fmt: skip
        ti = make_tree_inputs(wl, int(t), seed=0)
        kernel = a.kernel if layout.kind == "mla" else "gqa_sm90"

        def make(splits=None, wl=wl, ti=ti, layout=layout):
            if layout.kind == "mla":
                return _cuda_mla_fn(wl, ti, kernel=a.kernel, num_splits=splits)
            return _cuda_gqa_fn(wl, ti, num_splits=splits)

        _, chosen = make()
        counts = sorted({chosen, *(int(x) for x in a.splits.split(","))})
        for splits in counts:
            fn, _ = make(splits)
            replay, per = _graphed(fn, wl.n_rot, wl.device)
            ms = time_cuda(lambda replay=replay: replay(0)).p50 / per
            mark = " (chosen)" if splits == chosen else ""
            print(f"{spec} splits={splits:3d}: {ms * 1e3:8.1f} us{mark}", flush=True)
            rows.append({"point": spec, "kernel": kernel, "splits": splits,
                         "chosen": splits == chosen, "ms": ms, **env})  # fmt: skip
        del wl, ti
        torch.cuda.empty_cache()
    if a.out:
        write_dicts(Path(a.out) / "mla_splits.csv", rows)


if __name__ == "__main__":
    main()
