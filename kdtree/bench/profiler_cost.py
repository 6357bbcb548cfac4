"""What the phase profiler costs per instrumented call, off and on (host side).

Each case is a tiny statement timed with many calls per sample (``time_per_call_ns``). The
periodic log lines are formatted as usual but sent to a null handler, so terminal I/O is not
counted. Running the suite resets the profiler and restores its on/off state afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kdtree import profiler
from kdtree.bench.schema import BenchRow
from kdtree.bench.timing import Timing, time_per_call_ns

SUITE = "profiler"
#: Per-call budgets from issue 3 (µs, host side).
TARGET_OFF_US = 0.2
TARGET_ON_US = 5.0


def _bare() -> None:
    return None


@profiler.profiled("bench_profiled")
def _decorated() -> None:
    return None


_NESTED = "with phase('bench_outer'):\n    with phase('bench_inner'):\n        pass"
# (name, statement, calls per execution of the statement)
_CASES = [
    ("phase", "with phase('bench_phase'):\n    pass", 1),
    ("nested_phase", _NESTED, 2),
    ("profiled", "decorated()", 1),
    ("step", "step()", 1),
]
# the floor: a loop, a plain call, and a ``with`` over the profiler's own C-level no-op
_BASELINES = [
    ("empty_loop", "pass", 1),
    ("bare_call", "bare()", 1),
    ("with_noop", "with noop:\n    pass", 1),
]


@dataclass
class CostResult:
    name: str
    provider: str  # baseline | off | on_host | on_gpu
    per_call_us: Timing
    target_us: float | None

    @property
    def ok(self) -> bool | None:
        return None if self.target_us is None else self.per_call_us.p50 < self.target_us


def measure(number: int = 20_000, repeat: int = 15, gpu: bool = False) -> list[CostResult]:
    """Time every case off, on (host only) and, with ``gpu`` and CUDA, on with CUDA events."""
    g = {
        "phase": profiler.phase,
        "step": profiler.step,
        "decorated": _decorated,
        "bare": _bare,
        "noop": profiler._NOOP,
    }
    was_on = profiler.is_enabled()
    log = logging.getLogger("kdtree.profiler")
    saved = (log.handlers[:], log.propagate, log.level)
    log.handlers[:] = [logging.NullHandler()]
    log.propagate = False
    log.setLevel(logging.INFO)
    out: list[CostResult] = []
    try:
        for name, stmt, calls in _BASELINES:
            t = time_per_call_ns(stmt, g, number=number, repeat=repeat)
            out.append(CostResult(name, "baseline", t.scaled(1e-3 / calls, "us"), None))
        modes = [("off", None), ("on_host", False)]
        import torch

        if gpu and torch.cuda.is_available():
            modes.append(("on_gpu", True))
        for provider, use_gpu in modes:
            profiler.reset()
            if use_gpu is None:
                profiler.disable()
            else:
                profiler.enable(gpu=use_gpu, nvtx=use_gpu)
            target = TARGET_OFF_US if provider == "off" else TARGET_ON_US
            for name, stmt, calls in _CASES:
                t = time_per_call_ns(stmt, g, number=number, repeat=repeat)
                out.append(CostResult(name, provider, t.scaled(1e-3 / calls, "us"), target))
            profiler.flush(sync=True)
    finally:
        profiler.disable()
        profiler.reset()
        if was_on:
            profiler.enable()
        log.handlers[:], log.propagate, log.level = saved
    return out


def to_rows(results: list[CostResult], number: int, repeat: int) -> list[BenchRow]:
    """Long-format rows (µs per instrumented call; p20/p80 across samples)."""
    rows = []
    for r in results:
        t = r.per_call_us
        rows.append(
            BenchRow(
                suite=SUITE,
                name=r.name,
                provider=r.provider,
                metric="per_call",
                unit="us",
                p50=t.p50,
                p20=t.p20,
                p80=t.p80,
                mode="host",
                config={
                    "number": number,
                    "repeat": repeat,
                    "target_us": r.target_us,
                    "every": profiler._S.every,
                    "within_target": r.ok,
                },
            )
        )
    return rows
