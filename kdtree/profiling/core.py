"""The profiler's hot path: phase objects, per-phase aggregates, CUDA-event pool, log lines.

Off: ``phase`` returns one shared no-op object and nothing is recorded or allocated. On: host
time from ``perf_counter_ns``, GPU time from pooled CUDA events harvested lazily with
``query()``, NVTX ranges, and every ``every`` calls of a phase one ``[kdtree-prof]`` line through
``logging``. Users import all of this from ``kdtree.profiler``.

This file needs only the standard library (torch is imported lazily, only for CUDA), so it can be
dropped alone into another engine's worker; its log lines are read back with
``kdtree.profiler.parse_log``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

try:
    from kdtree import env as _env

    _DEFAULTS = (_env.PROFILE, _env.PROFILE_EVERY, _env.PROFILE_GPU, Path(_env.PROFILE_DIR))
except ImportError:  # dropped into another engine without the kdtree package
    _DEFAULTS = (
        os.environ.get("KDTREE_PROFILE", "0").lower() in ("1", "true", "yes", "on"),
        int(os.environ.get("KDTREE_PROFILE_EVERY") or 50),
        os.environ.get("KDTREE_PROFILE_GPU", "1").lower() in ("1", "true", "yes", "on"),
        Path(os.environ.get("KDTREE_PROFILE_DIR") or "runs/profile"),
    )

__all__ = [
    "REPORT_COLUMNS",
    "SAMPLE_COLUMNS",
    "STEP",
    "disable",
    "enable",
    "flush",
    "is_enabled",
    "logger",
    "phase",
    "profiled",
    "reset",
    "step",
    "step_count",
]

#: The periodic lines keep the historical logger name (log filters and ``parse_log`` users).
logger = logging.getLogger("kdtree.profiler")

#: Name of the pseudo-phase that ``step()`` records (time between consecutive step marks).
STEP = "step"
#: Columns of ``report()`` and ``parse_log()`` (``parse_log`` adds pid/rank/host/time/line).
REPORT_COLUMNS = [
    "phase",
    "n",
    "mean_ms",
    "p50_ms",
    "p99_ms",
    "last_ms",
    "total_ms",
    "share",
    "gpu_n",
    "gpu_mean_ms",
    "depth",
    "parent",
]
#: Columns of ``samples()`` (one row per phase call) and of the Parquet file.
SAMPLE_COLUMNS = [
    "seq",
    "phase",
    "parent",
    "depth",
    "step",
    "pid",
    "tid",
    "start_ns",
    "dur_ns",
    "host_ms",
    "gpu_ms",
]
_LOG_TAG = "[kdtree-prof]"


class _NoOp:
    """The shared object ``phase`` returns while off.

    ``__enter__``/``__exit__`` are the C-level ``"".format`` (builtins do not bind, so ``with``
    calls them with 0 and 3 arguments; each returns the interned empty string, which is falsy,
    so exceptions propagate). That halves the cost of a Python-level no-op context manager and
    allocates nothing.
    """

    __slots__ = ()
    __enter__ = "".format
    __exit__ = "".format


_NOOP = _NoOp()


class _Stats:
    """Running aggregates of one phase (exact counts; quantiles come from raw samples)."""

    __slots__ = (
        "n",
        "total_ns",
        "last_ns",
        "window",
        "gpu_n",
        "gpu_total_ms",
        "gpu_last_ms",
        "depth",
        "parent",
    )

    def __init__(self, depth: int, parent: str) -> None:
        self.n = 0
        self.total_ns = 0
        self.last_ns = 0
        self.window: list[int] = []  # durations since the last log line
        self.gpu_n = 0
        self.gpu_total_ms = 0.0
        self.gpu_last_ms = math.nan
        self.depth = depth
        self.parent = parent


class _State:
    """Everything the profiler holds; one module-level instance, guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tls = threading.local()
        self.every = _DEFAULTS[1]
        self.gpu = False
        self.nvtx = False
        self.cuda = False  # gpu or nvtx: one check on the hot path
        self.out_dir = _DEFAULTS[3]
        self.max_samples = 200_000
        self.torch: Any = None
        self.thread_names: dict[int, str] = {}
        self.reset()

    def reset(self) -> None:
        self.stats: dict[str, _Stats] = {}
        self.samples: deque[tuple] = deque(maxlen=self.max_samples)
        self.gpu_ms: dict[int, float] = {}
        self.pending: list[tuple[int, str, Any, Any]] = []
        self.pool: list[Any] = []
        self.seq = itertools.count()
        self.step_index = 0
        self.step_start_ns: int | None = None
        self.epoch_ns = time.time_ns()
        self.perf_ns = time.perf_counter_ns()


