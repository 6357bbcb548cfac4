"""Routed-expert execution for verify batches, three ways, one entry point.

* ``loop``: the model's own ``Experts.forward`` — a torch loop over the experts that got tokens
  (one host sync for the counts, ~7 launches per touched expert). The honest baseline.
* ``bmm``: gather the touched experts' weights (``index_select``), pad each expert's tokens to
  the largest count and run three batched matmuls. Few launches, but the weight gather writes
  and re-reads every touched expert (≈3× the bytes).
* ``grouped``: ``torch._grouped_mm`` over the tokens sorted by expert with per-expert offsets:
  experts with no tokens are empty groups, so only touched experts' weights are read; no host
  sync, so it can sit in a CUDA graph. (PyTorch ≥ 2.8; on CUDA it needs sm90+ and bf16.)

All three return ``Σ_k w[n, k] · expert_{idx[n, k]}(x[n])`` for ``x [N, d]``, ``idx, w [N, k]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["MOE_PROVIDERS", "distinct_experts", "moe_experts", "moe_floor_ms"]

MOE_PROVIDERS = ("loop", "bmm", "grouped")


def distinct_experts(idx: torch.Tensor) -> int:
    """Number of distinct expert ids in ``idx`` (any shape)."""
    return int(torch.unique(idx).numel())


def _check(experts, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> None:
    n_exp, inter, hidden = experts.gate_proj.shape
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"x: expected [N, {hidden}], got {tuple(x.shape)}")
    if idx.dim() != 2 or idx.shape[0] != x.shape[0] or idx.dtype != torch.int64:
        raise ValueError(
            f"idx: expected int64 [{x.shape[0]}, k], got {idx.dtype} {tuple(idx.shape)}"
        )
    if w.shape != idx.shape:
        raise ValueError(f"w: expected shape {tuple(idx.shape)}, got {tuple(w.shape)}")


def _experts_bmm(experts, x, idx, w):
    n, k = idx.shape
    flat = idx.reshape(-1)
    uniq, inv, counts = torch.unique(flat, return_inverse=True, return_counts=True)
    m = int(counts.max())  # host sync: the padded group size
    order = inv.argsort(stable=True)
    grp = inv[order]
    starts = counts.cumsum(0) - counts
    pos = torch.arange(n * k, device=x.device) - starts[grp]
    tok = order // k
    xp = x.new_zeros(uniq.numel(), m, x.shape[1])
    xp[grp, pos] = x[tok]
    wg = experts.gate_proj.index_select(0, uniq)
    wu = experts.up_proj.index_select(0, uniq)
    wd = experts.down_proj.index_select(0, uniq)
    h = F.silu(torch.bmm(xp, wg.transpose(1, 2))) * torch.bmm(xp, wu.transpose(1, 2))
    y = torch.bmm(h, wd.transpose(1, 2))[grp, pos]  # [N*k, d] in sorted order
    y = y * w.reshape(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype))


def _experts_grouped(experts, x, idx, w):
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(
            f"provider='grouped' needs torch._grouped_mm (PyTorch >= 2.8), have {torch.__version__}"
        )
    n, k = idx.shape
    n_exp = experts.gate_proj.shape[0]
    flat = idx.reshape(-1)
    order = flat.argsort(stable=True)
    offs = torch.bincount(flat, minlength=n_exp).cumsum(0).to(torch.int32)
    tok = order // k
    xs = x[tok]
    g = torch._grouped_mm(xs, experts.gate_proj.transpose(-2, -1), offs=offs)
    u = torch._grouped_mm(xs, experts.up_proj.transpose(-2, -1), offs=offs)
    h = (F.silu(g) * u).to(x.dtype)
    y = torch._grouped_mm(h, experts.down_proj.transpose(-2, -1), offs=offs)
    y = y * w.reshape(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype))


def moe_experts(
    experts, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, *, provider: str = "loop"
) -> torch.Tensor:
    """Routed-expert output ``[N, d]`` (``experts``: a kdtree ``Experts`` module)."""
    _check(experts, x, idx, w)
    if provider == "loop":
        return experts(x, idx, w)
    if provider == "bmm":
        return _experts_bmm(experts, x, idx, w)
    if provider == "grouped":
        return _experts_grouped(experts, x, idx, w)
    raise ValueError(f"provider={provider!r}: expected one of {MOE_PROVIDERS}")


def moe_floor_ms(n_distinct: float, expert_bytes: float, bandwidth_TBps: float) -> float:  # noqa: N803
    """Byte floor of one MoE layer's routed experts: every touched expert's weights read once
    at ``bandwidth_TBps`` (TB/s): ``n_distinct · expert_bytes / bandwidth``, in ms."""
    if bandwidth_TBps <= 0:
        raise ValueError(f"bandwidth_TBps={bandwidth_TBps}: expected > 0")
    return n_distinct * expert_bytes / (bandwidth_TBps * 1e12) * 1e3
