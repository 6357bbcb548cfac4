"""Expert-load statistics: how many distinct experts (and bytes) verifying ``T`` tokens touches.

Routing model (all cases share it, so they differ in one knob each): token ``i`` picks its
``k`` experts as the top-k of ``log p_e + G_ie`` — Gumbel-top-k, i.e. ``k`` draws without
replacement proportional to the popularity ``p``:

* ``uniform``: ``p`` uniform (what an aux-loss-free balanced router looks like over many
  unrelated tokens);
* ``zipf``: ``p_e ∝ rank_e^-s`` over a random ranking (a skewed router);
* ``correlated``: the Gumbel noise is correlated along the tree — a Gaussian AR(1) down each
  edge (``z_child = ρ z_parent + √(1-ρ²) ε``) mapped to Gumbel through its CDF — so tree tokens
  that share a prefix share experts. Each token's marginal routing is unchanged; ``ρ = 0`` is
  the independent case, ``ρ → 1`` gives every token its parent's experts.

``calibrate_rho`` picks ``ρ`` so that the *excess parent-child overlap* (overlap above chance,
normalised) equals one measured on a real model's trees — the assumption that this normalised
overlap transfers from the mini model to K2 scale is stated wherever it is used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "ROUTING_KINDS",
    "calibrate_rho",
    "excess_overlap",
    "expected_distinct_uniform",
    "overlap_with_parent",
    "random_tree_parents",
    "routing_curve",
    "sample_routing",
    "zipf_log_popularity",
]

ROUTING_KINDS = ("uniform", "zipf", "correlated")


def expected_distinct_uniform(n_experts: int, top_k: int, t: float) -> float:
    """E[distinct experts] for ``t`` independent tokens each choosing ``top_k`` of
    ``n_experts`` uniformly without replacement: ``n · (1 - (1 - k/n)^t)``."""
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k={top_k}: expected 1 <= top_k <= n_experts={n_experts}")
    if t < 0:
        raise ValueError(f"t={t}: expected >= 0")
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** t)


def zipf_log_popularity(n_experts: int, s: float, gen: torch.Generator) -> torch.Tensor:
    """``log p [n]`` with ``p_e ∝ rank_e^-s`` (ranks a random permutation; ``s=0``: uniform)."""
    if s < 0:
        raise ValueError(f"s={s}: expected a Zipf exponent >= 0")
    ranks = torch.randperm(n_experts, generator=gen).double() + 1.0
    logp = -s * ranks.log()
    return (logp - torch.logsumexp(logp, 0)).float()


def random_tree_parents(t: int, gen: torch.Generator, *, branching: float = 0.5) -> list[int]:
    """Parents of a random tree in pop order (``parents[0] = -1``, ``parents[j] < j``): with
    probability ``branching`` a uniform earlier node, else ``j - 1`` (a DDTree-like main chain
    with side branches)."""
    if t < 1:
        raise ValueError(f"t={t}: expected >= 1")
    if not 0.0 <= branching <= 1.0:
        raise ValueError(f"branching={branching}: expected a probability")
    parents = [-1]
    for j in range(1, t):
        if float(torch.rand((), generator=gen)) < branching:
            parents.append(int(torch.randint(0, j, (), generator=gen)))
        else:
            parents.append(j - 1)
    return parents


def _check_parents(parents: Sequence[int], t: int) -> None:
    if len(parents) != t:
        raise ValueError(f"parents: expected {t} entries, got {len(parents)}")
    for j, p in enumerate(parents):
        if (j == 0 and p != -1) or (j > 0 and not 0 <= p < j):
            raise ValueError(f"parents[{j}]={p}: expected -1 for the root and 0 <= p < {j} else")


def sample_routing(
    t: int,
    n_experts: int,
    top_k: int,
    gen: torch.Generator,
    *,
    log_pop: torch.Tensor | None = None,
    parents: Sequence[int] | None = None,
    rho: float = 0.0,
) -> torch.Tensor:
    """Expert ids ``int64 [t, top_k]`` under the Gumbel-top-k model (module docstring).
    ``parents`` with ``rho > 0`` correlates the noise along tree edges."""
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k={top_k}: expected 1 <= top_k <= n_experts={n_experts}")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho={rho}: expected 0 <= rho < 1")
    if rho > 0 and parents is None:
        raise ValueError("parents: required when rho > 0 (correlation runs along tree edges)")
    z = torch.randn(t, n_experts, generator=gen, dtype=torch.float64)
    if rho > 0:
        _check_parents(parents, t)
        c = math.sqrt(1.0 - rho * rho)
        for j in range(1, t):
            z[j] = rho * z[parents[j]] + c * z[j]
    u = (0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))).clamp(1e-12, 1.0 - 1e-12)
    gumbel = -torch.log(-torch.log(u))
    logits = gumbel if log_pop is None else gumbel + log_pop.double()[None]
    return logits.topk(top_k, dim=-1).indices


def overlap_with_parent(idx: torch.Tensor, parents: Sequence[int]) -> float:
    """Mean fraction of a node's experts that its parent also chose (nodes with a parent)."""
    t, k = idx.shape
    _check_parents(parents, t)
    if t < 2:
        return float("nan")
    sets = [set(row) for row in idx.tolist()]
    return float(np.mean([len(sets[j] & sets[parents[j]]) / k for j in range(1, t)]))


