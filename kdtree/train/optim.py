"""AdamW with a warmup + cosine schedule, seeding, device choice and a wall-clock deadline."""

from __future__ import annotations

import math
import random
import time

import torch


def resolve_device(device: str) -> torch.device:
    """``auto`` → cuda when available, else cpu; ``cuda`` without a GPU is a clear error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r}: CUDA is not available on this machine (use --device cpu or auto)"
        )
    return dev


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def make_adamw(params, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95)):
    """AdamW; matrices decay, vectors (norms, biases) do not. Fused on CUDA."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = bool(params) and params[0].is_cuda
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def cosine_lr(
    frac: float, peak: float, warmup_frac: float = 0.04, floor_frac: float = 0.1
) -> float:
    """Linear warmup to ``peak`` over ``warmup_frac``, cosine down to ``floor_frac * peak``.

    ``frac`` is the run's progress in [0, 1] (steps done / steps, or time used / budget,
    whichever is further), so a run cut by its wall-clock budget still finishes its decay.
    """
    if not 0.0 <= warmup_frac < 1.0:
        raise ValueError(f"warmup_frac={warmup_frac}: expected [0, 1)")
    frac = min(max(frac, 0.0), 1.0)
    if frac < warmup_frac:
        return peak * max(frac / warmup_frac, 1e-3)
    t = (frac - warmup_frac) / (1.0 - warmup_frac)
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def set_lr(opt, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


class Deadline:
    """A wall-clock budget: ``expired()`` once ``seconds`` have passed (None: never)."""

    def __init__(self, seconds: float | None) -> None:
        self.t0 = time.perf_counter()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def expired(self) -> bool:
        return self.left() <= 0

    def progress(self, step: int, total_steps: int) -> float:
        """The larger of the step fraction and the time fraction, in [0, 1]."""
        frac = step / max(1, total_steps)
        if self.seconds is not None and self.seconds > 0:
            frac = max(frac, self.elapsed() / self.seconds)
        return min(frac, 1.0)
