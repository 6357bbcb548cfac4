"""Figures the notebooks need that no area module provides (pure ``make_*_fig`` builders)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kdtree.nb_shipped import require_columns as _require

_VERDICT_COLORS = {"refuted": "#54A24B", "confirmed": "#E45756", "inconclusive": "#F58518"}


def make_verdict_fig(
    table: pd.DataFrame, gap_ms: float, context: int, title: str | None = None
) -> go.Figure:
    """Each suspect's fitted cost at ``context`` (95 % CI as error bars, log axis) against the
    gap it would have to explain; colour = verdict."""
    _require(table, {"suspect", "verdict", "cost_ms", "cost_lo", "cost_hi"}, "table")
    t = table.sort_values("cost_ms")
    cost = t["cost_ms"].clip(lower=1e-6)
    fig = go.Figure(go.Scatter(
        x=cost, y=t["suspect"], mode="markers",
        marker={"size": 12, "color": [_VERDICT_COLORS.get(v, "#888") for v in t["verdict"]]},
        error_x={"type": "data", "symmetric": False,
                 "array": (t["cost_hi"] - t["cost_ms"]).clip(lower=0),
                 "arrayminus": (t["cost_ms"] - t["cost_lo"].clip(lower=1e-6)).clip(lower=0)},
        text=t["verdict"], hovertemplate="%{y}: %{x:.3g} ms (%{text})<extra></extra>",
        name="fitted cost",
    ))  # fmt: skip
    fig.add_vline(x=gap_ms, line_dash="dot", annotation_text=f"gap {gap_ms:g} ms")
    fig.update_layout(
        title=title or f"Which suspect explains the gap? (fitted cost at {context:,} tokens)",
        xaxis_type="log", xaxis_title="ms per step", template="plotly_white",
        margin={"l": 280},
    )  # fmt: skip
    return fig


def make_phase_vs_context_fig(
    steps: pd.DataFrame, y: str = "host_ms", title: str | None = None
) -> go.Figure:
    """Median cost of every phase against context (log-log), one line per phase."""
    _require(steps, {"context", "phase", y}, "steps")
    med = steps.groupby(["phase", "context"])[y].median().reset_index()
    fig = go.Figure()
    for phase, g in med.groupby("phase"):
        fig.add_scatter(x=g["context"], y=g[y].clip(lower=1e-6), mode="lines+markers",
                        name=str(phase))  # fmt: skip
    fig.update_layout(title=title or f"Phase cost vs context ({y})", xaxis_type="log",
                      yaxis_type="log", xaxis_title="context (tokens)", yaxis_title="ms",
                      template="plotly_white")  # fmt: skip
    return fig


def make_bar_compare_fig(
    df: pd.DataFrame, x: str, y: str, color: str, title: str, y_title: str, log_y: bool = False
) -> go.Figure:
    """Grouped bars of ``y`` by ``x``, one group member per ``color`` value."""
    _require(df, {x, y, color}, "df")
    fig = go.Figure()
    for key, g in df.groupby(color, sort=False):
        fig.add_bar(x=g[x].astype(str), y=g[y], name=str(key))
    fig.update_layout(title=title, barmode="group", yaxis_title=y_title, xaxis_title=x,
                      template="plotly_white", yaxis_type="log" if log_y else "linear")  # fmt: skip
    return fig


def make_roofline_fig(df: pd.DataFrame, x: str, title: str) -> go.Figure:
    """Fraction of the physical floor reached (``frac_of_floor``) per provider against ``x``."""
    _require(df, {x, "provider", "frac_of_floor"}, "df")
    fig = go.Figure()
    for prov, g in df.sort_values(x).groupby("provider", sort=False):
        fig.add_scatter(x=g[x], y=g["frac_of_floor"], mode="lines+markers", name=str(prov))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="floor")
    fig.update_layout(title=title, xaxis_type="log", yaxis_tickformat=".0%",
                      yaxis_title="fraction of the floor", xaxis_title=x,
                      template="plotly_white")  # fmt: skip
    return fig


def make_stacked_phase_fig(
    share: pd.DataFrame, title: str, y_title: str = "ms per step"
) -> go.Figure:
    """Stacked bars: rows are configurations (index), columns are phases."""
    fig = go.Figure()
    for phase in share.columns:
        fig.add_bar(x=[str(i) for i in share.index], y=share[phase].to_numpy(np.float64),
                    name=str(phase))  # fmt: skip
    fig.update_layout(title=title, barmode="stack", yaxis_title=y_title,
                      template="plotly_white")  # fmt: skip
    return fig


def make_tree_fig(
    tree, labels: list[str], accepted: list[int] | None = None, title: str | None = None
) -> go.Figure:
    """A draft tree laid out by depth (x) and pop order (y): edges parent → child, nodes
    coloured by score, the accepted path in red. ``tree``: ``kdtree.spec.tree.Tree``."""
    parents = tree.parents.tolist()
    depths = tree.depths.tolist()
    scores = tree.scores.float().tolist()
    n = len(parents)
    if len(labels) != n:
        raise ValueError(f"labels: expected {n} strings (one per node), got {len(labels)}")
    # y: leaves get consecutive slots in depth-first order, a parent sits at its children's mean
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    y = [0.0] * n
    slot = 0

    def place(i: int) -> float:
        nonlocal slot
        if not kids[i]:
            y[i] = float(slot)
            slot += 1
        else:
            y[i] = float(np.mean([place(c) for c in kids[i]]))
        return y[i]

    place(0)
    acc = set(accepted or [])
    fig = go.Figure()
    for path_only in (False, True):
        ex, ey = [], []
        for i, p in enumerate(parents):
            if p >= 0 and ((i in acc and p in acc) == path_only):
                ex += [depths[p], depths[i], None]
                ey += [y[p], y[i], None]
        fig.add_scatter(x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=path_only,
                        name="accepted path" if path_only else "edges",
                        line={"color": "#E45756" if path_only else "#bbb",
                              "width": 3 if path_only else 1})  # fmt: skip
    fig.add_scatter(
        x=depths, y=y, mode="markers+text", text=labels, textposition="middle right",
        marker={"size": 10, "color": scores, "colorscale": "Viridis", "showscale": True,
                "colorbar": {"title": "score"},
                "line": {"color": ["#E45756" if i in acc else "#fff" for i in range(n)],
                         "width": 2}},
        customdata=np.stack([np.arange(n), scores], axis=1),
        hovertemplate="node %{customdata[0]}: %{text}<br>score %{customdata[1]:.3f}"
                      "<extra></extra>",
        name="nodes", showlegend=False,
    )  # fmt: skip
    fig.update_layout(
        title=title or f"Draft tree: {n - 1} nodes + root, accepted {len(acc)}",
        xaxis_title="depth", yaxis_visible=False, template="plotly_white",
        height=max(400, 14 * slot + 120),
    )  # fmt: skip
    return fig


def make_floor_facets_fig(tidy: pd.DataFrame, title: str) -> go.Figure:
    """Fraction of the floor against prefix length L, one panel per layout, one line per
    (provider, T); rows of ``kdtree.nb_shipped.verify_rows`` (failed/skipped rows dropped)."""
    from plotly.subplots import make_subplots

    _require(tidy, {"layout", "L", "T", "provider", "frac_of_floor"}, "tidy")
    ok = tidy.dropna(subset=["frac_of_floor"])
    layouts = sorted(ok["layout"].unique())
    if not layouts:
        raise ValueError("tidy: no row carries a fraction of the floor")
    fig = make_subplots(rows=1, cols=len(layouts), subplot_titles=layouts, shared_yaxes=True)
    dash = {t: d for t, d in zip(sorted(ok["T"].unique()), ["dot", "solid", "dash", "dashdot"],
                                 strict=False)}  # fmt: skip
    palette = {}
    for col, layout in enumerate(layouts, start=1):
        for (prov, t), g in ok[ok["layout"] == layout].groupby(["provider", "T"]):
            color = palette.setdefault(prov, f"hsl({len(palette) * 47 % 360},65%,45%)")
            g = g.sort_values("L")
            fig.add_scatter(x=g["L"], y=g["frac_of_floor"], mode="lines+markers",
                            name=f"{prov} T={t}", legendgroup=prov, row=1, col=col,
                            line={"color": color, "dash": dash.get(t, "solid")})  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_xaxes(type="log", title_text="L (prefix tokens)")
    fig.update_yaxes(type="log", tickformat=".0%", title_text="fraction of the floor", col=1)
    fig.update_layout(title=title, template="plotly_white", height=480)
    return fig


def make_phase_timeline_fig(events: pd.DataFrame, title: str, max_steps: int = 6) -> go.Figure:
    """Host intervals of the first ``max_steps`` steps as a Gantt-like chart: one row per phase
    name, bar length = host ms; hover shows the CUDA-event ms. ``events``: rows of
    ``kdtree.nb_shipped.load_phase_events``."""
    _require(events, {"name", "start_ms", "host_ms", "gpu_ms"}, "events")
    unit = "graph_step" if (events["name"] == "graph_step").any() else "step"
    starts = events.loc[events["name"] == unit, "start_ms"].sort_values()
    stop = starts.iloc[max_steps] if len(starts) > max_steps else events["end_ms"].max()
    ev = events[events["start_ms"] < stop]
    fig = go.Figure()
    for name, g in ev.groupby("name", sort=False):
        fig.add_bar(y=[name] * len(g), x=g["host_ms"], base=g["start_ms"], orientation="h",
                    name=str(name), customdata=g["gpu_ms"].fillna(-1),
                    hovertemplate="%{y}: %{x:.3f} ms host, %{customdata:.3f} ms GPU events"
                                  "<extra></extra>")  # fmt: skip
    fig.update_layout(title=title, barmode="overlay", xaxis_title="ms since the first step",
                      template="plotly_white", height=320, showlegend=False)  # fmt: skip
    return fig


def make_cta_timeline_fig(bars: pd.DataFrame, title: str) -> go.Figure:
    """One verify call CTA by CTA (``kdtree.profiling.cta_timeline.gantt``): a lane a CTA, its
    phases as horizontal bars from ``start`` to ``end`` (µs), coloured by phase."""
    _require(bars, {"lane", "smid", "phase", "start", "end"}, "bars")
    fig = go.Figure()
    for phase, g in bars.groupby("phase", sort=False):
        fig.add_bar(y=g["lane"], x=g["end"] - g["start"], base=g["start"], orientation="h",
                    name=str(phase), customdata=g["smid"],
                    hovertemplate="CTA %{y} (SM %{customdata}): %{base:.2f} + %{x:.2f} µs"
                                  "<extra></extra>")  # fmt: skip
    fig.update_layout(title=title, barmode="overlay", xaxis_title="µs from the first CTA",
                      yaxis_title="CTA (split kernel by entry, then the merge)",
                      template="plotly_white", height=460)  # fmt: skip
    return fig


def make_grid_heatmap_fig(grid: pd.DataFrame, value: str, title: str, zmid: float) -> go.Figure:
    """One heatmap a (layout, batch) of a whole-grid table (``kdtree.nb_shipped.grid_vs_peers``):
    ``value`` by prefix length (x) and tree size T (y), coloured on a diverging scale centred at
    ``zmid`` (1.0 for a speed-up), each cell labelled with its value."""
    from plotly.subplots import make_subplots

    _require(grid, {"layout", "B", "T", "L", value}, "grid")
    panels = sorted({(r.layout, int(r.B)) for r in grid.itertuples(index=False)})
    if not panels:
        raise ValueError("grid: no rows")
    cols = len({b for _, b in panels})
    rows = -(-len(panels) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{lay}, batch {b}" for lay, b in panels],
                        horizontal_spacing=0.06, vertical_spacing=0.09)  # fmt: skip
    for i, (layout, b) in enumerate(panels):
        g = grid[(grid["layout"] == layout) & (grid["B"] == b)]
        z = g.pivot_table(index="T", columns="L", values=value)
        fig.add_heatmap(
            z=z.values, x=[f"{int(x) // 1024}k" for x in z.columns], y=[f"T={t}" for t in z.index],
            zmid=zmid, colorscale="RdBu", showscale=i == 0, texttemplate="%{z:.2f}",
            row=i // cols + 1, col=i % cols + 1,
        )  # fmt: skip
    fig.update_layout(title=title, template="plotly_white", height=260 * rows)
    return fig
