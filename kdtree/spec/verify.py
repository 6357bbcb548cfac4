"""Verify inputs: what the target needs to run the padded trees on top of the paged prefix.

Work per step is O(B·T) per batch and independent of the context length: the tree tokens, the
positions ``L + depth``, the packed ``T × T`` ancestor bitmask and the slots of the ``T`` new
tokens (read off the page table on the device). Only ``dense=True`` builds the generic
O(context) mask ``[B, T, max(L) + T]`` — on the host, one request at a time, then copied to the
device — the way SGLang's DDTree port builds its ``custom_mask``. That path is the baseline the
notebooks measure; keep it honest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdtree.attention import AttnMetadata
from kdtree.cache import PagedKVCache
from kdtree.spec.bitmask import unpack_bits
from kdtree.spec.tree import BatchedTrees

__all__ = ["VerifyInputs", "build_dense_mask_host", "prepare_for_verify", "tree_slot_mapping"]


@dataclass
class VerifyInputs:
    """Device tensors for one verify forward plus the host prefix lengths they came from."""

    input_ids: torch.Tensor  # int64 [B, T]
    positions: torch.Tensor  # int64 [B, T]
    attn: AttnMetadata
    prefix_lens: list[int]  # host copy of L per request

    @property
    def slot_mapping(self) -> torch.Tensor:
        return self.attn.slot_mapping


def tree_slot_mapping(
    page_table: torch.Tensor, prefix_lens: torch.Tensor, T: int, page_size: int
) -> torch.Tensor:
    """Slots of logical positions ``L .. L+T-1`` per request, gathered from ``page_table``
    (``int32 [B, P]``) on its device: ``int64 [B, T]``, O(B·T), no host sync."""
    pos = prefix_lens.to(torch.int64)[:, None] + torch.arange(
        T, dtype=torch.int64, device=page_table.device
    )
    pages = page_table.to(torch.int64).gather(1, pos // page_size)
    return pages * page_size + pos % page_size


def build_dense_mask_host(
    prefix_lens: Sequence[int], tree_mask: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """The generic O(context) custom mask, built per request on the host and copied over.

    ``bool [B, T, max(L) + T]``: key ``j < L`` visible, ``L <= j < L + T`` through the tree
    bits, beyond hidden. Mirrors SGLang's DDTree port (a ``ones(T, L + T)`` block per request
    with the visibility matrix in its last ``T`` columns).
    """
    tree_host = tree_mask.cpu()
    B, T, _ = tree_host.shape
    width = max(prefix_lens) + T
    dense = torch.zeros(B, T, width, dtype=torch.bool)
    for b, L in enumerate(prefix_lens):
        block = torch.ones(T, L + T, dtype=torch.bool)
        block[:, L:] = unpack_bits(tree_host[b], T)
        dense[b, :, : L + T] = block
    return dense.to(device)


def prepare_for_verify(
    cache: PagedKVCache,
    reqs: Sequence[int],
    trees: BatchedTrees,
    *,
    backend: str = "auto",
    dense: bool = False,
) -> VerifyInputs:
    """Reserve ``T`` slots per request and build the verify inputs for ``trees`` (root = bonus).

    ``reqs`` are the cache's request slots, in batch order. Positions are ``L + depth``;
    padded nodes sit at ``L`` and see only themselves. Nothing here grows with ``L`` unless
    ``dense=True``.
    """
    reqs = [int(r) for r in reqs]
    if len(reqs) != trees.tokens.shape[0]:
        raise ValueError(f"reqs: expected {trees.tokens.shape[0]} request slots, got {len(reqs)}")
    T = trees.T
    device = cache.device
    prefix = [cache.length(r) for r in reqs]
    cache.reserve(reqs, T)
    page_table = cache.batch_page_table(reqs)
    prefix_dev = torch.tensor(prefix, dtype=torch.int32).to(device, non_blocking=True)
    slot_mapping = tree_slot_mapping(page_table, prefix_dev, T, cache.page_size)
    input_ids = trees.tokens.to(device, non_blocking=True)
    positions = prefix_dev.to(torch.int64)[:, None] + trees.depths.to(device, non_blocking=True)
    tree_mask = trees.mask.to(device, non_blocking=True)
    dense_mask = build_dense_mask_host(prefix, trees.mask, device) if dense else None
    attn = AttnMetadata(
        mode="tree",
        slot_mapping=slot_mapping,
        page_table=page_table,
        prefix_lens=prefix_dev,
        tree_mask=tree_mask,
        backend=backend,
        dense_mask=dense_mask,
    )
    return VerifyInputs(input_ids, positions, attn, prefix)
