"""Tree-mask bit packing: bit ``j % 64`` of word ``j // 64`` of row ``i`` ⇔ ``i`` sees ``j``.

Words are ``int64``; bit 63 is the sign bit (two's complement), so a set bit 63 makes the word
negative. Both helpers work on any leading shape and on any device.
"""

from __future__ import annotations

import torch

__all__ = ["num_words", "pack_bits", "unpack_bits"]


def num_words(t: int) -> int:
    """Number of int64 words that hold ``t`` bits."""
    if t < 0:
        raise ValueError(f"t={t}: expected a non-negative number of bits")
    return (t + 63) // 64


def _bit_values(device: torch.device) -> torch.Tensor:
    bits = torch.ones(64, dtype=torch.int64, device=device) << torch.arange(
        64, dtype=torch.int64, device=device
    )
    return bits  # bit 63: 1 << 63 wraps to the int64 minimum, as two's complement wants


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack ``bool [..., T]`` into ``int64 [..., ceil(T / 64)]``."""
    if bits.dtype != torch.bool:
        raise TypeError(f"bits: expected a bool tensor, got {bits.dtype}")
    if bits.dim() < 1:
        raise ValueError("bits: expected at least one dimension [..., T]")
    t = bits.shape[-1]
    w = num_words(t)
    padded = torch.zeros(*bits.shape[:-1], w * 64, dtype=torch.bool, device=bits.device)
    padded[..., :t] = bits
    words = padded.view(*bits.shape[:-1], w, 64).to(torch.int64) * _bit_values(bits.device)
    return words.sum(dim=-1)  # distinct powers of two: the sum is the bitwise or (wraps for 63)


def unpack_bits(words: torch.Tensor, t: int) -> torch.Tensor:
    """Unpack ``int64 [..., W]`` into ``bool [..., t]`` (``W`` must equal ``ceil(t / 64)``)."""
    if words.dtype != torch.int64:
        raise TypeError(f"words: expected an int64 tensor, got {words.dtype}")
    if words.dim() < 1 or words.shape[-1] != num_words(t):
        raise ValueError(
            f"words: expected shape [..., {num_words(t)}] for t={t}, got {tuple(words.shape)}"
        )
    bits = (words.unsqueeze(-1) & _bit_values(words.device)) != 0
    return bits.reshape(*words.shape[:-1], words.shape[-1] * 64)[..., :t]
