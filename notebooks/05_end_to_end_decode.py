# %% [markdown]
# # 05 · End-to-end decode: what each fix buys
# **Question:** with everything in place, how fast does decoding run in `ar`, `chain` and
# `tree` mode — TTFT, prefill and decode tokens/s, acceptance τ, where each step's time goes —
# and what did each fix change?
#
# Headless: `kdtree notebooks run 05`. Live on this machine with the tiny (or shipped trained)
# pair; on a CPU the GPU-only parts (CUDA graphs, GPU idle fraction) come from shipped rows.

# %%
import ipywidgets as widgets
import pandas as pd
from IPython.display import display

from kdtree import nb, nb_live
from kdtree import nb_shipped as ns
from kdtree.bench.tree_build import run_tree_build
from kdtree.viz import decode as vd
from kdtree.viz import notebook_figs as nf

# %% tags=["parameters"]
DEVICE: str = "auto"  # "auto", "cpu" or "cuda[:N]"
SEED: int = 0  # seed for every RNG
INTERACTIVE: bool = True  # show widgets (headless runs set False)
OUT_DIR: str = "runs/05_end_to_end_decode"  # summary.json and figures go here
PROMPT: str = "def quicksort(xs):\n    "  # prompt text (random ids when no tokenizer is shipped)
MODES: list = ["ar", "chain", "tree"]  # decode modes to compare
BUDGET: int = 16  # tree budget B
TOP_K: int = 4  # per-depth top-K of the drafter
NEW_TOKENS: int = 12  # tokens generated per mode
CONTEXT: int = 2048  # prefix length for the before/after step timing (tokens)
STEPS: int = 2  # measured steps per before/after configuration

# %%
ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)
pair = nb_live.load_pair(ctx.device, seed=SEED)
prompt = nb_live.prompt_ids(pair, PROMPT, seed=SEED)
decode_rows = nb.load_bench("decode", gpu_only=True)
step_rows = nb.load_bench("step", gpu_only=True)
print(pair.describe(), f"· prompt of {len(prompt)} tokens")
if decode_rows is None and not ctx.live_gpu:
    nb.note(
        "GPU decode rows are not shipped yet (data/bench/decode.csv): every number below "
        "is a live CPU measurement of the tiny pair"
        + ("" if pair.trained else " with random weights (τ near 1, so no speedup)")
        + "."
    )

# %% [markdown]
# ## 1. The three modes side by side
# Greedy decoding of the same prompt; TTFT is the prefill, decode tokens/s counts the
# generated tokens over the decode loop's wall time.

# %%
table, phase_ms = nb_live.decode_modes(
    pair, prompt, MODES, budget=BUDGET, top_k=TOP_K, new_tokens=NEW_TOKENS
)
nb.show(
    nf.make_bar_compare_fig(
        table.assign(metric="decode tok/s"),
        "mode",
        "decode_tok_s",
        "metric",
        f"Decode tokens/s on {ctx.device} (live)",
        "tokens/s",
    ),
    "decode_tok_s",
)
table

# %% [markdown]
# ## 2. Where each step's time goes
# Mean ms per step of every engine phase (device-synchronised timings), stacked per mode.

# %%
nb.show(
    nf.make_stacked_phase_fig(phase_ms, f"Per-phase time per step on {ctx.device}"),
    "phase_breakdown",
)
phase_ms.round(3)

# %% [markdown]
# ## 3. Before and after each fix, on one page
# Measured here: the generic O(context) `dense_mask` verify path vs the reference path at
# the same context, and the heap tree build vs the device builder. Verify kernel and CUDA
# graphs: GPU rows (`data/bench/step.csv`, `verify_attention.csv`) when shipped.

# %%
generic = nb_live.profile_steps(
    pair, contexts=[CONTEXT], steps=STEPS, budget=BUDGET, top_k=TOP_K, dense_mask=True
)
fixed = nb_live.profile_steps(
    pair, contexts=[CONTEXT], steps=STEPS, budget=BUDGET, top_k=TOP_K, dense_mask=False
)
builds = nb_live.bench_frame(
    run_tree_build([1], [BUDGET], device=ctx.device, fast=True, providers=("heap", "device_torch"))
)
fixes = nb_live.before_after(generic, fixed, builds, step_rows)
nb.show(
    nf.make_bar_compare_fig(
        fixes.melt(
            id_vars=["fix"], value_vars=["before_ms", "after_ms"], var_name="when", value_name="ms"
        ),
        "fix",
        "ms",
        "when",
        "Before / after each fix",
        "ms",
        log_y=True,
    ),
    "before_after",
)
fixes

