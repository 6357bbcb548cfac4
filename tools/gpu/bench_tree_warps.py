"""Warps per program for the Triton tree builders (``--algo threshold``: ``thresh_warps``;
``--algo heap``: the two-pop replay, ``default_num_warps``): batch 1, depth 15, K 8 (the
engine's top-K) and 32 (the tree-build benchmark's), budgets 16 / 64 / 256, each build
replayed from a CUDA graph holding ten builds and timed with CUDA events; ``same_tree``
compares every config with the heap replay's tree. Prints one line per point and appends it
to ``tree_warps.csv`` in ``--out`` as it goes (each config compiles first, ~3 s: a stage timeout
keeps what was measured).
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env
from kdtree.bench.timing import graph_of, time_cuda
from kdtree.spec.gpu.tree_build_triton import build_trees_triton, default_num_warps, thresh_warps
from kdtree.spec.tree import draft_topk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--algo", default="threshold", choices=("threshold", "heap"))
    ap.add_argument("--warps", default="1,2,4,8,16", help="comma-separated warps to try")
    a = ap.parse_args()
    warps = [int(x) for x in a.warps.split(",")]
    default = thresh_warps if a.algo == "threshold" else default_num_warps
    gen = torch.Generator(device="cuda").manual_seed(0)
    path = Path(a.out) / "tree_warps.csv"
    env = run_env(shlex.join(["python3", *sys.argv]))  # device, versions, sha, time, command
    fields = ["algo", "K", "budget", "num_warps", "p50_us", "default", "same_tree", *env]
    with open(path, "w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=fields).writeheader()
    for k in (8, 32):
        logits = torch.randn(1, 15, 8192, device="cuda", generator=gen) * 3
        lp, tok = draft_topk(logits, k)
        bonus = torch.zeros(1, dtype=torch.int64, device="cuda")
        for budget in (16, 64, 256):
            ref = build_trees_triton(lp, tok, budget, bonus, algo="heap")
            line, rows = [], []
            for w in warps:
                try:
                    g, out = graph_of(
                        lambda w=w, b=budget, lp=lp, tok=tok, bonus=bonus: build_trees_triton(
                            lp, tok, b, bonus, num_warps=w, algo=a.algo
                        )
                    )
                    us = time_cuda(g.replay).p50 / 10 * 1e3
                    same = torch.equal(out.parents, ref.parents) and torch.equal(
                        out.tokens, ref.tokens
                    )
                except Exception as exc:  # a config Triton refuses is a row, not a crash
                    us, same = float("nan"), f"failed: {type(exc).__name__}"
                rows.append(dict(algo=a.algo, K=k, budget=budget, num_warps=w, p50_us=round(us, 2),
                                 default=w == default(budget), same_tree=same, **env))  # fmt: skip
                line.append(f"w{w} {us:6.1f}{'*' if w == default(budget) else ''}")
            print(
                f"{a.algo} K={k:2} B={budget:3}: " + "  ".join(line) + "   (* = default)",
                flush=True,
            )
            with open(path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=fields).writerows(rows)


if __name__ == "__main__":
    main()
