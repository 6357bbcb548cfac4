"""Cost-aware budget choice (CaDDTree-style): pick ``B`` each round to maximise expected tokens
per unit time, from a measured latency model and the drafter's own acceptance estimate.

Per round, the heap already gives every node's score ``log q(u)`` in pop order, so the expected
accepted length of the tree cut to ``B`` nodes is ``E[τ | B] = 1 + Σ_{i ≤ B} exp(score_i)``
(DDTree Prop. 1, plus the bonus token). With a latency model ``cost(T, L)`` (ms per step for a
verify of ``T = B + 1`` tokens at context ``L``, fixed per-step costs included) the policy picks

    B* = argmax_B  E[τ | B] / cost(B + 1, L)

over a candidate set (the budgets a CUDA-graph runner would capture). ``E[τ | B]`` is concave
in ``B`` (scores are non-increasing in pop order) and a convex cost makes the ratio unimodal, so
the greedy scan stops at the first decrease (``greedy=True``); ``greedy=False`` scans all.

:class:`CostAwareEngine` runs the policy inside the engine (tree mode); :func:`simulate` replays
recorded rounds (:mod:`kdtree.scale.record`) under fixed budgets and under the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kdtree.scale.record import Round, tau_at_budget
from kdtree.spec.engine import SpecEngine

__all__ = [
    "DEFAULT_CANDIDATES",
    "BudgetChoice",
    "CostAwareEngine",
    "TableLatency",
    "acceptance_scale",
    "choose_budget",
    "simulate",
]

DEFAULT_CANDIDATES = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

#: ``cost(T, L) -> ms`` for one decode step verifying ``T`` tokens at context ``L``.
LatencyFn = Callable[[int, int], float]


@dataclass
class TableLatency:
    """A measured latency table: ``ms[i, j]`` at tree size ``ts[i]`` and context
    ``contexts[j]``; linear interpolation in both (linear extrapolation in ``T`` past the last
    point, clamped in ``L``), plus ``fixed_ms`` per step (drafting, host work)."""

    ts: np.ndarray
    contexts: np.ndarray
    ms: np.ndarray
    fixed_ms: float = 0.0

    def __post_init__(self) -> None:
        self.ts = np.asarray(self.ts, dtype=np.float64)
        self.contexts = np.asarray(self.contexts, dtype=np.float64)
        self.ms = np.asarray(self.ms, dtype=np.float64).reshape(len(self.ts), len(self.contexts))
        if len(self.ts) < 1 or np.any(np.diff(self.ts) <= 0):
            raise ValueError(f"ts={self.ts.tolist()}: expected increasing tree sizes")
        if np.any(np.diff(self.contexts) <= 0):
            raise ValueError(f"contexts={self.contexts.tolist()}: expected increasing contexts")
        if not np.all(np.isfinite(self.ms)) or np.any(self.ms <= 0):
            raise ValueError("ms: expected finite positive times")

    @classmethod
    def from_points(cls, points: dict[tuple[int, int], float], fixed_ms: float = 0.0):
        """From ``{(T, L): ms}`` covering a full grid."""
        ts = sorted({t for t, _ in points})
        ls = sorted({c for _, c in points})
        missing = [(t, c) for t in ts for c in ls if (t, c) not in points]
        if missing:
            raise ValueError(f"points: the (T, L) grid is incomplete, missing {missing[:4]}")
        ms = np.array([[points[(t, c)] for c in ls] for t in ts])
        return cls(np.array(ts), np.array(ls), ms, fixed_ms)

    def _in_t(self, t: float, col: np.ndarray) -> float:
        if len(self.ts) == 1:
            return float(col[0])
        if t >= self.ts[-1]:
            slope = (col[-1] - col[-2]) / (self.ts[-1] - self.ts[-2])
            return float(col[-1] + slope * (t - self.ts[-1]))
        return float(np.interp(t, self.ts, col))

    def __call__(self, t: int, context: int) -> float:
        per_l = np.array([self._in_t(t, self.ms[:, j]) for j in range(len(self.contexts))])
        if len(self.contexts) == 1:
            return float(per_l[0]) + self.fixed_ms
        return float(np.interp(context, self.contexts, per_l)) + self.fixed_ms


@dataclass(frozen=True)
class BudgetChoice:
    budget: int
    expected_tau: float
    step_ms: float
    tokens_per_ms: float
    evaluated: int  # candidates whose cost was looked up


def choose_budget(
    expected_tau: np.ndarray,
    latency: LatencyFn,
    context: int,
    candidates: Sequence[int] = DEFAULT_CANDIDATES,
    *,
    greedy: bool = True,
) -> BudgetChoice:
    """The candidate budget maximising ``expected_tau[B] / latency(B + 1, context)``.

    ``expected_tau[B]`` = ``E[τ | B]`` (``Round.expected_accepted``; for a batch, the sum over
    requests); candidates past its end are dropped (the heap ran dry)."""
    exp = np.asarray(expected_tau, dtype=np.float64)
    cands = sorted({int(b) for b in candidates if 0 <= int(b) < len(exp)})
    if not cands:
        raise ValueError(
            f"candidates={list(candidates)}: none in 0..{len(exp) - 1} (the recorded tree size)"
        )
    best: BudgetChoice | None = None
    evaluated = 0
    for b in cands:
        ms = float(latency(b + 1, context))
        if not ms > 0:
            raise ValueError(f"latency({b + 1}, {context}) = {ms}: expected a positive time")
        evaluated += 1
        rate = exp[b] / ms
        if best is None or rate > best.tokens_per_ms:
            best = BudgetChoice(b, float(exp[b]), ms, rate, evaluated)
        elif greedy:
            break
    return BudgetChoice(
        best.budget, best.expected_tau, best.step_ms, best.tokens_per_ms, evaluated
    )


def acceptance_scale(rounds: Sequence[Round], budget: int | None = None) -> float:
    """How far the drafter's own estimate is off: ``Σ (τ(B) - 1) / Σ (E[τ | B] - 1)`` over
    ``rounds`` at ``budget`` (default: the recorded size). > 1: the drafter is underconfident
    (more is accepted than its probabilities say)."""
    if not rounds:
        raise ValueError("rounds: expected at least one recorded round")
    b = min(r.size for r in rounds) - 1 if budget is None else budget
    got = sum(tau_at_budget(r.path, b) - 1 for r in rounds)
    exp = sum(r.expected_accepted[b] - 1 for r in rounds)
    return float(got / exp) if exp > 0 else float("nan")


def simulate(
    rounds: Sequence[Round],
    latency: LatencyFn,
    *,
    fixed_budgets: Sequence[int],
    candidates: Sequence[int] = DEFAULT_CANDIDATES,
    greedy: bool = True,
    scales: dict[str, float] | None = None,
) -> list[dict]:
    """Replay recorded rounds: tokens, time and tokens/s under each fixed budget and under the
    cost-aware policy. Each round's τ at budget ``B`` is exact (path truncation, see
    :mod:`kdtree.scale.record`); the trajectory is the recorded one (a smaller budget would
    have led to other rounds, so this estimates per-round rates, not a different run).
    ``scales`` adds policies that multiply the drafter's ``E[τ | B] - 1`` by a factor (e.g.
    :func:`acceptance_scale`); default ``{"cost-aware": 1.0}``."""
    if not rounds:
        raise ValueError("rounds: expected at least one recorded round")
    max_b = min(r.size for r in rounds) - 1
    bad = [b for b in fixed_budgets if not 0 <= b <= max_b]
    if bad:
        raise ValueError(f"fixed_budgets {bad}: outside 0..{max_b} (the recorded trees' size)")
    out = []
    for b in fixed_budgets:
        tokens = sum(tau_at_budget(r.path, b) for r in rounds)
        ms = sum(latency(b + 1, r.context) for r in rounds)
        exp = sum(r.expected_accepted[b] for r in rounds)
        out.append(_sim_row(f"fixed B={b}", b, tokens, ms, exp, len(rounds), [b] * len(rounds)))
    for name, scale in (scales or {"cost-aware": 1.0}).items():
        if not np.isfinite(scale) or scale <= 0:
            raise ValueError(f"scales[{name!r}]={scale}: expected a positive factor")
        chosen, tokens, ms, exp = [], 0, 0.0, 0.0
        for r in rounds:
            e = 1.0 + scale * (r.expected_accepted - 1.0)
            c = choose_budget(e, latency, r.context, candidates, greedy=greedy)
            chosen.append(c.budget)
            tokens += tau_at_budget(r.path, c.budget)
            ms += c.step_ms
            exp += c.expected_tau
        out.append(_sim_row(name, float(np.mean(chosen)), tokens, ms, exp, len(rounds), chosen))
    return out


def _sim_row(policy, budget, tokens, ms, exp, n, chosen) -> dict:
    return {
        "policy": policy,
        "budget": budget,
        "rounds": n,
        "tokens": int(tokens),
        "time_ms": float(ms),
        "tokens_per_s": 1e3 * tokens / ms,
        "tau_mean": tokens / n,
        "expected_tau_mean": exp / n,
        "chosen": list(chosen),
    }


class CostAwareEngine(SpecEngine):
    """Tree-mode engine that picks the budget every round with :func:`choose_budget`.

    A ``SpecEngine`` at ``budget = max(candidates)`` whose ``budget_policy`` is
    :meth:`choose`: the heap runs once at the max budget to get the scores, the policy picks
    ``B`` for the batch (sum of the active requests' ``E[τ | B]`` over the cost at the longest
    context), and the tree is rebuilt at ``B`` (identical to the first ``B + 1`` pops) and
    verified at ``T = B + 1`` (``fixed_tree_size = False``: the latency model prices that
    shape). ``self.chosen`` lists the budgets; ``acceptance_scale`` multiplies the drafter's
    ``E[τ | B] - 1`` (calibration, see :func:`acceptance_scale`).
    """

    fixed_tree_size = False

    def __init__(
        self,
        target,
        drafter,
        *,
        latency: LatencyFn,
        candidates: Sequence[int] = DEFAULT_CANDIDATES,
        greedy: bool = True,
        acceptance_scale: float = 1.0,
        **kwargs,
    ) -> None:
        if not acceptance_scale > 0:
            raise ValueError(f"acceptance_scale={acceptance_scale}: expected > 0")
        self.acceptance_scale = float(acceptance_scale)
        cands = sorted({int(b) for b in candidates})
        if not cands or cands[0] < 0:
            raise ValueError(f"candidates={list(candidates)}: expected non-negative budgets")
        kwargs.pop("mode", None)
        kwargs["budget"] = cands[-1]
        super().__init__(target, drafter, mode="tree", budget_policy=self.choose, **kwargs)
        self.latency, self.candidates, self.greedy = latency, cands, greedy
        self.chosen: list[int] = []

    def choose(self, expected: np.ndarray, context_lens: list[int], active: list[int]) -> int:
        """The engine's ``budget_policy``: :func:`choose_budget` on the active requests'
        summed (scaled) ``E[τ | B]`` at the longest context; recorded in ``self.chosen``."""
        scale, exp = self.acceptance_scale, None
        for b in active:
            e = expected[b] if scale == 1.0 else 1.0 + scale * (expected[b] - 1.0)
            exp = e if exp is None else exp + e
        choice = choose_budget(
            exp, self.latency, max(context_lens), self.candidates, greedy=self.greedy
        )
        self.chosen.append(choice.budget)
        return choice.budget
