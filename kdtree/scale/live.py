"""What notebook 06 computes itself: shipped GPU rows when present, else small live CPU runs
(a reduced-width K2 slice, the tiny or trained MLA+MoE pair), each labelled with its source.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd
import torch

from kdtree.bench.schema import run_env
from kdtree.scale.spec import K2RankSpec, ShapeDoesNotFitError, check_fits

__all__ = [
    "K2Data",
    "conclusions",
    "cpu_threads",
    "without_expert_load",
    "k2_layer_data",
    "memory_check",
    "moe_load_data",
    "rows_frame",
    "spec_table",
]


def cpu_threads(device: str) -> int:
    """On a CPU run, one intra-op thread (the tiny models are faster that way on a shared
    2-core machine, as in the test suite); returns the thread count in use."""
    if not device.startswith("cuda") and (os.cpu_count() or 1) <= 4:
        torch.set_num_threads(1)
    return torch.get_num_threads()


def rows_frame(rows) -> pd.DataFrame:
    """BenchRows → the long-format DataFrame the figure builders read."""
    env = run_env("notebook 06")
    return pd.DataFrame([r.to_record(env) for r in rows])


def spec_table(spec: K2RankSpec) -> pd.DataFrame:
    """What one rank holds: per-rank shapes and bf16 bytes of each part."""
    gib = 2**30
    rows = [
        ("attention heads", f"{spec.heads_total} / {spec.tp} = {spec.heads}", spec.attn_params()),
        ("routed experts", f"all {spec.n_experts}, width {spec.expert_width} / {spec.tp} = "
         f"{spec.expert_width_rank}", spec.n_experts * spec.expert_params()),
        ("shared expert", f"width {spec.expert_width_rank}", spec.n_shared * spec.expert_params()),
        ("dense MLP (layer 0)", f"width {spec.dense_width} / {spec.tp} = "
         f"{spec.dense_width_rank}", spec.dense_mlp_params()),
        ("embedding + LM head", f"vocab {spec.vocab} / {spec.tp} = {spec.vocab_rank}",
         2 * spec.vocab_rank * spec.hidden),
    ]  # fmt: skip
    df = pd.DataFrame(rows, columns=["part", "per-rank shape", "params"])
    df["GiB (bf16)"] = df["params"] * 2 / gib
    df.loc[len(df)] = ["one expert (read per touched expert)", "3 × 256 × 7168",
                       spec.expert_params(), spec.expert_bytes() / gib]  # fmt: skip
    total = spec.embed_bytes() + sum(spec.layer_weight_bytes(i) for i in range(spec.n_layers))
    df.loc[len(df)] = [f"whole rank, {spec.n_layers} layers", "", total // 2, total / gib]
    return df


def memory_check(spec: K2RankSpec, n_layers: int, context: int, tree: int, device: str) -> str:
    """The memory check's verdict for a slice on ``device`` (the error message when it does
    not fit, with the bytes it would need)."""
    need = spec.slice_bytes(n_layers, context, tree)["total"]
    try:
        check_fits(f"{spec.label}: {n_layers} layers at L={context}, T={tree}", need, device)
    except ShapeDoesNotFitError as exc:
        return f"does not fit — {exc}"
    return f"fits: {need / 2**30:.1f} GiB needed on {device}"


class K2Data:
    """Rows for one suite and where they came from (``shipped GPU`` or ``live CPU, reduced``)."""

    def __init__(self, df: pd.DataFrame, source: str, gpu: bool) -> None:
        self.df, self.source, self.gpu = df, source, gpu


def k2_layer_data(
    shipped: pd.DataFrame | None,
    device: str,
    *,
    reduce: int,
    contexts: Sequence[int],
    trees: Sequence[int],
    attn_providers: Sequence[str],
    moe_providers: Sequence[str],
    rep_ms: float,
    whole_layer: bool = False,
) -> K2Data:
    """Shipped ``k2_layer`` GPU rows when present (and not on a live GPU), else a live run."""
    from kdtree.scale.bench import run_k2_layer
    from kdtree.scale.spec import K2_REFERENCE

    if shipped is not None and not device.startswith("cuda"):
        sub = shipped[shipped["suite"] == "k2_layer"]
        if len(sub):
            return K2Data(sub, "shipped GPU rows (data/bench/k2_layer.csv)", True)
    spec = K2_REFERENCE.reduced(1 if device.startswith("cuda") else reduce)
    rows, _ = run_k2_layer(spec, n_layers=2, contexts=contexts, trees=trees,
                           attn_providers=attn_providers, moe_providers=moe_providers,
                           device=torch.device(device), rep_ms=rep_ms,
                           whole_layer=whole_layer)  # fmt: skip
    return K2Data(rows_frame(rows), f"live {device}: {spec.label}", device.startswith("cuda"))


def moe_load_data(
    shipped: pd.DataFrame | None,
    device: str,
    *,
    reduce: int,
    trees: Sequence[int],
    kinds: Sequence[str],
    providers: Sequence[str],
    trials: int,
    rep_ms: float,
    mini_excess: float | None,
    time_kinds: Sequence[str] | None = None,
) -> K2Data:
    """Shipped ``moe_load`` GPU rows when present, else a live run (reduced width on a CPU)."""
    from kdtree.scale.bench import run_moe_load
    from kdtree.scale.spec import K2_REFERENCE

    if shipped is not None and not device.startswith("cuda"):
        sub = shipped[(shipped["suite"] == "moe_load") & (shipped["name"] != "mini_routing")]
        if len(sub):
            return K2Data(sub, "shipped GPU rows (data/bench/moe_load.csv)", True)
    spec = K2_REFERENCE.reduced(1 if device.startswith("cuda") else reduce)
    rows, _ = run_moe_load(spec, trees=trees, kinds=kinds, providers=providers,
                           device=torch.device(device), trials=trials, rep_ms=rep_ms,
                           mini_excess=mini_excess, time_kinds=time_kinds)  # fmt: skip
    return K2Data(rows_frame(rows), f"live {device}: {spec.label}", device.startswith("cuda"))


def without_expert_load(model):
    """The same step model with every MoE layer's routed experts held at their ``T = 1``
    cost: what the step would cost if extra verify tokens touched no extra experts."""
    from kdtree.scale.extrapolate import StepModel

    def layer_ms(kind: str, t: int, context: int) -> dict[str, float]:
        out = dict(model.layer_ms(kind, t, context))
        if kind == "moe":
            out["experts"] = model.layer_ms(kind, 1, context)["experts"]
        return out

    return StepModel(model.spec, layer_ms, model.lm_head_ms, model.link)


def _mode_share(chosen) -> tuple[int, float]:
    counts = pd.Series(list(chosen)).value_counts()
    return int(counts.index[0]), float(counts.iloc[0] / counts.sum())


def conclusions(
    *,
    sources: dict[str, str],
    gpu_rows: bool,
    rank_gib: float,
    fit_msg: str,
    steps: pd.DataFrame,
    step_ctx: int,
    distinct: pd.DataFrame,
    rho: float,
    sims: dict[str, list[dict]],
    k2_where: str,
    local_where: str,
    no_load: list[dict],
    investigation: dict,
    scale: float | None = None,
) -> str:
    """Notebook 06's Conclusions as Markdown, every number computed from its arguments."""
    import numpy as np

    by_t = steps.set_index("T")
    t_lo, t_hi = int(by_t.index.min()), int(by_t.index.max())
    k2_sim = {s["policy"]: s for s in sims[k2_where]}
    best_fixed = max(
        (s for p, s in k2_sim.items() if p.startswith("fixed")), key=lambda s: s["tokens_per_s"]
    )
    stand_in = "" if gpu_rows else " (CPU stand-in widths: how the parts scale, not K2 ms)"
    hi = by_t.loc[t_hi]
    lines = [
        f"- Source: layer times from **{sources['k2_layer']}**; expert load from "
        f"**{sources['moe_load']}**; mini model **{sources['pair']}**.",
        f"- One rank of the full model at bf16 needs {rank_gib:.0f} GiB (memory check: "
        f"{fit_msg.split(' —')[0]}).",
        f"- Modelled step{stand_in} at L={step_ctx:,}: {by_t.loc[t_lo, 'step_ms']:.3g} ms at "
        f"T={t_lo} → {hi['step_ms']:.3g} ms at T={t_hi}; routed experts are "
        f"{hi['experts_ms'] / hi['step_ms']:.0%} of it at T={t_hi} (all-reduces, modelled: "
        f"{hi['allreduce_ms']:.3g} ms).",
    ]
    if {"uniform", "correlated"} <= set(distinct.columns):
        uni, cor = distinct["uniform"], distinct["correlated"]
        lines.append(
            f"- At K2 scale a verify of T={int(uni.index.max())} uniform-routed tokens touches "
            f"{uni.iloc[-1]:.0f} of 384 experts per layer (T={int(uni.index.min())}: "
            f"{uni.iloc[0]:.0f}); with tree correlation (ρ={rho:.2f}, from the mini model) "
            f"{cor.iloc[-1]:.0f}."
        )
    flat = {s["policy"]: s for s in no_load}["cost-aware"]
    local = {s["policy"]: s for s in sims[local_where]}
    b_k2, sh_k2 = _mode_share(k2_sim["cost-aware"]["chosen"])
    b_flat, sh_flat = _mode_share(flat["chosen"])
    b_loc, sh_loc = _mode_share(local["cost-aware"]["chosen"])
    lines += [
        f"- The investigation measured {investigation['tokens_per_s']} tok/s at 46k on RTX PRO "
        f"6000 + int4; the what-if of this model there needs τ ≈ "
        f"{hi['tau_for_5.2_tok_s_on_rtx']:.2g} per step at T={t_hi} to reach it.",
        f"- Under the {k2_where} the cost-aware policy reaches "
        f"{k2_sim['cost-aware']['tokens_per_s']:.3g} tok/s vs the best fixed budget "
        f"({best_fixed['policy']}) {best_fixed['tokens_per_s']:.3g} tok/s on these rounds.",
        f"- Budget choice: under the K2 step the policy picks B = {b_k2} in {sh_k2:.0%} of the "
        f"rounds; with the expert-load term removed (experts at their T=1 cost) B = {b_flat} "
        f"({sh_flat:.0%}); under this machine's measured latency B = {b_loc} ({sh_loc:.0%}). "
        f"Mean chosen B {np.mean(k2_sim['cost-aware']['chosen']):.1f} with vs "
        f"{np.mean(flat['chosen']):.1f} without the experts each extra token touches.",
    ]
    cal = [p for p in k2_sim if p.startswith("cost-aware (")]
    if cal and scale is not None:
        lines.append(
            f"- The drafter's own estimate Σ exp(score) is off by ×{scale:.2f} on these rounds "
            f"(accepted beyond the root / expected); with that factor the policy "
            f"({cal[0]}) reaches {k2_sim[cal[0]]['tokens_per_s']:.3g} tok/s under the K2 step "
            f"and {local[cal[0]]['tokens_per_s']:.3g} tok/s under this machine's latency "
            f"(uncalibrated {local['cost-aware']['tokens_per_s']:.3g}, best fixed "
            f"{max(v['tokens_per_s'] for p, v in local.items() if p.startswith('fixed')):.3g})."
        )
    return "\n".join(lines) + "\n"
