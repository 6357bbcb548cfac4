"""Shared timers: host (``torch.utils.benchmark``) and GPU (CUDA events), as p50/p20/p80 in ms.

``time_cpu(fn)`` for host-side work, ``time_cuda(fn)`` for device work (warm-up, L2 flush,
per-repetition CUDA events, one synchronisation at the end), ``time_fn(fn, device)`` picks one.
``time_per_call_ns(stmt)`` measures sub-microsecond per-call costs (many calls per sample).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any L2 we target (H200: 60 MB)


@dataclass(frozen=True)
class Timing:
    """Quantiles of repeated measurements (``unit`` is ms unless said otherwise)."""

    p50: float
    p20: float
    p80: float
    mean: float
    n: int
    unit: str = "ms"

    @classmethod
    def from_samples(cls, values, unit: str = "ms") -> Timing:
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0 or not np.all(np.isfinite(arr)):
            raise ValueError(
                f"values: expected a non-empty sequence of finite numbers, got {arr.size} values"
            )
        p20, p50, p80 = np.quantile(arr, [0.2, 0.5, 0.8])
        return cls(float(p50), float(p20), float(p80), float(arr.mean()), int(arr.size), unit)

    def scaled(self, factor: float, unit: str) -> Timing:
        return Timing(
            self.p50 * factor,
            self.p20 * factor,
            self.p80 * factor,
            self.mean * factor,
            self.n,
            unit,
        )

    def as_dict(self) -> dict:
        return asdict(self)


def time_cpu(fn: Callable[[], object], *, min_run_time: float = 0.2, warmup: int = 1) -> Timing:
    """Host wall time of ``fn()`` via ``torch.utils.benchmark.Timer.blocked_autorange``.

    Each block's per-call mean is one sample, so quantiles describe block-to-block spread.
    """
    from torch.utils import benchmark

    _check_callable(fn)
    for _ in range(warmup):
        fn()
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(
        min_run_time=min_run_time
    )
    return Timing.from_samples(m.times).scaled(1e3, "ms")


def time_per_call_ns(
    stmt: str, globals_: dict, *, number: int = 20_000, repeat: int = 15, setup: str = "pass"
) -> Timing:
    """Per-call cost in ns of a tiny statement: ``repeat`` samples of ``number`` calls each."""
    import timeit

    if number < 1 or repeat < 1:
        raise ValueError(f"number={number}, repeat={repeat}: expected both >= 1")
    timer = timeit.Timer(stmt, setup=setup, globals=globals_)
    timer.timeit(number=max(1, number // 10))  # warm-up
    per_call = [t / number * 1e9 for t in timer.repeat(repeat=repeat, number=number)]
    return Timing.from_samples(per_call, unit="ns")


def time_cuda(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    flush_l2: bool = True,
    max_reps: int = 10_000,
) -> Timing:
    """Device time of ``fn()`` with one CUDA-event pair per repetition (``do_bench`` style).

    Warm-up for ``warmup_ms``, then about ``rep_ms`` worth of repetitions; the L2 cache is
    overwritten before each one when ``flush_l2``; a single synchronisation at the end.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "time_cuda: needs a CUDA device (torch.cuda.is_available() is False)"
            "; use time_cpu for host-side timing"
        )
    _check_callable(fn)
    cache = (
        torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    )
    fn()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(5):
        if cache is not None:
            cache.zero_()
        fn()
    t1.record()
    torch.cuda.synchronize()
    est = max(t0.elapsed_time(t1) / 5, 1e-4)
    n_warm = max(1, int(warmup_ms / est))
    n_rep = max(1, min(max_reps, int(rep_ms / est)))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for s, e in zip(starts, ends, strict=True):
        if cache is not None:
            cache.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return Timing.from_samples([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)])


def graph_of(fn: Callable[[], object], reps: int = 10):
    """``(graph, out)``: ``reps`` calls of ``fn`` captured in one CUDA graph after three warm
    calls on a side stream (compiles and allocations happen there), and the last call's output
    (the buffers a replay rewrites). Timing a replay and dividing by ``reps`` measures the
    kernels without the graph launch."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            out = fn()
    return graph, out


def time_fn(fn: Callable[[], object], device: torch.device | str, **kwargs) -> Timing:
    """``time_cuda`` on a CUDA device, ``time_cpu`` otherwise."""
    dev = torch.device(device)
    return time_cuda(fn, **kwargs) if dev.type == "cuda" else time_cpu(fn, **kwargs)


def _check_callable(fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"fn: expected a zero-argument callable, got {type(fn).__name__}")


def fmt_ms(value: float) -> str:
    """Compact ms formatting for tables (``nan`` stays visible)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    return f"{value:.4g}"