# %% [markdown]
# ## 4. Shipped H200 rows: decode modes and the step's phases
# `data/bench/decode.csv` (`kdtree bench decode --sweep` on the H200 with the shipped
# H200-trained pair, every mode replayed from CUDA graphs through `GraphStepRunner`), eight
# runs: the modes over all 164 HumanEval prompts behind 1k tokens of stdlib (twice: calls P and
# Q) and over 32 prompts (call S), T = 1 over 32 prompts, the budget sweep (tree B = 8-256, 32 prompts), the context sweeps
# (1k / 64k over 8 prompts; 1k-128k over 4 prompts, 96 tokens, with the eager dense-mask path
# beside them) and the modes over 8 prompts with per-phase ms; and
# `data/bench/step.csv` (`kdtree bench step`, tiny-llama from a synthetic prefix: eager,
# generic dense-mask and CUDA-graph steps, per-phase ms and the kernel-level GPU idle
# fraction). Speed-ups compare points of the same run and temperature, graph rows with graph
# rows, on the pooled rate (all generated tokens over all decode time).

# %%
gpu_decode = ns.decode_table(decode_rows) if decode_rows is not None else None
gpu_steps = ns.step_phase_table(step_rows) if step_rows is not None else None
if gpu_decode is not None:
    nb.show(vd.make_acceptance_fig(decode_rows), "gpu_acceptance")
    modes_run = gpu_decode[gpu_decode["run"] == gpu_decode["run"].iloc[0]]
    nb.show(
        nf.make_bar_compare_fig(modes_run.assign(T="T = " + modes_run["temperature"]
                                .map("{:g}".format)), "name", "decode_tok_s_pooled", "T",
                                "H200 decode tokens/s (CUDA graphs, pooled)", "tokens/s"),
        "gpu_decode_tok_s",
    )  # fmt: skip
    for fig_fn, key in ((vd.make_budget_fig, "gpu_budget"), (vd.make_context_fig, "gpu_context")):
        try:
            nb.show(fig_fn(decode_rows), key)
        except ValueError as exc:  # rows without a budget or context sweep
            print(f"{key}: {exc}")
    display(gpu_decode.drop(columns="run").round(3))
if gpu_steps is not None:
    phase_cols = [c for c in gpu_steps.columns if c in phase_ms.columns or c == "step_ms"]
    wide = gpu_steps.set_index(gpu_steps["provider"] + " @" + gpu_steps["context"].astype(str))
    parts = wide[[c for c in phase_cols if c != "step_ms"]].fillna(0.0)
    parts["(rest of the step)"] = (wide["step_ms"] - parts.sum(axis=1)).clip(lower=0.0)
    nb.show(nf.make_stacked_phase_fig(parts, "H200 step: ms per phase (step.csv)"), "gpu_steps")
    display(gpu_steps.round(4))

# %% [markdown]
# ## 4b. What moved τ on HumanEval: the drafter's training prompts
# The session-3 drafter was trained on target continuations of random stdlib windows; the
# shipped one on the same recipe with half of the prompts cut just past a function docstring
# (`kdtree/train/docprompts.py`, the HumanEval shape, HumanEval itself never read). Both decoded
# all 164 prompts in the same device call (P), under the same kernels and tuning table: the
# session-3 drafter's run is kept in `data/bench/logs/decode_session4_old_drafter.csv.gz`.

# %%
old_path = nb.data_path("bench", "logs", "decode_session4_old_drafter.csv.gz")
if decode_rows is not None and old_path.is_file():
    old_rows = pd.read_csv(old_path)
    ab_runs = {
        # call P's runs: the old drafter's second run (--max-seconds 120), the new one's modes
        "session-3 drafter (random windows)": old_rows[
            old_rows["command"].str.contains("--max-seconds 120", regex=False)
        ],
        "shipped drafter (half docstring cuts)": decode_rows[
            decode_rows["command"].str.contains("--parts modes", regex=False)
            & decode_rows["command"].str.contains("--drafter drafter_doc", regex=False)
        ],
    }
    ab = ns.drafter_ab_table(ab_runs)
    nb.show(vd.make_drafter_ab_fig(ab_runs), "gpu_drafter_ab")
    display(ab.round(3))
