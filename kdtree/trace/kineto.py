"""Chrome-trace JSON from the PyTorch profiler (Kineto) or from ``kdtree.profiler``.

Complete events (``"ph": "X"``) become intervals: categories ``kernel``, ``gpu_memcpy`` and
``gpu_memset`` are ``kernel`` intervals; ``user_annotation`` (``record_function``) and any
category Kineto does not use (our profiler's phases) are ``phase`` intervals, or ``step`` for
step marks (``ProfilerStep#N``, ``step``). Op-level categories (``cpu_op``, ``cuda_runtime`` ...)
and ``gpu_user_annotation`` (a GPU-side copy of the annotations) are skipped. Timestamps are
microseconds: relative to ``baseTimeNanoseconds`` when the file has it, else absolute Unix-epoch
microseconds (recognised by magnitude) or relative. A ``gpu_busy_pct`` series is derived from
the kernels so the burst/gap analysis runs on Kineto traces too.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree.trace.busy import annotation_kind, kernel_busy_series
from kdtree.trace.schema import Trace, TraceFormatError, empty_intervals, empty_series

KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
SKIP_CATS = {
    "cpu_op", "cuda_runtime", "cuda_driver", "python_function", "trace", "overhead", "ac2g",
    "fwdbwd", "gpu_user_annotation", "cpu_instant_event", "flow", "memory", "mtia_runtime",
    "privateuse1_runtime", "xpu_runtime",
}  # fmt: skip


def _read_json(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, "valid JSON (Chrome trace)", line=exc.lineno,
                               got=exc.msg) from None  # fmt: skip


def looks_like_chrome_trace(path: str | Path) -> bool:
    p = Path(path)
    name = p.name.lower()
    if not (name.endswith(".json") or name.endswith(".json.gz")):
        return False
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return '"traceEvents"' in head or head.lstrip().startswith("[")


def load_chrome_trace(path: str | Path, *, busy_bin_us: float = 100.0) -> Trace:
    """Load kernel, phase and step intervals (+ a derived busy series) from a Chrome trace."""
    path = Path(path)
    doc = _read_json(path)
    if isinstance(doc, list):
        events, base_ns = doc, None
    elif isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise TraceFormatError(path, 'a "traceEvents" list', field="traceEvents",
                                   got=sorted(doc)[:8])  # fmt: skip
        events = doc["traceEvents"]
        base_ns = doc.get("baseTimeNanoseconds")
        if base_ns is not None and not isinstance(base_ns, int | float | str):
            raise TraceFormatError(path, "an integer", field="baseTimeNanoseconds", got=base_ns)
    else:
        raise TraceFormatError(path, "a JSON object or array", got=type(doc).__name__)
    if not isinstance(events, list):
        raise TraceFormatError(path, "a list", field="traceEvents", got=type(events).__name__)
    starts, ends, names, kinds, sources = [], [], [], [], []
    skipped: dict[str, int] = {}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise TraceFormatError(path, "an event object", field=f"traceEvents[{i}]", got=ev)
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        name = str(ev.get("name", ""))
        is_step = cat != "gpu_user_annotation" and annotation_kind(name) == "step"
        if cat in SKIP_CATS and not is_step:  # old Kineto files ProfilerStep#N under cpu_op
            skipped[cat] = skipped.get(cat, 0) + 1
            continue
        ts = _num(path, ev, "ts", i)
        dur = _num(path, ev, "dur", i)
        if dur < 0:
            raise TraceFormatError(path, "dur >= 0", field=f"traceEvents[{i}].dur", got=dur)
        if cat in KERNEL_CATS:
            kind, src = "kernel", f"kineto:{cat}"
        else:
            kind, src = annotation_kind(name), f"kineto:{cat or 'annotation'}"
        starts.append(ts)
        ends.append(ts + dur)
        names.append(name)
        kinds.append(kind)
        sources.append(src)
    s_us = np.asarray(starts, dtype=np.float64)
    e_us = np.asarray(ends, dtype=np.float64)
    if base_ns is not None:
        base, clock = int(float(base_ns)), "unix_epoch_ns"
    elif len(s_us) and 1e15 <= float(np.median(s_us)) < 4.1e15:
        base, clock = 0, "unix_epoch_ns"
    else:
        base, clock = 0, "relative_ns"
    if starts:
        intervals = pd.DataFrame({
            "start_ns": base + np.round(s_us * 1000).astype(np.int64),
            "end_ns": base + np.round(e_us * 1000).astype(np.int64),
            "name": names, "kind": kinds, "source": sources,
        })  # fmt: skip
    else:
        intervals = empty_intervals()
    series = empty_series()
    if (intervals["kind"] == "kernel").any():
        series = kernel_busy_series(intervals, int(busy_bin_us * 1000), "kineto")
    meta = {"source_file": str(path), "format": "chrome-trace", "clock": clock,
            "base_time_ns": base or None, "skipped_categories": skipped,
            "derived_series": "gpu_busy_pct from kernel intervals" if len(series) else None}  # fmt: skip
    return Trace(series, intervals, meta)


def _num(path, ev: dict, key: str, i: int) -> float:
    v = ev.get(key)
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            v = None
    if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v):
        raise TraceFormatError(path, "a number (microseconds)", field=f"traceEvents[{i}].{key}",
                               got=ev.get(key))  # fmt: skip
    return float(v)
