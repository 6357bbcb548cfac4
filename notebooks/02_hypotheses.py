# %% [markdown]
# # 02 · Hypotheses: which suspect explains the idle time?
# **Question:** is the per-step O(context) mask construction really what leaves the GPU idle,
# or is it something else — and what do the measurements say instead of the guess?
#
# Headless: `kdtree notebooks run 02`. Each suspect is a profiler phase, measured across context
# lengths, fitted (slope, log-log exponent, bootstrap CI) and judged against the gap.

# %%
import ipywidgets as widgets
from IPython.display import display

from kdtree import hypothesis, nb, nb_live
from kdtree import nb_shipped as ns
from kdtree.viz import notebook_figs as nf
from kdtree.viz import profile as vp

# %% tags=["parameters"]
DEVICE: str = "auto"  # "auto", "cpu" or "cuda[:N]"
SEED: int = 0  # seed for every RNG
INTERACTIVE: bool = True  # show widgets (headless runs set False)
OUT_DIR: str = "runs/02_hypotheses"  # summary.json and figures go here
MODEL: str = "tiny-mla"  # target config (random weights: timing does not depend on them)
CONTEXTS: list = [1024, 4096, 12000]  # prefix lengths to measure (tokens)
REPEATS: int = 3  # measured steps per context (after one warm-up step)
BUDGET: int = 16  # tree budget B
TOP_K: int = 4  # per-depth top-K of the drafter
GAP_MS: float = 200.0  # the idle gap per step the original claim must explain (ms)
AT_CONTEXT: int = 46000  # context of the original observation (tokens)
N_BOOT: int = 300  # bootstrap resamples for the confidence intervals

# %%
ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)
claim = hypothesis.Hypothesis(
    phase="prepare_for_verify",
    gap_ms=GAP_MS,
    context=AT_CONTEXT,
    claim=f"O(context) mask construction explains an idle gap of {GAP_MS:g} ms per step",
)
gpu_steps = nb.load_bench("hypothesis_cuda_steps")
print(
    f"claim: {claim.claim} at {AT_CONTEXT:,} tokens; measuring {MODEL} on {ctx.device} at "
    f"{CONTEXTS} with the generic dense_mask verify path"
)
if gpu_steps is None and not ctx.live_gpu:
    nb.note(
        "GPU measurements are not shipped yet (data/bench/hypothesis_cuda_steps.csv): the "
        "verdicts below come from live CPU runs of a tiny model. Costs are CPU host times."
    )

# %% [markdown]
# ## 1. Measure every phase across contexts
# The engine runs from a synthetic prefix of each length (no prefill), in tree mode on the
# `dense_mask` path, which builds the full O(context) mask in `prepare_for_verify` every step.

# %%
exp = hypothesis.mask_build_experiment(
    contexts=CONTEXTS,
    repeats=REPEATS,
    warmup=1,
    model=MODEL,
    budget=BUDGET,
    top_k=TOP_K,
    device=ctx.device,
    hypothesis=claim,
    n_boot=N_BOOT,
    seed=SEED,
)
steps = nb_live.with_overhead(exp.steps)
nb.show(nf.make_phase_vs_context_fig(steps), "phases_vs_context")
nb_live.phase_means(steps.rename(columns={"host_ms": "ms"}))

# %% [markdown]
# ## 2. The original claim: the mask build
# The fitted cost of `prepare_for_verify` at the observed context, against the gap.

# %%
print(exp.verdict.summary)
nb.show(
    vp.make_fit_fig(
        exp.steps,
        exp.fits,
        "prepare_for_verify",
        gap_ms=GAP_MS,
        title="prepare_for_verify (mask build) vs context",
    ),
    "mask_build_fit",
)

# %% [markdown]
# ## 3. Every suspect, judged the same way

# %%
table = nb_live.judge_suspects(steps, gap_ms=GAP_MS, context=AT_CONTEXT, n_boot=N_BOOT, seed=SEED)
nb.show(nf.make_verdict_fig(table, GAP_MS, AT_CONTEXT), "verdicts")
table

# %% [markdown]
# ## 4. Shipped GPU measurements (when present)
# `data/bench/hypothesis_cuda_steps.csv`: the same experiment on the H200 (tiny-mla, dense-mask
# path), each phase timed on the host and with CUDA events. Where the host time exceeds the
# event time, the phase is host work the GPU waits for. The verdicts judge the host times.