else:
    ab = None
    print("drafter A/B rows not shipped here")

# %% [markdown]
# ## 5. Budget and mode (interactive only)

# %%
if INTERACTIVE:

    def render(budget, new_tokens):
        t, p = nb_live.decode_modes(
            pair, prompt, MODES, budget=budget, top_k=TOP_K, new_tokens=new_tokens
        )
        return nf.make_stacked_phase_fig(
            p,
            f"B={budget}: decode tok/s "
            + ", ".join(f"{r.mode} {r.decode_tok_s:.1f}" for r in t.itertuples()),
        )

    nb.interact(
        render,
        budget=widgets.IntSlider(value=BUDGET, min=1, max=128),
        new_tokens=widgets.IntSlider(value=NEW_TOKENS, min=4, max=64),
    )

# %% [markdown]
# ## Conclusions

# %%
by = table.set_index("mode")
speedup = (by["decode_tok_s"] / by.loc["ar", "decode_tok_s"]) if "ar" in by.index else None
share = phase_ms.div(phase_ms.sum(axis=1), axis=0)
top = {m: share.loc[m].idxmax() for m in share.index}
nb.markdown(
    "- Decode tokens/s on "
    + ctx.device
    + ": "
    + ", ".join(f"`{m}` {r.decode_tok_s:.2f} (τ {r.tau:.2f})" for m, r in by.iterrows())
    + (
        f"; `tree` runs at **{speedup['tree']:.2f}×** `ar`."
        if speedup is not None and "tree" in speedup
        else "."
    )
    + "\n"
    + "- The largest share of a step: "
    + ", ".join(f"`{m}` → {p} ({share.loc[m, p]:.0%})" for m, p in top.items())
    + ".\n"
    + "".join(
        f"- {r.fix}: {r.before_ms:.3g} ms → {r.after_ms:.3g} ms "
        f"({r.before_ms / r.after_ms:.2g}×, {r.where}).\n"
        for r in fixes.itertuples()
    )
    + "".join(
        f"- {line}\n"
        for line in (ns.decode_findings(gpu_decode, gpu_steps) if gpu_decode is not None else [])
    )
    + "".join(
        f"- Same call, {int(r.n_prompts)} prompts: the {r.drafter} decodes `{r.name}` at "
        f"{r.decode_tok_s_pooled:.0f} tok/s, pooled τ {r.tau_pooled:.2f} "
        f"({r.speedup_vs_ar:.2f}× its run's ar).\n"
        for r in ([] if ab is None else ab[ab["name"].str.startswith("tree")].itertuples())
    )
)

# %%
nb.write_summary(
    {
        "source": f"live {ctx.device}"
        + (" + shipped GPU rows" if decode_rows is not None else ""),
        "gpu_data_shipped": decode_rows is not None,
        "models": pair.source,
        "modes": MODES,
        "decode_tok_s": by["decode_tok_s"].to_dict(),
        "ttft_s": by["TTFT_s"].to_dict(),
        "tau": by["tau"].to_dict(),
        "speedup_vs_ar": None if speedup is None else speedup.to_dict(),
        "phase_share": {m: share.loc[m].to_dict() for m in share.index},
        "fixes": fixes.to_dict("records"),
        "gpu_decode": None if gpu_decode is None else gpu_decode.to_dict("records"),
        "gpu_steps": None if gpu_steps is None else gpu_steps.to_dict("records"),
        "gpu_drafter_ab": None if ab is None else ab.to_dict("records"),
    }
)
nb.check((table["gen_tok"] == NEW_TOKENS).all(), "every mode generated NEW_TOKENS tokens")
nb.check((table["tau"] >= 1).all(), "τ counts the bonus token, so it is at least 1")
nb.check(float(by.loc["ar", "tau"]) == 1.0 if "ar" in by.index else True, "ar accepts one token")
nb.check((fixes[["before_ms", "after_ms"]] > 0).all().all(), "before/after times are positive")
