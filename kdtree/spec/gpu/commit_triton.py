"""The one-launch KV commit kernel (all layers, all buffers; read every source, then write)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdtree.spec.gpu.commit import CommitPlan

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _commit_kv_kernel(
    ptrs,  # int64 [NB]: base address of each buffer
    row_elems,  # int64 [NB]: elements per slot of each buffer
    src,  # int64 [B, P]
    dst,  # int64 [B, P]
    P,
    DTYPE: tl.constexpr,
    P_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    buf = tl.program_id(1)
    ct = tl.program_id(2)
    n = tl.load(row_elems + buf)
    if ct * BLOCK_C < n:
        base = tl.load(ptrs + buf).to(tl.pointer_type(DTYPE))
        k = tl.arange(0, P_PAD)
        s = tl.load(src + b * P + k, mask=k < P, other=-1)
        d = tl.load(dst + b * P + k, mask=k < P, other=-1)
        cols = ct * BLOCK_C + tl.arange(0, BLOCK_C)
        m = (s >= 0)[:, None] & (cols < n)[None, :]
        rows = tl.load(base + s[:, None] * n + cols[None, :], mask=m)  # all reads first
        tl.store(base + d[:, None] * n + cols[None, :], rows, mask=m)


def commit_kv_triton(plan: CommitPlan, src: torch.Tensor, dst: torch.Tensor) -> None:
    """One launch: grid (requests, buffers, column tiles)."""
    if plan.dtype not in _TL_DTYPES:
        raise TypeError(f"cache dtype {plan.dtype}: expected one of {list(_TL_DTYPES)}")
    if src.device != plan.device or dst.device != plan.device:
        raise ValueError(f"src, dst: on {src.device}/{dst.device}, expected {plan.device}")
    B, P = src.shape
    if B == 0 or P == 0:
        return
    src = src.contiguous()
    dst = dst.contiguous()
    block_c = min(256, triton.next_power_of_2(plan.max_row))
    grid = (B, len(plan.buffers), triton.cdiv(plan.max_row, block_c))
    _commit_kv_kernel[grid](
        plan.ptrs,
        plan.row_elems,
        src,
        dst,
        P,
        DTYPE=_TL_DTYPES[plan.dtype],
        P_PAD=triton.next_power_of_2(P),
        BLOCK_C=block_c,
    )


@triton.jit
def _commit_path_kernel(
    ptrs,  # int64 [NB]
    row_elems,  # int64 [NB]
    page_table,  # int32 [B, pages] (row stride pt_stride)
    pt_stride,
    prefix,  # int32 [B]: L before the step
    path,  # int64 [B, P]
    count,  # int64 [B]
    P,
    page_size,
    DTYPE: tl.constexpr,
    P_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    buf = tl.program_id(1)
    ct = tl.program_id(2)
    n = tl.load(row_elems + buf)
    if ct * BLOCK_C < n:
        k = tl.arange(0, P_PAD)
        node = tl.load(path + b * P + k, mask=k < P, other=-1)
        cnt = tl.load(count + b)
        move = (k < cnt) & (node != k) & (node >= 0)
        L = tl.load(prefix + b).to(tl.int64)
        ps = tl.where(move, L + node, 0)
        pd = tl.where(move, L + k, 0)
        pt = page_table + b * pt_stride
        s = tl.load(pt + ps // page_size, mask=move, other=0).to(tl.int64) * page_size + (
            ps % page_size
        )
        d = tl.load(pt + pd // page_size, mask=move, other=0).to(tl.int64) * page_size + (
            pd % page_size
        )
        base = tl.load(ptrs + buf).to(tl.pointer_type(DTYPE))
        cols = ct * BLOCK_C + tl.arange(0, BLOCK_C)
        m = move[:, None] & (cols < n)[None, :]
        rows = tl.load(base + s[:, None] * n + cols[None, :], mask=m)  # all reads first
        tl.store(base + d[:, None] * n + cols[None, :], rows, mask=m)


def commit_path_triton(
    plan: CommitPlan,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    path: torch.Tensor,
    count: torch.Tensor,
    page_size: int,
) -> None:
    """One launch: slots from the page table and the path, then the moves, for all buffers."""
    if plan.dtype not in _TL_DTYPES:
        raise TypeError(f"cache dtype {plan.dtype}: expected one of {list(_TL_DTYPES)}")
    for name, t in (
        ("page_table", page_table),
        ("prefix_lens", prefix_lens),
        ("path", path),
        ("count", count),
    ):
        if t.device != plan.device:
            raise ValueError(f"{name}: on {t.device}, expected {plan.device}")
    if page_table.dtype != torch.int32 or page_table.stride(1) != 1:
        raise ValueError("page_table: expected int32 rows with unit column stride")
    B, P = path.shape
    if B == 0 or P == 0:
        return
    path = path.to(torch.int64).contiguous()
    count = count.to(torch.int64).contiguous()
    prefix_lens = prefix_lens.to(torch.int32).contiguous()
    block_c = min(256, triton.next_power_of_2(plan.max_row))
    grid = (B, len(plan.buffers), triton.cdiv(plan.max_row, block_c))
    _commit_path_kernel[grid](
        plan.ptrs,
        plan.row_elems,
        page_table,
        page_table.stride(0),
        prefix_lens,
        path,
        count,
        P,
        page_size,
        DTYPE=_TL_DTYPES[plan.dtype],
        P_PAD=triton.next_power_of_2(P),
        BLOCK_C=block_c,
    )
