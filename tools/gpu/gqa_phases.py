"""Where the CUDA GQA split kernel's time goes, at verify bench GQA points.

1. Phase clocks (``KDTREE_GQA_CLOCKS=1``): thread 0 of each consumer warpgroup and of the
   producer stamp ``clock()`` at each phase boundary; mean cycles per tile per phase
   (``cuda_gqa.CONSUMER_PHASES``, ``PRODUCER_PHASES``).
2. Ablations (``KDTREE_GQA_ABLATE``, wrong results, timing only), graph-replayed p50: no KV
   loads past the first stages (1: the compute alone), no softmax (8), consumers that only wait
   and release (16: the copies alone); and the kernel without turns (``KDTREE_GQA_PINGPONG=0``,
   clocks and time).

    python3 tools/gpu/gqa_phases.py [--points gqa_8q1kv_d128:131072:65,...] [--warpgroups 2|3]
        [--page-size 16] [--out DIR]

It runs the two-warpgroup kernel shape (``KDTREE_GQA_WARPGROUPS=2``) at every point, in its
clocks build (``KDTREE_CUDA_DEFINES=KDTREE_GQA_WIDE_CLOCKS``, added to any defines already set:
register clocks, and the exact softmax on every tile as before session 25); ``--warpgroups 3``
the three-warpgroup shape in the layout ``launch_plan`` gives it, with and without turns, in its
clocks build (``KDTREE_GQA_TALL_CLOCKS``: its consumers' clocks sum in shared memory since
session 15, its producer keeps none; the build runs 2-7 % slower than the default one at T=65,
ablations included).
"""

from __future__ import annotations

import argparse
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
    _graphed,
    make_tree_inputs,
)
from kdtree.kernels import cuda_gqa

ABLATIONS = (0, 1, 8, 9, 16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--points",
        default="gqa_8q1kv_d128:131072:65,gqa_8q1kv_d128:131072:17,"
        "gqa_32q8kv_d128:131072:65,gqa_32q8kv_d128:131072:17",
    )
    ap.add_argument("--warpgroups", type=int, choices=(2, 3), default=2)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ["KDTREE_GQA_WARPGROUPS"] = str(a.warpgroups)
    # each shape's clocks are a measurement build's (Tall's: 2-7 % slower; Wide's: the exact
    # softmax on every tile, as before session 25)
    clocks = "KDTREE_GQA_TALL_CLOCKS" if a.warpgroups == 3 else "KDTREE_GQA_WIDE_CLOCKS"
    defs = os.environ.get("KDTREE_CUDA_DEFINES", "")
    os.environ["KDTREE_CUDA_DEFINES"] = ",".join(filter(None, (defs, clocks)))
    env = run_env(shlex.join(["python3", *sys.argv]))
    rows = []
    for spec in a.points.split(","):
        name, length, t = spec.split(":")
        wl = Workload(
            LAYOUTS[name],
            1,
            int(length),
            int(t),
            a.page_size,
            torch.bfloat16,
            torch.device("cuda"),
            seed=0,
        )
        ti = make_tree_inputs(wl, int(t), seed=0)
        os.environ["KDTREE_GQA_ABLATE"] = "0"
        on = "1" if a.warpgroups == 2 else "2"  # KDTREE_GQA_PINGPONG that gives this shape turns
        for turns in (on, "0"):
            os.environ["KDTREE_GQA_PINGPONG"] = turns
            os.environ["KDTREE_GQA_CLOCKS"] = "1"
            fn, splits = _cuda_gqa_fn(wl, ti)
            fn(0)
            torch.cuda.synchronize()
            cuda_gqa.phase_clocks()  # drop the warm-up call's sums
            fn(0)
            torch.cuda.synchronize()
            ck = cuda_gqa.phase_clocks()
            os.environ["KDTREE_GQA_CLOCKS"] = "0"
            print(f"{spec} turns={turns} splits={splits} "
                  f"tiles/CTA={ck['tiles'] / max(ck['ctas'], 1):.1f}: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in ck.items() if "." in k), flush=True)  # fmt: skip
            rec = {"point": spec, "warpgroups": a.warpgroups, "page_size": a.page_size,
                   "tma": os.environ.get("KDTREE_GQA_TMA", "1"), "turns": int(turns),
                   "splits": splits, **ck}  # fmt: skip
            for ab in ABLATIONS if turns != "0" else (0,):
                os.environ["KDTREE_GQA_ABLATE"] = str(ab)
                fn, _ = _cuda_gqa_fn(wl, ti)
                replay, per = _graphed(fn, wl.n_rot, wl.device)
                ms = time_cuda(lambda replay=replay: replay(0)).p50 / per
                rec[f"ms_ablate{ab}"] = ms
                print(f"  turns {turns} ablate {ab:2d}: {ms * 1e3:8.1f} us", flush=True)
            os.environ["KDTREE_GQA_ABLATE"] = "0"
            rows.append({**rec, **env})
        os.environ.pop("KDTREE_GQA_PINGPONG")
        del wl, ti
        torch.cuda.empty_cache()
    if a.out:  # (points of different shapes stamp different phases: the union of the columns)
        keys = dict.fromkeys(k for r in rows for k in r)
        write_dicts(
            Path(a.out) / "gqa_phases.csv", [{k: r.get(k, "") for k in keys} for r in rows]
        )


if __name__ == "__main__":
    main()
