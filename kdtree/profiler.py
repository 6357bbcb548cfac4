"""Env-gated phase profiler: named host (and CUDA-event) timings with near-zero cost when off.

Usage::

    from kdtree import profiler
    with profiler.phase("prepare_for_verify"):
        ...
    @profiler.profiled("tree_build")
    def build(...): ...
    profiler.step()                      # end of one decode step
    profiler.report()                    # pandas DataFrame, one row per phase

Off (the default unless ``KDTREE_PROFILE=1``): ``phase`` returns one shared no-op object and
nothing is recorded or allocated. On: host time from ``perf_counter_ns`` (anchored to the Unix
epoch for Chrome traces), GPU time from pooled CUDA events recorded outside graph capture and
harvested lazily with ``query()`` (never a synchronisation on the hot path), NVTX ranges with the
same names, and every ``every`` calls of a phase one ``[kdtree-prof]`` line through ``logging``
(n, mean and last over all calls; p50/p99 over the calls since the phase's previous line).
While the current CUDA stream is capturing a graph, phases record nothing; a phase around
``graph.replay()`` is timed as a whole.

The parts live in ``kdtree/profiling/`` (``core``: hot path; ``report``, ``chrome``, ``store``,
``logparse``); this module re-exports them, so ``profiler.phase`` *is* ``core.phase`` (no extra
call on the hot path). Import needs only the standard library (torch and pandas lazily), and
``kdtree/profiling/core.py`` alone can be dropped into another engine's worker; its log lines are
analysed here with ``parse_log``.
"""

from __future__ import annotations

from kdtree.profiling.chrome import chrome_trace, export_chrome_trace, load_chrome_trace
from kdtree.profiling.core import (
    _NOOP,  # noqa: F401 - the shared off object (tests, the cost bench)
    _S,  # noqa: F401 - profiler state (tests, the cost bench)
    REPORT_COLUMNS,
    SAMPLE_COLUMNS,
    STEP,
    disable,
    enable,
    flush,
    is_enabled,
    logger,
    phase,
    profiled,
    reset,
    step,
    step_count,
)
from kdtree.profiling.logparse import parse_log
from kdtree.profiling.report import report, samples, summarize
from kdtree.profiling.store import load_samples, save

__all__ = [
    "REPORT_COLUMNS",
    "SAMPLE_COLUMNS",
    "STEP",
    "chrome_trace",
    "disable",
    "enable",
    "export_chrome_trace",
    "flush",
    "is_enabled",
    "load_chrome_trace",
    "load_samples",
    "logger",
    "parse_log",
    "phase",
    "profiled",
    "report",
    "reset",
    "samples",
    "save",
    "step",
    "step_count",
    "summarize",
]
