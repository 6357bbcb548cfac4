"""The CUDA C++ tree builder's time by phase: batch 1, depth 15, K 8 and 32, budgets 16 / 64 /
256 on the tree-phase benchmark's draft-like top-K (vocab 8192). ``p50_us`` is a CUDA-graph replay
of ten builds divided by ten (as ``bench_tree_phases.py``); the phase columns are thread 0's
``clock64()`` deltas (median over 50 eager builds) in cycles: log-probs loaded, seed prologue,
seed DP, expansion, order, row map, emit; then the order's parts (preorder keys, runs of 32
sorted, the merge stages), the expansion's (radix select, one-warp depths, block depths) and what
the build did (``CLOCK_COUNTERS``, the seed DP's depth steps). Appends rows to
``tree_cuda_phases.csv`` in ``--out``."""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env
from kdtree.bench.timing import graph_of, time_cuda
from kdtree.spec.gpu.tree_build_cuda import (
    CLOCK_COLS,
    CLOCK_COUNTERS,
    CLOCK_SPLITS,
    build_trees_cuda,
)
from kdtree.spec.tree import draft_topk

PHASES = ("load", "prologue", "seed", "expand", "order", "rowmap", "emit")
SPLITS = ("order_keys", "order_runs", "order_merge", "select_cycles", "warp_depth_cycles",
          "block_depth_cycles")  # fmt: skip


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
    counters = [c for c in CLOCK_COUNTERS if c != "path"] + ["dp_steps"]
    fields = ["K", "budget", "vocab", "p50_us", "path", "cycles_total", *PHASES, *SPLITS,
              *counters, *env]  # fmt: skip
    with open(path, "w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=fields, lineterminator="\n").writeheader()
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
            clk = torch.zeros(1, CLOCK_COLS, dtype=torch.int64, device="cuda")
            runs = []
            for _ in range(50):
                build_trees_cuda(lp, tok, budget, bonus, clocks=clk)
                runs.append(clk[0].clone())
            c = torch.stack(runs)
            d = c[:, :8].diff(dim=1).median(dim=0).values.tolist()
            # stamps 16 / 17 split the order (stamp 4 .. 5) into keys, runs of 32, merge stages
            parts = torch.stack([c[:, 16] - c[:, 4], c[:, 17] - c[:, 16], c[:, 5] - c[:, 17],
                                 c[:, 18], c[:, 19], c[:, 20]], dim=1)  # fmt: skip
            sp = parts.median(dim=0).values.tolist()
            names = (*CLOCK_COUNTERS, *CLOCK_SPLITS)
            last = dict(zip(names, c[-1, 8:].tolist(), strict=True))  # the same every build
            row = dict(K=k, budget=budget, vocab=a.vocab, p50_us=round(us, 2),
                       path=int(pth.item()), cycles_total=int(sum(d)),
                       **dict(zip(PHASES, (int(x) for x in d), strict=True)),
                       **dict(zip(SPLITS, (int(x) for x in sp), strict=True)),
                       **{n: int(last[n]) for n in counters}, **env)  # fmt: skip
            print(f"K={k:2} B={budget:3}: {us:6.1f} us  cycles " + " ".join(
                f"{p}={int(x)}" for p, x in zip(PHASES + SPLITS, d + sp, strict=True))
                + "  " + " ".join(f"{n}={int(last[n])}" for n in counters), flush=True)  # fmt: skip
            with open(path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=fields, lineterminator="\n").writerow(row)


if __name__ == "__main__":
    main()
