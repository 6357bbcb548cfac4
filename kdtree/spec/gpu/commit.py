"""KV commit after the walk: move the accepted path's K/V rows to contiguous positions.

The verify forward wrote tree node ``j`` at logical position ``L + j``; the accepted path
``path[0..n-1]`` (``path[0] = 0``, increasing) must end up at ``L .. L + n - 1``. Rows with
``path[k] == k`` are already in place and are skipped. The Triton kernel moves every buffer of
every layer (GQA ``k``/``v`` or the MLA latent) in ONE launch: one program per (request,
buffer, column tile) loads all of the request's source rows before it stores any, so a row that
is both a source and a destination (``path = [0, 2, 3]``: 2→1, 3→2) is read before it is
overwritten. Buffers are reached through a table of base pointers, so per-layer tensors need
not share one allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "CommitPlan",
    "commit_kv",
    "commit_kv_torch",
    "commit_path",
    "commit_slots",
    "make_commit_plan",
]


def commit_slots(
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    path: torch.Tensor,
    count: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and destination slots ``int64 [B, P]`` of the rows to move (``-1``: nothing).

    ``page_table int32 [B, pages]``, ``prefix_lens [B]`` (L before the step), ``path [B, P]``
    accepted node indices (``-1`` padded), ``count [B]``.
    """
    B, P = path.shape
    k = torch.arange(P, device=path.device).unsqueeze(0)
    move = (k < count.unsqueeze(1)) & (path != k) & (path >= 0)
    L = prefix_lens.to(torch.int64).unsqueeze(1)
    pt = page_table.to(torch.int64)

    def slot(pos: torch.Tensor) -> torch.Tensor:
        pos = torch.where(move, pos, 0)
        return pt.gather(1, pos // page_size) * page_size + pos % page_size

    src = torch.where(move, slot(L + path), -1)
    dst = torch.where(move, slot(L + k), -1)
    return src, dst


def commit_kv_torch(buffers: Sequence[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Reference: per buffer, gather every source row, then scatter (syncs on the mask)."""
    move = src >= 0
    s, d = src[move], dst[move]
    for buf in buffers:
        rows = buf.view(-1, *buf.shape[2:])
        rows.index_copy_(0, d, rows.index_select(0, s))


class CommitPlan:
    """Static pointer table over ``buffers`` for the one-launch kernel (build once, reuse)."""

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        if not buffers:
            raise ValueError("buffers: expected at least one cache tensor")
        dtype, device = buffers[0].dtype, buffers[0].device
        for i, b in enumerate(buffers):
            if b.dtype != dtype or b.device != device:
                raise ValueError(
                    f"buffers[{i}]: {b.dtype} on {b.device}, expected {dtype} on {device}"
                )
            if not b.is_contiguous():
                raise ValueError(f"buffers[{i}]: expected a contiguous cache tensor")
        self.buffers = list(buffers)
        self.dtype, self.device = dtype, device
        self.row_elems = torch.tensor(
            [b[0, 0].numel() for b in buffers], dtype=torch.int64, device=device
        )
        self.max_row = int(max(b[0, 0].numel() for b in buffers))
        self.ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)


def make_commit_plan(cache) -> CommitPlan:
    """The plan for a ``kdtree.cache.PagedKVCache`` (GQA ``k`` + ``v`` or MLA ``kv``)."""
    return CommitPlan(list(cache.k) + list(cache.v) if cache.kind == "gqa" else list(cache.kv))


def commit_kv(
    buffers: Sequence[torch.Tensor] | CommitPlan,
    src: torch.Tensor,
    dst: torch.Tensor,
    *,
    backend: str = "auto",
) -> None:
    """Move rows ``src → dst`` (``int64 [B, P]`` slots, ``-1`` = skip) in every buffer.

    ``backend``: ``"triton"`` (one launch for all buffers), ``"torch"`` (reference) or
    ``"auto"`` (triton on CUDA, torch elsewhere).
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend={backend!r}: expected 'auto', 'torch' or 'triton'")
    if src.shape != dst.shape or src.dim() != 2:
        raise ValueError(
            f"src, dst: expected matching [B, P], got {tuple(src.shape)}, {tuple(dst.shape)}"
        )
    plan = buffers if isinstance(buffers, CommitPlan) else None
    bufs = plan.buffers if plan is not None else list(buffers)
    if backend == "auto":
        backend = "triton" if src.is_cuda else "torch"
    if backend == "torch":
        commit_kv_torch(bufs, src, dst)
        return
    from kdtree.spec.gpu.commit_triton import commit_kv_triton

    commit_kv_triton(plan if plan is not None else CommitPlan(bufs), src, dst)


def commit_path(
    buffers: Sequence[torch.Tensor] | CommitPlan,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    path: torch.Tensor,
    count: torch.Tensor,
    page_size: int,
    *,
    backend: str = "auto",
) -> None:
    """Commit accepted paths (``path [B, P]``, ``count [B]``; rows at ``L + path[k]`` move to
    ``L + k``). ``"triton"``: ONE launch computes the slots from the page table and moves
    every buffer; ``"torch"``: :func:`commit_slots` + :func:`commit_kv_torch`."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend={backend!r}: expected 'auto', 'torch' or 'triton'")
    if path.dim() != 2 or count.shape != (path.shape[0],):
        raise ValueError(
            f"path, count: expected [B, P] and [B], got {tuple(path.shape)}, {tuple(count.shape)}"
        )
    plan = buffers if isinstance(buffers, CommitPlan) else None
    if backend == "auto":
        backend = "triton" if path.is_cuda else "torch"
    if backend == "torch":
        src, dst = commit_slots(page_table, prefix_lens, path, count, page_size)
        commit_kv_torch(plan.buffers if plan is not None else list(buffers), src, dst)
        return
    from kdtree.spec.gpu.commit_triton import commit_path_triton

    commit_path_triton(
        plan if plan is not None else CommitPlan(list(buffers)),
        page_table,
        prefix_lens,
        path,
        count,
        page_size,
    )
