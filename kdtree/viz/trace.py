"""Figures for DRAM traces: the series with shaded phases, the gap histogram, per-step idle
and idle time by phase. Time axes are milliseconds from the first sample."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kdtree.trace.analysis import PHASE_KINDS, TraceSummary
from kdtree.trace.schema import Trace

_PALETTE = (
    "#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6",
    "#9D755D", "#BAB0AC",
)  # fmt: skip


def phase_colors(names) -> dict[str, str]:
    """A stable colour per phase name (sorted order)."""
    return {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(sorted(set(names)))}


def make_dram_phase_fig(
    trace: Trace,
    phases: Trace | pd.DataFrame | None = None,
    *,
    metric: str | None = None,
    summary: TraceSummary | None = None,
    window_ms: tuple[float, float] | None = None,
    phase_kinds: tuple[str, ...] = PHASE_KINDS,
    max_shapes: int = 600,
    title: str | None = None,
) -> go.Figure:
    """The metric over time with phase intervals shaded (``add_vrect``) and, when ``summary``
    is given, the hysteresis thresholds as dashed lines. ``window_ms`` (from the first sample)
    limits the view; at most ``max_shapes`` phase rectangles are drawn (the earliest ones)."""
    rows = trace.metric(metric)
    if rows.empty:
        raise ValueError("trace: expected samples for the chosen metric")
    t0 = int(rows["t_ns"].iloc[0])
    x = (rows["t_ns"].to_numpy(np.int64) - t0) / 1e6
    y = rows["value"].to_numpy(np.float64)
    lo, hi = window_ms if window_ms is not None else (float(x[0]), float(x[-1]))
    if hi <= lo:
        raise ValueError(f"window_ms={window_ms}: expected (start, end) with end > start")
    keep = (x >= lo) & (x <= hi)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x[keep], y=y[keep], mode="lines", name=str(rows["metric"].iloc[0]),
                             line={"shape": "hv", "width": 1.2, "color": "#222"}))  # fmt: skip
    iv = trace.intervals
    if isinstance(phases, Trace):
        iv = pd.concat([iv, phases.intervals], ignore_index=True)
    elif isinstance(phases, pd.DataFrame):
        iv = pd.concat([iv, phases], ignore_index=True)
    ph = iv[iv["kind"].isin(phase_kinds)].copy()
    ph["s"] = (ph["start_ns"] - t0) / 1e6
    ph["e"] = (ph["end_ns"] - t0) / 1e6
    ph = ph[(ph["e"] > lo) & (ph["s"] < hi)].sort_values("s").head(max_shapes)
    colors = phase_colors(ph["name"])
    for r in ph.itertuples():
        fig.add_vrect(x0=max(r.s, lo), x1=min(r.e, hi), fillcolor=colors[r.name], opacity=0.18,
                      line_width=0, layer="below")  # fmt: skip
    for name, c in colors.items():  # legend entries for the shaded phases
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker={"color": c, "size": 10, "symbol": "square"}))  # fmt: skip
    if summary is not None and np.isfinite(summary.thresholds.high):
        fig.add_hline(y=summary.thresholds.high, line_dash="dash", line_color="#E45756",
                      annotation_text="high", annotation_position="top left")  # fmt: skip
        fig.add_hline(y=summary.thresholds.low, line_dash="dot", line_color="#4C78A8",
                      annotation_text="low", annotation_position="bottom left")  # fmt: skip
    unit = trace.meta.get("units", {}).get(str(rows["metric"].iloc[0]), "")
    fig.update_layout(
        title=title or "DRAM throughput with engine phases",
        xaxis_title="time (ms)",
        yaxis_title=f"{rows['metric'].iloc[0]}{f' ({unit})' if unit else ''}",
        template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 50, "b": 60},
    )
    return fig


def make_gap_histogram_fig(summary: TraceSummary, title: str | None = None) -> go.Figure:
    """Gap counts per length bin (log-spaced ms) with total idle per bin on hover."""
    h = summary.gap_hist
    fig = go.Figure()
    if len(h):
        centers = np.sqrt(h["lo_ms"].to_numpy() * h["hi_ms"].to_numpy())
        fig.add_trace(go.Bar(
            x=centers, y=h["count"], width=(h["hi_ms"] - h["lo_ms"]).to_numpy(),
            customdata=np.stack([h["lo_ms"], h["hi_ms"], h["total_ms"]], axis=1),
            hovertemplate="%{customdata[0]:.3f}-%{customdata[1]:.3f} ms: %{y} gaps, "
                          "%{customdata[2]:.2f} ms idle<extra></extra>",
            marker_color="#4C78A8", name="gaps",
        ))  # fmt: skip
        fig.update_xaxes(type="log")
    fig.update_layout(title=title or f"Idle gaps ({len(summary.gaps)})", xaxis_title="gap (ms)",
                      yaxis_title="count", template="plotly_white", bargap=0.05)  # fmt: skip
    return fig


def make_step_idle_fig(summary: TraceSummary, title: str | None = None) -> go.Figure:
    """Per-step busy and idle time as stacked bars (steps from marks or periodicity)."""
    s = summary.steps
    fig = go.Figure()
    if len(s):
        busy = (s["duration_ms"] - s["idle_ms"]).clip(lower=0)
        fig.add_trace(go.Bar(x=s["step"], y=busy, name="DRAM busy", marker_color="#54A24B"))
        fig.add_trace(go.Bar(x=s["step"], y=s["idle_ms"], name="idle", marker_color="#E45756"))
    fig.update_layout(
        barmode="stack", template="plotly_white", xaxis_title="step", yaxis_title="ms",
        title=title or f"Idle per step (steps from {summary.step_source})",
    )  # fmt: skip
    return fig


def make_idle_by_phase_fig(summary: TraceSummary, title: str | None = None) -> go.Figure:
    """Horizontal bars: idle (gap) time attributed to each phase, share in the label."""
    a = summary.attribution.sort_values("idle_ms")
    fig = go.Figure()
    if len(a):
        colors = phase_colors(a["phase"])
        fig.add_trace(go.Bar(
            x=a["idle_ms"], y=a["phase"], orientation="h",
            text=[f"{v:.1%}" for v in a["share"]], textposition="auto",
            marker_color=[colors[p] for p in a["phase"]],
        ))  # fmt: skip
    fig.update_layout(title=title or "Idle time by phase", xaxis_title="idle (ms)",
                      template="plotly_white", showlegend=False)  # fmt: skip
    return fig
