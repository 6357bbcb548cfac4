"""Keep the best-validation weights and stop when validation stops improving.

Small corpora let a model memorise its training split: validation loss falls, bottoms out, then
climbs while the training loss keeps falling. :class:`BestKeeper` holds a CPU copy of the
``state_dict`` at the best validation score seen, says when ``patience`` evaluations in a row
brought no improvement, and puts the best weights back at the end of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``model.state_dict()`` (parameters and buffers)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@dataclass
class BestKeeper:
    """Best-so-far tracker with patience.

    ``mode="min"`` for losses, ``"max"`` for scores such as τ. An evaluation counts as an
    improvement when it beats the best by more than ``min_delta``. ``patience=0`` never stops
    early (the best weights are still kept and restored).
    """

    patience: int = 3
    mode: str = "min"
    min_delta: float = 0.0
    best: float = field(init=False)
    best_step: int = field(default=-1, init=False)
    bad_evals: int = field(default=0, init=False)
    state: dict[str, torch.Tensor] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode={self.mode!r}: expected 'min' or 'max'")
        if self.patience < 0:
            raise ValueError(f"patience={self.patience}: expected >= 0")
        if self.min_delta < 0:
            raise ValueError(f"min_delta={self.min_delta}: expected >= 0")
        self.best = math.inf if self.mode == "min" else -math.inf

    def _better(self, value: float) -> bool:
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float, step: int, model: torch.nn.Module) -> bool:
        """Record the evaluation at ``step``; snapshot ``model`` if it is the best so far.

        Returns True when the run should stop (``patience`` evaluations without improvement).
        A NaN evaluation never counts as an improvement.
        """
        if not math.isnan(value) and self._better(value):
            self.best, self.best_step, self.bad_evals = float(value), int(step), 0
            self.state = cpu_state(model)
            return False
        self.bad_evals += 1
        return self.patience > 0 and self.bad_evals >= self.patience

    @property
    def has_best(self) -> bool:
        return self.state is not None

    def restore(self, model: torch.nn.Module) -> bool:
        """Load the best weights into ``model`` (on its own device); False if none kept."""
        if self.state is None:
            return False
        model.load_state_dict(self.state)
        return True

    def summary(self) -> dict:
        """``best_step``, ``best_val`` and the evaluations since the best (JSON-able)."""
        return {
            "best_step": self.best_step,
            "best_val": self.best if math.isfinite(self.best) else None,
            "evals_since_best": self.bad_evals,
            "patience": self.patience,
            "select_mode": self.mode,
        }
