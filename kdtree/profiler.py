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

The module needs only the standard library at import (torch and pandas are imported lazily), so
the file can be dropped into another engine's worker and its log lines analysed with
``parse_log``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import re
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
    "export_chrome_trace",
    "flush",
    "is_enabled",
    "load_chrome_trace",
    "load_samples",
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


# --------------------------------------------------------------------------- results


def _pd():
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - pandas is a dev dependency here
        raise ImportError("kdtree.profiler: report/export/parse need pandas installed") from exc
    return pd


def samples(sync: bool = True):
    """Raw samples as a DataFrame (``SAMPLE_COLUMNS``); ``start_ns`` is Unix-epoch ns."""
    pd = _pd()
    flush(sync)
    with _S.lock:
        rows = list(_S.samples)
        gpu = dict(_S.gpu_ms)
        offset = _S.epoch_ns - _S.perf_ns
    pid = os.getpid()
    df = pd.DataFrame(
        rows, columns=["seq", "phase", "parent", "depth", "step", "tid", "t0", "dur_ns"]
    )
    df["pid"] = pid
    df["start_ns"] = df["t0"].astype("int64") + offset
    df["dur_ns"] = df["dur_ns"].astype("int64")
    df["host_ms"] = df["dur_ns"] / 1e6
    df["gpu_ms"] = df["seq"].map(gpu).astype("float64")
    return df[SAMPLE_COLUMNS].reset_index(drop=True)


def report(sync: bool = True):
    """One row per phase: n, mean/p50/p99/last/total (ms), share of the step, GPU mean.

    n, mean, total and last are exact; p50/p99 come from the retained raw samples. ``share``
    is the phase's total over the total of the ``step`` pseudo-phase (NaN without step marks).
    """
    pd = _pd()
    raw = samples(sync)
    with _S.lock:
        stats = {
            k: (v.n, v.total_ns, v.last_ns, v.gpu_n, v.gpu_total_ms, v.depth, v.parent)
            for k, v in _S.stats.items()
        }
    q = raw.groupby("phase")["host_ms"].quantile([0.5, 0.99]).unstack() if len(raw) else None
    step_total = stats[STEP][1] / 1e6 if STEP in stats else math.nan
    rows = []
    for name, (n, total_ns, last_ns, gpu_n, gpu_total, depth, parent) in stats.items():
        total_ms = total_ns / 1e6
        has_q = q is not None and name in q.index
        rows.append(
            {
                "phase": name,
                "n": n,
                "mean_ms": total_ms / n,
                "p50_ms": float(q.loc[name, 0.5]) if has_q else math.nan,
                "p99_ms": float(q.loc[name, 0.99]) if has_q else math.nan,
                "last_ms": last_ns / 1e6,
                "total_ms": total_ms,
                "share": total_ms / step_total if step_total and step_total > 0 else math.nan,
                "gpu_n": gpu_n,
                "gpu_mean_ms": gpu_total / gpu_n if gpu_n else math.nan,
                "depth": depth,
                "parent": parent,
            }
        )
    df = pd.DataFrame(rows, columns=REPORT_COLUMNS)
    return df.sort_values(["depth", "total_ms"], ascending=[True, False]).reset_index(drop=True)


def summarize(df):
    """``report()``'s table computed from a samples DataFrame (e.g. ``load_samples(path)``)."""
    pd = _pd()
    if missing := {"phase", "host_ms", "gpu_ms", "depth", "parent", "seq"} - set(df.columns):
        raise ValueError(f"df: missing sample columns {sorted(missing)}")
    rows = []
    steps = df.loc[df["phase"] == STEP, "host_ms"].sum()
    for name, g in df.sort_values("seq").groupby("phase", sort=False):
        h, gpu = g["host_ms"], g["gpu_ms"].dropna()
        rows.append(
            {
                "phase": name,
                "n": len(g),
                "mean_ms": h.mean(),
                "p50_ms": h.quantile(0.5),
                "p99_ms": h.quantile(0.99),
                "last_ms": h.iloc[-1],
                "total_ms": h.sum(),
                "share": h.sum() / steps if steps > 0 else math.nan,
                "gpu_n": len(gpu),
                "gpu_mean_ms": gpu.mean() if len(gpu) else math.nan,
                "depth": int(g["depth"].iloc[0]),
                "parent": g["parent"].iloc[0],
            }
        )
    out = pd.DataFrame(rows, columns=REPORT_COLUMNS)
    return out.sort_values(["depth", "total_ms"], ascending=[True, False]).reset_index(drop=True)


