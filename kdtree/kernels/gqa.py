"""Triton tree-verify attention for GQA / MHA (head dim 64 or 128).

Grid ``(M tiles, splits, batch × kv heads)``: the M tile packs ``G·T`` query rows (all tree
tokens × all query heads of one KV head), so each KV tile is loaded once per M tile; M tiles
are the fastest grid axis, so tiles of the same split run together and share the KV through
L2. Split ``s`` streams its chunk of the prefix with no mask; the last split then attends to
the ``T`` tree keys (logical positions ``L .. L+T-1``) through the ancestor bitmask. Partials
are merged by :func:`kdtree.kernels._common.launch_merge` (skipped with one split).
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
from kdtree.kernels.heuristics import tail_rows

# Runtime values that change with T, batch or the split count: no recompiles for them.
_DYNAMIC = (
    "T",
    "G",
    "num_kv_heads",
    "NUM_SPLITS",
    "max_pages",
    "stride_ptb",
    "stride_mb",
    "stride_mt",
)


@triton.jit
def _gqa_scores_at(
    q,
    slot,
    ok,
    k_base,
    stride_ks,
    d_offs,
    qk_scale,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Base-2 scores of the packed rows ``q`` against the keys in physical ``slot`` (``ok``:
    their validity, used only when ``MASKED``)."""
    if MASKED:
        k = tl.load(
            k_base + slot[:, None] * stride_ks + d_offs[None, :], mask=ok[:, None], other=0.0
        )
    else:
        k = tl.load(k_base + slot[:, None] * stride_ks + d_offs[None, :])
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where(ok[None, :], s, float("-inf"))
    return s


@triton.jit
def _gqa_scores(
    q,
    pos,
    pos_valid,
    pt_row_ptr,
    max_pages,
    k_base,
    stride_ks,
    d_offs,
    qk_scale,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Base-2 scores of the packed rows ``q`` against the keys at logical ``pos``; also
    returns the keys' physical slots (for the matching V load) and their validity."""
    slot, ok = kv_slots(pt_row_ptr, pos, pos_valid, max_pages, PAGE_SIZE)
    s = _gqa_scores_at(q, slot, ok, k_base, stride_ks, d_offs, qk_scale, MASKED, DOT_PRECISION)
    return s, slot, ok


@triton.jit
def _gqa_tile(
    q_ptr,
    k_ptr,
    v_ptr,
    pt_ptr,
    plen_ptr,
    mask_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    qk_scale,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ptb,
    max_pages,
    stride_mb,
    stride_mt,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_pr,
    stride_lb,
    stride_lh,
    stride_ls,
    T,
    G,
    NUM_SPLITS,
    row0,
    pid_s,
    b,
    kvh,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PT_PREFETCH: tl.constexpr,
):
    """One M tile (``BLOCK_M`` packed rows from ``row0``) of one split: the prefix chunk, the
    tree block on the last split, the partial or the output."""
    rows = row0 + tl.arange(0, BLOCK_M)
    row_valid = rows < T * G
    t_idx = rows // G
    h_idx = rows % G
    d_offs = tl.arange(0, HEAD_DIM)
    q_ptrs = (
        q_ptr
        + b.to(tl.int64) * stride_qb
        + t_idx[:, None].to(tl.int64) * stride_qt
        + (kvh * G + h_idx)[:, None] * stride_qh
        + d_offs[None, :]
    )
    q = tl.load(q_ptrs, mask=row_valid[:, None], other=0.0)

    length = tl.load(plen_ptr + b)
    pt_row = pt_ptr + b.to(tl.int64) * stride_ptb
    k_base = k_ptr + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + kvh.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # This split's chunk of the prefix: whole BLOCK_N tiles, no mask, then one masked tail.
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = pid_s * chunk
    end = tl.minimum(start + chunk, length)
    n_full = tl.maximum(end - start, 0) // BLOCK_N
    if PT_PREFETCH:  # tile i's slots are loaded in iteration i - 1 (the first before the loop)
        pos = start + tl.arange(0, BLOCK_N)
        slot_next, _ok = kv_slots(pt_row, pos, pos < end, max_pages, PAGE_SIZE)
    for i in range(n_full):
        if PT_PREFETCH:
            slot = slot_next
            pos = start + (i + 1) * BLOCK_N + tl.arange(0, BLOCK_N)
            slot_next, _ok = kv_slots(pt_row, pos, pos < end, max_pages, PAGE_SIZE)
        else:
            pos = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
            slot, _ok = kv_slots(pt_row, pos, pos < end, max_pages, PAGE_SIZE)
        s = _gqa_scores_at(q, slot, _ok, k_base, stride_ks, d_offs, qk_scale, False, DOT_PRECISION)
        m_i, l_i, acc, p = online_update(m_i, l_i, acc, s, False)
        v = tl.load(v_base + slot[:, None] * stride_vs + d_offs[None, :])
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    tail = start + n_full * BLOCK_N
    if tail < end:
        pos = tail + tl.arange(0, BLOCK_N)
        s, slot, ok = _gqa_scores(
            q,
            pos,
            pos < end,
            pt_row,
            max_pages,
            k_base,
            stride_ks,
            d_offs,
            qk_scale,
            PAGE_SIZE,
            True,
            DOT_PRECISION,
        )
        m_i, l_i, acc, p = online_update(m_i, l_i, acc, s, True)
        v = tl.load(
            v_base + slot[:, None] * stride_vs + d_offs[None, :], mask=ok[:, None], other=0.0
        )
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)

    # The tree block (last split only): keys L .. L+T-1 through the ancestor bitmask.
    if pid_s == NUM_SPLITS - 1:
        mask_row = mask_ptr + b.to(tl.int64) * stride_mb
        for j0 in range(0, T, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            j_valid = j < T
            s, slot, ok = _gqa_scores(
                q,
                length + j,
                j_valid,
                pt_row,
                max_pages,
                k_base,
                stride_ks,
                d_offs,
                qk_scale,
                PAGE_SIZE,
                True,
                DOT_PRECISION,
            )
            s = tl.where(
                tree_bits(mask_row, stride_mt, t_idx, row_valid, j, j_valid), s, float("-inf")
            )
            m_i, l_i, acc, p = online_update(m_i, l_i, acc, s, True)
            v = tl.load(
                v_base + slot[:, None] * stride_vs + d_offs[None, :], mask=ok[:, None], other=0.0
            )
            acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)

    store_result(
        acc,
        m_i,
        l_i,
        rows,
        row_valid,
        G,
        d_offs,
        out_ptr + b.to(tl.int64) * stride_ob,
        stride_ot,
        stride_oh,
        kvh * G,
        part_ptr
        + b.to(tl.int64) * stride_pb
        + kvh.to(tl.int64) * stride_ph
        + pid_s.to(tl.int64) * stride_ps,
        stride_pr,
        lse_ptr + b.to(tl.int64) * stride_lb + kvh * stride_lh + pid_s * stride_ls,
        DIRECT_OUT,
    )


