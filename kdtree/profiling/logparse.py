"""``parse_log``: the periodic ``[kdtree-prof]`` lines of any log (plain, ``journalctl``,
per-rank prefixes) back into a ``report()``-like table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kdtree.profiling.core import REPORT_COLUMNS, STEP
from kdtree.profiling.report import _pd

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