_S = _State()
_ON = False
_perf_ns = time.perf_counter_ns
_new_phase = object.__new__


def is_enabled() -> bool:
    """Whether phases are being recorded."""
    return _ON


def enable(
    gpu: bool | None = None,
    *,
    every: int | None = None,
    nvtx: bool | None = None,
    out_dir: str | Path | None = None,
    max_samples: int | None = None,
) -> None:
    """Switch recording on (notebooks, tests). ``None`` keeps the ``KDTREE_PROFILE_*`` default.

    ``gpu``: CUDA-event timing (ignored without CUDA). ``every``: log line cadence in calls.
    ``nvtx``: NVTX ranges (default: on when torch is loaded and CUDA is available).
    ``max_samples``: raw samples kept for ``samples()``/exports (oldest dropped first;
    aggregates stay exact). Torch is imported only for ``gpu``/``nvtx`` or if already loaded.
    """
    global _ON
    if every is not None and (not isinstance(every, int) or every < 1):
        raise ValueError(f"every={every!r}: expected an integer >= 1")
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
        raise ValueError(f"max_samples={max_samples!r}: expected an integer >= 1")
    want_gpu = _DEFAULTS[2] if gpu is None else bool(gpu)
    cuda = _cuda_available(load=want_gpu or bool(nvtx))
    with _S.lock:
        _S.every = every if every is not None else _S.every
        _S.gpu = want_gpu and cuda
        _S.nvtx = cuda if nvtx is None else (bool(nvtx) and cuda)
        _S.cuda = _S.gpu or _S.nvtx
        if out_dir is not None:
            _S.out_dir = Path(out_dir)
        if max_samples is not None and max_samples != _S.max_samples:
            _S.max_samples = max_samples
            _S.samples = deque(_S.samples, maxlen=max_samples)
        _ON = True
    _ensure_log_handler()


def disable() -> None:
    """Switch recording off; collected data stays until ``reset()``."""
    global _ON
    _ON = False


def reset() -> None:
    """Drop every sample and aggregate (pending CUDA events are abandoned)."""
    with _S.lock:
        _S.reset()


def phase(name: str):
    """Context manager timing one named phase; the shared no-op when off or capturing."""
    if not _ON:
        return _NOOP
    if _S.torch is not None and _capturing():
        return _NOOP
    p = _new_phase(_Phase)  # no Python-level __init__ frame on the hot path
    p.name = name
    return p


def profiled(name: str | Any = None):
    """Decorator form of ``phase``: ``@profiled("tree_build")`` or bare ``@profiled``."""
    if callable(name):
        return profiled(None)(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"profiled(name={name!r}): expected a phase name (str) or nothing")

    def deco(fn):
        label = name or fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not _ON:
                return fn(*args, **kwargs)
            with phase(label):
                return fn(*args, **kwargs)

        return wrapper

    return deco


def step_count() -> int:
    """Number of ``step()`` marks since the last ``reset()`` (the current step's index)."""
    return _S.step_index


def step() -> None:
    """Mark the end of one decode step (records the ``step`` pseudo-phase)."""
    if not _ON or (_S.torch is not None and _capturing()):
        return
    now = _perf_ns()
    tl = _thread_state()
    with _S.lock:
        start = _S.step_start_ns
        _S.step_start_ns = now
        index = _S.step_index
        _S.step_index += 1
        line = None
        if start is not None:
            _seq, line = _record(STEP, "", 0, index, tl.tid, start, now - start)
        if _S.pending:
            _harvest(block=False)
    if line is not None:
        logger.info(line)


class _Phase:
    """One timed interval; created by ``phase()`` (``name`` set there)."""

    __slots__ = ("name", "t0", "parent", "depth", "ev0", "stack", "tid")

    def __enter__(self) -> None:
        try:
            stack = _S.tls.stack
        except AttributeError:
            stack = _thread_state().stack
        self.stack = stack
        self.parent = stack[-1] if stack else ""
        self.depth = len(stack)
        stack.append(self.name)
        self.ev0 = None
        if _S.cuda:
            if _S.nvtx:
                _S.torch.cuda.nvtx.range_push(self.name)
            if _S.gpu:
                self.ev0 = _take_event()
                self.ev0.record()
        self.t0 = _perf_ns()
        if _S.step_start_ns is None:  # first phase since reset(): the first step starts here
            _S.step_start_ns = self.t0

    def __exit__(self, *exc: object) -> None:
        t1 = _perf_ns()
        ev1 = None
        if _S.cuda:
            if self.ev0 is not None:
                ev1 = _take_event()
                ev1.record()
            if _S.nvtx:
                _S.torch.cuda.nvtx.range_pop()
        stack = self.stack
        if stack and stack[-1] == self.name:
            stack.pop()
        tid = _S.tls.tid
        with _S.lock:
            seq, line = _record(
                self.name, self.parent, self.depth, _S.step_index, tid, self.t0, t1 - self.t0
            )
            if ev1 is not None:
                _S.pending.append((seq, self.name, self.ev0, ev1))
        if line is not None:
            logger.info(line)