@triton.jit(do_not_specialize=_DYNAMIC)
def _gqa_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pt_ptr,
    plen_ptr,
    mask_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    qk_scale,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ptb,
    max_pages,
    stride_mb,
    stride_mt,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_pr,
    stride_lb,
    stride_lh,
    stride_ls,
    T,
    G,
    num_kv_heads,
    NUM_SPLITS,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DIRECT_OUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PT_PREFETCH: tl.constexpr = False,
    TAIL_M: tl.constexpr = 0,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads
    if TAIL_M > 0 and pid_m == tl.num_programs(0) - 1:
        # the few rows past the last full tile (T = 2^k + 1 leaves G of them) in a small tile,
        # so the last program of a split does not spend a full tile's MMAs on padding
        _gqa_tile(
            q_ptr, k_ptr, v_ptr, pt_ptr, plen_ptr, mask_ptr, out_ptr, part_ptr, lse_ptr, qk_scale,
            stride_qb, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
            stride_ptb, max_pages, stride_mb, stride_mt, stride_ob, stride_ot, stride_oh,
            stride_pb, stride_ph, stride_ps, stride_pr, stride_lb, stride_lh, stride_ls, T, G,
            NUM_SPLITS,
            pid_m * BLOCK_M, pid_s, b, kvh,
            HEAD_DIM, TAIL_M, BLOCK_N, PAGE_SIZE, DIRECT_OUT, DOT_PRECISION, PT_PREFETCH,
        )  # fmt: skip
    else:
        _gqa_tile(
            q_ptr, k_ptr, v_ptr, pt_ptr, plen_ptr, mask_ptr, out_ptr, part_ptr, lse_ptr, qk_scale,
            stride_qb, stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
            stride_ptb, max_pages, stride_mb, stride_mt, stride_ob, stride_ot, stride_oh,
            stride_pb, stride_ph, stride_ps, stride_pr, stride_lb, stride_lh, stride_ls, T, G,
            NUM_SPLITS,
            pid_m * BLOCK_M, pid_s, b, kvh,
            HEAD_DIM, BLOCK_M, BLOCK_N, PAGE_SIZE, DIRECT_OUT, DOT_PRECISION, PT_PREFETCH,
        )  # fmt: skip


def gqa_split_args(
    q,
    k_cache,
    v_cache,
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
    (computed once per shape by the launch cache). ``part``/``lse`` are views ``[B, Hkv, S, R, D]`` /
    ``[B, Hkv, S, R]`` (unused when ``num_splits == 1``: the kernel writes ``out``)."""
    b, t, hq, d = q.shape
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    return split_launch_args(
        b * hkv,
        g * t,
        (*q.stride()[:3], *k_cache.stride()[1:3], *v_cache.stride()[1:3]),
        page_table,
        tree_mask,
        out,
        part,
        lse,
        (0, 1, 2, 3),
        (0, 1, 2),
        (t, g, hkv),
        {"HEAD_DIM": d, "TAIL_M": tail_rows(g * t, cfg)},
        page_size,
        qk_scale=qk_scale,
        num_splits=num_splits,
        cfg=cfg,
        dot_precision=dot_precision,
    )


def launch_gqa_split(*tensors, **options) -> None:
    """Launch the split kernel on ``(q, k_cache, v_cache, page_table, prefix_lens, tree_mask,
    out, part, lse)`` with :func:`gqa_split_args`'s keywords (``part``/``lse`` unused with one
    split)."""
    launch_split(_gqa_split_kernel, gqa_split_args, tensors, **options)
