"""KV commit: keep the accepted path's K/V as the next ``τ`` committed positions.

After verify, request ``b``'s tree K/V sit at logical positions ``L + i`` (node ``i``). The
accepted path ``p_0 = 0 < p_1 < .. < p_{τ-1}`` must end up at ``L + j`` (``j`` = depth). Two ways:

* ``copy``: for every layer, read the rows at slots of ``L + p_j`` and write them to the slots of
  ``L + j`` (all reads before any write; rows with ``p_j == j`` are already in place and skipped);
* ``remap`` (page size 1 only, where a page is one slot): point page-table entries ``L + j`` at
  the pages that hold ``L + p_j`` and return the rejected pages to the free list — no K/V moves.

Then the cache lengths become ``L + τ`` and the drafter's context receives the accepted nodes' tap
features at positions ``L .. L + τ - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kdtree.cache import PagedKVCache
from kdtree.spec.accept import Acceptance

__all__ = ["commit_kv", "drafter_context_update", "gather_path_taps"]


def _layer_tensors(cache: PagedKVCache) -> list[torch.Tensor]:
    return [*cache.k, *cache.v] if cache.kind == "gqa" else list(cache.kv)


def _copy_rows(
    cache: PagedKVCache, slot_mapping: torch.Tensor, accepts: Sequence[Acceptance]
) -> int:
    """Copy accepted rows into place for every layer; returns the number of rows moved."""
    T = slot_mapping.shape[1]
    src, dst = [], []
    for b, acc in enumerate(accepts):
        for j, p in enumerate(acc.path):
            if p != j:
                src.append(b * T + p)
                dst.append(b * T + j)
    if not src:
        return 0
    flat_slots = slot_mapping.reshape(-1)
    idx = torch.tensor([src, dst], dtype=torch.int64).to(flat_slots.device)
    src_slots, dst_slots = flat_slots[idx[0]], flat_slots[idx[1]]
    tensors = _layer_tensors(cache)
    views = [t.view(-1, *t.shape[2:]) for t in tensors]
    rows = [v.index_select(0, src_slots) for v in views]  # read everything first
    for v, r in zip(views, rows, strict=True):
        v.index_copy_(0, dst_slots, r)
    return len(src)


def _remap_pages(cache: PagedKVCache, req: int, start: int, path: Sequence[int], T: int) -> None:
    """Page size 1: logical ``start + j`` → the page of ``start + path[j]``; free the rest.

    Touches the cache's page bookkeeping (``_pages``, ``_free``, ``page_table``) directly: the
    cache has no public remap yet.
    """
    pages = cache._pages[req]
    tail = pages[start : start + T]
    if len(tail) != T:
        raise ValueError(f"request {req}: {len(tail)} reserved slots after {start}, expected {T}")
    keep = [tail[p] for p in path]
    keep_set = set(path)
    freed = [tail[i] for i in range(T) if i not in keep_set] + pages[start + T :]
    del pages[start:]  # in place: O(T), not O(context)
    pages.extend(keep)
    cache._free.extend(reversed(freed))
    cache.page_table[req, start : start + len(keep)] = torch.tensor(keep, dtype=torch.int32).to(
        cache.device
    )


def commit_kv(
    cache: PagedKVCache,
    reqs: Sequence[int],
    prefix_lens: Sequence[int],
    slot_mapping: torch.Tensor,
    accepts: Sequence[Acceptance | None],
    *,
    method: str = "auto",
) -> str:
    """Commit each request's accepted path (``None``: commit nothing for that request).

    ``slot_mapping int64 [B, T]`` are the slots the verify wrote (positions ``L .. L+T-1``).
    ``method``: ``"copy"``, ``"remap"`` (page size 1 only) or ``"auto"`` (remap at page size 1).
    Returns the method used.
    """
    if method not in ("auto", "copy", "remap"):
        raise ValueError(f"method={method!r}: expected 'auto', 'copy' or 'remap'")
    if method == "remap" and cache.page_size != 1:
        raise ValueError(f"method='remap': needs page_size 1, the cache has {cache.page_size}")
    if not (len(reqs) == len(prefix_lens) == len(accepts) == slot_mapping.shape[0]):
        raise ValueError(
            f"reqs, prefix_lens, accepts, slot_mapping: batch sizes differ ({len(reqs)}, "
            f"{len(prefix_lens)}, {len(accepts)}, {slot_mapping.shape[0]})"
        )
    if method == "auto":
        method = "remap" if cache.page_size == 1 else "copy"
    T = slot_mapping.shape[1]
    live = [(b, a) for b, a in enumerate(accepts) if a is not None]
    for b, acc in live:
        if acc.path[0] != 0 or any(q <= p for p, q in zip(acc.path, acc.path[1:], strict=False)):
            raise ValueError(f"accepts[{b}].path={acc.path}: expected 0 first, increasing")
        if acc.path[-1] >= T:
            raise ValueError(f"accepts[{b}].path={acc.path}: node beyond the tree size {T}")
    if method == "copy":
        keep = [a if a is not None else Acceptance((0,), 0) for a in accepts]
        # A request committing nothing has path (0,): node 0 is already in place, no copy.
        _copy_rows(cache, slot_mapping, keep)
        for b, acc in live:
            cache.set_length(int(reqs[b]), int(prefix_lens[b]) + acc.accepted_len)
    else:
        for b, acc in live:
            r, L = int(reqs[b]), int(prefix_lens[b])
            _remap_pages(cache, r, L, acc.path, T)
            cache.set_length(r, L + acc.accepted_len)
    return method


def gather_path_taps(
    taps: torch.Tensor, accepts: Sequence[Acceptance | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tap features of each accepted path, left-aligned: ``([B, N, F], lengths int64 [B])``
    with ``N = max τ`` (requests committing nothing get length 0)."""
    B, T, F = taps.shape
    lens = [a.accepted_len if a is not None else 0 for a in accepts]
    N = max(1, max(lens, default=1))
    idx = torch.zeros(B, N, dtype=torch.int64)
    for b, a in enumerate(accepts):
        if a is not None:
            idx[b, : len(a.path)] = torch.tensor(a.path, dtype=torch.int64)
    idx = idx.to(taps.device)
    gathered = taps.gather(1, idx[:, :, None].expand(B, N, F))
    return gathered, torch.tensor(lens, dtype=torch.int64).to(taps.device)


def drafter_context_update(
    drafter,
    ctx,
    taps: torch.Tensor,
    tree_tokens: torch.Tensor,
    accepts: Sequence[Acceptance | None],
    prefix_lens: Sequence[int],
) -> None:
    """Append the accepted nodes' tap features (positions ``L .. L + τ - 1``) to the drafter's
    per-request context; drafters with ``needs_tokens`` also get the token ids
    (``tree_tokens int64 [B, T]`` are the verified tree's tokens)."""
    feats, lens = gather_path_taps(taps, accepts)
    N = feats.shape[1]
    start = torch.tensor([int(x) for x in prefix_lens], dtype=torch.int64).to(taps.device)
    positions = start[:, None] + torch.arange(N, dtype=torch.int64, device=taps.device)
    drafter.append_context(ctx, feats, positions, lens)
    if getattr(drafter, "needs_tokens", False):
        toks, _ = gather_path_taps(tree_tokens[:, :, None], accepts)
        drafter.append_tokens(ctx, toks[..., 0], lens)