def excess_overlap(overlap: float, n_experts: int, top_k: int) -> float:
    """Parent-child overlap above chance, normalised: ``(o - k/n) / (1 - k/n)`` (0: independent
    routing, 1: identical expert sets)."""
    base = top_k / n_experts
    if base >= 1.0:
        return float("nan")
    return (overlap - base) / (1.0 - base)


def _mc_excess(rho: float, n_experts: int, top_k: int, t: int, trials: int, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    vals = []
    for _ in range(trials):
        parents = random_tree_parents(t, gen)
        idx = sample_routing(t, n_experts, top_k, gen, parents=parents, rho=rho)
        vals.append(overlap_with_parent(idx, parents))
    return excess_overlap(float(np.mean(vals)), n_experts, top_k)


def calibrate_rho(
    target_excess: float,
    n_experts: int,
    top_k: int,
    *,
    t: int = 33,
    trials: int = 4,
    seed: int = 0,
    iters: int = 14,
) -> float:
    """The ``rho`` whose Monte-Carlo excess parent-child overlap at (``n_experts``, ``top_k``)
    matches ``target_excess`` (bisection; common random numbers keep it monotone)."""
    if not math.isfinite(target_excess):
        raise ValueError(f"target_excess={target_excess}: expected a finite number")
    if target_excess <= 0:
        return 0.0
    lo, hi = 0.0, 0.999
    if _mc_excess(hi, n_experts, top_k, t, trials, seed) <= target_excess:
        return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if _mc_excess(mid, n_experts, top_k, t, trials, seed) < target_excess:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def routing_curve(
    kind: str,
    tree_sizes: Sequence[int],
    n_experts: int,
    top_k: int,
    *,
    trials: int = 16,
    seed: int = 0,
    zipf_s: float = 1.0,
    rho: float = 0.6,
) -> list[dict]:
    """Distinct experts touched by a verify batch of ``T`` tokens, per ``T``: one dict with
    ``kind, T, distinct_mean, distinct_p20, distinct_p80, expected_uniform`` (Monte Carlo over
    ``trials`` random trees / routings)."""
    if kind not in ROUTING_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {ROUTING_KINDS}")
    gen = torch.Generator().manual_seed(seed)
    log_pop = zipf_log_popularity(n_experts, zipf_s, gen) if kind == "zipf" else None
    rows = []
    for t in tree_sizes:
        counts = []
        for _ in range(trials):
            parents = random_tree_parents(t, gen) if kind == "correlated" else None
            idx = sample_routing(
                t,
                n_experts,
                top_k,
                gen,
                log_pop=log_pop,
                parents=parents,
                rho=rho if kind == "correlated" else 0.0,
            )
            counts.append(int(torch.unique(idx).numel()))
        arr = np.asarray(counts, dtype=np.float64)
        rows.append(
            {
                "kind": kind,
                "T": int(t),
                "distinct_mean": float(arr.mean()),
                "distinct_p20": float(np.quantile(arr, 0.2)),
                "distinct_p80": float(np.quantile(arr, 0.8)),
                "expected_uniform": expected_distinct_uniform(n_experts, top_k, t),
            }
        )
    return rows
