"""Plain CSV time series: a time column then one or more value columns.

The header is optional (a first row whose time cell is not a number is the header). The time
unit is ``time_unit`` when given (``s``, ``ms``, ``us``, ``ns``), else read from the header
(``t_ns``, ``time_us``, ``time (ms)``, ``seconds`` ...), else guessed: Unix-epoch magnitudes
(1e9 s, 1e12 ms, 1e15 us, 1e18 ns) are unambiguous; relative times take the unit that puts the
median sampling step closest to 100 us on a log scale. ``meta['time_unit_from']`` says which rule
decided.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np

from kdtree.trace.schema import Trace, TraceFormatError, empty_intervals, make_series

UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_UNIT_WORDS = {
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "ms": "ms", "msec": "ms", "millisecond": "ms", "milliseconds": "ms", "msecond": "ms",
    "us": "us", "µs": "us", "usec": "us", "microsecond": "us", "microseconds": "us",
    "usecond": "us",
    "ns": "ns", "nsec": "ns", "nanosecond": "ns", "nanoseconds": "ns", "nsecond": "ns",
}  # fmt: skip


def normalize_unit(unit: str, *, where: str = "time_unit") -> str:
    u = _UNIT_WORDS.get(unit.strip().lower())
    if u is None:
        raise ValueError(f"{where}={unit!r}: expected one of s, ms, us, ns")
    return u


def unit_from_header(name: str) -> str | None:
    """``t_ns`` -> ns, ``time (ms)`` -> ms, ``timestamp_us`` -> us, ``seconds`` -> s."""
    tokens = [t for t in re.split(r"[^a-zµ]+", name.lower()) if t]
    for tok in reversed(tokens):
        if tok in _UNIT_WORDS:
            return _UNIT_WORDS[tok]
    return None


def guess_unit(t: np.ndarray) -> tuple[str, str]:
    """Guess the unit of a time column; returns ``(unit, rule)``."""
    if len(t) == 0:
        raise ValueError("cannot guess the time unit of an empty column")
    first = float(np.nanmedian(t))
    # Unix epoch between 2001 and 2100 in each unit
    for unit, lo, hi in (("s", 1e9, 4.1e9), ("ms", 1e12, 4.1e12), ("us", 1e15, 4.1e15),
                         ("ns", 1e18, 4.1e18)):  # fmt: skip
        if lo <= first < hi:
            return unit, "epoch magnitude"
    steps = np.diff(np.sort(t))
    steps = steps[steps > 0]
    if len(steps) == 0:
        return "ns", "default (single time value)"
    dt = float(np.median(steps))
    target = math.log10(100e3)  # 100 us in ns
    best = min(UNIT_NS, key=lambda u: abs(math.log10(dt * UNIT_NS[u]) - target))
    return best, f"median step {dt:g} closest to 100 us"


def load_plain_csv(
    path: str | Path,
    *,
    time_unit: str | None = None,
    metric: str | None = None,
    source: str = "csv",
) -> Trace:
    """Load ``time,value[,value...]`` rows into the series table (one metric per value column)."""
    path = Path(path)
    rows: list[tuple[int, list[str]]] = []
    with path.open(newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
                continue
            rows.append((lineno, row))
    if not rows:
        raise TraceFormatError(path, "a time column and a value column", line=1, got="empty file")
    header: list[str] | None = None
    if not _is_number(rows[0][1][0]):
        header = [c.strip() for c in rows[0][1]]
        rows = rows[1:]
    if not rows:
        raise TraceFormatError(path, "at least one data row after the header", line=2)
    ncols = len(header) if header else len(rows[0][1])
    if ncols < 2:
        raise TraceFormatError(
            path, "at least 2 columns (time, value)", line=rows[0][0], got=ncols
        )
    names = header[1:] if header else None
    if names is None:
        names = [metric or "value"] if ncols == 2 else [f"value{i}" for i in range(1, ncols)]
    elif metric is not None and ncols == 2:
        names = [metric]
    tcol = header[0] if header else "time"
    times = np.empty(len(rows), dtype=np.float64)
    raw_times: list[str] = []
    values = np.empty((len(rows), ncols - 1), dtype=np.float64)
    for i, (lineno, row) in enumerate(rows):
        if len(row) != ncols:
            raise TraceFormatError(path, f"{ncols} columns", line=lineno, got=len(row))
        cell = row[0].strip()
        if not _is_number(cell):
            raise TraceFormatError(path, "a number", line=lineno, field=tcol, got=row[0])
        times[i] = float(cell)
        raw_times.append(cell)
        for j in range(1, ncols):
            v = row[j].strip()
            if not _is_number(v):
                field = header[j] if header else f"column {j + 1}"
                raise TraceFormatError(path, "a number", line=lineno, field=field, got=row[j])
            values[i, j - 1] = float(v)
    if time_unit is not None:
        unit, rule = normalize_unit(time_unit), "given"
    elif header and (hu := unit_from_header(tcol)) is not None:
        unit, rule = hu, f"header {tcol!r}"
    else:
        unit, rule = guess_unit(times)
    t_ns = _to_ns(raw_times, times, unit)
    order = np.argsort(t_ns, kind="stable")
    frames = [
        make_series(t_ns[order], name, values[order, j], source) for j, name in enumerate(names)
    ]
    import pandas as pd

    series = pd.concat(frames, ignore_index=True)
    epoch = t_ns.size > 0 and 1e18 <= float(np.median(t_ns)) < 4.1e18
    meta = {
        "source_file": str(path),
        "format": "plain-csv",
        "time_unit": unit,
        "time_unit_from": rule,
        "clock": "unix_epoch_ns" if epoch else "relative_ns",
    }
    return Trace(series, empty_intervals(), meta)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return s.strip().lower() not in ("nan", "inf", "-inf", "+inf", "infinity")


def _to_ns(raw: list[str], t: np.ndarray, unit: str) -> np.ndarray:
    """Convert to int64 ns; integer strings are converted exactly (epoch ns exceed float64)."""
    scale = UNIT_NS[unit]
    if all(r.lstrip("-").isdigit() for r in raw):
        return np.array([int(r) * scale for r in raw], dtype=np.int64)
    return np.round(t * scale).astype(np.int64)
