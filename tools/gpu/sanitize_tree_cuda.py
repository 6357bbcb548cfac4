"""A few CUDA tree builds for compute-sanitizer (memcheck / racecheck): draft-like top-K at
budgets 16 / 64 / 256 / 512, the forced slow paths (threshold 0: expand again at -inf; -inf:
radix select at every depth, a union past the register sort), batch 3; each checked against the
torch builder."""

from __future__ import annotations

import torch

from kdtree.spec.gpu.tree_build import build_trees_torch
from kdtree.spec.gpu.tree_build_cuda import build_trees_cuda
from kdtree.spec.tree import draft_topk

FIELDS = ("tokens", "parents", "depths", "mask", "scores", "ranks", "n_nodes")


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = 0
    for K, budget, theta in (
        (8, 16, None),
        (32, 64, None),
        (32, 256, None),
        (8, 512, None),
        (8, 64, 0.0),
        (8, 256, float("-inf")),
    ):
        logits = torch.randn(3, 15, 4096, device="cuda", generator=gen) * 3
        lp, tok = draft_topk(logits, K)
        bonus = torch.arange(3, device="cuda")
        got = build_trees_cuda(lp, tok, budget, bonus, theta=theta)
        ref = build_trees_torch(lp, tok, budget, bonus)
        for f in FIELDS:
            assert torch.equal(getattr(got, f), getattr(ref, f)), (K, budget, theta, f)
        n += 1
    torch.cuda.synchronize()
    print(f"{n} CUDA tree builds match the torch builder")


if __name__ == "__main__":
    main()