def chrome_trace(sync: bool = True) -> dict:
    """The samples as a Chrome/Perfetto trace dict (``ts``/``dur`` in µs from the Unix epoch)."""
    df = samples(sync)
    with _S.lock:
        names = dict(_S.thread_names)
    pid = os.getpid()
    events: list[dict] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "args": {"name": f"kdtree pid {pid}"},
        }
    ]
    for tid, tname in names.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}}
        )
    for row in df.itertuples(index=False):
        args = {
            "step": int(row.step),
            "depth": int(row.depth),
            "parent": row.parent,
            "seq": int(row.seq),
        }
        if not math.isnan(row.gpu_ms):
            args["gpu_ms"] = float(row.gpu_ms)
        events.append(
            {
                "name": row.phase,
                "cat": "kdtree",
                "ph": "X",
                "pid": int(row.pid),
                "tid": int(row.tid),
                "ts": row.start_ns / 1e3,
                "dur": row.dur_ns / 1e3,
                "args": args,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "unix_epoch", "producer": "kdtree.profiler"},
    }


def export_chrome_trace(path: str | Path, sync: bool = True) -> Path:
    """Write ``chrome_trace()`` as JSON (open in https://ui.perfetto.dev)."""
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(sync)))
    return path


def load_chrome_trace(path: str | Path):
    """Read a Chrome trace (ours or any ``ph: X`` events) back into ``SAMPLE_COLUMNS``."""
    import json

    pd = _pd()
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON Chrome trace ({exc})") from exc
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    rows = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        args = ev.get("args", {})
        start_ns = round(float(ev["ts"]) * 1e3)
        dur_ns = round(float(ev.get("dur", 0.0)) * 1e3)
        rows.append(
            {
                "seq": args.get("seq", len(rows)),
                "phase": ev["name"],
                "parent": args.get("parent", ""),
                "depth": args.get("depth", 0),
                "step": args.get("step", -1),
                "pid": ev.get("pid", 0),
                "tid": ev.get("tid", 0),
                "start_ns": start_ns,
                "dur_ns": dur_ns,
                "host_ms": dur_ns / 1e6,
                "gpu_ms": args.get("gpu_ms", math.nan),
            }
        )
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def save(out_dir: str | Path | None = None, sync: bool = True) -> dict[str, Path]:
    """Write ``samples.parquet``, ``trace.json`` and ``report.csv`` under ``out_dir``.

    Default folder: ``KDTREE_PROFILE_DIR`` / ``enable(out_dir=...)``; file names carry the pid.
    """
    out = Path(out_dir) if out_dir is not None else _S.out_dir
    out.mkdir(parents=True, exist_ok=True)
    tag = f"kdtree-prof-{os.getpid()}"
    paths = {
        "samples": out / f"{tag}.samples.parquet",
        "trace": out / f"{tag}.trace.json",
        "report": out / f"{tag}.report.csv",
    }
    samples(sync).to_parquet(paths["samples"], index=False)
    export_chrome_trace(paths["trace"], sync=False)
    report(sync=False).to_csv(paths["report"], index=False)
    return paths


def load_samples(path: str | Path):
    """Read a samples Parquet file written by ``save``."""
    return _pd().read_parquet(path)


# --------------------------------------------------------------------------- log parsing

