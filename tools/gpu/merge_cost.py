"""What the merge of the split partials costs the CUDA backends, and the split kernels' fixed cost.

1. At each point, graph-replayed p50 of the whole call with each merge (``KDTREE_CUDA_MERGE``):
   ``pdl`` (the shared CUDA merge as a programmatic dependent launch, the default), ``plain``
   (the same kernel in stream order), ``triton`` (the Triton merge), and ``split`` (the split
   kernel alone: the Triton path with its merge call made a no-op; the output is not merged).
2. ``--sweep``: the split kernel alone at a fixed split count over several lengths, for the
   fixed cost a CTA pays whatever its tile count (the intercept of time against tiles a CTA).

    python3 tools/gpu/merge_cost.py [--points gqa_8q1kv_d128:131072:17,mla_h8:131072:65,...]
        [--sweep gqa_8q1kv_d128:17:129,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
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
from kdtree.kernels import cuda_gqa, cuda_mla

MODES = ("pdl", "plain", "triton", "split")
DEFAULT_POINTS = (
    "gqa_8q1kv_d128:65536:17,gqa_8q1kv_d128:131072:17,gqa_8q1kv_d128:131072:65,"
    "gqa_32q8kv_d128:131072:17,gqa_32q8kv_d128:131072:65,"
    "mla_h8:131072:65,mla_h8:262144:65,mla_h16:262144:17,mla_h16:262144:65"
)
SWEEP_LENGTHS = (16384, 32768, 65536, 131072, 262144)


@contextlib.contextmanager
def merge_setting(mode: str):
    """``KDTREE_CUDA_MERGE`` for ``mode``; ``split`` also makes the backends' Triton merge call
    a no-op (the split kernel alone)."""
    os.environ["KDTREE_CUDA_MERGE"] = "triton" if mode == "split" else mode
    saved = cuda_gqa.launch_merge, cuda_mla.launch_merge
    if mode == "split":
        cuda_gqa.launch_merge = cuda_mla.launch_merge = lambda *a, **k: None
    try:
        yield
    finally:
        cuda_gqa.launch_merge, cuda_mla.launch_merge = saved
        os.environ.pop("KDTREE_CUDA_MERGE", None)


def time_point(name: str, length: int, t: int, mode: str, splits: int | None = None):
    """(µs a call, split count) of the CUDA backend at one point under ``mode``."""
    wl = Workload(LAYOUTS[name], 1, length, t, 16, torch.bfloat16, torch.device("cuda"), seed=0)
    ti = make_tree_inputs(wl, t, seed=0)
    with merge_setting(mode):
        if wl.layout.kind == "mla":
            fn, used = _cuda_mla_fn(wl, ti, cuda_mla.DEFAULT_KERNEL, num_splits=splits)
        else:
            fn, used = _cuda_gqa_fn(wl, ti, num_splits=splits)
        replay, per = _graphed(fn, wl.n_rot, wl.device)
        us = time_cuda(lambda: replay(0)).p50 / per * 1e3
    del wl, ti, fn
    torch.cuda.empty_cache()
    return us, used


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument(
        "--sweep",
        default="gqa_8q1kv_d128:17:129,gqa_8q1kv_d128:65:43",
        help="layout:T:splits; the split kernel alone at these splits over "
        + ",".join(str(n) for n in SWEEP_LENGTHS),
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    rows = []
    for spec in a.points.split(","):
        name, length, t = spec.split(":")
        got = {}
        for mode in MODES:
            us, splits = time_point(name, int(length), int(t), mode)
            got[mode] = us
            rows.append({"part": "modes", "point": spec, "mode": mode, "splits": splits,
                         "tiles_per_cta": None, "us": us, **env})  # fmt: skip
        print(f"{spec} ({splits} splits): " + ", ".join(f"{m} {v:.1f}" for m, v in got.items())
              + f" us; merge in stream order {got['plain'] - got['split']:.1f} us, as a "
              f"dependent {got['pdl'] - got['split']:.1f} us", flush=True)  # fmt: skip
    for spec in filter(None, a.sweep.split(",")):
        name, t, splits = spec.split(":")
        lay = LAYOUTS[name]
        rows_packed = int(t) * lay.hq // lay.hkv
        tile = cuda_gqa.SHAPES[cuda_gqa.consumer_warpgroups(rows_packed)][1]
        pts = []
        for length in SWEEP_LENGTHS:
            us, _ = time_point(name, length, int(t), "split", int(splits))
            tiles = math.ceil(math.ceil((length + int(t)) / int(splits)) / tile)
            pts.append((tiles, us))
            rows.append({"part": "sweep", "point": f"{name}:{length}:{t}", "mode": "split",
                         "splits": int(splits), "tiles_per_cta": tiles, "us": us, **env})  # fmt: skip
        xs = torch.tensor([p[0] for p in pts], dtype=torch.float64)
        ys = torch.tensor([p[1] for p in pts], dtype=torch.float64)
        slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum())
        icpt = float(ys.mean() - slope * xs.mean())
        print(f"sweep {spec}: " + ", ".join(f"{n} tiles {v:.1f}" for n, v in pts)
              + f" -> {slope:.3f} us a tile + {icpt:.1f} us fixed", flush=True)  # fmt: skip
    if a.out:
        write_dicts(Path(a.out) / "merge_cost.csv", rows)


if __name__ == "__main__":
    main()
