"""Figures for the Kimi-K2 scale suites (``k2_layer``, ``moe_load``, ``budget`` rows).

Pure builders: a long-format DataFrame (``kdtree.bench.schema.read_rows``) in, a plotly figure
out. Modelled numbers are labelled as such in every title or legend that shows them.
"""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go

__all__ = [
    "make_attention_fig",
    "make_budget_fig",
    "make_expert_load_fig",
    "make_layer_parts_fig",
    "make_mini_routing_fig",
    "make_moe_time_fig",
    "make_step_fig",
    "scale_frame",
]

_PART_ORDER = ("attn_in", "attn_kernel", "attn_out", "mlp_norm", "dense_mlp", "router",
               "experts", "shared_expert")  # fmt: skip


def scale_frame(df: pd.DataFrame, suite: str) -> pd.DataFrame:
    """Rows of ``suite`` with ``T`` (from ``x_value`` where it is T), parsed ``cfg`` and a
    ``context`` column (``None`` where a part does not depend on it)."""
    need = {"suite", "name", "provider", "metric", "x_name", "x_value", "p50", "config_json"}
    if missing := need - set(df.columns):
        raise ValueError(f"df: missing columns {sorted(missing)} (expected bench rows)")
    sub = df[df["suite"] == suite].copy()
    if sub.empty:
        raise ValueError(f"df: no rows of suite {suite!r}")
    sub["cfg"] = sub["config_json"].map(json.loads)
    sub["context"] = sub["cfg"].map(lambda c: c.get("context"))
    is_t = sub["x_name"] == "T"
    sub["T"] = pd.to_numeric(sub["x_value"].where(is_t), errors="coerce")
    sub["p50"] = sub["p50"].astype(float)
    return sub


def _need(sub: pd.DataFrame, what: str) -> pd.DataFrame:
    if sub.empty:
        raise ValueError(f"no rows for {what}")
    return sub


def make_layer_parts_fig(
    df: pd.DataFrame,
    context: int,
    *,
    layer: str = "moe",
    attn_provider: str = "triton",
    moe_provider: str = "loop",
    title: str | None = None,
) -> go.Figure:
    """Stacked ms per part of one verify layer against T at ``context``."""
    sub = scale_frame(df, "k2_layer")
    sub = sub[(sub["metric"] == "time") & (sub["cfg"].map(lambda c: c.get("layer")) == layer)]
    keep = (
        ((sub["name"] == "attn_kernel") & (sub["provider"] == attn_provider)
         & (sub["context"] == context))
        | ((sub["name"] == "experts") & (sub["provider"] == moe_provider))
        | (sub["name"].isin(_PART_ORDER) & (sub["provider"] == "model"))
    )  # fmt: skip
    sub = _need(sub[keep], f"layer {layer!r} at context {context}")
    fig = go.Figure()
    for part in _PART_ORDER:
        g = sub[sub["name"] == part].sort_values("T")
        if len(g):
            label = (
                f"{part} [{g['provider'].iloc[0]}]" if part in ("attn_kernel", "experts") else part
            )
            fig.add_bar(x=g["T"].astype(int).astype(str), y=g["p50"], name=label)
    spec = sub["cfg"].iloc[0].get("spec", "")
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        title=title or f"One {layer} layer, verify at L = {context:,} — {spec}",
        xaxis_title="tree tokens T",
        yaxis_title="ms per layer (measured)",
    )
    return fig


