"""One schema for every trace: a series table, an interval table and free-form metadata.

- ``series``: ``t_ns`` (int64, Unix-epoch nanoseconds where the source has a wall clock, else
  nanoseconds from the start of the recording), ``metric`` (str), ``value`` (float64),
  ``source`` (str: ``cupti``, ``nsys``, ``ncu``, ``kineto``, ``csv`` ...). ``t_ns`` marks the
  *start* of the sampling window the value averages over.
- ``intervals``: ``start_ns``, ``end_ns`` (int64, same clock as the series), ``name`` (str),
  ``kind`` (one of :data:`INTERVAL_KINDS`), ``source`` (str; an extension of the contract's four
  columns that tells host phases from GPU-side ones).
- ``meta``: a JSON-serialisable dict (clock, units, sampling interval, calibration ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SERIES_COLUMNS = ("t_ns", "metric", "value", "source")
INTERVAL_COLUMNS = ("start_ns", "end_ns", "name", "kind", "source")
INTERVAL_KINDS = frozenset({"phase", "kernel", "nvtx", "step", "gap", "burst"})
DRAM_METRIC = "dram__throughput.avg.pct_of_peak_sustained_elapsed"


class TraceFormatError(ValueError):
    """Malformed trace input: names the file, the line (or field) and what was expected."""

    def __init__(
        self,
        path: str | Path | None,
        expected: str,
        *,
        line: int | None = None,
        field: str | None = None,
        got: Any = None,
    ) -> None:
        where = str(path) if path is not None else "<trace>"
        if line is not None:
            where += f":{line}"
        parts = [where]
        if field is not None:
            parts.append(f"field {field!r}")
        msg = ": ".join(parts) + f": expected {expected}"
        if got is not None:
            msg += f", got {got!r}"
        super().__init__(msg)
        self.path, self.line, self.field, self.expected, self.got = (
            path,
            line,
            field,
            expected,
            got,
        )


def empty_series() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "t_ns": pd.Series([], dtype="int64"),
            "metric": pd.Series([], dtype="object"),
            "value": pd.Series([], dtype="float64"),
            "source": pd.Series([], dtype="object"),
        }
    )


def empty_intervals() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "start_ns": pd.Series([], dtype="int64"),
            "end_ns": pd.Series([], dtype="int64"),
            "name": pd.Series([], dtype="object"),
            "kind": pd.Series([], dtype="object"),
            "source": pd.Series([], dtype="object"),
        }
    )


def make_series(t_ns, metric, value, source: str) -> pd.DataFrame:
    """Build a series table; ``metric`` may be one name or one per sample."""
    t = np.asarray(t_ns, dtype=np.int64)
    v = np.asarray(value, dtype=np.float64)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError(
            f"t_ns and value must be 1-D of equal length, got {t.shape} and {v.shape}"
        )
    m = [metric] * len(t) if isinstance(metric, str) else list(metric)
    if len(m) != len(t):
        raise ValueError(f"metric: expected {len(t)} names, got {len(m)}")
    df = pd.DataFrame({"t_ns": t, "metric": m, "value": v, "source": source})
    return df.astype({"metric": "object", "source": "object"})


def make_intervals(start_ns, end_ns, name, kind, source: str) -> pd.DataFrame:
    """Build an interval table; ``name``/``kind`` may be scalars or one per interval."""
    s = np.asarray(start_ns, dtype=np.int64)
    e = np.asarray(end_ns, dtype=np.int64)
    if s.shape != e.shape or s.ndim != 1:
        raise ValueError(
            f"start_ns and end_ns must be 1-D of equal length, got {s.shape}, {e.shape}"
        )
    n = len(s)
    names = [name] * n if isinstance(name, str) else list(name)
    kinds = [kind] * n if isinstance(kind, str) else list(kind)
    bad = set(kinds) - INTERVAL_KINDS
    if bad:
        raise ValueError(f"kind: expected one of {sorted(INTERVAL_KINDS)}, got {sorted(bad)}")
    if n and (e < s).any():
        i = int(np.argmax(e < s))
        raise ValueError(f"interval {i}: end_ns {e[i]} < start_ns {s[i]}")
    df = pd.DataFrame({"start_ns": s, "end_ns": e, "name": names, "kind": kinds, "source": source})
    return df.astype({"name": "object", "kind": "object", "source": "object"})


def validate_series(df: pd.DataFrame, where: str = "series") -> pd.DataFrame:
    missing = [c for c in SERIES_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: missing columns {missing}; expected {list(SERIES_COLUMNS)}")
    out = df[list(SERIES_COLUMNS)].copy()
    out["t_ns"] = out["t_ns"].astype("int64")
    out["value"] = out["value"].astype("float64")
    out["metric"] = out["metric"].astype("object")
    out["source"] = out["source"].astype("object")
    return out.sort_values(["metric", "t_ns"], kind="stable").reset_index(drop=True)


def validate_intervals(df: pd.DataFrame, where: str = "intervals") -> pd.DataFrame:
    cols = list(INTERVAL_COLUMNS)
    df = df.copy()
    if "source" not in df.columns:
        df["source"] = ""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: missing columns {missing}; expected {cols}")
    out = df[cols].copy()
    out["start_ns"] = out["start_ns"].astype("int64")
    out["end_ns"] = out["end_ns"].astype("int64")
    for c in ("name", "kind", "source"):
        out[c] = out[c].astype("object")
    bad = set(out["kind"].unique()) - INTERVAL_KINDS
    if bad:
        raise ValueError(
            f"{where}: kind expected one of {sorted(INTERVAL_KINDS)}, got {sorted(bad)}"
        )
    if (out["end_ns"] < out["start_ns"]).any():
        i = int(np.argmax((out["end_ns"] < out["start_ns"]).to_numpy()))
        raise ValueError(f"{where}: row {i} has end_ns < start_ns")
    return out.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)


@dataclass
class Trace:
    """A DRAM (or any metric) time series plus named intervals on the same clock."""

    series: pd.DataFrame = field(default_factory=empty_series)
    intervals: pd.DataFrame = field(default_factory=empty_intervals)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.series = validate_series(self.series)
        self.intervals = validate_intervals(self.intervals)

    @property
    def metrics(self) -> list[str]:
        return sorted(self.series["metric"].unique().tolist())

    def metric(self, name: str | None = None) -> pd.DataFrame:
        """Rows of one metric sorted by time; ``None`` picks the DRAM metric (see below)."""
        name = pick_metric(self.metrics, name)
        rows = self.series[self.series["metric"] == name]
        return rows.sort_values("t_ns", kind="stable").reset_index(drop=True)

    def with_intervals(self, extra: pd.DataFrame) -> Trace:
        """A new trace with ``extra`` intervals appended (e.g. profiler phases)."""
        both = pd.concat([self.intervals, validate_intervals(extra)], ignore_index=True)
        return Trace(self.series, both, dict(self.meta))

    def window(self, start_ns: int, end_ns: int) -> Trace:
        """Samples and intervals that fall inside ``[start_ns, end_ns)``."""
        s = self.series
        s = s[(s["t_ns"] >= start_ns) & (s["t_ns"] < end_ns)]
        iv = self.intervals
        iv = iv[(iv["end_ns"] > start_ns) & (iv["start_ns"] < end_ns)]
        return Trace(s, iv, dict(self.meta))


def pick_metric(metrics: list[str], name: str | None) -> str:
    """Resolve a metric name: exact, else the only one, else the first containing ``dram``."""
    if not metrics:
        raise ValueError("trace has no series samples")
    if name is not None:
        if name in metrics:
            return name
        matches = [m for m in metrics if name in m]
        if len(matches) == 1:
            return matches[0]
        raise ValueError(f"metric {name!r}: expected one of {metrics}")
    if len(metrics) == 1:
        return metrics[0]
    if DRAM_METRIC in metrics:
        return DRAM_METRIC
    dram = [m for m in metrics if "dram" in m.lower()]
    if dram:
        return dram[0]
    raise ValueError(
        f"metric: several metrics and none with 'dram' in its name; pass one of {metrics}"
    )
