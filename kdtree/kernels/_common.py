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
    SPLITS_P2: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Log-sum-exp merge of ``NUM_SPLITS`` normalised partials into ``out [B, T, Hq, Dv]``.
    Grid: (row blocks, Dv blocks, batch x kv heads). One program reads every split of its
    ``BLOCK_R x BLOCK_D`` block at once: the LSEs in one load, the partials ``BLOCK_S`` splits
    at a time with ``BLOCK_S = SPLITS_P2`` wherever registers allow (one round trip to memory
    instead of one per chunk: the chunked version took 15-20 µs for 13-43 splits on the H200,
    ncu in session 6, call a)."""
    pid_r = tl.program_id(0)
    pid_d = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // num_kv_heads
    kvh = pid_bh % num_kv_heads
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_valid = rows < R
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    p_base = part_ptr + b.to(tl.int64) * stride_pb + kvh.to(tl.int64) * stride_ph
    l_base = lse_ptr + b.to(tl.int64) * stride_lb + kvh * stride_lh

    s_all = tl.arange(0, SPLITS_P2)
    lse_all = tl.load(
        l_base + s_all[:, None] * stride_ls + rows[None, :],
        mask=(s_all < NUM_SPLITS)[:, None] & row_valid[None, :],
        other=float("-inf"),
    )
    m = tl.max(lse_all, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w_all = tl.exp2(lse_all - m[None, :])  # [SPLITS_P2, BLOCK_R]; 0 for empty splits
    w_sum = tl.sum(w_all, 0)

    s_blk = tl.arange(0, BLOCK_S)
    if BLOCK_S == SPLITS_P2:  # the usual case: every partial in one load
        o = tl.load(
            p_base
            + s_blk[:, None, None].to(tl.int64) * stride_ps
            + rows[None, :, None].to(tl.int64) * stride_pr
            + d[None, None, :],
            mask=(s_blk < NUM_SPLITS)[:, None, None] & row_valid[None, :, None],
            other=0.0,
        )
        acc = tl.sum(o * w_all[:, :, None], 0)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        for s0 in range(0, NUM_SPLITS, BLOCK_S):
            s = s0 + s_blk
            s_ok = s < NUM_SPLITS
            lse = tl.load(
                l_base + s[:, None] * stride_ls + rows[None, :],
                mask=s_ok[:, None] & row_valid[None, :],
                other=float("-inf"),
            )
            w = tl.exp2(lse - m[None, :])
            o = tl.load(
                p_base
                + s[:, None, None].to(tl.int64) * stride_ps
                + rows[None, :, None].to(tl.int64) * stride_pr
                + d[None, None, :],
                mask=s_ok[:, None, None] & row_valid[None, :, None],
                other=0.0,
            )
            acc += tl.sum(o * w[:, :, None], 0)
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


def split_launch_args(
    grid_z: int,
    rows: int,
    head_args: tuple,
    page_table,
    tree_mask,
    out,
    part,
    lse,
    part_dims: tuple[int, ...],
    lse_dims: tuple[int, ...],
    tail_args: tuple,
    dims: dict,
    page_size: int,
    *,
    qk_scale: float,
    num_splits: int,
    cfg,
    dot_precision: str,
):
    """``(grid, args after the nine tensors, launch keywords)`` shared by the GQA and MLA split
    launches: ``head_args`` are the kernel's query/cache strides, ``part_dims``/``lse_dims``
    the workspace dims it takes strides of (0 with one split: the kernel writes ``out``),
    ``tail_args`` its runtime sizes before ``NUM_SPLITS`` and ``dims`` its head-dim constexprs."""
    direct = num_splits == 1
    grid = (triton.cdiv(rows, cfg.block_m), num_splits, grid_z)
    args = (
        qk_scale,
        *head_args,
        page_table.stride(0),
        page_table.shape[1],
        tree_mask.stride(0),
        tree_mask.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        *(0 if direct else part.stride(i) for i in part_dims),
        *(0 if direct else lse.stride(i) for i in lse_dims),
        *tail_args,
        num_splits,
    )
    kwargs = dict(
        **dims,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        PAGE_SIZE=page_size,
        DIRECT_OUT=direct,
        DOT_PRECISION=dot_precision,
        PT_PREFETCH=bool(getattr(cfg, "pt_prefetch", 0)),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return grid, args, kwargs


def launch_split(kernel, builder, tensors, **options) -> None:
    """Launch a split ``kernel`` on its nine ``tensors`` (``q...``, ``out``, ``part``, ``lse``)
    with the launch ``builder`` gives; ``part``/``lse`` are unused with one split."""
    grid, args, kwargs = builder(*tensors, **options)
    if kwargs["DIRECT_OUT"]:
        out = tensors[6]
        tensors = (*tensors[:7], out, out)  # placeholders: never touched with DIRECT_OUT
    kernel[grid](*tensors, *args, **kwargs)


#: fp32 partial elements one merge program holds at once (64 a thread on its 4 warps)
MERGE_TILE_ELEMS = 8192
#: merge programs to aim for (two per SM of an H100/H200): fewer, wider programs above it
MERGE_TARGET_PROGRAMS = 264


def merge_tiles(rows: int, dv: int, num_splits: int, programs_per_row: int = 1):
    """``(BLOCK_D, BLOCK_S, BLOCK_R)`` of the merge: all splits in one load where the tile
    allows (``BLOCK_S`` = the split count's power of two, up to ``MERGE_TILE_ELEMS // BLOCK_D``
    -- 64 splits at a 128-wide value head; more take a second, dependent load), then as many
    rows per program as keep at least ``MERGE_TARGET_PROGRAMS`` programs.
    ``programs_per_row``: the grid's third axis (batch x KV heads)."""
    block_d = min(triton.next_power_of_2(dv), 128)
    splits_p2 = max(2, triton.next_power_of_2(num_splits))
    block_s = min(splits_p2, max(1, MERGE_TILE_ELEMS // block_d))
    d_blocks = triton.cdiv(dv, block_d)
    block_r = 1
    while (
        block_r * 2 * block_s * block_d <= MERGE_TILE_ELEMS
        and triton.cdiv(rows, block_r * 2) * d_blocks * programs_per_row >= MERGE_TARGET_PROGRAMS
    ):
        block_r *= 2
    return block_d, block_s, block_r


def merge_launch_args(part, lse, out, num_kv_heads: int, group: int, rows: int, num_splits: int):
    """``(grid, positional args after the three tensors, keyword args)`` of the merge
    launch for these views (computed once per shape by the callers' launch cache)."""
    b = out.shape[0]
    dv = out.shape[3]
    block_d, block_s, block_r = merge_tiles(
        rows, dv, num_splits, programs_per_row=b * num_kv_heads
    )
    splits_p2 = max(2, triton.next_power_of_2(num_splits))
    grid = (triton.cdiv(rows, block_r), triton.cdiv(dv, block_d), b * num_kv_heads)
    args = (
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
    )
    kwargs = dict(
        SPLITS_P2=splits_p2, BLOCK_S=block_s, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4
    )
    return grid, args, kwargs


def launch_merge(part, lse, out, num_kv_heads: int, group: int, rows: int, num_splits: int):
    """Merge ``part [B, Hkv, S, R, Dv]`` / ``lse [B, Hkv, S, R]`` into ``out [B, T, Hq, Dv]``."""
    grid, args, kwargs = merge_launch_args(part, lse, out, num_kv_heads, group, rows, num_splits)
    _merge_kernel[grid](part, lse, out, *args, **kwargs)
