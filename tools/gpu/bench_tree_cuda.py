"""The CUDA C++ tree builder's time by phase: batch 1, depth 15, K 8 and 32, budgets 16 / 64 /
256 on the tree-phase benchmark's draft-like top-K (vocab 8192). ``p50_us`` is a CUDA-graph replay
of ten builds divided by ten (as ``bench_tree_phases.py``); the phase columns are thread 0's
``clock64()`` deltas (median over 50 eager builds) in cycles: log-probs loaded, seed prologue,
seed DP, expansion, order, row map, emit. Appends rows to ``tree_cuda_phases.csv`` in ``--out``."""

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
from kdtree.spec.tree import draft_topk

PHASES = ("load", "prologue", "seed", "expand", "order", "rowmap", "emit")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--budgets", default="16,64,256")
    ap.add_argument("--topk", default="8,32")
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    path = Path(a.out) / "tree_cuda_phases.csv"
    env = run_env(shlex.join(["python3", *sys.argv]))
    fields = ["K", "budget", "vocab", "p50_us", "path", "cycles_total", *PHASES, *env]
    with open(path, "w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=fields).writeheader()
    for k in (int(x) for x in a.topk.split(",")):
        logits = torch.randn(1, 15, a.vocab, device="cuda", generator=gen) * 3
        lp, tok = draft_topk(logits, k)
        bonus = torch.zeros(1, dtype=torch.int64, device="cuda")
        for budget in (int(x) for x in a.budgets.split(",")):
            pth = torch.full((1,), -1, dtype=torch.int32, device="cuda")
            g, _ = graph_of(
                lambda b=budget, lp=lp, tok=tok, bonus=bonus, pth=pth: build_trees_cuda(
                    lp, tok, b, bonus, path_out=pth
                )
            )
            us = time_cuda(g.replay).p50 / 10 * 1e3
            clk = torch.zeros(1, 8, dtype=torch.int64, device="cuda")
            stamps = []
            for _ in range(50):
                build_trees_cuda(lp, tok, budget, bonus, clocks=clk)
                stamps.append(clk[0].clone())
            d = torch.stack(stamps).diff(dim=1).median(dim=0).values.tolist()
            row = dict(K=k, budget=budget, vocab=a.vocab, p50_us=round(us, 2),
                       path=int(pth.item()), cycles_total=int(sum(d)),
                       **dict(zip(PHASES, (int(x) for x in d), strict=True)), **env)  # fmt: skip
            print(f"K={k:2} B={budget:3}: {us:6.1f} us  cycles " + " ".join(
                f"{p}={int(x)}" for p, x in zip(PHASES, d, strict=True)), flush=True)  # fmt: skip
            with open(path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=fields).writerow(row)


if __name__ == "__main__":
    main()
