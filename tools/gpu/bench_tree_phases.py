"""Phase breakdown of the threshold tree builder against the heap replay: batch 1, depth 15,
K 8 and 32, budgets 16 / 64 / 256, each kernel replayed from a CUDA graph holding ten builds.
``seed`` stops the kernel after its threshold, ``seed+expand`` after the expansion, ``full`` is
the whole build (``full_wN``: with N warps); ``heap`` is ``algo="heap"``; ``cuda`` is the CUDA
C++ builder (``kernels/tree_build.cu``), ``cuda_slow`` the same started at threshold -inf (every
depth over the budget keeps its best by radix select: its slow path). Prints one line per
point and appends rows to ``tree_phases.csv`` in ``--out`` as it goes."""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env
from kdtree.bench.timing import graph_of, time_cuda
from kdtree.spec.gpu.tree_build_cuda import build_trees_cuda
from kdtree.spec.gpu.tree_build_triton import build_trees_triton
from kdtree.spec.tree import draft_topk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budgets", default="16,64,256")
    ap.add_argument("--topk", default="8,32")
    ap.add_argument("--alt-warps", default="4", help="warps for extra full builds")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    path = Path(a.out) / "tree_phases.csv"
    env = run_env(shlex.join(["python3", *sys.argv]))
    fields = ["K", "budget", "phase", "p50_us", "path", *env]
    with open(path, "w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=fields).writeheader()
    for k in (int(x) for x in a.topk.split(",")):
        logits = torch.randn(1, 15, 8192, device="cuda", generator=gen) * 3
        lp, tok = draft_topk(logits, k)
        bonus = torch.zeros(1, dtype=torch.int64, device="cuda")
        for budget in (int(x) for x in a.budgets.split(",")):
            rows, line = [], []
            alts = [(f"full_w{w}", dict(num_warps=int(w))) for w in a.alt_warps.split(",") if w]
            for phase, kw in (
                ("seed", dict(_stop=1)),
                ("seed+expand", dict(_stop=2)),
                ("full", {}),
                *alts,
                ("heap", dict(algo="heap")),
                ("cuda", dict(cuda=True)),
                ("cuda_slow", dict(cuda=True, theta=float("-inf"))),
            ):
                pth = torch.full((1,), -1, dtype=torch.int32, device="cuda")
                if phase != "heap":
                    kw = dict(kw, path_out=pth)
                if kw.pop("cuda", False):
                    fn = build_trees_cuda
                else:
                    fn = build_trees_triton
                g, _ = graph_of(
                    lambda kw=kw, b=budget, lp=lp, tok=tok, bonus=bonus, fn=fn: fn(
                        lp, tok, b, bonus, **kw
                    )
                )
                us = time_cuda(g.replay).p50 / 10 * 1e3
                rows.append(dict(K=k, budget=budget, phase=phase, p50_us=round(us, 2),
                                 path=int(pth.item()), **env))  # fmt: skip
                line.append(f"{phase} {us:6.1f}")
            print(f"K={k:2} B={budget:3}: " + "  ".join(line), flush=True)
            with open(path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=fields).writerows(rows)


if __name__ == "__main__":
    main()
