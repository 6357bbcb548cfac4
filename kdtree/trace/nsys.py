"""Nsight Systems SQLite exports (``nsys export --type sqlite``).

Reads ``GPU_METRICS`` joined with ``TARGET_INFO_GPU_METRICS`` (the sampled DRAM/SM throughput
series), ``CUPTI_ACTIVITY_KIND_KERNEL`` (+ memcpy/memset when present) as ``kernel`` intervals and
``NVTX_EVENTS`` ranges as ``nvtx`` intervals (``step`` for step marks), with names resolved
through ``StringIds``. nsys timestamps count from the session start; when
``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` is present they are shifted to Unix-epoch ns.
Without ``GPU_METRICS``, a ``gpu_busy_pct`` series is derived from the kernels.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree.trace.busy import annotation_kind, kernel_busy_series
from kdtree.trace.schema import Trace, TraceFormatError, empty_intervals, empty_series


def is_sqlite(path: str | Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _tables(con: sqlite3.Connection) -> set[str]:
    return {
        r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")
    }


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _require(path, con, table: str, cols: tuple[str, ...]) -> None:
    have = _columns(con, table)
    for c in cols:
        if c not in have:
            raise TraceFormatError(path, f"column {c} in table {table}", field=f"{table}.{c}",
                                   got=sorted(have))  # fmt: skip


def _check_not_null(path, df: pd.DataFrame, table: str, cols: tuple[str, ...]) -> None:
    for c in cols:
        bad = df[c].isna().to_numpy()
        if bad.any():
            rowid = int(df["rowid"].iloc[int(np.argmax(bad))])
            raise TraceFormatError(path, f"a non-null integer in {table}.{c}",
                                   line=rowid, field=f"{table}.{c}")  # fmt: skip


def load_nsys_sqlite(path: str | Path, *, busy_bin_us: float = 100.0) -> Trace:
    """Load series and intervals from an nsys SQLite export (``line`` in errors = SQLite rowid)."""
    path = Path(path)
    if not is_sqlite(path):
        raise TraceFormatError(path, "an SQLite database (nsys export --type sqlite)", line=1)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = _tables(con)
        known = {"GPU_METRICS", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"}
        if not tables & known:
            raise TraceFormatError(path, f"at least one of the tables {sorted(known)}",
                                   got=sorted(tables))  # fmt: skip
        offset, clock = 0, "nsys_session_ns"
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            _require(path, con, "TARGET_INFO_SESSION_START_TIME", ("utcEpochNs",))
            row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            if row and row[0] is not None:
                offset, clock = int(row[0]), "unix_epoch_ns"
        strings = _strings(path, con, tables)
        series = _gpu_metrics(path, con, tables) if "GPU_METRICS" in tables else empty_series()
        frames = []
        if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
            frames.append(_kernels(path, con, strings))
        for table, label in (("CUPTI_ACTIVITY_KIND_MEMCPY", "[memcpy]"),
                             ("CUPTI_ACTIVITY_KIND_MEMSET", "[memset]")):  # fmt: skip
            if table in tables:
                frames.append(_plain_activity(path, con, table, label))
        if "NVTX_EVENTS" in tables:
            frames.append(_nvtx(path, con, strings))
        frames = [f for f in frames if len(f)]
        intervals = pd.concat(frames, ignore_index=True) if frames else empty_intervals()
    finally:
        con.close()
    derived = None
    if series.empty and len(intervals):
        series = kernel_busy_series(intervals, int(busy_bin_us * 1000), "nsys")
        derived = "gpu_busy_pct from kernel intervals"
    series = series.assign(t_ns=series["t_ns"].astype("int64") + offset)
    intervals = intervals.assign(
        start_ns=intervals["start_ns"].astype("int64") + offset,
        end_ns=intervals["end_ns"].astype("int64") + offset,
    )
    meta = {"source_file": str(path), "format": "nsys-sqlite", "clock": clock,
            "session_start_epoch_ns": offset or None, "derived_series": derived}  # fmt: skip
    return Trace(series, intervals, meta)


def _strings(path, con, tables) -> dict[int, str]:
    if "StringIds" not in tables:
        return {}
    _require(path, con, "StringIds", ("id", "value"))
    return dict(con.execute("SELECT id, value FROM StringIds").fetchall())


def _gpu_metrics(path, con, tables) -> pd.DataFrame:
    if "TARGET_INFO_GPU_METRICS" not in tables:
        raise TraceFormatError(path, "table TARGET_INFO_GPU_METRICS (metric names for GPU_METRICS)",
                               field="TARGET_INFO_GPU_METRICS")  # fmt: skip
    _require(path, con, "GPU_METRICS", ("timestamp", "typeId", "metricId", "value"))
    _require(path, con, "TARGET_INFO_GPU_METRICS", ("metricId", "metricName", "typeId"))
    df = pd.read_sql_query(
        "SELECT g.rowid AS rowid, g.timestamp AS t_ns, g.typeId AS type_id, "
        "t.metricName AS metric, g.value AS value "
        "FROM GPU_METRICS g LEFT JOIN TARGET_INFO_GPU_METRICS t "
        "ON g.metricId = t.metricId AND g.typeId = t.typeId",
        con,
    )
    _check_not_null(path, df, "GPU_METRICS", ("t_ns", "value"))
    if df["metric"].isna().any():
        rowid = int(df["rowid"][df["metric"].isna()].iloc[0])
        raise TraceFormatError(path, "a metricId listed in TARGET_INFO_GPU_METRICS", line=rowid,
                               field="GPU_METRICS.metricId")  # fmt: skip
    if df["type_id"].nunique() > 1:  # several GPUs: keep them apart
        df["metric"] = df["metric"] + " [gpu type " + df["type_id"].astype(str) + "]"
    df["source"] = "nsys"
    return df[["t_ns", "metric", "value", "source"]].astype({"t_ns": "int64", "value": "float64"})


def _kernels(path, con, strings) -> pd.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    _require(path, con, table, ("start", "end"))
    cols = _columns(con, table)
    name_col = next((c for c in ("shortName", "demangledName", "mangledName") if c in cols), None)
    sel = f", {name_col} AS name_id" if name_col else ""
    df = pd.read_sql_query(f"SELECT rowid, start, end{sel} FROM {table}", con)
    _check_not_null(path, df, table, ("start", "end"))
    if name_col:
        names = [
            strings.get(int(i), f"kernel#{i}") if pd.notna(i) else "kernel" for i in df["name_id"]
        ]
    else:
        names = ["kernel"] * len(df)
    return _frame(df["start"], df["end"], names, ["kernel"] * len(df), "nsys:kernel")


def _plain_activity(path, con, table: str, label: str) -> pd.DataFrame:
    _require(path, con, table, ("start", "end"))
    df = pd.read_sql_query(f"SELECT rowid, start, end FROM {table}", con)
    _check_not_null(path, df, table, ("start", "end"))
    return _frame(df["start"], df["end"], [label] * len(df), ["kernel"] * len(df), "nsys:kernel")


def _nvtx(path, con, strings) -> pd.DataFrame:
    table = "NVTX_EVENTS"
    _require(path, con, table, ("start", "end", "eventType"))
    cols = _columns(con, table)
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    df = pd.read_sql_query(
        f"SELECT rowid, start, end, {text} AS text, {text_id} AS text_id FROM {table} "
        f"WHERE end IS NOT NULL",  # ranges only: marks and domain/category records have no end
        con,
    )
    _check_not_null(path, df, table, ("start",))
    names = []
    for t, tid in zip(df["text"], df["text_id"], strict=True):
        if isinstance(t, str) and t:
            names.append(t)
        elif pd.notna(tid):
            names.append(strings.get(int(tid), f"nvtx#{int(tid)}"))
        else:
            names.append("nvtx")
    kinds = [annotation_kind(n, default="nvtx") for n in names]
    return _frame(df["start"], df["end"], names, kinds, "nsys:nvtx")


def _frame(start, end, names, kinds, source) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": start.astype("int64"), "end_ns": end.astype("int64"),
                         "name": names, "kind": kinds, "source": source})  # fmt: skip