_LINE_RE = re.compile(r"\[kdtree-prof\]\s+(?P<phase>.+?):\s+n=(?P<n>\d+)(?P<rest>.*)$")
_FIELD_RE = re.compile(
    r"(?P<key>[a-z0-9_]+)=(?P<val>[-+]?(?:nan|inf|[0-9.]+(?:e[-+]?\d+)?))(?:ms)?", re.IGNORECASE
)
_JOURNAL_RE = re.compile(
    r"^(?P<time>[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d(?:\.\d+)?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+"
    r"(?P<host>\S+)\s+[^\s\[]+\[(?P<pid>\d+)\]:"
)
_PID_RE = re.compile(r"\bpid[=:\s]\s*(\d+)|\b[A-Za-z_][\w.-]*\[(\d+)\]:", re.IGNORECASE)
_RANK_RE = re.compile(r"(?:\b[Rr][Aa][Nn][Kk]|\[default|\bTP)[\s=:#_-]?(\d+)")
_TIME_RE = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?")
_FIELD_COLUMNS = {
    "mean": "mean_ms",
    "last": "last_ms",
    "p50": "p50_ms",
    "p99": "p99_ms",
    "gpu_mean": "gpu_mean_ms",
}


def parse_log(source: str | Path, latest: bool = False):
    """Read ``[kdtree-prof]`` lines from any text (plain log, ``journalctl`` output, ...).

    ``source`` is a path or the text itself. Returns ``REPORT_COLUMNS`` plus ``pid``, ``rank``,
    ``host`` (from ``journalctl``/logging prefixes, NA when absent), ``time`` and ``line``
    (1-based line number), one row per log line; ``latest=True`` keeps the last line of each
    (pid, rank, host, phase). ``share`` uses the ``step`` line of the same process.
    """
    pd = _pd()
    text = _read_text(source)
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _LINE_RE.search(line)
        if m is None:
            continue
        prefix = line[: m.start()]
        row: dict[str, Any] = {"phase": m["phase"].strip(), "n": int(m["n"])}
        for f in _FIELD_RE.finditer(m["rest"]):
            col = _FIELD_COLUMNS.get(f["key"].lower())
            if col is not None:
                row[col] = float(f["val"])
        if "mean_ms" not in row:
            raise ValueError(f"line {lineno}: [kdtree-prof] line without mean=...ms: {line!r}")
        row.update(_prefix_fields(prefix))
        row["line"] = lineno
        rows.append(row)
    keys = ["pid", "rank", "host"]
    cols = REPORT_COLUMNS + keys + ["time", "line"]
    df = pd.DataFrame(rows, columns=cols)
    if df.empty:
        return df
    df["n"] = df["n"].astype("int64")
    df["total_ms"] = df["n"] * df["mean_ms"]
    df["gpu_n"] = pd.array([pd.NA] * len(df), dtype="Int64")
    for k in ("pid", "rank"):
        df[k] = pd.array(df[k], dtype="Int64")
    df["host"] = df["host"].astype("string")
    # share: this line's total over the latest step total of the same process seen so far
    group = df[keys].astype("string").fillna("").agg("|".join, axis=1)
    step_total = df["total_ms"].where(df["phase"] == STEP)
    step_total = step_total.groupby(group).ffill()
    df["share"] = df["total_ms"] / step_total
    if latest:
        df = df.assign(_group=group).drop_duplicates(["_group", "phase"], keep="last")
    return df[cols].reset_index(drop=True)


def _read_text(source: str | Path) -> str:
    if isinstance(source, Path):
        return source.read_text(errors="replace")
    if not isinstance(source, str):
        raise TypeError(f"parse_log(source={type(source).__name__}): expected a path or text")
    if "\n" not in source and len(source) < 4096:
        p = Path(source)
        if p.is_file():
            return p.read_text(errors="replace")
    return source


def _prefix_fields(prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {"pid": None, "rank": None, "host": None, "time": None}
    j = _JOURNAL_RE.search(prefix)
    if j is not None:
        out.update(time=j["time"], host=j["host"], pid=int(j["pid"]))
        prefix = prefix[j.end() :]
    if out["pid"] is None:
        p = _PID_RE.search(prefix)
        if p is not None:
            out["pid"] = int(p.group(1) or p.group(2))
    r = _RANK_RE.search(prefix)
    if r is not None:
        out["rank"] = int(r.group(1))
    if out["time"] is None:
        t = _TIME_RE.search(prefix)
        if t is not None:
            out["time"] = t.group(0)
    return out


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