# %%
gpu_table = hvg = None
if gpu_steps is not None:
    hvg = ns.host_vs_gpu(gpu_steps)
    long = hvg[hvg["phase"] != "step"].melt(
        id_vars=["context", "phase"], value_vars=["host_ms", "gpu_ms"], var_name="clock"
    )
    nb.show(
        nf.make_bar_compare_fig(
            long.assign(case=long["phase"] + " @" + long["context"].astype(str)),
            "case", "value", "clock", "H200: host vs CUDA-event ms per phase", "ms", log_y=True,
        ),
        "host_vs_gpu",
    )  # fmt: skip
    display(hvg.round(4))
    gpu_table = nb_live.judge_suspects(
        gpu_steps, gap_ms=GAP_MS, context=AT_CONTEXT, n_boot=N_BOOT, seed=SEED
    )
    nb.show(
        nf.make_verdict_fig(gpu_table, GAP_MS, AT_CONTEXT, title="GPU (shipped)"), "verdicts_gpu"
    )
gpu_table

# %% [markdown]
# ## 5. Pick a context and a suspect (interactive only)

# %%
if INTERACTIVE:
    phases = sorted(steps["phase"].unique())
    nb.interact(
        lambda phase, context: vp.make_fit_fig(
            exp.steps if phase != "other" else steps,
            hypothesis.fit(steps, phase, at_context=context, n_boot=100).assign(
                at_context=context
            ),
            phase,
            gap_ms=GAP_MS,
        ),
        phase=widgets.Dropdown(options=phases, value="prepare_for_verify"),
        context=widgets.IntSlider(value=AT_CONTEXT, min=min(CONTEXTS), max=200_000, step=1000),
    )

# %% [markdown]
# ## Conclusions

# %%
mask = table.set_index("phase").loc["prepare_for_verify"]
biggest = table.sort_values("cost_ms").iloc[-1]
step_at = steps[steps["phase"] == "step"].groupby("context")["host_ms"].median()
nb.markdown(
    f"- On {ctx.device} ({'CPU host time' if not ctx.live_gpu else 'GPU run'}), the mask build "
    f"(`prepare_for_verify`, dense path) is fitted at **{mask.cost_ms:.3g} ms** "
    f"[{mask.cost_lo:.3g}, {mask.cost_hi:.3g}] per step at {AT_CONTEXT:,} tokens — "
    f"{mask.gap_share:.2%} of the {GAP_MS:g} ms gap: **{mask.verdict}**.\n"
    f"- It grows {mask.slope_ms_per_1k:.3g} ms per 1k tokens (log-log exponent "
    f"{mask.exponent:.2f}).\n"
    f"- The costliest suspect at that context is **{biggest.suspect}** "
    f"({biggest.cost_ms:.3g} ms, {biggest.verdict}); a whole step took "
    f"{step_at.iloc[-1]:.3g} ms at {step_at.index[-1]:,} tokens here.\n"
    + "".join(
        f"- {line}\n" for line in (ns.hypothesis_findings(hvg, GAP_MS) if hvg is not None else [])
    )
    + (
        "- H200 verdict on the mask build (host times): **"
        + str(gpu_table.set_index("phase").loc["prepare_for_verify", "verdict"])
        + "**."
        if gpu_table is not None and "prepare_for_verify" in set(gpu_table["phase"])
        else ""
    )
)

# %%
nb.write_summary(
    {
        "source": "shipped GPU + live" if gpu_steps is not None else f"live {ctx.device}",
        "gpu_data_shipped": gpu_steps is not None,
        "model": MODEL,
        "contexts": CONTEXTS,
        "gap_ms": GAP_MS,
        "at_context": AT_CONTEXT,
        "mask_build_ms_at_max_context": float(
            exp.steps.loc[
                (exp.steps["phase"] == "prepare_for_verify")
                & (exp.steps["context"] == max(CONTEXTS)),
                "host_ms",
            ].median()
        ),
        "mask_build_fit_ms": float(mask.cost_ms),
        "mask_verdict": str(mask.verdict),
        "step_ms": {int(k): float(v) for k, v in step_at.items()},
        "verdicts": {
            r.phase: {"verdict": r.verdict, "cost_ms": r.cost_ms} for r in table.itertuples()
        },
        "gpu_host_vs_event_ms": None if hvg is None else hvg.to_dict("records"),
        "gpu_verdicts": None
        if gpu_table is None
        else {
            r.phase: {"verdict": r.verdict, "cost_ms": r.cost_ms} for r in gpu_table.itertuples()
        },
    }
)
nb.check(set(table["verdict"]) <= {"confirmed", "refuted", "inconclusive"}, "known verdicts")
nb.check((exp.steps["host_ms"] >= 0).all(), "phase times are non-negative")
nb.check((table["cost_lo"] <= table["cost_hi"] + 1e-12).all(), "CI bounds are ordered")
nb.check(sorted(exp.steps["context"].unique()) == sorted(CONTEXTS), "every context measured")
