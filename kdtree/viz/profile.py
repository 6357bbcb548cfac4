"""Figures for the phase profiler and the hypothesis harness (pure builders, plotly)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kdtree.profiler import STEP

__all__ = [
    "make_fit_fig",
    "make_phase_share_fig",
    "make_phase_table_fig",
    "make_phase_timeline_fig",
    "make_step_breakdown_fig",
]

_ORDER = ["draft", "tree_build", "prepare_for_verify", "verify", "accept", "commit"]


def _require(df: pd.DataFrame, cols: set[str], what: str) -> None:
    if missing := cols - set(df.columns):
        raise ValueError(f"{what}: missing columns {sorted(missing)}")


def make_phase_table_fig(report: pd.DataFrame, title: str = "Phase times") -> go.Figure:
    """``profiler.report()`` / ``parse_log(latest=True)`` as a table figure."""
    _require(report, {"phase", "n", "mean_ms", "p50_ms", "p99_ms", "share"}, "report")
    cols = [
        c
        for c in (
            "phase",
            "n",
            "mean_ms",
            "p50_ms",
            "p99_ms",
            "last_ms",
            "total_ms",
            "share",
            "gpu_mean_ms",
        )
        if c in report.columns
    ]

    def fmt(v):
        if isinstance(v, float | np.floating):
            return "" if np.isnan(v) else f"{v:.4g}"
        return str(v)

    cells = [[fmt(v) for v in report[c]] for c in cols]
    fig = go.Figure(go.Table(header={"values": cols}, cells={"values": cells}))
    fig.update_layout(title=title)
    return fig


def make_phase_share_fig(report: pd.DataFrame, title: str = "Where the step goes") -> go.Figure:
    """Horizontal bars of mean ms per phase (host, and GPU when measured), step excluded."""
    _require(report, {"phase", "mean_ms"}, "report")
    df = report[report["phase"] != STEP].sort_values("mean_ms")
    fig = go.Figure(go.Bar(x=df["mean_ms"], y=df["phase"], orientation="h", name="host"))
    if "gpu_mean_ms" in df and df["gpu_mean_ms"].notna().any():
        fig.add_bar(x=df["gpu_mean_ms"], y=df["phase"], orientation="h", name="GPU (events)")
    fig.update_layout(title=title, xaxis_title="mean ms per call", barmode="group")
    return fig


def make_step_breakdown_fig(
    samples: pd.DataFrame, title: str = "Phase time per step", value: str = "host_ms"
) -> go.Figure:
    """Stacked bars: for each step, the top-level phases' time (``profiler.samples()``)."""
    _require(samples, {"step", "phase", "depth", value}, "samples")
    top = samples[(samples["depth"] == 0) & (samples["phase"] != STEP)]
    per = top.groupby(["step", "phase"])[value].sum().unstack("phase").fillna(0.0)
    phases = [p for p in _ORDER if p in per.columns] + [p for p in per.columns if p not in _ORDER]
    fig = go.Figure()
    for p in phases:
        fig.add_bar(x=per.index, y=per[p], name=p)
    steps = samples[samples["phase"] == STEP]
    if len(steps):
        fig.add_scatter(
            x=steps["step"],
            y=steps[value],
            mode="markers",
            name="whole step",
            marker={"symbol": "line-ew-open", "size": 14},
        )
    fig.update_layout(title=title, barmode="stack", xaxis_title="step", yaxis_title="ms")
    return fig


def make_fit_fig(
    steps: pd.DataFrame,
    fits: pd.DataFrame,
    phase: str,
    gap_ms: float | None = None,
    y: str = "host_ms",
    title: str | None = None,
) -> go.Figure:
    """Phase cost vs context (every step as a dot, medians joined), the fitted line, and the
    gap the hypothesis must explain as a horizontal line. Log-log axes."""
    _require(steps, {"batch", "context", "phase", y}, "steps")
    _require(fits, {"phase", "metric", "batch", "intercept_ms", "slope_ms_per_1k"}, "fits")
    fig = go.Figure()
    data = steps[(steps["phase"] == phase) & steps[y].notna()]
    if data.empty:
        raise ValueError(f"phase={phase!r}: no {y} values in steps")
    xmax = float(data["context"].max())
    for batch, g in data.groupby("batch"):
        fig.add_scatter(
            x=g["context"], y=g[y], mode="markers", opacity=0.35, name=f"B={batch} steps"
        )
        med = g.groupby("context")[y].median()
        fig.add_scatter(x=med.index, y=med.values, mode="lines+markers", name=f"B={batch} median")
        f = fits[(fits["phase"] == phase) & (fits["metric"] == y) & (fits["batch"] == batch)]
        if len(f):
            r = f.iloc[0]
            at = float(r.get("at_context", xmax) or xmax)
            xs = np.geomspace(float(g["context"].min()), max(xmax, at), 50)
            fit_y = r["intercept_ms"] + r["slope_ms_per_1k"] * xs / 1e3
            fig.add_scatter(
                x=xs,
                y=np.clip(fit_y, 1e-6, None),
                mode="lines",
                line={"dash": "dash"},
                name=f"B={batch} fit: {r['slope_ms_per_1k']:.3g} ms/1k, "
                f"exp {r.get('exponent', float('nan')):.2f}",
            )
    if gap_ms is not None:
        fig.add_hline(y=gap_ms, line_dash="dot", annotation_text=f"gap {gap_ms:g} ms")
    fig.update_layout(
        title=title or f"{phase}: {y} vs context",
        xaxis_type="log",
        yaxis_type="log",
        xaxis_title="context (tokens)",
        yaxis_title=y,
    )
    return fig


def make_phase_timeline_fig(
    samples: pd.DataFrame, title: str = "Phase timeline", max_rows: int = 20_000
) -> go.Figure:
    """Gantt of phase intervals (one lane per thread and depth) on the Unix-epoch clock, so
    DRAM samples or trace gaps can be overlaid with ``add_vrect``/``add_scatter`` later."""
    _require(samples, {"phase", "tid", "depth", "start_ns", "dur_ns"}, "samples")
    df = samples[samples["phase"] != STEP].tail(max_rows)
    if df.empty:
        raise ValueError("samples: no phase intervals to draw")
    t0 = int(df["start_ns"].min())
    fig = go.Figure()
    for name, g in df.groupby("phase", sort=False):
        lanes = [f"tid {t} / d{d}" for t, d in zip(g["tid"], g["depth"], strict=True)]
        fig.add_bar(
            x=g["dur_ns"] / 1e6,
            base=(g["start_ns"] - t0) / 1e6,
            y=lanes,
            orientation="h",
            name=str(name),
            hovertext=[f"{name}: {d / 1e6:.4g} ms" for d in g["dur_ns"]],
        )
    fig.update_layout(
        title=title,
        barmode="overlay",
        xaxis_title=f"ms since {pd.to_datetime(t0, unit='ns')} (UTC)",
        yaxis={"autorange": "reversed"},
    )
    return fig
