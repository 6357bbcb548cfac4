"""What one decode step and one ``generate`` call leave behind.

A :class:`StepRecord` describes one batched step: per-request fields are tuples parallel to
``batch_index`` (the requests that took part in the step), phase times are shared by the batch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is a notebook extra, imported lazily
    import pandas as pd

__all__ = ["PHASES", "GenerateResult", "StepRecord"]

#: Engine phases in step order (also the profiler's phase names).
PHASES = ("draft", "tree_build", "prepare_for_verify", "verify", "accept", "commit")


@dataclass(frozen=True)
class StepRecord:
    """One engine step.

    ``tree_size``: nodes verified per request (root included; 1 for ``ar``).
    ``accepted_len``: τ per request, accepted nodes including the root/bonus (1 ≤ τ ≤ depth+1).
    ``bonus_token``: the new bonus (the token the target chose after the accepted path).
    ``emitted``: tokens appended to the request's output by this step (τ, fewer when a stop
    token or ``max_new_tokens`` cut it short). ``context_len``: committed prefix ``L`` before
    the step. ``phase_ms``: host wall time per phase (device-synchronised only when the engine
    runs with ``timings=True``).
    """

    step: int
    mode: str
    batch_index: tuple[int, ...]
    tree_size: tuple[int, ...]
    accepted_len: tuple[int, ...]
    bonus_token: tuple[int, ...]
    emitted: tuple[int, ...]
    context_len: tuple[int, ...]
    phase_ms: dict[str, float] = field(default_factory=dict)

    @property
    def total_ms(self) -> float:
        return float(sum(self.phase_ms.values()))

    def rows(self) -> list[dict]:
        """One flat dict per request (for DataFrames)."""
        return [
            {
                "step": self.step,
                "mode": self.mode,
                "batch_index": b,
                "tree_size": self.tree_size[i],
                "accepted_len": self.accepted_len[i],
                "bonus_token": self.bonus_token[i],
                "emitted": self.emitted[i],
                "context_len": self.context_len[i],
                **{f"{k}_ms": v for k, v in self.phase_ms.items()},
            }
            for i, b in enumerate(self.batch_index)
        ]


@dataclass
class GenerateResult:
    """Tokens generated per request (prompt excluded) and one :class:`StepRecord` per step."""

    tokens: list[list[int]]
    steps: list[StepRecord]
    mode: str = "tree"

    def acceptance_histogram(self) -> dict[int, int]:
        """τ → number of (request, step) pairs that accepted τ nodes (root included)."""
        counts = Counter(t for rec in self.steps for t in rec.accepted_len)
        return dict(sorted(counts.items()))

    @property
    def tau_mean(self) -> float:
        """Mean acceptance length τ over all (request, step) pairs (NaN without steps)."""
        taus = [t for rec in self.steps for t in rec.accepted_len]
        return float(sum(taus) / len(taus)) if taus else float("nan")

    @property
    def target_forwards_per_token(self) -> float:
        """Verify forwards a request took part in per token those steps emitted (≈ 1/τ)."""
        forwards = sum(len(rec.batch_index) for rec in self.steps)
        emitted = sum(sum(rec.emitted) for rec in self.steps)
        return forwards / emitted if emitted else float("nan")

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def frame(self) -> pd.DataFrame:
        """One row per (step, request) with every StepRecord field and ``<phase>_ms``."""
        import pandas as pd

        return pd.DataFrame([row for rec in self.steps for row in rec.rows()])

    def phase_table(self) -> pd.DataFrame:
        """Per-phase step time: calls, total / mean / p50 / p90 ms and share of the step."""
        import pandas as pd

        cols = ["phase", "calls", "total_ms", "mean_ms", "p50_ms", "p90_ms", "share_pct"]
        per_phase: dict[str, list[float]] = {}
        for rec in self.steps:
            for name, ms in rec.phase_ms.items():
                per_phase.setdefault(name, []).append(ms)
        order = [p for p in PHASES if p in per_phase] + sorted(set(per_phase) - set(PHASES))
        grand = sum(sum(v) for v in per_phase.values())
        rows = []
        for name in order:
            s = pd.Series(per_phase[name], dtype="float64")
            rows.append(
                {
                    "phase": name,
                    "calls": len(s),
                    "total_ms": float(s.sum()),
                    "mean_ms": float(s.mean()),
                    "p50_ms": float(s.quantile(0.5)),
                    "p90_ms": float(s.quantile(0.9)),
                    "share_pct": 100.0 * float(s.sum()) / grand if grand > 0 else float("nan"),
                }
            )
        return pd.DataFrame(rows, columns=cols)

    def summary(self) -> dict:
        """JSON-ready headline numbers."""
        return {
            "mode": self.mode,
            "requests": len(self.tokens),
            "generated_tokens": sum(len(t) for t in self.tokens),
            "steps": self.num_steps,
            "tau_mean": self.tau_mean,
            "target_forwards_per_token": self.target_forwards_per_token,
            "acceptance_histogram": {str(k): v for k, v in self.acceptance_histogram().items()},
            "step_ms_mean": (
                sum(r.total_ms for r in self.steps) / self.num_steps
                if self.steps
                else float("nan")
            ),
        }
