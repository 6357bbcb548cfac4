"""What the merge of the split partials costs the CUDA backends, and the split kernels' fixed cost.

1. At each point, graph-replayed p50 of the whole call under each setting of :data:`MODES`
   (``KDTREE_CUDA_MERGE``: ``plain``, the shared CUDA merge in stream order; ``pdl``, the same
   kernel as a programmatic dependent launch; ``triton``, the Triton merge; ``split``, the
   split kernel alone -- the Triton path with its merge call made a no-op, the output not
   merged). Every setting's graph is captured once; the timings alternate between them for
   ``--rounds`` rounds (median). (Session 12's calls b-c also timed two knobs since taken out:
   one merge CTA an SM under PDL, and the GQA split kernel itself a programmatic dependent.)
2. ``--sweep``: the split kernel alone at a fixed split count over several lengths, for the
   fixed cost a CTA pays whatever its tile count (the intercept of time against tiles a CTA).

    python3 tools/gpu/merge_cost.py [--points gqa_8q1kv_d128:131072:17,mla_h8:131072:65,...]
        [--modes pdl,plain,...] [--rounds 5] [--sweep gqa_8q1kv_d128:17:129,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import statistics
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

#: setting -> environment (``split`` also turns the Triton merge call into a no-op)
MODES = {
    "plain": {"KDTREE_CUDA_MERGE": "plain"},
    "pdl": {"KDTREE_CUDA_MERGE": "pdl"},
    "triton": {"KDTREE_CUDA_MERGE": "triton"},
    "split": {"KDTREE_CUDA_MERGE": "triton"},
}
DEFAULT_POINTS = (
    "gqa_8q1kv_d128:65536:17,gqa_8q1kv_d128:131072:17,gqa_8q1kv_d128:131072:65,"
    "gqa_32q8kv_d128:131072:17,gqa_32q8kv_d128:131072:65,"
    "mla_h8:131072:65,mla_h8:262144:65,mla_h16:262144:17,mla_h16:262144:65"
)
SWEEP_LENGTHS = (16384, 32768, 65536, 131072, 262144)


@contextlib.contextmanager
def setting(mode: str):
    """The environment of ``mode`` (:data:`MODES`) while a call is captured."""
    env = MODES[mode]
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    saved = cuda_gqa.launch_merge, cuda_mla.launch_merge
    if mode == "split":
        cuda_gqa.launch_merge = cuda_mla.launch_merge = lambda *a, **k: None
    try:
        yield
    finally:
        cuda_gqa.launch_merge, cuda_mla.launch_merge = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def capture(wl, ti, mode: str, splits: int | None = None):
    """``(replay, calls a replay, split count)`` of the CUDA backend under ``mode``."""
    with setting(mode):
        if wl.layout.kind == "mla":
            fn, used = _cuda_mla_fn(wl, ti, cuda_mla.DEFAULT_KERNEL, num_splits=splits)
        else:
            fn, used = _cuda_gqa_fn(wl, ti, num_splits=splits)
        replay, per = _graphed(fn, wl.n_rot, wl.device)
    return replay, per, used


def time_modes(name: str, length: int, t: int, modes, rounds: int, splits: int | None = None):
    """{mode: median µs a call}, split count: each mode's graph captured once, the timings
    alternating between modes for ``rounds`` rounds."""
    wl = Workload(LAYOUTS[name], 1, length, t, 16, torch.bfloat16, torch.device("cuda"), seed=0)
    ti = make_tree_inputs(wl, t, seed=0)
    graphs = {m: capture(wl, ti, m, splits) for m in modes}
    times = {m: [] for m in modes}
    for _ in range(rounds):
        for m, (replay, per, _) in graphs.items():
            times[m].append(time_cuda(lambda replay=replay: replay(0)).p50 / per * 1e3)
    used = next(iter(graphs.values()))[2]
    del graphs, wl, ti
    torch.cuda.empty_cache()
    return {m: statistics.median(v) for m, v in times.items()}, used


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument(
        "--sweep",
        default="gqa_8q1kv_d128:17:129,gqa_8q1kv_d128:65:43",
        help="layout:T:splits; the split kernel alone at these splits over "
        + ",".join(str(n) for n in SWEEP_LENGTHS),
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    rows = []
    modes = a.modes.split(",")
    for spec in filter(None, a.points.split(",")):
        name, length, t = spec.split(":")
        got, splits = time_modes(name, int(length), int(t), modes, a.rounds)
        for mode, us in got.items():
            rows.append({"part": "modes", "point": spec, "mode": mode, "splits": splits,
                         "tiles_per_cta": None, "us": us, **env})  # fmt: skip
        print(f"{spec} ({splits} splits): " + ", ".join(f"{m} {v:.1f}" for m, v in got.items())
              + " us", flush=True)  # fmt: skip
    for spec in filter(None, a.sweep.split(",")):
        name, t, splits = spec.split(":")
        lay = LAYOUTS[name]
        rows_packed = int(t) * lay.hq // lay.hkv
        tile = cuda_gqa.SHAPES[cuda_gqa.launch_plan(rows_packed)[0]][1]
        pts = []
        for length in SWEEP_LENGTHS:
            got, _ = time_modes(name, length, int(t), ["split"], 1, int(splits))
            us = got["split"]
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