def _record(
    name: str, parent: str, depth: int, step_index: int, tid: int, t0: int, dur: int
) -> tuple[int, str | None]:
    """Store one sample, update the aggregates; returns (seq, log line due). Lock held."""
    seq = next(_S.seq)
    _S.samples.append((seq, name, parent, depth, step_index, tid, t0, dur))
    st = _S.stats.get(name)
    if st is None:
        st = _S.stats[name] = _Stats(depth, parent)
    st.n += 1
    st.total_ns += dur
    st.last_ns = dur
    st.window.append(dur)
    line = None
    if st.n % _S.every == 0:
        if _S.pending:
            _harvest(block=False)
        line = _log_line(name, st)
        st.window.clear()
    return seq, line


def _log_line(name: str, st: _Stats) -> str:
    window = sorted(st.window)
    parts = [
        f"{_LOG_TAG} {name}: n={st.n}",
        f"mean={_ms(st.total_ns / st.n / 1e6)}ms",
        f"last={_ms(st.last_ns / 1e6)}ms",
        f"p50={_ms(_quantile(window, 0.50) / 1e6)}ms",
        f"p99={_ms(_quantile(window, 0.99) / 1e6)}ms",
    ]
    if st.gpu_n:
        parts.append(f"gpu_mean={_ms(st.gpu_total_ms / st.gpu_n)}ms")
    return " ".join(parts)


def _ms(value: float) -> str:
    return format(value, ".4g")


def _quantile(sorted_values: list[int], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an already sorted list."""
    if not sorted_values:
        return math.nan
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _thread_state():
    tl = _S.tls
    try:
        tl.stack  # noqa: B018 - attribute probe: first use on this thread initialises it
    except AttributeError:
        tl.stack = []
        tl.tid = threading.get_native_id()
        _S.thread_names[tl.tid] = threading.current_thread().name
    return tl


# --------------------------------------------------------------------------- CUDA side


def _cuda_available(load: bool) -> bool:
    """True (and ``_S.torch`` set) when CUDA can be used. Torch is imported only when ``load``
    or already imported by the process, so a host-only profiler never pulls it in."""
    torch = sys.modules.get("torch")
    if torch is None and load:
        try:
            import torch
        except ImportError:
            return False
    if torch is None:
        return False
    if not torch.cuda.is_available():
        return False
    _S.torch = torch
    return True


def _capturing() -> bool:
    torch = _S.torch
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _take_event():
    try:
        return _S.pool.pop()  # atomic under the GIL; empty -> a new event
    except IndexError:
        return _S.torch.cuda.Event(enable_timing=True)


def _harvest(block: bool) -> None:
    """Turn completed event pairs into GPU times; call with the lock held."""
    still = []
    for item in _S.pending:
        seq, name, ev0, ev1 = item
        if not block and not ev1.query():
            still.append(item)
            continue
        if block:
            ev1.synchronize()
        ms = ev0.elapsed_time(ev1)
        _S.gpu_ms[seq] = ms
        st = _S.stats.get(name)
        if st is not None:
            st.gpu_n += 1
            st.gpu_total_ms += ms
            st.gpu_last_ms = ms
        _S.pool.append(ev0)
        _S.pool.append(ev1)
    _S.pending = still


def flush(sync: bool = True) -> int:
    """Harvest outstanding CUDA events (waiting for them when ``sync``); returns how many wait."""
    with _S.lock:
        if _S.pending:
            _harvest(block=sync)
        return len(_S.pending)


def _ensure_log_handler() -> None:
    """Make the periodic lines visible when nobody configured logging (scripts, the CLI)."""
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        # once the application configures logging, its root handlers print the lines instead
        handler.addFilter(lambda record: not logging.getLogger().handlers)
        logger.addHandler(handler)


if _DEFAULTS[0]:
    enable()
