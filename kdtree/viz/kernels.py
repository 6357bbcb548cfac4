"""Figures for the verify-attention benchmark (pure builders over ``verify_attention.csv``).

``load_verify_rows`` flattens the long-format CSV (``config_json`` → columns); the builders
filter one head layout / batch / tree size and draw time against prefix length per provider,
and the fraction of the physical floor.
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

__all__ = [
    "load_verify_rows",
    "make_floor_fraction_fig",
    "make_verify_speedup_table",
    "make_verify_time_fig",
]

_CFG_COLS = ("layout", "kind", "batch", "L", "T", "floor_ms", "page_size", "reason")


def load_verify_rows(source) -> pd.DataFrame:
    """A DataFrame of the ``verify_attention`` suite with config fields as columns
    (``source``: a CSV path or an already-loaded long-format DataFrame)."""
    df = source if isinstance(source, pd.DataFrame) else pd.read_csv(source)
    if "config_json" not in df.columns:
        raise ValueError("source: expected the long-format bench CSV (no config_json column)")
    df = df[df["suite"] == "verify_attention"].copy()
    cfg = df["config_json"].map(lambda s: json.loads(s) if isinstance(s, str) else {})
    for col in _CFG_COLS:
        df[col] = cfg.map(lambda c, col=col: c.get(col))
    return df


def _select(df: pd.DataFrame, layout: str, batch: int, tree: int, metric: str) -> pd.DataFrame:
    sel = df[
        (df["layout"] == layout)
        & (df["batch"] == batch)
        & (df["T"] == tree)
        & (df["metric"] == metric)
    ]
    return sel.sort_values("L")


def _label(row) -> str:
    return row["provider"] + (" (graph)" if row["mode"] == "graph" else "")


def make_verify_time_fig(
    df: pd.DataFrame, layout: str, batch: int, tree: int, floor: bool = True
) -> go.Figure:
    """p50 time (with p20–p80 bars) against prefix length L, one line per provider; the
    floor measured in the same run as a dashed line."""
    sel = _select(df, layout, batch, tree, "time")
    if sel.empty:
        raise ValueError(f"no time rows for layout={layout!r}, batch={batch}, T={tree}")
    fig = go.Figure()
    for label, grp in sel.groupby(sel.apply(_label, axis=1), sort=False):
        fig.add_trace(
            go.Scatter(
                x=grp["L"],
                y=grp["p50"],
                mode="lines+markers",
                name=label,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": grp["p80"] - grp["p50"],
                    "arrayminus": grp["p50"] - grp["p20"],
                },
            )
        )
    if floor and sel["floor_ms"].notna().any():
        fl = sel.dropna(subset=["floor_ms"]).groupby("L")["floor_ms"].first()
        fig.add_trace(
            go.Scatter(
                x=fl.index,
                y=fl.values,
                mode="lines",
                name="floor",
                line={"dash": "dash", "color": "black"},
            )
        )
    fig.update_layout(
        title=f"Verify attention, {layout}, batch {batch}, T={tree}",
        xaxis={"title": "prefix length L", "type": "log"},
        yaxis={"title": "ms (p50)", "type": "log"},
        legend={"title": "provider"},
    )
    return fig


def make_floor_fraction_fig(
    df: pd.DataFrame,
    layout: str,
    batch: int,
    trees: tuple[int, ...] | None = None,
    providers: tuple[str, ...] | None = None,
) -> go.Figure:
    """Fraction of the floor max(bytes/copy BW, FLOPs/matmul rate) against L, per provider
    and tree size."""
    sel = df[(df["layout"] == layout) & (df["batch"] == batch) & (df["metric"] == "frac_of_floor")]
    if trees is not None:
        sel = sel[sel["T"].isin(trees)]
    if providers is not None:
        sel = sel[sel["provider"].isin(providers)]
    if sel.empty:
        raise ValueError(f"no frac_of_floor rows for layout={layout!r}, batch={batch}")
    fig = go.Figure()
    for (label, t), grp in sel.groupby([sel.apply(_label, axis=1), "T"], sort=False):
        grp = grp.sort_values("L")
        fig.add_trace(
            go.Scatter(x=grp["L"], y=grp["p50"], mode="lines+markers", name=f"{label}, T={t}")
        )
    fig.update_layout(
        title=f"Fraction of the physical floor, {layout}, batch {batch}",
        xaxis={"title": "prefix length L", "type": "log"},
        yaxis={"title": "floor / time", "tickformat": ".0%"},
    )
    return fig


def make_verify_speedup_table(df: pd.DataFrame, ours: str = "ours") -> pd.DataFrame:
    """Per point: our p50, the best peer's p50 and name, and the speedup (best peer / ours)."""
    t = df[(df["metric"] == "time") & (df["mode"] != "plan")]
    peers = t[
        ~t["provider"].str.startswith(ours)
        & ~t["provider"].isin(["fi_cascade_prefix", "fi_mla_prefix"])
    ]
    mine = t[t["provider"] == ours].set_index("name")["p50"]
    rows = []
    for name, grp in peers.groupby("name"):
        if name not in mine.index:
            continue
        best = grp.loc[grp["p50"].idxmin()]
        rows.append(
            {
                "name": name,
                "ours_ms": mine[name],
                "best_peer": best["provider"],
                "best_peer_ms": best["p50"],
                "speedup": best["p50"] / mine[name],
            }
        )
    return pd.DataFrame(rows)
