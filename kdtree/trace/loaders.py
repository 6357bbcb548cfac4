"""``load_trace(path)``: any supported file -> :class:`~kdtree.trace.schema.Trace`.

Formats (``fmt``): ``native`` (our ``NAME.trace.json`` + CSVs), ``csv`` (time, value),
``ncu-raw`` / ``ncu-details`` (Nsight Compute ``--csv``), ``nsys`` (SQLite export), ``chrome``
(Kineto / ``kdtree.profiler`` Chrome trace). ``auto`` detects from the name and content.
"""

from __future__ import annotations

from pathlib import Path

from kdtree.trace.kineto import load_chrome_trace, looks_like_chrome_trace
from kdtree.trace.ncu import load_ncu_csv, sniff_ncu
from kdtree.trace.nsys import is_sqlite, load_nsys_sqlite
from kdtree.trace.plaincsv import load_plain_csv
from kdtree.trace.schema import Trace
from kdtree.trace.store import is_native, load_native

FORMATS = ("auto", "native", "csv", "ncu-raw", "ncu-details", "nsys", "chrome")


def detect_format(path: str | Path) -> str:
    p = Path(path)
    if is_native(p):
        return "native"
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such trace file")
    if is_sqlite(p):
        return "nsys"
    if looks_like_chrome_trace(p):
        return "chrome"
    page = sniff_ncu(p)
    if page is not None:
        return f"ncu-{page}"
    return "csv"


def load_trace(
    path: str | Path,
    fmt: str = "auto",
    *,
    time_unit: str | None = None,
    metric: str | None = None,
    busy_bin_us: float = 100.0,
) -> Trace:
    """Load ``path`` into the common schema; ``time_unit``/``metric`` only apply to plain CSV."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r}: expected one of {FORMATS}")
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind == "native":
        return load_native(path)
    if kind == "csv":
        return load_plain_csv(path, time_unit=time_unit, metric=metric)
    if kind in ("ncu-raw", "ncu-details"):
        return load_ncu_csv(path, page=kind.removeprefix("ncu-"))
    if kind == "nsys":
        return load_nsys_sqlite(path, busy_bin_us=busy_bin_us)
    return load_chrome_trace(path, busy_bin_us=busy_bin_us)


def load_phases(path: str | Path, fmt: str = "auto") -> Trace:
    """Load a file whose intervals are the phases to attribute gaps to (Chrome trace, nsys ...)."""
    return load_trace(path, fmt)
