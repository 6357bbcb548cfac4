"""Triton helpers shared by the GQA and MLA tree-verify kernels.

Conventions: the softmax runs in base 2 (scores are pre-multiplied by ``sm_scale·log2(e)``),
so every log-sum-exp stored in a workspace is base 2. Row ``r`` of an M tile is query row
``(t = r // G, h = r % G)``: all ``G`` query heads that share a KV head, for every tree token.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def kv_slots(pt_row_ptr, pos, valid, max_pages, PAGE_SIZE: tl.constexpr):
    """Physical slot (int64) of logical positions ``pos`` through one page-table row; invalid
    positions and positions beyond the table map to slot 0 (and must be masked by the caller)."""
    page_idx = pos // PAGE_SIZE
    ok = valid & (page_idx < max_pages)
    page = tl.load(pt_row_ptr + page_idx, mask=ok, other=0).to(tl.int64)
    return page * PAGE_SIZE + (pos % PAGE_SIZE).to(tl.int64), ok


@triton.jit
def tree_bits(mask_row_ptr, stride_mt, t_idx, row_valid, j, j_valid):
    """``[BLOCK_M, BLOCK_N]`` booleans: tree token ``t_idx`` sees tree token ``j`` (bit
    ``j % 64`` of word ``j // 64`` of its bitmask row)."""
    ptrs = mask_row_ptr + t_idx[:, None] * stride_mt + (j // 64)[None, :]
    words = tl.load(ptrs, mask=row_valid[:, None] & j_valid[None, :], other=0)
    return ((words >> (j % 64).to(tl.int64)[None, :]) & 1) != 0


@triton.jit
def online_update(m_i, l_i, acc, s, MASKED: tl.constexpr):
    """One online-softmax step on base-2 scores ``s``: returns the new max, the new row sum,
    the rescaled accumulator and the probabilities ``p`` (fp32). With ``MASKED``, rows whose
    scores are all ``-inf`` so far stay at zero weight instead of producing NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, acc * alpha[:, None], p


@triton.jit
def store_result(
    acc,
    m_i,
    l_i,
    rows,
    row_valid,
    G,
    d_offs,
    out_ptr,
    stride_ot,
    stride_oh,
    head0,
    part_ptr,
    stride_pr,
    lse_ptr,
    DIRECT_OUT: tl.constexpr,
):
    """Finish a split: with ``DIRECT_OUT`` write the normalised output rows into ``out`` (one
    split only); otherwise write the normalised partial and its base-2 LSE to the workspace."""
    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    if DIRECT_OUT:
        t_idx = rows // G
        h_idx = rows % G
        ptrs = (
            out_ptr
            + t_idx[:, None].to(tl.int64) * stride_ot
            + (head0 + h_idx)[:, None] * stride_oh
            + d_offs[None, :]
        )
        tl.store(ptrs, o.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
    else:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        ptrs = part_ptr + rows[:, None].to(tl.int64) * stride_pr + d_offs[None, :]
        tl.store(ptrs, o, mask=row_valid[:, None])
        tl.store(lse_ptr + rows, lse, mask=row_valid)


@triton.jit(do_not_specialize=("num_kv_heads", "G", "R", "NUM_SPLITS"))
def _merge_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_pr,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_ob,
    stride_ot,
    stride_oh,
    num_kv_heads,
    G,
    R,
    NUM_SPLITS,
    DV: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Log-sum-exp merge of ``NUM_SPLITS`` normalised partials into ``out [B, T, Hq, DV]``.
    Grid: (row blocks, batch × kv heads)."""
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_valid = rows < R
    d = tl.arange(0, DV)
    p_base = part_ptr + b.to(tl.int64) * stride_pb + kvh.to(tl.int64) * stride_ph
    l_base = lse_ptr + b.to(tl.int64) * stride_lb + kvh * stride_lh
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    w_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, DV], tl.float32)
    for s in range(NUM_SPLITS):
        lse = tl.load(l_base + s * stride_ls + rows, mask=row_valid, other=float("-inf"))
        m_new = tl.maximum(m_i, lse)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        w = tl.exp2(lse - m_use)
        o = tl.load(
            p_base + s * stride_ps + rows[:, None].to(tl.int64) * stride_pr + d[None, :],
            mask=row_valid[:, None] & (w > 0.0)[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + o * w[:, None]
        w_sum = w_sum * alpha + w
        m_i = m_new
    out = acc / tl.where(w_sum > 0.0, w_sum, 1.0)[:, None]
    t_idx = rows // G
    h_idx = rows % G
    ptrs = (
        out_ptr
        + b.to(tl.int64) * stride_ob
        + t_idx[:, None].to(tl.int64) * stride_ot
        + (kvh * G + h_idx)[:, None] * stride_oh
        + d[None, :]
    )
    tl.store(ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def launch_merge(part, lse, out, num_kv_heads: int, group: int, rows: int, num_splits: int):
    """Merge ``part [B, Hkv, S, R, Dv]`` / ``lse [B, Hkv, S, R]`` into ``out [B, T, Hq, Dv]``."""
    b = out.shape[0]
    dv = out.shape[3]
    block_r = 16 if dv <= 128 else 8
    grid = (triton.cdiv(rows, block_r), b * num_kv_heads)
    _merge_kernel[grid](
        part,
        lse,
        out,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        part.stride(3),
        lse.stride(0),
        lse.stride(1),
        lse.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        num_kv_heads,
        group,
        rows,
        num_splits,
        DV=dv,
        BLOCK_R=block_r,
        num_warps=4,
    )
