"""Building blocks shared by the models: RMSNorm, RoPE (as transformers computes it for each
family), the SwiGLU MLP and the model output record."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MLP",
    "ModelOutput",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rope",
    "apply_rope_interleave",
    "rope_inv_freq",
]


@dataclass
class ModelOutput:
    """``logits [B, T, V]`` fp32; ``taps [B, T, n_taps * d]`` when asked for."""

    logits: torch.Tensor
    taps: torch.Tensor | None = None


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``, normalised in fp32 like transformers."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype == self.weight.dtype:
            # one fused kernel on CUDA instead of eight elementwise/reduction launches (the
            # decode step is launch-bound for small models); fp32 accumulation as below, the
            # only difference is that x/rms is not rounded to x's dtype before the weight
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, inter: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(
    dim: int, theta: float, scaling: dict | None, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[dim // 2]`` and the cos/sin scale (``attention_factor``) for
    rope types ``default``, ``linear``, ``llama3`` and ``yarn``, as transformers computes them."""
    base = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    inv = 1.0 / base
    kind = "default" if not scaling else scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / scaling["factor"], 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, inv_l), 1.0
    if kind == "yarn":
        factor = scaling.get("factor")
        orig = scaling["original_max_position_embeddings"]
        if factor is None:
            factor = max_position_embeddings / orig
        att = scaling.get("attention_factor")
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if att is None:
            if mscale and mscale_all:
                att = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
            else:
                att = _yarn_mscale(factor)
        beta_fast = scaling.get("beta_fast") or 32
        beta_slow = scaling.get("beta_slow") or 1

        def corr_dim(rot: float) -> float:
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

        lo, hi = corr_dim(beta_fast), corr_dim(beta_slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        extrap = 1 - ramp
        inv = (inv / factor) * (1 - extrap) + inv * extrap
        return inv, float(att)
    raise ValueError(f"rope_scaling type {kind!r}: expected default, linear, llama3 or yarn")


class RotaryEmbedding(nn.Module):
    """``cos, sin [B, T, dim]`` (``cat(freqs, freqs)``, scaled) for integer positions."""

    def __init__(
        self, dim: int, theta: float, scaling: dict | None = None, max_positions: int = 4096
    ) -> None:
        super().__init__()
        inv, self.attention_scaling = rope_inv_freq(dim, theta, scaling, max_positions)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama/Qwen3 (half-split) RoPE. ``x [B, T, H, D]``, ``cos/sin [B, T, D]``."""
    cos, sin = cos[:, :, None], sin[:, :, None]
    return x * cos + _rotate_half(x) * sin


def apply_rope_interleave(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek interleaved RoPE: pairs ``(x0, x1), (x2, x3) ...`` rotated, output laid out
    de-interleaved (``[evens', odds']``) exactly as transformers' DeepSeek-V3 does."""
    half = cos.shape[-1] // 2
    cos, sin = cos[:, :, None, :half], sin[:, :, None, :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
