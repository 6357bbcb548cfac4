"""Figures for the context-decode benchmark (``kdtree bench decode`` rows, ``decode.csv``).

Pure builders: a DataFrame from ``kdtree.bench.schema.read_rows`` in, a plotly figure out.
"""

from __future__ import annotations

import json

__all__ = [
    "decode_frame",
    "make_acceptance_fig",
    "make_budget_fig",
    "make_context_fig",
    "pick_run",
    "run_with_most_prompts",
]

_NEED = {"suite", "name", "mode", "metric", "x_name", "x_value", "p50", "config_json"}


def decode_frame(df):
    """Decode-suite rows with ``budget``, ``temperature``, ``ctx``, ``dense_mask`` columns."""
    missing = _NEED - set(df.columns)
    if missing:
        raise ValueError(f"df: missing columns {sorted(missing)} (expected decode.csv rows)")
    sub = df[df["suite"] == "decode"].copy()
    if sub.empty:
        raise ValueError("df: no rows of suite 'decode'")
    cfg = sub["config_json"].map(json.loads)
    sub["budget"] = cfg.map(lambda c: int(c.get("budget", 0)))
    sub["temperature"] = cfg.map(lambda c: float(c.get("temperature", 0.0)))
    sub["ctx"] = cfg.map(lambda c: int(c.get("ctx", 0)))
    sub["dense_mask"] = cfg.map(lambda c: bool(c.get("dense_mask", False)))
    # one invocation of the benchmark = one run: points are compared only within their run
    sub["run"] = sub["command"].fillna("") if "command" in sub.columns else ""
    sub["n_prompts"] = cfg.map(lambda c: int(c.get("n_prompts", 0)))
    return sub


def run_with_most_prompts(sub):
    """The rows of the run over the most prompts (ties: the first run in file order) — the
    rule the shipped-data conclusions and the acceptance figure share."""
    return sub[sub["run"] == sub.loc[sub["n_prompts"].idxmax(), "run"]]


def pick_run(sub, key: str):
    """The rows of the run with the most distinct values of ``key`` (ties: the first run in
    file order): a budget figure takes the budget sweep, a context figure the context sweep,
    never a mix of points from different runs."""
    if sub.empty:
        return sub
    counts = sub.groupby("run", sort=False)[key].nunique()
    return sub[sub["run"] == counts.idxmax()]


def _pick(sub, metric: str):
    out = sub[sub["metric"] == metric]
    if out.empty:
        raise ValueError(f"metric={metric!r}: no rows (present: {sorted(sub['metric'].unique())})")
    return out


def make_acceptance_fig(
    df, temperature: float = 0.0, ctx: int | None = None, title: str | None = None
):
    """Acceptance-length histograms (share of steps accepting τ tokens), one bar group per
    point (chain, tree budgets) at ``temperature`` (and ``ctx``, default: the smallest)."""
    import plotly.graph_objects as go

    sub = decode_frame(df)
    sub = _pick(sub[(sub["temperature"] == temperature) & (sub["mode"] != "ar")], "tau_count")
    ctx = int(sub["ctx"].min()) if ctx is None else ctx
    sub = sub[sub["ctx"] == ctx]
    if sub.empty:
        raise ValueError(f"ctx={ctx}: no acceptance rows at temperature {temperature}")
    sub = run_with_most_prompts(sub)
    fig = go.Figure()
    for name, g in sub.groupby("name", sort=False):
        tau, share, mean_tau = tau_histogram(g)
        fig.add_trace(go.Bar(x=tau, y=share, name=f"{name} (τ̄ = {mean_tau:.2f})"))
    return _acceptance_layout(
        fig, title or f"Acceptance length per step, T = {temperature:g}, context {ctx}"
    )


def _acceptance_layout(fig, title: str):
    """Axes of an acceptance-length histogram figure (grouped bars, share of steps)."""
    fig.update_layout(
        title=title,
        xaxis_title="accepted tokens per step τ (bonus included)",
        yaxis_title="share of steps",
        barmode="group",
        yaxis_tickformat=".0%",
    )
    return fig


