"""Tables from the recorded samples: raw ``samples()``, the per-phase ``report()``, and
``summarize()`` for a saved samples file. Pandas is imported on first use."""

from __future__ import annotations

import math
import os

from kdtree.profiling.core import _S, REPORT_COLUMNS, SAMPLE_COLUMNS, STEP, flush


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
