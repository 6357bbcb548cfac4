"""One launch of the CUDA C++ tree builder under a ``torch.cuda.nvtx`` range ``prof``, for
``ncu --nvtx --nvtx-include prof/`` with source correlation (build with ``KDTREE_CUDA_LINEINFO=1``).

The inputs are ``bench_tree_cuda.py``'s (draft-like top-K of ``randn * 3`` logits, depth 15), but
``--batch`` requests at once (default 528: four CTAs per SM of the H200's 132 over the launch,
two resident at budget 256), so the warp-state
sampler collects enough samples per source line from one launch. Every request is a different
draw, as in a real batch.
"""

from __future__ import annotations

import argparse

import torch

from kdtree.spec.gpu.tree_build_cuda import build_trees_cuda
from kdtree.spec.tree import draft_topk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=528)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(a.batch, 15, a.vocab, device="cuda", generator=gen) * 3
    lp, tok = draft_topk(logits, a.topk)
    bonus = torch.zeros(a.batch, dtype=torch.int64, device="cuda")
    for _ in range(3):  # build, load and warm the library outside the range
        build_trees_cuda(lp, tok, a.budget, bonus)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    build_trees_cuda(lp, tok, a.budget, bonus)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    print(f"tree build: batch {a.batch}, budget {a.budget}, K {a.topk}, vocab {a.vocab}")


if __name__ == "__main__":
    main()
