"""Triton tree-verify attention for absorbed MLA (one latent KV head: ``c`` then ``k_pe``).

Same schedule as :mod:`kdtree.kernels.gqa` with ``G = H`` query heads on the single latent
head: the M tile packs ``H·T`` rows, the score is the split dot ``q_nope·cᵀ + q_pe·k_peᵀ``
(512 + 64) and the latent tile ``c`` is loaded once and used as both K and V. Grid
``(M tiles, splits, batch)``; the last split also attends to the tree keys through the
ancestor bitmask.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kdtree.kernels._common import (
    kv_slots,
    launch_split,
    online_update,
    split_launch_args,
    store_result,
    tree_bits,
)

# Runtime values that change with T, batch or the split count: no recompiles for them.
_DYNAMIC = ("T", "H", "NUM_SPLITS", "max_pages", "stride_ptb", "stride_mb", "stride_mt")


@triton.jit
def _mla_tile_at(
    qn,
    qp,
    base,
    ok,
    r_offs,
    p_offs,
    qk_scale,
    RANK: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Latent tile ``c [BLOCK_N, RANK]`` at the row pointers ``base [BLOCK_N, 1]`` (``ok``:
    validity, used only when ``MASKED``) and the base-2 scores against it."""
    if MASKED:
        c = tl.load(base + r_offs[None, :], mask=ok[:, None], other=0.0)
        kp = tl.load(base + RANK + p_offs[None, :], mask=ok[:, None], other=0.0)
    else:
        c = tl.load(base + r_offs[None, :])
        kp = tl.load(base + RANK + p_offs[None, :])
    s = tl.dot(qn, tl.trans(c), input_precision=DOT_PRECISION)
    s = tl.dot(qp, tl.trans(kp), s, input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where(ok[None, :], s, float("-inf"))
    return s, c


@triton.jit
def _mla_tile(
    qn,
    qp,
    pos,
    pos_valid,
    pt_row_ptr,
    max_pages,
    kv_ptr,
    stride_ks,
    r_offs,
    p_offs,
    qk_scale,
    RANK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Latent tile ``c [BLOCK_N, RANK]`` at logical ``pos`` and the base-2 scores against it."""
    slot, ok = kv_slots(pt_row_ptr, pos, pos_valid, max_pages, PAGE_SIZE)
    base = kv_ptr + slot[:, None] * stride_ks
    return _mla_tile_at(qn, qp, base, ok, r_offs, p_offs, qk_scale, RANK, MASKED, DOT_PRECISION)


@triton.jit(do_not_specialize=_DYNAMIC)
def _mla_split_kernel(
    qn_ptr,
    qp_ptr,
    kv_ptr,
    pt_ptr,
    plen_ptr,
    mask_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    qk_scale,
    stride_qnb,
    stride_qnt,
    stride_qnh,
    stride_qpb,
    stride_qpt,
    stride_qph,
    stride_ks,
    stride_ptb,
    max_pages,
    stride_mb,
    stride_mt,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_pb,
    stride_ps,
    stride_pr,
    stride_lb,
    stride_ls,
    T,
    H,
    NUM_SPLITS,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PT_PREFETCH: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < T * H
    t_idx = rows // H
    h_idx = rows % H
    r_offs = tl.arange(0, RANK)
    p_offs = tl.arange(0, ROPE)
    qn = tl.load(
        qn_ptr
        + b.to(tl.int64) * stride_qnb
        + t_idx[:, None].to(tl.int64) * stride_qnt
        + h_idx[:, None] * stride_qnh
        + r_offs[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )
    qp = tl.load(
        qp_ptr
        + b.to(tl.int64) * stride_qpb
        + t_idx[:, None].to(tl.int64) * stride_qpt
        + h_idx[:, None] * stride_qph
        + p_offs[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )

    length = tl.load(plen_ptr + b)
    pt_row = pt_ptr + b.to(tl.int64) * stride_ptb

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, RANK], tl.float32)

    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = pid_s * chunk
    end = tl.minimum(start + chunk, length)
    n_full = tl.maximum(end - start, 0) // BLOCK_N
    if PT_PREFETCH:  # tile i's slots are loaded in iteration i - 1 (the first before the loop)
        pos = start + tl.arange(0, BLOCK_N)
        slot_next, _ok = kv_slots(pt_row, pos, pos < end, max_pages, PAGE_SIZE)
    for i in range(n_full):
        if PT_PREFETCH:
            base = kv_ptr + slot_next[:, None] * stride_ks
            pos = start + (i + 1) * BLOCK_N + tl.arange(0, BLOCK_N)
            slot_next, _ok = kv_slots(pt_row, pos, pos < end, max_pages, PAGE_SIZE)
        else:
            pos = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
            slot, _ok = kv_slots(pt_row, pos, pos < end, max_pages, PAGE_SIZE)
            base = kv_ptr + slot[:, None] * stride_ks
        s, c = _mla_tile_at(
            qn, qp, base, _ok, r_offs, p_offs, qk_scale, RANK, False, DOT_PRECISION
        )
        m_i, l_i, acc, p = online_update(m_i, l_i, acc, s, False)
        acc += tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)
    tail = start + n_full * BLOCK_N
    if tail < end:
        pos = tail + tl.arange(0, BLOCK_N)
        s, c = _mla_tile(
            qn,
            qp,
            pos,
            pos < end,
            pt_row,
            max_pages,
            kv_ptr,
            stride_ks,
            r_offs,
            p_offs,
            qk_scale,
            RANK,
            PAGE_SIZE,
            True,
            DOT_PRECISION,
        )
        m_i, l_i, acc, p = online_update(m_i, l_i, acc, s, True)
        acc += tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)

    if pid_s == NUM_SPLITS - 1:
        mask_row = mask_ptr + b.to(tl.int64) * stride_mb
        for j0 in range(0, T, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            j_valid = j < T
            s, c = _mla_tile(
                qn,
                qp,
                length + j,
                j_valid,
                pt_row,
                max_pages,
                kv_ptr,
                stride_ks,
                r_offs,
                p_offs,
                qk_scale,
                RANK,
                PAGE_SIZE,
                True,
                DOT_PRECISION,
            )
            s = tl.where(
                tree_bits(mask_row, stride_mt, t_idx, row_valid, j, j_valid), s, float("-inf")
            )
            m_i, l_i, acc, p = online_update(m_i, l_i, acc, s, True)
            acc += tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)

    store_result(
        acc,
        m_i,
        l_i,
        rows,
        row_valid,
        H,
        r_offs,
        out_ptr + b.to(tl.int64) * stride_ob,
        stride_ot,
        stride_oh,
        0,
        part_ptr + b.to(tl.int64) * stride_pb + pid_s.to(tl.int64) * stride_ps,
        stride_pr,
        lse_ptr + b.to(tl.int64) * stride_lb + pid_s * stride_ls,
        DIRECT_OUT,
    )


def mla_split_args(
    q_nope,
    q_pe,
    kv_cache,
    page_table,
    prefix_lens,
    tree_mask,
    out,
    part,
    lse,
    *,
    qk_scale: float,
    num_splits: int,
    cfg,
    dot_precision: str,
):
    """``(grid, args after the nine tensors, launch keywords)`` of one split launch
    (computed once per shape by the launch cache): ``part [B, 1, S, R, RANK]``,
    ``lse [B, 1, S, R]``."""
    b, t, h, rank = q_nope.shape
    return split_launch_args(
        b,
        h * t,
        (*q_nope.stride()[:3], *q_pe.stride()[:3], kv_cache.stride(1)),
        page_table,
        tree_mask,
        out,
        part,
        lse,
        (0, 2, 3),
        (0, 2),
        (t, h),
        {"RANK": rank, "ROPE": q_pe.shape[3]},
        kv_cache.shape[1],
        qk_scale=qk_scale,
        num_splits=num_splits,
        cfg=cfg,
        dot_precision=dot_precision,
    )


def launch_mla_split(*tensors, **options) -> None:
    """Launch the split kernel on ``(q_nope, q_pe, kv_cache, page_table, prefix_lens,
    tree_mask, out, part, lse)`` with :func:`mla_split_args`'s keywords (``part``/``lse``
    unused with one split)."""
    launch_split(_mla_split_kernel, mla_split_args, tensors, **options)
