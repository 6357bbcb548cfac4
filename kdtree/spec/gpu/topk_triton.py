"""The draft's per-depth top-K log-probs in one Triton launch: one program per (request, depth)
row holds the row in registers, takes its log-sum-exp, then ``K`` max-with-index reductions,
each masking out the value it picked.

Why: ``torch.log_softmax`` + ``torch.topk`` over the vocabulary ran one radix-select block per
row — 16 rows at batch 1, so 16 of 132 SMs — and took ~49 µs of the H200's tree step in the
session-3 profile (63 µs per call in ``tools/gpu/bench_draft_topk.py``, CUDA graph, V = 8192). A
two-stage ``torch.topk`` (per 512-wide chunk, then the survivors) was 1.2x faster at batch 1 and
1.4x slower at batch 8 and 32 in the same script, so it was dropped for this kernel.

Tie rule: among equal values the lowest token id comes first (``tl.max`` with
``return_indices_tie_break_left``), which is deterministic; ``torch.topk``'s order among ties is
unspecified, so the two may list tied tokens differently but select the same values. ``-inf``
logits are selected as the lowest finite float (then reported as ``-inf``), so a row with fewer
than ``K`` finite logits still yields ``K`` distinct token ids below ``V``, as ``torch.topk``
does; a picked value becomes ``-inf``, below every candidate left.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_VOCAB", "draft_topk_triton"]

#: Largest vocabulary held in one program's registers (16 warps x 32 lanes x 64 values).
MAX_VOCAB = 32768
LOWEST = tl.constexpr(-3.4028234663852886e38)  # the lowest finite float32


@triton.jit
def _topk_lse_kernel(
    x_ptr,
    lp_ptr,
    tok_ptr,
    V,
    stride_x,
    K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_V)
    valid = offs < V
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=valid, other=float("-inf")).to(
        tl.float32
    )
    m = tl.max(x, 0)
    lse = m + tl.log(tl.sum(tl.exp(x - m), 0))
    # -inf logits compete as the lowest finite float: padding and picked values stay below them
    x = tl.where(valid & (x == float("-inf")), LOWEST, x)
    for k in tl.range(0, K):
        v, i = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(lp_ptr + row * K + k, tl.where(v == LOWEST, float("-inf"), v - lse))
        tl.store(tok_ptr + row * K + k, i.to(tl.int64))
        x = tl.where(offs == i, float("-inf"), x)


def draft_topk_triton(draft_logits: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``draft_logits [B, D, V]`` → ``(lp float32 [B, D, K], tok int64 [B, D, K])``, descending,
    as :func:`kdtree.spec.tree.draft_topk` (validated there)."""
    *lead, V = draft_logits.shape
    if V > MAX_VOCAB:
        raise ValueError(f"vocabulary {V}: the fused top-K holds at most {MAX_VOCAB} values a row")
    if not 1 <= K <= V:
        raise ValueError(f"K={K}: expected 1 <= K <= vocabulary size {V}")
    x = draft_logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    lp = torch.empty(rows, K, dtype=torch.float32, device=x.device)
    tok = torch.empty(rows, K, dtype=torch.int64, device=x.device)
    if rows == 0:
        return lp.reshape(*lead, K), tok.reshape(*lead, K)
    block = triton.next_power_of_2(V)
    warps = max(4, min(16, block // 512))
    _topk_lse_kernel[(rows,)](x, lp, tok, V, x.stride(0), K=K, BLOCK_V=block, num_warps=warps)
    return lp.reshape(*lead, K), tok.reshape(*lead, K)
