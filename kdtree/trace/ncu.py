"""Nsight Compute CSV exports: ``--page raw --csv`` (wide) and ``--page details --csv`` (long).

ncu replays every kernel in isolation, so a report has no wall clock. Kernels are laid end to end
in ``ID`` order using their measured duration (``gpu__time_duration.sum`` or the ``Duration``
row of the details page); ``meta['clock'] == 'kernel_sequence_ns'`` says so. Each numeric metric
becomes a series sampled once per kernel at the kernel's start; each kernel an interval of kind
``kernel``. ``==PROF==`` log lines and anything before the CSV header are skipped; ``n/a``
values are dropped and counted in ``meta['n_missing_values']``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from kdtree.trace.plaincsv import _UNIT_WORDS, UNIT_NS
from kdtree.trace.schema import Trace, TraceFormatError, empty_series, make_intervals

_KEY_COLUMNS = ("ID", "Kernel Name")
_DETAILS_COLUMNS = ("Metric Name", "Metric Unit", "Metric Value")
_DURATION_METRICS = ("gpu__time_duration.sum", "gpu__time_duration.avg", "Duration")
_MISSING = {"", "n/a", "N/A", "nan"}


def sniff_ncu(path: str | Path) -> str | None:
    """``'raw'`` or ``'details'`` if the file looks like an ncu CSV export, else ``None``."""
    try:
        header = _find_header(Path(path), max_lines=200)[1]
    except (TraceFormatError, UnicodeDecodeError, OSError):
        return None
    return "details" if all(c in header for c in _DETAILS_COLUMNS) else "raw"


def _find_header(path: Path, max_lines: int | None = None) -> tuple[int, list[str], list[tuple]]:
    """Return (header line number, header cells, [(line, cells) of the rest])."""
    text = path.read_text(errors="strict")
    lines = text.splitlines()
    header_at = None
    for i, line in enumerate(lines if max_lines is None else lines[:max_lines]):
        if line.startswith("==PROF==") or not line.startswith('"'):
            continue
        cells = next(csv.reader([line]))
        if all(c in cells for c in _KEY_COLUMNS):
            header_at = i
            break
    if header_at is None:
        raise TraceFormatError(path, 'an ncu CSV header row with "ID" and "Kernel Name"', line=1)
    header = next(csv.reader([lines[header_at]]))
    rest = []
    for j in range(header_at + 1, len(lines)):
        line = lines[j]
        if not line.strip() or line.startswith("==PROF=="):
            continue
        rest.append((j + 1, next(csv.reader(io.StringIO(line)))))
    return header_at + 1, header, rest


def _number(cell: str) -> float | None:
    s = cell.strip().replace(",", "")
    if s in _MISSING:
        return None
    try:
        return float(s)
    except ValueError:
        return None


_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def normalize_unit(value: float, unit: str) -> tuple[float, str]:
    """ncu scales units per row (``usecond``/``msecond``, ``Kbyte``/``Mbyte``, ``Mhz``/``Ghz``):
    bring times to ``ns``, sizes to ``byte``, rates to ``byte/second``, clocks to ``hz``."""
    u = unit.strip()
    if (scale := _unit_scale_ns(u)) is not None:
        return value * scale, "ns"
    low = u.lower()
    for base in ("byte/second", "byte/s", "byte", "hz"):
        if low.endswith(base) and low[: -len(base)] in _SI:
            name = "byte/second" if base == "byte/s" else base
            return value * _SI[low[: -len(base)]], name
    return value, u


def _unit_scale_ns(unit: str) -> int | None:
    u = _UNIT_WORDS.get(unit.strip().lower())
    return UNIT_NS[u] if u else None


def load_ncu_csv(path: str | Path, page: str | None = None) -> Trace:
    """Load an ncu CSV (``page`` = ``'raw'`` | ``'details'`` | ``None`` to detect)."""
    path = Path(path)
    header_line, header, rows = _find_header(path)
    kind = page or ("details" if all(c in header for c in _DETAILS_COLUMNS) else "raw")
    if kind not in ("raw", "details"):
        raise ValueError(f"page={page!r}: expected 'raw', 'details' or None")
    for lineno, cells in rows:
        if len(cells) != len(header):
            raise TraceFormatError(path, f"{len(header)} fields like the header", line=lineno,
                                   got=len(cells))  # fmt: skip
    if kind == "details":
        missing = [c for c in _DETAILS_COLUMNS if c not in header]
        if missing:
            raise TraceFormatError(path, f"details columns {list(_DETAILS_COLUMNS)}",
                                   line=header_line, got=missing)  # fmt: skip
        kernels, values, units, n_missing = _parse_details(path, header, rows)
    else:
        kernels, values, units, n_missing = _parse_raw(path, header, rows)
    return _to_trace(path, kind, kernels, values, units, n_missing)


def _kernel_id(path: Path, lineno: int, cell: str) -> int:
    s = cell.strip()
    if not s.lstrip("-").isdigit():
        raise TraceFormatError(path, "an integer kernel ID", line=lineno, field="ID", got=cell)
    return int(s)


def _parse_raw(path: Path, header: list[str], rows: list[tuple]):
    id_col, name_col = header.index("ID"), header.index("Kernel Name")
    if not rows:
        raise TraceFormatError(path, "a units row after the header", line=None)
    units_line, units_row = rows[0]
    if units_row[id_col].strip():
        raise TraceFormatError(path, "the units row (empty ID cell) right after the header",
                               line=units_line, field="ID", got=units_row[id_col])  # fmt: skip
    info_cols = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
                 "Stream", "Block Size", "Grid Size", "Device", "CC", "Kernel Time"}  # fmt: skip
    metric_cols = [j for j, h in enumerate(header) if h not in info_cols]
    data = rows[1:]
    numeric = {}
    for j in metric_cols:
        cells = [r[1][j] for r in data]
        parsed = [_number(c) for c in cells]
        if any(p is not None for p in parsed):
            for (lineno, r), p in zip(data, parsed, strict=True):
                if p is None and r[j].strip() not in _MISSING:
                    raise TraceFormatError(path, "a number or n/a", line=lineno,
                                           field=header[j], got=r[j])  # fmt: skip
            numeric[j] = parsed
    kernels = [(_kernel_id(path, ln, r[id_col]), r[name_col]) for ln, r in data]
    values, units = {}, {}
    for j, col in numeric.items():
        unit = normalize_unit(1.0, units_row[j])[1]
        values[header[j]] = [
            None if p is None else normalize_unit(p, units_row[j])[0] for p in col
        ]
        units[header[j]] = unit
    n_missing = sum(p is None for col in numeric.values() for p in col)
    return kernels, values, units, n_missing


def _parse_details(path: Path, header: list[str], rows: list[tuple]):
    id_col, name_col = header.index("ID"), header.index("Kernel Name")
    mn, mu, mv = (header.index(c) for c in _DETAILS_COLUMNS)
    order: dict[int, str] = {}
    per_kernel: dict[int, dict[str, float | None]] = {}
    units: dict[str, str] = {}
    n_missing = 0
    for lineno, r in rows:
        kid = _kernel_id(path, lineno, r[id_col])
        order.setdefault(kid, r[name_col])
        metric = r[mn].strip()
        if not metric:
            raise TraceFormatError(path, "a metric name", line=lineno, field="Metric Name")
        val = _number(r[mv])
        if val is None:
            if r[mv].strip() in _MISSING:
                n_missing += 1
            continue  # string-valued metrics (cache config, ...) are not series
        val, unit = normalize_unit(val, r[mu])
        if units.setdefault(metric, unit) != unit:  # same label, other section and unit
            metric = f"{metric} [{unit}]"
            units.setdefault(metric, unit)
        per_kernel.setdefault(kid, {}).setdefault(metric, val)
    kernels = list(order.items())
    metrics = sorted(units)
    values = {m: [per_kernel.get(k, {}).get(m) for k, _ in kernels] for m in metrics}
    return kernels, values, units, n_missing


def _to_trace(path, kind, kernels, values, units, n_missing) -> Trace:
    if not kernels:
        raise TraceFormatError(path, "at least one kernel row")
    order = np.argsort([k for k, _ in kernels], kind="stable")
    kernels = [kernels[i] for i in order]
    values = {m: [v[i] for i in order] for m, v in values.items()}
    dur_metric = next((m for m in _DURATION_METRICS if m in values), None)
    if dur_metric is not None and (scale := _unit_scale_ns(units.get(dur_metric, ""))) is not None:
        dur = np.array([np.nan if d is None else d * scale for d in values[dur_metric]])
        clock = "kernel_sequence_ns"
        if np.isnan(dur).any():
            raise TraceFormatError(path, f"a duration for every kernel in {dur_metric!r}",
                                   field=dur_metric)  # fmt: skip
    else:
        dur = np.full(len(kernels), 1000.0)
        clock = "kernel_ordinal (no duration metric: kernels placed 1 us apart)"
    dur_ns = np.maximum(np.round(dur).astype(np.int64), 1)
    starts = np.concatenate([[0], np.cumsum(dur_ns)[:-1]]).astype(np.int64)
    frames = []
    for m, vals in values.items():
        mask = np.array([v is not None for v in vals])
        if not mask.any():
            continue
        v = np.array([np.nan if x is None else x for x in vals], dtype=np.float64)
        frames.append(pd.DataFrame({"t_ns": starts[mask], "metric": m, "value": v[mask],
                                    "source": "ncu"}))  # fmt: skip
    series = pd.concat(frames, ignore_index=True) if frames else empty_series()
    intervals = make_intervals(starts, starts + dur_ns, [n for _, n in kernels], "kernel", "ncu")
    meta = {
        "source_file": str(path),
        "format": f"ncu-csv-{kind}",
        "clock": clock,
        "units": units,
        "n_kernels": len(kernels),
        "n_missing_values": int(n_missing),
        "kernel_ids": [k for k, _ in kernels],
    }
    return Trace(series, intervals, meta)
