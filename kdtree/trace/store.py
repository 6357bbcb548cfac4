"""Our own capture format: two CSV tables plus a JSON sidecar (no pyarrow needed on the GPU box).

A trace called ``NAME`` is three files side by side::

    NAME.trace.json      {"format": "kdtree-trace", "version": 1,
                          "series": "NAME.series.csv", "intervals": "NAME.intervals.csv",
                          "meta": {...}}
    NAME.series.csv      t_ns,metric,value,source
    NAME.intervals.csv   start_ns,end_ns,name,kind,source

The tables may be gzipped (``NAME.series.csv.gz``; the sidecar names the files). Any of the
three paths (or ``NAME`` itself) opens the trace.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree.trace.schema import (
    INTERVAL_COLUMNS,
    INTERVAL_KINDS,
    SERIES_COLUMNS,
    Trace,
    TraceFormatError,
)

FORMAT = "kdtree-trace"
VERSION = 1
_SUFFIXES = (
    ".trace.json", ".series.csv.gz", ".intervals.csv.gz", ".series.csv", ".intervals.csv",
)  # fmt: skip


def trace_stem(path: str | Path) -> Path:
    """``dir/NAME`` for any of ``NAME``, ``NAME.trace.json``, ``NAME.series.csv`` ..."""
    p = Path(path)
    for suf in _SUFFIXES:
        if p.name.endswith(suf):
            return p.with_name(p.name[: -len(suf)])
    return p


def is_native(path: str | Path) -> bool:
    """True for our sidecar (checked by content: ``kdtree.profiler`` also writes
    ``*.trace.json``, in Chrome format), our CSV tables, or a stem with a sidecar next to it."""
    p = Path(path)
    if p.name.endswith(_SUFFIXES[1:]):
        return True
    side = p if p.name.endswith(".trace.json") else p.with_name(p.name + ".trace.json")
    if not side.is_file():
        return False
    with side.open(errors="replace") as fh:
        head = fh.read(4096)
    return f'"format": "{FORMAT}"' in head or f'"format":"{FORMAT}"' in head


def save_trace(trace: Trace, path: str | Path, *, compress: bool = False) -> Path:
    """Write ``trace`` as ``NAME.trace.json`` + two CSVs (``.csv.gz`` with ``compress``);
    returns the sidecar's path."""
    stem = trace_stem(path)
    stem.parent.mkdir(parents=True, exist_ok=True)
    ext = ".csv.gz" if compress else ".csv"
    series_p = stem.with_name(stem.name + ".series" + ext)
    iv_p = stem.with_name(stem.name + ".intervals" + ext)
    side_p = stem.with_name(stem.name + ".trace.json")
    trace.series.to_csv(series_p, index=False, columns=list(SERIES_COLUMNS))
    trace.intervals.to_csv(iv_p, index=False, columns=list(INTERVAL_COLUMNS))
    side = {
        "format": FORMAT,
        "version": VERSION,
        "series": series_p.name,
        "intervals": iv_p.name,
        "meta": trace.meta,
    }
    side_p.write_text(json.dumps(side, indent=1, default=_json_default) + "\n")
    return side_p


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def load_native(path: str | Path) -> Trace:
    """Read a trace written by :func:`save_trace`, checking every row."""
    stem = trace_stem(path)
    side_p = stem.with_name(stem.name + ".trace.json")
    meta: dict = {}
    series_p = stem.with_name(stem.name + ".series.csv")
    iv_p = stem.with_name(stem.name + ".intervals.csv")
    if not series_p.exists() and series_p.with_name(series_p.name + ".gz").exists():
        series_p = series_p.with_name(series_p.name + ".gz")
        iv_p = iv_p.with_name(iv_p.name + ".gz")
    if side_p.exists():
        try:
            side = json.loads(side_p.read_text())
        except json.JSONDecodeError as exc:
            raise TraceFormatError(side_p, "valid JSON", line=exc.lineno, got=exc.msg) from None
        if not isinstance(side, dict) or side.get("format") != FORMAT:
            got = side.get("format") if isinstance(side, dict) else type(side).__name__
            raise TraceFormatError(side_p, f'"format": "{FORMAT}"', field="format", got=got)
        if side.get("version") != VERSION:
            raise TraceFormatError(
                side_p, f"version {VERSION}", field="version", got=side.get("version")
            )
        meta = side.get("meta") or {}
        series_p = side_p.with_name(side.get("series", series_p.name))
        iv_p = side_p.with_name(side.get("intervals", iv_p.name))
    if not series_p.exists() and not iv_p.exists():
        raise FileNotFoundError(f"{path}: no {series_p.name} or {iv_p.name} next to it")
    series = _read_table(series_p, SERIES_COLUMNS, ("t_ns",), ("value",))
    intervals = _read_table(iv_p, INTERVAL_COLUMNS, ("start_ns", "end_ns"), ())
    if len(intervals):
        bad = ~intervals["kind"].isin(INTERVAL_KINDS)
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise TraceFormatError(
                iv_p,
                f"one of {sorted(INTERVAL_KINDS)}",
                line=i + 2,
                field="kind",
                got=intervals["kind"].iloc[i],
            )
        neg = intervals["end_ns"] < intervals["start_ns"]
        if neg.any():
            i = int(np.argmax(neg.to_numpy()))
            raise TraceFormatError(iv_p, "end_ns >= start_ns", line=i + 2, field="end_ns")
    return Trace(series, intervals, meta)


def _read_table(path: Path, columns, int_cols, float_cols) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame({c: [] for c in columns})
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in columns if c not in raw.columns and c != "source"]
    if missing:
        raise TraceFormatError(
            path, f"header with columns {list(columns)}", line=1, got=list(raw.columns)
        )
    if "source" not in raw.columns:
        raw["source"] = ""
    out = raw[list(columns)].copy()
    for col in (*int_cols, *float_cols):
        out[col] = parse_numeric_column(path, raw[col], col, integer=col in int_cols)
    return out


def parse_numeric_column(path, col: pd.Series, name: str, *, integer: bool, first_line: int = 2):
    """Parse strings to numbers; the first bad cell raises with its file line (header = 1)."""
    num = pd.to_numeric(col.str.strip(), errors="coerce")
    bad = num.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        what = "an integer" if integer else "a number"
        raise TraceFormatError(path, what, line=i + first_line, field=name, got=col.iloc[i])
    if integer:
        if not np.all(np.mod(num.to_numpy(dtype=np.float64), 1) == 0):
            i = int(np.argmax(np.mod(num.to_numpy(dtype=np.float64), 1) != 0))
            raise TraceFormatError(
                path, "an integer", line=i + first_line, field=name, got=col.iloc[i]
            )
        # large epoch-ns values lose precision as float: reparse exactly as int64
        return col.str.strip().map(lambda s: int(s) if s.lstrip("-").isdigit() else int(float(s)))
    return num.astype("float64")
