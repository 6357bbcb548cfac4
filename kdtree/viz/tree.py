"""Figures for the tree build: heap vs device builder timings, and one DDTree drawn as a tree.

Pure builders: data in, ``plotly.graph_objects.Figure`` out (plotly is imported lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["make_tree_build_fig", "make_tree_fig", "make_tree_phase_fig", "tree_layout"]


def make_tree_phase_fig(table, *, title: str | None = None):
    """Stacked phases of the threshold builder (seed, expand, order) beside the heap replay's
    bar, one group per (K, budget); ``table`` from ``kdtree.nb_shipped.tree_phase_table``."""
    import plotly.graph_objects as go

    need = {"K", "budget", "seed", "expand", "order", "heap"}
    missing = need - set(table.columns)
    if missing:
        raise ValueError(f"table: missing columns {sorted(missing)} (expected tree_phase_table)")
    cases = [f"K={r.K} B={r.budget}" for r in table.itertuples()]
    fig = go.Figure()
    for phase in ("seed", "expand", "order"):
        fig.add_trace(
            go.Bar(
                x=[cases, ["threshold"] * len(cases)], y=table[phase], name=f"threshold: {phase}"
            )
        )
    fig.add_trace(go.Bar(x=[cases, ["heap"] * len(cases)], y=table["heap"], name="heap replay"))
    fig.update_layout(
        barmode="stack",
        title=title or "Tree build per phase, batch 1 (µs per build, ten builds per graph replay)",
        yaxis_title="µs",
        legend_title="builder: phase",
    )
    return fig


def make_tree_cuda_phase_fig(table, *, title: str | None = None):
    """Stacked phases of the CUDA C++ tree builder, one bar per (vocab, K, budget); ``table``
    from ``kdtree.nb_shipped.tree_cuda_phase_table``."""
    import plotly.graph_objects as go

    from kdtree.nb_shipped import CUDA_TREE_PHASES

    need = {"vocab", "K", "budget", *CUDA_TREE_PHASES}
    missing = need - set(table.columns)
    if missing:
        raise ValueError(
            f"table: missing columns {sorted(missing)} (expected tree_cuda_phase_table)"
        )
    cases = [f"V={r.vocab} K={r.K} B={r.budget}" for r in table.itertuples()]
    fig = go.Figure()
    for phase in CUDA_TREE_PHASES:
        fig.add_trace(go.Bar(x=cases, y=table[phase], name=phase))
    fig.add_hline(y=20.0, line_dash="dot", annotation_text="issue target 20 µs")
    fig.update_layout(
        barmode="stack",
        title=title
        or "CUDA tree builder per phase, batch 1 (µs per build, ten builds per graph replay)",
        yaxis_title="µs",
        legend_title="phase",
    )
    return fig


def make_tree_build_fig(df, *, metric: str = "time", title: str | None = None):
    """Time per step vs budget B (log-log), one line per (provider, batch).

    ``df``: rows of the ``tree_build`` suite (``kdtree bench tree-build``), as read by
    ``kdtree.bench.schema.read_rows``. ``metric``: ``"time"`` or ``"speedup_vs_heap"``.
    """
    import plotly.graph_objects as go

    need = {"provider", "metric", "x_value", "p50", "name"}
    missing = need - set(df.columns)
    if missing:
        raise ValueError(f"df: missing columns {sorted(missing)} (expected tree_build rows)")
    sub = df[df["metric"] == metric].copy()
    if sub.empty:
        raise ValueError(
            f"metric={metric!r}: no rows (metrics present: {sorted(df['metric'].unique())})"
        )
    sub["budget"] = sub["x_value"].astype(float)
    sub["batch"] = sub["name"].str.extract(r"_b(\d+)$")[0].astype(int)
    fig = go.Figure()
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    for (prov, batch), g in sorted(sub.groupby(["provider", "batch"])):
        g = g.sort_values("budget")
        err = {}
        if {"p20", "p80"} <= set(g.columns) and g["p20"].notna().all():
            err = dict(
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=(g["p80"] - g["p50"]).tolist(),
                    arrayminus=(g["p50"] - g["p20"]).tolist(),
                )
            )
        fig.add_trace(
            go.Scatter(
                x=g["budget"],
                y=g["p50"],
                mode="lines+markers",
                name=f"{prov}, batch {batch}",
                line=dict(dash=dashes[sorted(sub["batch"].unique()).index(batch) % len(dashes)]),
                legendgroup=prov,
                **err,
            )
        )
    unit = sub["unit"].iloc[0] if "unit" in sub.columns else ""
    device = sub["device"].iloc[0] if "device" in sub.columns else ""
    fig.update_layout(
        title=title or f"Tree build per step ({metric}) — {device}",
        xaxis=dict(title="node budget B", type="log"),
        yaxis=dict(title=f"{metric} [{unit}]", type="log"),
        template="plotly_white",
        legend=dict(groupclick="toggleitem"),
    )
    return fig


def tree_layout(parents: Sequence[int]) -> list[tuple[float, float]]:
    """``(x, y)`` per node: x = depth, y = leaf order in a depth-first walk (children in index
    order), internal nodes centred over their children. ``parents[0] == -1``; ``-1`` elsewhere
    marks padding (placed nowhere: ``(nan, nan)``)."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(parents):
        if i and p >= 0:
            if p >= i:
                raise ValueError(f"parents[{i}]={p}: expected a parent index < {i}")
            children[p].append(i)
    pos = [(float("nan"), float("nan"))] * n
    next_leaf = 0.0

    def place(i: int, depth: int) -> float:
        nonlocal next_leaf
        if not children[i]:
            y = next_leaf
            next_leaf += 1.0
        else:
            ys = [place(c, depth + 1) for c in children[i]]
            y = (ys[0] + ys[-1]) / 2
        pos[i] = (float(depth), y)
        return y

    import sys

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * n + 100))
    if n:
        place(0, 0)
    return pos