def make_attention_fig(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Verify-attention ms per layer against context, one line per (provider, T)."""
    sub = scale_frame(df, "k2_layer")
    sub = sub[(sub["name"] == "attn_kernel") & (sub["metric"] == "time")]
    sub = sub[sub["cfg"].map(lambda c: c.get("layer")) == "moe"]
    sub = _need(sub, "attention kernel rows")
    fig = go.Figure()
    for (prov, t), g in sub.groupby(["provider", "T"]):
        g = g.sort_values("context")
        fig.add_scatter(x=g["context"], y=g["p50"], mode="lines+markers",
                        name=f"{prov}, T={int(t)}",
                        line={"dash": "solid" if prov == "triton" else "dot"})  # fmt: skip
    fig.update_layout(template="plotly_white", xaxis_type="log", yaxis_type="log",
                      title=title or "Absorbed-MLA verify attention per layer (8 heads/rank)",
                      xaxis_title="context L (tokens)", yaxis_title="ms")  # fmt: skip
    return fig


def make_step_fig(
    df: pd.DataFrame,
    context: int,
    *,
    provider: str = "triton+loop",
    reference_tok_s: float | None = 5.2,
    title: str | None = None,
) -> go.Figure:
    """The modelled 61-layer step at ``context``: stacked parts per T (H200 + NVLink model),
    the what-if on the investigation's machine as markers, and the tokens/s at τ = 1."""
    sub = scale_frame(df, "k2_layer")
    sub = sub[(sub["metric"] == "time") & (sub["provider"] == provider)
              & (sub["context"] == context)]  # fmt: skip
    h200 = _need(sub[sub["name"] == "step_61_layers"].sort_values("T"), f"step rows {provider}")
    rtx = sub[sub["name"] == "step_what_if_rtx_int4"].sort_values("T")
    xs = h200["T"].astype(int).astype(str)
    fig = go.Figure()
    parts = pd.DataFrame(list(h200["cfg"].map(lambda c: c["parts_ms"])))
    for col in [c for c in parts.columns if c != "total"]:
        fig.add_bar(x=xs, y=parts[col], name=col + (" (modelled)" if col == "allreduce" else ""))
    if len(rtx):
        fig.add_scatter(x=rtx["T"].astype(int).astype(str), y=rtx["p50"], mode="markers",
                        marker={"size": 12, "symbol": "diamond"},
                        name="what-if: RTX PRO 6000, int4 experts, PCIe (modelled)")  # fmt: skip
    if reference_tok_s:
        fig.add_hline(y=1e3 / reference_tok_s, line_dash="dot",
                      annotation_text=f"1 token per step at {reference_tok_s} tok/s "
                      "(investigation, measured)")  # fmt: skip
    fig.update_layout(barmode="stack", template="plotly_white", yaxis_type="log",
                      title=title or f"Decode step, 61 layers + TP8 all-reduces, L = {context:,} "
                      f"({provider}; layers measured, step modelled)",
                      xaxis_title="tree tokens T", yaxis_title="ms per step")  # fmt: skip
    return fig


def make_expert_load_fig(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Distinct experts touched per MoE layer against T for each routing case (p20–p80 band)
    and the uniform expectation."""
    sub = scale_frame(df, "moe_load")
    sub = _need(sub[sub["name"] == "distinct_experts"], "distinct_experts rows")
    fig = go.Figure()
    for prov, g in sub.groupby("provider"):
        g = g.sort_values("T")
        err = None
        if g["p80"].notna().any():
            err = {"type": "data", "symmetric": False, "array": g["p80"] - g["p50"],
                   "arrayminus": g["p50"] - g["p20"]}  # fmt: skip
        fig.add_scatter(x=g["T"], y=g["p50"], mode="lines+markers", name=str(prov), error_y=err,
                        line={"dash": "dot" if prov == "expected_uniform" else "solid"})  # fmt: skip
    fig.update_layout(template="plotly_white", xaxis_type="log",
                      title=title or "Experts touched by one verify batch (K2: 384 experts, top-8)",
                      xaxis_title="tree tokens T", yaxis_title="distinct experts")  # fmt: skip
    return fig


def make_mini_routing_fig(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """The mini model's real routing: measured distinct experts vs the uniform and the
    independent-token expectations."""
    sub = scale_frame(df, "moe_load")
    sub = _need(sub[sub["name"] == "mini_routing"], "mini_routing rows")
    src = sub["cfg"].iloc[0].get("source", "")
    fig = go.Figure()
    for prov, g in sub.groupby("provider"):
        g = g.sort_values("T")
        fig.add_scatter(x=g["T"], y=g["p50"], mode="lines+markers", name=str(prov),
                        line={"dash": "solid" if prov == "measured" else "dot"})  # fmt: skip
    fig.update_layout(template="plotly_white", xaxis_type="log",
                      title=title or f"Mini model's routing under tree verify ({src} weights)",
                      xaxis_title="tree tokens T", yaxis_title="distinct experts per layer")  # fmt: skip
    return fig


def make_moe_time_fig(df: pd.DataFrame, kind: str = "uniform", title: str | None = None):
    """Time of one MoE layer's routed experts against T per provider, and the byte floor
    (expected) from the experts the same routing touched."""
    sub = scale_frame(df, "moe_load")
    sub = sub[(sub["name"] == "experts_time") & (sub["cfg"].map(lambda c: c.get("kind")) == kind)]
    sub = _need(sub, f"experts_time rows for kind {kind!r}")
    fig = go.Figure()
    for prov, g in sub.groupby("provider"):
        g = g.sort_values("T")
        fig.add_scatter(x=g["T"], y=g["p50"], mode="lines+markers",
                        name="expected (byte floor)" if prov == "floor" else f"measured: {prov}",
                        line={"dash": "dot" if prov == "floor" else "solid"})  # fmt: skip
    fig.update_layout(template="plotly_white", xaxis_type="log", yaxis_type="log",
                      title=title or f"Routed experts per MoE layer, {kind} routing",
                      xaxis_title="tree tokens T", yaxis_title="ms per MoE layer")  # fmt: skip
    return fig


def make_budget_fig(sim: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Tokens/s per policy (fixed budgets and cost-aware), one bar group per latency source.
    ``sim``: columns ``policy``, ``tokens_per_s``, ``where``."""
    missing = {"policy", "tokens_per_s", "where"} - set(sim.columns)
    if missing:
        raise ValueError(f"sim: missing columns {sorted(missing)}")
    fig = go.Figure()
    for where, g in sim.groupby("where", sort=False):
        base = g["tokens_per_s"].max()
        fig.add_bar(x=g["policy"], y=g["tokens_per_s"] / base, name=str(where),
                    text=[f"{v:.3g}" for v in g["tokens_per_s"]])  # fmt: skip
    fig.update_layout(template="plotly_white", barmode="group",
                      title=title or "Tokens/s by budget policy (relative to the best; "
                      "labels: tokens/s)", yaxis_title="relative tokens/s")  # fmt: skip
    return fig
