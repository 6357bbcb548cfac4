"""Packed ancestor bitmasks: bit ``j % 64`` of word ``j // 64`` of row ``i`` ⇔ ``i`` sees ``j``.

The verify step never builds a ``[T, L]`` mask: the prefix is fully visible and only the
``T × T`` tree block travels, packed into ``int64 [..., T, ceil(T / 64)]`` words. Bit 63 is the
sign bit of an ``int64``; packing and unpacking go through two's-complement arithmetic so it
round-trips like every other bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "ancestor_mask",
    "ancestor_mask_np",
    "chain_mask",
    "num_words",
    "pack_bits",
    "pack_bits_np",
    "unpack_bits",
]

BITS_PER_WORD = 64


def num_words(t: int) -> int:
    """Number of int64 words that hold ``t`` bits."""
    if t < 0:
        raise ValueError(f"t={t}: expected a non-negative number of bits")
    return (t + BITS_PER_WORD - 1) // BITS_PER_WORD


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(BITS_PER_WORD, dtype=torch.int64, device=device)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack ``bool [..., T]`` into ``int64 [..., W]``, ``W = ceil(T / 64)`` (bit 63 is the sign)."""
    if not isinstance(bits, torch.Tensor) or bits.dtype != torch.bool:
        got = bits.dtype if isinstance(bits, torch.Tensor) else type(bits).__name__
        raise TypeError(f"bits: expected a torch.bool tensor, got {got}")
    if bits.dim() < 1:
        raise ValueError("bits: expected at least one dimension [..., T]")
    T = bits.shape[-1]
    W = num_words(T)
    pad = W * BITS_PER_WORD - T
    if pad:
        bits = torch.nn.functional.pad(bits, (0, pad), value=False)
    grouped = bits.reshape(*bits.shape[:-1], W, BITS_PER_WORD).to(torch.int64)
    # Distinct powers of two; 1 << 63 is -2**63 in int64 and the sum wraps exactly.
    return (grouped << _shifts(bits.device)).sum(dim=-1)


def unpack_bits(words: torch.Tensor, T: int) -> torch.Tensor:
    """Unpack ``int64 [..., W]`` into ``bool [..., T]`` (inverse of :func:`pack_bits`)."""
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int64:
        got = words.dtype if isinstance(words, torch.Tensor) else type(words).__name__
        raise TypeError(f"words: expected a torch.int64 tensor, got {got}")
    if words.dim() < 1:
        raise ValueError("words: expected at least one dimension [..., W]")
    W = words.shape[-1]
    if T < 0 or T > W * BITS_PER_WORD:
        raise ValueError(f"T={T}: expected 0 <= T <= {W * BITS_PER_WORD} for W={W} words")
    # Arithmetic shift keeps the sign in high bits, but `& 1` only looks at bit 0.
    bits = (words.unsqueeze(-1) >> _shifts(words.device)) & 1
    return bits.reshape(*words.shape[:-1], W * BITS_PER_WORD)[..., :T].bool()


def ancestor_mask_np(parents: Sequence[int]) -> np.ndarray:
    """:func:`ancestor_mask` on the host, as a numpy ``bool [T, T]`` array."""
    par = [int(p) for p in parents]
    T = len(par)
    mask = np.zeros((T, T), dtype=np.bool_)
    for i, p in enumerate(par):
        if p >= i or p < -1:
            raise ValueError(f"parents[{i}]={p}: expected -1 or a parent index < {i}")
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def ancestor_mask(parents: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Ancestor-or-self visibility ``bool [T, T]`` from ``parents [T]`` (``-1`` for a root).

    Row ``i`` is row ``parents[i]`` plus ``i`` itself, so ``parents[i] < i`` is required. Padded
    rows carry parent ``-1`` and therefore see only themselves.
    """
    par = parents.tolist() if isinstance(parents, torch.Tensor) else parents
    return torch.from_numpy(ancestor_mask_np(par))


def pack_bits_np(bits: np.ndarray) -> np.ndarray:
    """:func:`pack_bits` on the host: numpy ``bool [..., T]`` → ``int64 [..., W]``."""
    bits = np.asarray(bits, dtype=np.bool_)
    T = bits.shape[-1]
    W = num_words(T)
    pad = W * BITS_PER_WORD - T
    if pad:
        bits = np.concatenate([bits, np.zeros((*bits.shape[:-1], pad), np.bool_)], axis=-1)
    packed = np.packbits(bits, axis=-1, bitorder="little")  # uint8 [..., W * 8]
    return np.ascontiguousarray(packed).view("<i8").astype(np.int64, copy=False)


def chain_mask(T: int) -> torch.Tensor:
    """Causal visibility of a path of ``T`` tokens: ``bool [T, T]`` lower triangular."""
    if T < 0:
        raise ValueError(f"T={T}: expected a non-negative chain length")
    return torch.ones(T, T, dtype=torch.bool).tril()