def tau_histogram(g):
    """One point's ``tau_count`` rows → (accepted lengths, share of steps, pooled τ: all
    accepted tokens over all steps)."""
    g = g.assign(tau=g["x_value"].astype(int)).sort_values("tau")
    count = g["p50"].astype(float)
    if count.sum() <= 0:
        raise ValueError("tau_count rows: no steps counted")
    return g["tau"], count / count.sum(), float((g["tau"] * count).sum() / count.sum())


def make_drafter_ab_fig(
    runs: dict, name: str = "tree_B64_graph", temperature: float = 0.0, title: str | None = None
):
    """Acceptance-length histograms of one point (``name``) across decode runs made with
    different drafters: ``runs`` maps a label to that run's rows."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, df in runs.items():
        sub = decode_frame(df)
        sub = sub[(sub["name"] == name) & (sub["temperature"] == temperature)]
        sub = _pick(sub, "tau_count")
        if sub["run"].nunique() != 1:
            raise ValueError(f"{label}: {sub['run'].nunique()} runs; pass the rows of one run")
        tau, share, mean_tau = tau_histogram(sub)
        fig.add_trace(go.Bar(x=tau, y=share, name=f"{label} (τ̄ = {mean_tau:.2f})"))
    return _acceptance_layout(
        fig, title or f"{name}: acceptance length per step by drafter, T = {temperature:g}"
    )


def make_budget_fig(df, temperature: float = 0.0, title: str | None = None):
    """τ and decode tokens/s against the tree budget B (log x), chain and ar as lines."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sub = decode_frame(df)
    sub = sub[sub["temperature"] == temperature]
    base_ctx = int(sub["ctx"].min())
    sub = sub[(sub["ctx"] == base_ctx) & ~sub["dense_mask"]]
    sub = sub[sub["run"] == pick_run(sub[sub["mode"] == "tree"], "budget")["run"].iloc[0]]
    tree = sub[sub["mode"] == "tree"]
    tau = _pick(tree, "tau").sort_values("budget")
    tps = _pick(tree, "decode_tok_s_pooled").sort_values("budget")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance length τ", "decode tokens/s"))
    fig.add_trace(
        go.Scatter(x=tau["budget"], y=tau["p50"], mode="lines+markers", name="tree τ"),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(x=tps["budget"], y=tps["p50"], mode="lines+markers", name="tree tok/s"),
        row=1,
        col=2,
    )
    for mode, dash in (("chain", "dash"), ("ar", "dot")):
        for metric, col in (("tau", 1), ("decode_tok_s_pooled", 2)):
            ref = sub[(sub["mode"] == mode) & (sub["metric"] == metric)]
            if not ref.empty:
                fig.add_hline(
                    y=float(ref["p50"].iloc[0]),
                    line_dash=dash,
                    row=1,
                    col=col,
                    annotation_text=mode,
                )
    fig.update_xaxes(type="log", title_text="tree budget B")
    fig.update_layout(title=title or f"Budget trade-off, T = {temperature:g}, context {base_ctx}")
    return fig


def make_context_fig(
    df, temperature: float = 0.0, metric: str = "decode_tok_s_pooled", title: str | None = None
):
    """Decode tokens/s (or any per-point metric) against context length, one line per point
    (ar, chain, tree with our kernels, tree through the dense-mask path)."""
    import plotly.graph_objects as go

    sub = decode_frame(df)
    sub = pick_run(_pick(sub[sub["temperature"] == temperature], metric), "ctx")
    fig = go.Figure()
    for name, g in sub.groupby("name", sort=False):
        g = g.sort_values("ctx")
        if g["ctx"].nunique() < 2:
            continue
        fig.add_trace(go.Scatter(x=g["ctx"], y=g["p50"], mode="lines+markers", name=name))
    if not fig.data:
        raise ValueError("no point was measured at two or more contexts")
    unit = sub["unit"].iloc[0] if "unit" in sub.columns else ""
    fig.update_layout(
        title=title or f"{metric} vs context, T = {temperature:g}",
        xaxis_title="context tokens",
        yaxis_title=f"{metric} ({unit})",
    )
    fig.update_xaxes(type="log")
    return fig
