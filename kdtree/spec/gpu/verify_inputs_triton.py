"""Fused verify-input fill: ids, positions, bitmask and slots of a batch in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 64


@triton.jit
def _fill_kernel(
    tok,
    dep,
    mask,  # tree: int64 [B, T], int64 [B, T], int64 [B, T, W]
    prefix,  # int32 [B]
    page_table,
    pt_stride,  # int32 [B, pages]
    ids_out,
    pos_out,
    mask_out,
    slot_out,
    T,
    W,
    page_size,
    BLOCK_T: tl.constexpr,
    WP: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    m = i < T
    row = b * T + i
    L = tl.load(prefix + b).to(tl.int64)
    tl.store(ids_out + row, tl.load(tok + row, mask=m), mask=m)
    tl.store(pos_out + row, L + tl.load(dep + row, mask=m), mask=m)
    p = L + i
    page = tl.load(page_table + b * pt_stride + p // page_size, mask=m, other=0).to(tl.int64)
    tl.store(slot_out + row, page * page_size + p % page_size, mask=m)
    w = tl.arange(0, WP)
    mm = m[:, None] & (w < W)[None, :]
    off = row[:, None] * W + w[None, :]
    tl.store(mask_out + off, tl.load(mask + off, mask=mm), mask=mm)


def fill_triton(
    buf, tree, prefix_lens: torch.Tensor, page_table: torch.Tensor, page_size: int
) -> None:
    """One launch over (request, row tile) writing all four static buffers of ``buf``."""
    B, T = buf.input_ids.shape
    W = buf.tree_mask.shape[-1]
    if page_table.dtype != torch.int32 or page_table.stride(1) != 1:
        raise ValueError("page_table: expected int32 rows with unit column stride")
    tok = tree.tokens.contiguous()
    dep = tree.depths.contiguous()
    mask = tree.mask.contiguous()
    prefix = prefix_lens.to(torch.int32).contiguous()
    grid = (B, triton.cdiv(T, BLOCK_T))
    _fill_kernel[grid](
        tok,
        dep,
        mask,
        prefix,
        page_table,
        page_table.stride(0),
        buf.input_ids,
        buf.positions,
        buf.tree_mask,
        buf.slot_mapping,
        T,
        W,
        page_size,
        BLOCK_T=BLOCK_T,
        WP=triton.next_power_of_2(W),
    )
