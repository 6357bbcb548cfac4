"""Paged KV cache: pages of ``page_size`` slots, a free-list page allocator, per-request page
tables and committed lengths.

Physical slot ``s = page * page_size + offset``. GQA stores ``k[layer]``, ``v[layer]`` as
``[num_pages, page_size, Hkv, D]``; MLA stores one latent tensor per layer, ``kv[layer]``:
``[num_pages, page_size, kv_lora_rank + rope_dim]`` (``c_kv`` first, then the roped ``k_pe``).
Requests are integer slots ``0 .. max_batch - 1``; row ``r`` of ``page_table`` belongs to request
``r``. Host-side bookkeeping (pages per request, lengths) is authoritative; ``page_table`` and
``lengths`` tensors on the cache's device mirror it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

__all__ = ["CacheExhaustedError", "PagedKVCache"]


_UNCHECKED = object()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class CacheExhaustedError(RuntimeError):
    """Not enough free pages (or page-table columns) for a reservation."""


def _as_list(reqs: int | Sequence[int]) -> list[int]:
    return [reqs] if isinstance(reqs, int) else [int(r) for r in reqs]


class PagedKVCache:
    """Paged KV cache for ``num_layers`` layers, ``kind="gqa"`` (k/v) or ``"mla"`` (latent)."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        max_batch: int,
        max_pages_per_req: int | None = None,
        kind: Literal["gqa", "mla"] = "gqa",
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        kv_lora_rank: int | None = None,
        rope_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_pages", num_pages),
            ("page_size", page_size),
            ("max_batch", max_batch),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: expected a positive int")
        if kind not in ("gqa", "mla"):
            raise ValueError(f"kind={kind!r}: expected 'gqa' or 'mla'")
        self.kind = kind
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_batch = max_batch
        self.max_pages_per_req = max_pages_per_req or num_pages
        self.dtype = dtype
        self.device = torch.device(device)
        shape_base = (num_pages, page_size)
        if kind == "gqa":
            if not n_kv_heads or not head_dim:
                raise ValueError("n_kv_heads, head_dim: required (positive) for kind='gqa'")
            self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
            self.v_head_dim = v_head_dim or head_dim
            self.k = [
                torch.zeros(*shape_base, n_kv_heads, head_dim, dtype=dtype, device=self.device)
                for _ in range(num_layers)
            ]
            self.v = [
                torch.zeros(
                    *shape_base, n_kv_heads, self.v_head_dim, dtype=dtype, device=self.device
                )
                for _ in range(num_layers)
            ]
            self.kv: list[torch.Tensor] = []
        else:
            if not kv_lora_rank or not rope_dim:
                raise ValueError("kv_lora_rank, rope_dim: required (positive) for kind='mla'")
            self.kv_lora_rank, self.rope_dim = kv_lora_rank, rope_dim
            self.kv = [
                torch.zeros(*shape_base, kv_lora_rank + rope_dim, dtype=dtype, device=self.device)
                for _ in range(num_layers)
            ]
            self.k, self.v = [], []
        self.page_table = torch.zeros(
            max_batch, self.max_pages_per_req, dtype=torch.int32, device=self.device
        )
        self.lengths = torch.zeros(max_batch, dtype=torch.int32, device=self.device)
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self._pages: list[list[int]] = [[] for _ in range(max_batch)]
        self._lengths: list[int] = [0] * max_batch

    # ------------------------------------------------------------------ construction helpers

    @classmethod
    def for_model(
        cls,
        config,
        *,
        max_batch: int,
        max_len: int,
        page_size: int = 16,
        num_pages: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> PagedKVCache:
        """A cache shaped for ``config`` (a kdtree model config) holding ``max_len`` tokens for
        each of ``max_batch`` requests (unless ``num_pages`` says otherwise)."""
        pages_per_req = -(-max_len // page_size)
        num_pages = num_pages or pages_per_req * max_batch
        common = dict(
            num_layers=config.num_hidden_layers,
            num_pages=num_pages,
            page_size=page_size,
            max_batch=max_batch,
            max_pages_per_req=pages_per_req,
            dtype=dtype,
            device=device,
        )
        if getattr(config, "kv_lora_rank", None):
            return cls(
                kind="mla",
                kv_lora_rank=config.kv_lora_rank,
                rope_dim=config.qk_rope_head_dim,
                **common,
            )
        return cls(
            kind="gqa",
            n_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            **common,
        )

    # ------------------------------------------------------------------ bookkeeping

    def _check_req(self, req: int) -> None:
        if not isinstance(req, int) or not 0 <= req < self.max_batch:
            raise ValueError(f"req={req!r}: expected a request slot in [0, {self.max_batch})")

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def length(self, req: int) -> int:
        """Committed tokens of ``req`` (host value)."""
        self._check_req(req)
        return self._lengths[req]

    def capacity(self, req: int) -> int:
        """Tokens that ``req``'s pages hold."""
        self._check_req(req)
        return len(self._pages[req]) * self.page_size

    def pages(self, req: int) -> list[int]:
        """Physical pages of ``req``, in logical order (a copy)."""
        self._check_req(req)
        return list(self._pages[req])

    def reserve(self, reqs: int | Sequence[int], n_tokens: int | Sequence[int]) -> None:
        """Make sure each request has pages for ``length + n_tokens`` tokens. All or nothing:
        on exhaustion a ``CacheExhaustedError`` is raised and nothing changes."""
        reqs = _as_list(reqs)
        counts = [n_tokens] * len(reqs) if isinstance(n_tokens, int) else list(n_tokens)
        if len(counts) != len(reqs):
            raise ValueError(f"n_tokens: expected {len(reqs)} counts, got {len(counts)}")
        if len(set(reqs)) != len(reqs):
            raise ValueError(f"reqs={reqs}: duplicate request slots")
        need: list[int] = []
        for r, n in zip(reqs, counts, strict=True):
            self._check_req(r)
            if n < 0:
                raise ValueError(f"n_tokens={n}: expected >= 0")
            pages_needed = -(-(self._lengths[r] + n) // self.page_size)
            if pages_needed > self.max_pages_per_req:
                raise CacheExhaustedError(
                    f"request {r}: {self._lengths[r]} + {n} tokens need {pages_needed} pages, "
                    f"the page table holds {self.max_pages_per_req} per request"
                )
            need.append(max(0, pages_needed - len(self._pages[r])))
        if sum(need) > len(self._free):
            raise CacheExhaustedError(
                f"KV cache exhausted: {sum(need)} more pages needed for requests {reqs}, "
                f"{len(self._free)} of {self.num_pages} free (page_size={self.page_size}); "
                "cached data is intact"
            )
        for r, k in zip(reqs, need, strict=True):
            if k == 0:
                continue
            start = len(self._pages[r])
            new = [self._free.pop() for _ in range(k)]
            self._pages[r].extend(new)
            self.page_table[r, start : start + k] = torch.tensor(new, dtype=torch.int32).to(
                self.device
            )

    def set_length(self, req: int, length: int) -> None:
        """Set ``req``'s committed length (within its reserved pages); pages are kept."""
        self._check_req(req)
        if not 0 <= length <= self.capacity(req):
            raise ValueError(
                f"length={length}: expected 0 <= length <= capacity {self.capacity(req)} of "
                f"request {req}"
            )
        self._lengths[req] = length
        self.lengths[req] = length

    def advance(self, req: int, n: int) -> None:
        """Commit ``n`` more tokens for ``req``."""
        self.set_length(req, self.length(req) + n)

    def release(self, req: int) -> None:
        """Return ``req``'s pages to the free list and reset its length."""
        self._check_req(req)
        self._free.extend(reversed(self._pages[req]))
        self._pages[req] = []
        self._lengths[req] = 0
        self.lengths[req] = 0
        self.page_table[req].zero_()

    def remap_tail(self, req: int, start: int, path: Sequence[int]) -> None:
        """Page size 1 only: logical position ``start + j`` takes the page that held logical
        position ``start + path[j]`` (an accepted tree path, no copy); every other page at or
        after ``start`` goes back to the free list."""
        self._check_req(req)
        if self.page_size != 1:
            raise ValueError(f"remap_tail: needs page_size 1, this cache has {self.page_size}")
        pages = self._pages[req]
        tail = pages[start:]
        if start < 0 or start > len(pages):
            raise ValueError(f"start={start}: outside request {req}'s {len(pages)} pages")
        if len(set(path)) != len(path) or any(not 0 <= p < len(tail) for p in path):
            raise ValueError(f"path={list(path)}: expected distinct offsets in [0, {len(tail)})")
        keep = [tail[p] for p in path]
        kept = set(path)
        freed = [tail[i] for i in range(len(tail)) if i not in kept]
        self._pages[req] = pages[:start] + keep
        self._free.extend(reversed(freed))
        if keep:
            self.page_table[req, start : start + len(keep)] = torch.tensor(
                keep, dtype=torch.int32
            ).to(self.device)
        self.page_table[req, start + len(keep) :] = 0
        if self._lengths[req] > len(self._pages[req]):
            self.set_length(req, len(self._pages[req]))

    def trim(self, req: int) -> None:
        """Free the pages of ``req`` beyond those its committed length needs."""
        self._check_req(req)
        need = -(-self._lengths[req] // self.page_size)
        extra = self._pages[req][need:]
        self._pages[req] = self._pages[req][:need]
        self._free.extend(reversed(extra))
        self.page_table[req, need:] = 0

    # ------------------------------------------------------------------ slots

    def slots(self, req: int, start: int, n: int) -> torch.Tensor:
        """Physical slots (``int64 [n]`` on the cache's device) of logical positions
        ``start .. start + n - 1`` of ``req``; they must lie within its reserved pages."""
        self._check_req(req)
        if start < 0 or n < 0 or start + n > self.capacity(req):
            raise ValueError(
                f"positions {start}..{start + n - 1} of request {req}: outside its reserved "
                f"{self.capacity(req)} tokens (call reserve first)"
            )
        pos = torch.arange(start, start + n, dtype=torch.int64)
        pages = torch.tensor(self._pages[req], dtype=torch.int64)
        if n == 0:
            return pos.to(self.device)
        return (pages[pos // self.page_size] * self.page_size + pos % self.page_size).to(
            self.device
        )

    def slot_mapping(self, reqs: Sequence[int], starts: Sequence[int], n: int) -> torch.Tensor:
        """``int64 [len(reqs), n]``: slots of positions ``starts[b] .. starts[b] + n - 1``."""
        if len(reqs) != len(starts):
            raise ValueError(f"starts: expected {len(reqs)} entries, got {len(starts)}")
        return torch.stack([self.slots(r, s, n) for r, s in zip(reqs, starts, strict=True)])

    def batch_page_table(self, reqs: Sequence[int]) -> torch.Tensor:
        """Rows of ``page_table`` for ``reqs`` (``int32 [len(reqs), max_pages]``)."""
        for r in reqs:
            self._check_req(r)
        if list(reqs) == list(range(len(reqs))):
            return self.page_table[: len(reqs)]
        return self.page_table[torch.tensor(list(reqs), device=self.device)]

    def batch_lengths(self, reqs: Sequence[int]) -> torch.Tensor:
        """``int32 [len(reqs)]`` committed lengths."""
        return torch.tensor([self.length(r) for r in reqs], dtype=torch.int32).to(self.device)

    # ------------------------------------------------------------------ writes

    def _flat_slots(self, slot_mapping: torch.Tensor, n: int) -> torch.Tensor:
        if slot_mapping.dtype != torch.int64:
            raise TypeError(f"slot_mapping: expected int64, got {slot_mapping.dtype}")
        flat = slot_mapping.reshape(-1)
        if flat.numel() != n:
            raise ValueError(
                f"slot_mapping: {flat.numel()} slots for {n} tokens (shape {tuple(slot_mapping.shape)})"
            )
        if flat.device != self.device:
            raise ValueError(f"slot_mapping: on {flat.device}, expected {self.device}")
        return flat

    def check_slots(self, slot_mapping: torch.Tensor) -> torch.Tensor | None:
        """Validate a slot mapping once (one host sync): every slot inside the cache, ``-1``
        only for padding. Returns the keep mask when there is padding, else ``None``. Inside a
        CUDA graph capture nothing is checked (``None``). Pass the result to ``write(keep=)``
        to validate once per forward instead of once per layer."""
        flat = slot_mapping.reshape(-1)
        if flat.numel() == 0 or _capturing():
            return None
        lo, hi = (int(x) for x in torch.stack([flat.min(), flat.max()]).tolist())
        if hi >= self.num_pages * self.page_size:
            raise ValueError(
                f"slot_mapping: slot {hi} beyond the cache's {self.num_pages * self.page_size} slots"
            )
        if lo < -1:
            raise ValueError(f"slot_mapping: slot {lo}; expected >= 0, or -1 for padding")
        return flat >= 0 if lo < 0 else None

    def _write(self, dst: torch.Tensor, flat_slots: torch.Tensor, src: torch.Tensor, keep) -> None:
        view = dst.view(-1, *dst.shape[2:])
        src = src.to(dst.dtype)
        if keep is not None:  # -1 marks padding tokens: not written
            flat_slots, src = flat_slots[keep], src[keep]
        view.index_copy_(0, flat_slots, src)

    def write(
        self,
        layer: int,
        slot_mapping: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        keep: torch.Tensor | None | object = _UNCHECKED,
    ) -> None:
        """GQA: write ``k, v [..., Hkv, D]`` (leading dims match ``slot_mapping``) of ``layer``.
        ``keep``: the result of ``check_slots`` (skips re-validating)."""
        if self.kind != "gqa":
            raise TypeError("write: this is an MLA cache, use write_latent")
        if k.shape[-2:] != (self.n_kv_heads, self.head_dim) or v.shape[-2:] != (
            self.n_kv_heads,
            self.v_head_dim,
        ):
            raise ValueError(
                f"k, v: expected [..., {self.n_kv_heads}, {self.head_dim}] and "
                f"[..., {self.n_kv_heads}, {self.v_head_dim}], got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        n = k.numel() // (self.n_kv_heads * self.head_dim)
        flat = self._flat_slots(slot_mapping, n)
        if keep is _UNCHECKED:
            keep = self.check_slots(slot_mapping)
        self._write(self.k[layer], flat, k.reshape(n, self.n_kv_heads, self.head_dim), keep)
        self._write(self.v[layer], flat, v.reshape(n, self.n_kv_heads, self.v_head_dim), keep)

    def write_latent(
        self,
        layer: int,
        slot_mapping: torch.Tensor,
        c_kv: torch.Tensor,
        k_pe: torch.Tensor,
        *,
        keep: torch.Tensor | None | object = _UNCHECKED,
    ) -> None:
        """MLA: write ``c_kv [..., kv_lora_rank]`` (normed) and ``k_pe [..., rope_dim]`` (roped).
        ``keep``: the result of ``check_slots`` (skips re-validating)."""
        if self.kind != "mla":
            raise TypeError("write_latent: this is a GQA cache, use write")
        if c_kv.shape[-1] != self.kv_lora_rank or k_pe.shape[-1] != self.rope_dim:
            raise ValueError(
                f"c_kv, k_pe: expected [..., {self.kv_lora_rank}] and [..., {self.rope_dim}], "
                f"got {tuple(c_kv.shape)}, {tuple(k_pe.shape)}"
            )
        n = c_kv.numel() // self.kv_lora_rank
        flat = self._flat_slots(slot_mapping, n)
        if keep is _UNCHECKED:
            keep = self.check_slots(slot_mapping)
        lat = torch.cat([c_kv.reshape(n, -1), k_pe.reshape(n, -1).to(c_kv.dtype)], dim=-1)
        self._write(self.kv[layer], flat, lat, keep)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(kind={self.kind}, layers={self.num_layers}, pages={self.num_pages}"
            f"x{self.page_size}, free={self.free_pages}, max_batch={self.max_batch}, "
            f"dtype={self.dtype}, device={self.device})"
        )
