"""Where the wgmma or seesaw MLA split kernel's time goes, at the verify bench's MLA points.

1. Phase clocks (``KDTREE_MLA_CLOCKS=1``): thread 0 of each consumer warpgroup stamps the
   32-bit ``clock()`` at each phase boundary; mean cycles per tile per phase (``cuda_mla.WGMMA_PHASES`` / ``SEESAW_PHASES``);
   ``cycles_per_tile`` is warpgroup 0's sum.
2. Ablations (``KDTREE_MLA_ABLATE``, wrong results, timing only): graph-replayed p50 with the KV
   loads past tile 1 dropped (1), the S MMAs dropped (2), the P V MMAs dropped (4, wgmma only),
   and sums.

    python3 tools/gpu/mla_phases.py [--points h16:131072:65,h8:131072:65] [--out DIR]
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
    _cuda_mla_fn,
    _graphed,
    make_tree_inputs,
)
from kdtree.kernels import cuda_mla

ABLATIONS = (0, 1, 2, 4, 6, 3, 5, 7)
SEESAW_ABLATIONS = (0, 1, 2, 3)  # the seesaw kernel has no P V ablation (bit 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="h16:131072:65,h8:131072:65,h16:65536:65,h16:131072:17")
    ap.add_argument("--kernel", default="wgmma")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))  # device, versions, sha, time, command
    rows = []
    for spec in a.points.split(","):
        h, length, t = spec.split(":")
        lay = LAYOUTS[f"mla_{h}"]
        wl = Workload(
            lay, 1, int(length), int(t), 16, torch.bfloat16, torch.device("cuda"), seed=0
        )
        ti = make_tree_inputs(wl, int(t), seed=0)
        os.environ["KDTREE_MLA_ABLATE"] = "0"
        os.environ["KDTREE_MLA_CLOCKS"] = "1"
        fn, splits = _cuda_mla_fn(wl, ti, kernel=a.kernel)
        fn(0)
        torch.cuda.synchronize()
        cuda_mla.wgmma_clocks(a.kernel)  # drop the warm-up call's sums
        fn(0)
        torch.cuda.synchronize()
        ck = cuda_mla.wgmma_clocks(a.kernel)
        os.environ["KDTREE_MLA_CLOCKS"] = "0"
        total = sum(v for k, v in ck.items() if k.startswith("wg0."))
        print(f"{spec} splits={splits} tiles/CTA={ck['tiles'] / max(ck['ctas'], 1):.1f} "
              f"cycles/tile={total:.0f}: " + ", ".join(
                  f"{k} {v:.0f}" for k, v in ck.items() if k.startswith("wg")), flush=True)  # fmt: skip
        rec = {
            "point": spec,
            "kernel": a.kernel,
            "tma": os.environ.get("KDTREE_MLA_TMA", "1"),
            "splits": splits,
            "cycles_per_tile": total,
            **ck,
        }
        for ab in ABLATIONS if a.kernel == "wgmma" else SEESAW_ABLATIONS:
            os.environ["KDTREE_MLA_ABLATE"] = str(ab)
            fn, _ = _cuda_mla_fn(wl, ti, kernel=a.kernel)
            replay, per = _graphed(fn, wl.n_rot, wl.device)
            ms = time_cuda(lambda replay=replay: replay(0)).p50 / per
            rec[f"ms_ablate{ab}"] = ms
            print(f"  ablate {ab}: {ms * 1e3:8.1f} us", flush=True)
        os.environ["KDTREE_MLA_ABLATE"] = "0"
        rows.append({**rec, **env})
        del wl, ti
        torch.cuda.empty_cache()
    if a.out:
        write_dicts(Path(a.out) / "mla_phases.csv", rows)


if __name__ == "__main__":
    main()