def make_tree_fig(
    tokens: Sequence[int] | torch.Tensor,
    parents: Sequence[int] | torch.Tensor,
    *,
    scores: Sequence[float] | torch.Tensor | None = None,
    accepted_path: Sequence[int] | None = None,
    decode: Callable[[int], str] | None = None,
    title: str = "DDTree draft tree",
):
    """Interactive DDTree: nodes at (depth, leaf order), edges parent → child, hover shows
    index / token / score; ``accepted_path`` (node indices from the walk) is highlighted.

    Padding nodes (parent -1 beyond the root) are dropped. ``decode`` maps a token id to text.
    """
    import plotly.graph_objects as go

    tok = [int(t) for t in torch.as_tensor(tokens).reshape(-1).tolist()]
    par = [int(p) for p in torch.as_tensor(parents).reshape(-1).tolist()]
    if len(tok) != len(par) or not tok:
        raise ValueError(
            f"tokens, parents: expected equal non-empty lengths, got {len(tok)}, {len(par)}"
        )
    sc = None if scores is None else [float(s) for s in torch.as_tensor(scores).reshape(-1)]
    real = [i for i in range(len(par)) if i == 0 or par[i] >= 0]
    pos = tree_layout(par)
    on_path = set(accepted_path or [])
    for i in on_path:
        if i not in real:
            raise ValueError(f"accepted_path: node {i} is not a real node of this tree")
    fig = go.Figure()
    for highlight in (False, True):
        xs, ys = [], []
        for i in real[1:]:
            if (i in on_path and par[i] in on_path) != highlight:
                continue
            (x0, y0), (x1, y1) = pos[par[i]], pos[i]
            xs += [x0, x1, None]
            ys += [y0, y1, None]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                hoverinfo="skip",
                showlegend=highlight,
                name="accepted path" if highlight else "edges",
                line=dict(
                    color="crimson" if highlight else "#b0b0b0", width=3 if highlight else 1
                ),
            )
        )
    label = [decode(t) if decode else str(t) for t in tok]
    hover = [
        f"node {i}<br>token {tok[i]} ({label[i]!r})<br>depth {int(pos[i][0])}"
        + (f"<br>score {sc[i]:.4g}" if sc is not None else "")
        + ("<br><b>accepted</b>" if i in on_path else "")
        for i in real
    ]
    fig.add_trace(
        go.Scatter(
            x=[pos[i][0] for i in real],
            y=[pos[i][1] for i in real],
            mode="markers+text",
            text=[label[i] for i in real],
            textposition="middle right",
            hovertext=hover,
            hoverinfo="text",
            name="nodes",
            marker=dict(
                size=[14 if i in on_path else 9 for i in real],
                color=[sc[i] for i in real] if sc is not None else "#4c78a8",
                colorscale="Viridis",
                showscale=sc is not None,
                colorbar=dict(title="score") if sc is not None else None,
                line=dict(color=["crimson" if i in on_path else "white" for i in real], width=2),
            ),
        )
    )
    fig.update_layout(
        title=title + f" — {len(real)} nodes" + (f", τ = {len(on_path)}" if on_path else ""),
        xaxis=dict(title="depth", dtick=1),
        yaxis=dict(visible=False),
        template="plotly_white",
        hovermode="closest",
    )
    return fig
