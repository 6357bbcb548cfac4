"""Verify inputs on the device, written in place into preallocated buffers: O(B·T) per step.

Nothing here looks at the prefix: positions are ``L + depth``, the mask is the tree's packed
``T × T`` bitmask, and the ``T`` new slots are read off the page table at ``L .. L + T - 1``.
Pages are reserved ahead on the host (``reserve_ahead``), a few steps' worth at a time, so the
page table only ever grows by the new pages' entries — it is never rebuilt over the prefix.
The buffers keep their addresses for the life of the object, which is what a CUDA graph needs:
a graph replays reads of exactly these tensors, so every step must ``copy_`` into them (the
trap: rebinding ``positions`` to a fresh tensor silently freezes the depth positions).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu.tree_build import DeviceTree

__all__ = ["DeviceVerifyBuffers", "reserve_ahead"]


class DeviceVerifyBuffers:
    """Static ``input_ids``, ``positions``, ``tree_mask``, ``slot_mapping`` for ``batch × T``."""

    def __init__(self, batch: int, budget: int, device: torch.device | str) -> None:
        if batch < 1 or budget < 0:
            raise ValueError(f"batch={batch}, budget={budget}: expected batch >= 1, budget >= 0")
        self.batch, self.T = batch, budget + 1
        dev = torch.device(device)
        self.device = dev
        self.input_ids = torch.zeros(batch, self.T, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(batch, self.T, dtype=torch.int64, device=dev)
        self.tree_mask = torch.zeros(
            batch, self.T, num_words(self.T), dtype=torch.int64, device=dev
        )
        self.slot_mapping = torch.zeros(batch, self.T, dtype=torch.int64, device=dev)
        self._arange = torch.arange(self.T, dtype=torch.int64, device=dev)

    def fill(
        self,
        tree: DeviceTree,
        prefix_lens: torch.Tensor,
        page_table: torch.Tensor,
        page_size: int,
        *,
        backend: str = "auto",
    ) -> None:
        """Write this step's inputs in place (no allocation visible to the caller, no sync).

        ``backend``: ``"triton"`` (one fused launch), ``"torch"`` (a handful of ops) or
        ``"auto"`` (triton on CUDA, torch elsewhere).
        """
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"backend={backend!r}: expected 'auto', 'torch' or 'triton'")
        if tree.tokens.shape != (self.batch, self.T):
            raise ValueError(
                f"tree: expected {self.batch} trees of T={self.T} nodes, got "
                f"{tuple(tree.tokens.shape)}"
            )
        if prefix_lens.shape != (self.batch,) or page_table.shape[0] != self.batch:
            raise ValueError(
                f"prefix_lens, page_table: expected [{self.batch}] and [{self.batch}, pages], got "
                f"{tuple(prefix_lens.shape)} and {tuple(page_table.shape)}"
            )
        if backend == "triton" or (backend == "auto" and self.device.type == "cuda"):
            from kdtree.spec.gpu.verify_inputs_triton import fill_triton

            fill_triton(self, tree, prefix_lens, page_table, page_size)
            return
        L = prefix_lens.to(torch.int64).unsqueeze(1)
        self.input_ids.copy_(tree.tokens)
        self.positions.copy_(L + tree.depths)
        self.tree_mask.copy_(tree.mask)
        pos = L + self._arange
        pages = page_table.to(torch.int64).gather(1, pos // page_size)
        self.slot_mapping.copy_(pages * page_size + pos % page_size)


def reserve_ahead(cache, reqs: Sequence[int], lengths: Sequence[int], tokens: int) -> None:
    """Host side, at a sync point: record committed ``lengths`` and make sure each request has
    pages for ``tokens`` more (e.g. ``steps_until_next_sync · max_accept + T``). Only new pages
    are written into ``cache.page_table``."""
    for r, n in zip(reqs, lengths, strict=True):
        if n > cache.capacity(int(r)):
            raise ValueError(f"lengths: request {r} at {n} tokens exceeds its reserved pages")
        cache.set_length(int(r), int(n))
    cache.reserve([int(r) for r in reqs], int(tokens))
