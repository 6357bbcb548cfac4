# %% [markdown]
# # 06 · At Kimi-K2 scale: one TP8 rank, MoE expert load, and the budget to pick
# **Question:** at Kimi-K2 scale, what does one verify step cost per layer and for the whole
# 61-layer TP8 model, how much of it is expert weights touched by the tree's tokens, and
# which budget maximises tokens per second once that cost is in the picture?
#
# Headless: `kdtree notebooks run 06`. With GPU rows shipped (`kdtree bench k2-layer`,
# `moe-load`, `budget` → `data/bench/`) the figures show the H200 measurements of a
# full-size rank slice; without them this notebook runs a **reduced-width** slice on the CPU
# (labelled as such: its milliseconds are not K2 numbers) and the tiny or trained MLA+MoE pair.

# %%
import numpy as np
import pandas as pd

from kdtree import nb, nb_live
from kdtree.scale import budget as sb
from kdtree.scale import budget_bench as bb
from kdtree.scale import live
from kdtree.scale.extrapolate import INVESTIGATION, RTX_PRO_6000_INT4, what_if
from kdtree.scale.record import Round, record_rounds
from kdtree.scale.routing import calibrate_rho
from kdtree.scale.spec import K2_REFERENCE
from kdtree.scale.tables import pick_providers, step_model_from_rows
from kdtree.viz import scale as vs

# %% tags=["parameters"]
DEVICE: str = "auto"  # "auto", "cpu" or "cuda[:N]"
SEED: int = 0  # seed for every RNG
INTERACTIVE: bool = True  # show widgets (headless runs set False)
OUT_DIR: str = "runs/06_moe_and_scale"  # summary.json and figures go here
REDUCE: int = 16  # width divisor of the live CPU slice (1: full K2 size, GPU only)
CONTEXTS: list = [512, 2048]  # live slice: prefix lengths L (GPU rows: 4k..185k)
TREES: list = [1, 9, 33]  # live slice: tree sizes T
ATTN_PROVIDERS: list = ["eager"]  # live slice attention ("triton" is slow in the CPU interpreter)
MOE_PROVIDERS: list = ["loop", "grouped"]  # live slice routed-expert providers
REP_MS: float = 5.0  # timing window per live measurement (ms)
STEP_CONTEXT: int = 46000  # context of the modelled step (the investigation's 46k)
ROUTING_TREES: list = [1, 9, 17, 65, 257]  # T for the K2-scale routing statistics
ROUTING_TRIALS: int = 3  # Monte-Carlo routings per (case, T)
TIME_KINDS: list = ["uniform", "correlated"]  # routing cases whose MoE time is measured live
MINI_BUDGET: int = 32  # budget of the recorded mini-model trees
NEW_TOKENS: int = 24  # tokens per prompt when recording / running live
N_PROMPTS: int = 2  # prompts to record
FIXED_BUDGETS: list = [2, 8, 32]  # fixed budgets the policy is compared with
CANDIDATES: list = [0, 1, 2, 4, 8, 16, 32]  # budgets the cost-aware policy may pick

# %%
ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)
threads = live.cpu_threads(ctx.device)
spec = K2_REFERENCE
shipped = {s: nb.load_bench(s, gpu_only=True) for s in ("k2_layer", "moe_load", "budget")}
pair = nb_live.load_pair(ctx.device, config="tiny-mla", seed=SEED)
texts = ["def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        "]
prompts = [nb_live.prompt_ids(pair, t, seed=i) for i, t in enumerate(texts[:N_PROMPTS])]
print(pair.describe(), f"· {threads} intra-op thread(s)")
gpu_shipped = {k: v is not None for k, v in shipped.items()}
if not ctx.live_gpu and not any(gpu_shipped.values()):
    nb.note(
        "No GPU rows of the scale suites are shipped yet (data/bench/k2_layer.csv, "
        "moe_load.csv, budget.csv): the slice below is the reduced-width CPU stand-in, so its "
        "milliseconds say how the parts scale, not what K2 costs on an H200."
    )
if not pair.trained:
    nb.note(
        "The trained pair is not shipped (data/models): the MLA+MoE mini model and its "
        "drafter have random weights, so τ stays near 1 and its routing is a random router's."
    )

# %% [markdown]
# ## 1. What one TP8 rank holds
# TP8 without expert parallelism (as SGLang and vLLM run DeepSeek-V3 / Kimi-K2): 8 of the 64
# heads, **all 384 routed experts with each expert's width split by 8** (2048 / 8 = 256), the
# shared expert split the same way, the vocabulary split by 8. A verify step reads every
# expert that any of its tokens routes to: 11 MB of bf16 per expert per rank.

# %%
table = live.spec_table(spec)
fit_msg = live.memory_check(spec, spec.n_layers, 185_000, 257, ctx.device)
print("whole rank at bf16, L=185k, T=257:", fit_msg)
table.round(3)

# %% [markdown]
# ## 2. One layer of the slice, part by part
# Verify of `T` tree tokens at context `L`: attention in (norms, q/kv LoRA, RoPE, latent
# write, absorption), the attention kernel, attention out, and the MLP — dense in layer 0,
# router + routed experts + shared expert after it.

# %%
k2 = live.k2_layer_data(
    shipped["k2_layer"], ctx.device, reduce=REDUCE, contexts=CONTEXTS, trees=TREES,
    attn_providers=ATTN_PROVIDERS, moe_providers=MOE_PROVIDERS, rep_ms=REP_MS,
)  # fmt: skip
attn_p, moe_p = pick_providers(k2.df)
frame = vs.scale_frame(k2.df, "k2_layer")
ctx_list = sorted(int(c) for c in frame["context"].dropna().unique())
show_ctx = int(min(ctx_list, key=lambda c: abs(c - STEP_CONTEXT)))
print(f"source: {k2.source}; providers {attn_p} + {moe_p}; contexts {ctx_list}")
nb.show(vs.make_layer_parts_fig(k2.df, show_ctx, attn_provider=attn_p, moe_provider=moe_p),
        "layer_parts")  # fmt: skip
nb.show(vs.make_attention_fig(k2.df), "attention_vs_context")

# %% [markdown]
# ## 3. The whole step: 61 layers plus the TP8 all-reduces
# Layer times are measured; the step is **modelled**: 1 dense + 60 MoE layers, the LM head
# shard, and two all-reduces of `T × 7168` bf16 per layer on an NVLink model. Beside it, the
# original investigation's **measured** 5.2 tok/s at 46k — on TP8 RTX PRO 6000 Blackwell
# (GDDR7 1.79 TB/s vs 4.8 TB/s, PCIe instead of NVLink, int4 experts instead of bf16), with
# drafting and host work included, which this model leaves out.

# %%
model = step_model_from_rows(k2.df, spec, attn_provider=attn_p, moe_provider=moe_p)
step_ctx = STEP_CONTEXT if k2.gpu else show_ctx
steps = []
for t in sorted(frame["T"].dropna().astype(int).unique()):
    parts = model.parts(t, step_ctx)
    rtx = what_if(parts, RTX_PRO_6000_INT4, model, t)
    steps.append(
        {
            "T": t,
            "step_ms": parts["total"],
            "experts_ms": parts["moe_experts"],
            "allreduce_ms": parts["allreduce"],
            "tok_s_at_tau1": 1e3 / parts["total"],
            "rtx_int4_ms": rtx["total"],
            "tau_for_5.2_tok_s_on_rtx": INVESTIGATION["tokens_per_s"] * rtx["total"] / 1e3,
        }
    )
steps = pd.DataFrame(steps)
if (frame["name"] == "step_61_layers").any() and show_ctx in ctx_list:
    nb.show(vs.make_step_fig(k2.df, show_ctx, provider=f"{attn_p}+{moe_p}"), "step_modelled")
print(f"modelled at L={step_ctx:,} from {k2.source}")
steps.round(3)

# %% [markdown]
# ## 4. MoE expert load under tree verify
# **(a) The mini model's real routing.** Trees recorded at one budget give the experts every
# smaller budget touches (a tree of budget B is the first B+1 pops; routing depends only on
# ancestors). Measured against uniform routing and against *independent* tokens with the
# layer's own expert popularity: below the independent curve means tree tokens share experts.

# %%
rounds = record_rounds(pair.target, pair.drafter, prompts, budget=MINI_BUDGET, top_k=8,
                       max_new_tokens=NEW_TOKENS)  # fmt: skip
mini_rows, mini = bb.mini_routing_rows(pair.target.config, rounds, "cpu", pair.source)
nb.show(vs.make_mini_routing_fig(live.rows_frame(mini_rows)), "mini_routing")
rho = calibrate_rho(mini["excess_overlap"], spec.n_experts, spec.top_k, trials=2)
print(f"{len(rounds)} rounds; parent-child expert overlap {mini['overlap']:.3f} "
      f"(chance {pair.target.config.num_experts_per_tok / pair.target.config.n_routed_experts:.3f});"
      f" excess {mini['excess_overlap']:.3f} → ρ = {rho:.2f} at K2 scale")  # fmt: skip

# %% [markdown]
# **(b) At K2 scale** (384 experts, top-8): distinct experts per MoE layer for uniform,
# Zipf-skewed and tree-correlated routing (ρ calibrated above), and the time of one MoE
# layer's routed experts against the byte floor (every touched expert read once).

# %%
moe = live.moe_load_data(
    shipped["moe_load"], ctx.device, reduce=REDUCE, trees=ROUTING_TREES,
    kinds=["uniform", "zipf", "correlated"], providers=MOE_PROVIDERS,
    trials=ROUTING_TRIALS, rep_ms=REP_MS, mini_excess=mini["excess_overlap"],
    time_kinds=TIME_KINDS,
)  # fmt: skip
print(f"source: {moe.source}")
nb.show(vs.make_expert_load_fig(moe.df), "expert_load")
timed = vs.scale_frame(moe.df, "moe_load").query("name == 'experts_time'")
for kind in sorted(set(timed["cfg"].map(lambda c: c.get("kind")))):
    nb.show(vs.make_moe_time_fig(moe.df, kind), f"moe_time_{kind}")
mf = vs.scale_frame(moe.df, "moe_load")
distinct = (mf[mf["name"] == "distinct_experts"].pivot_table(index="T", columns="provider",
            values="p50"))  # fmt: skip
distinct.round(1)

# %% [markdown]
# ## 5. Cost-aware budget
# Each round the policy picks `B` from the candidates to maximise `E[τ | B] / cost(B + 1, L)`
# with `E[τ | B] = 1 + Σ exp(score)` over the first `B` pops, stopping at the first decrease.
# Replayed over the recorded rounds (exact τ per budget) under this machine's measured step
# latency and under the modelled K2 step; then run live against fixed budgets.

# %%
lat = bb.measure_latency(pair.target, pair.drafter, sorted(set(CANDIDATES) | set(FIXED_BUDGETS)),
                         context=int(np.median([r.context for r in rounds])), steps=1)  # fmt: skip
k2_rounds = [Round(r.scores, r.parents, r.path, step_ctx, r.routing) for r in rounds]
scale = sb.acceptance_scale(rounds)
SCALES = {"cost-aware": 1.0, "cost-aware (calibrated)": scale if scale > 0 else 1.0}
K2_WHERE = "K2 step, modelled from " + ("GPU rows" if k2.gpu else "the reduced CPU slice")
sims = {
    f"{ctx.device} measured": sb.simulate(
        rounds, lat, fixed_budgets=FIXED_BUDGETS, candidates=CANDIDATES, scales=SCALES
    ),
    K2_WHERE: sb.simulate(
        k2_rounds,
        model.step_ms,
        fixed_budgets=FIXED_BUDGETS,
        candidates=CANDIDATES,
        scales=SCALES,
    ),
}
live_runs = bb.run_live(
    pair.target,
    pair.drafter,
    prompts[:1],
    budgets=FIXED_BUDGETS,
    latency=lat,
    candidates=CANDIDATES,
    max_new_tokens=NEW_TOKENS,
    acceptance_scale=SCALES["cost-aware (calibrated)"],
)
sim = pd.DataFrame(
    [{**s, "where": w} for w, ss in sims.items() for s in ss]
    + [{**s, "where": f"live {ctx.device}"} for s in live_runs]
)
nb.show(vs.make_budget_fig(sim), "budget_policy")
if shipped["budget"] is not None:
    print("shipped GPU budget rows:")
    print(shipped["budget"].query("metric == 'tokens_per_s'")[["name", "provider", "p50"]])
sim[["where", "policy", "budget", "tau_mean", "tokens_per_s"]].round(3)

# %% [markdown]
# ## 6. Explore (interactive only)

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    nb.interact(
        lambda context: vs.make_layer_parts_fig(k2.df, context, attn_provider=attn_p,
                                                moe_provider=moe_p),
        context=widgets.SelectionSlider(options=[int(c) for c in ctx_list], value=show_ctx),
    )  # fmt: skip

# %% [markdown]
# ## Conclusions

# %%
no_load = sb.simulate(
    k2_rounds, live.without_expert_load(model).step_ms, fixed_budgets=FIXED_BUDGETS,
    candidates=CANDIDATES,
)  # fmt: skip
nb.markdown(
    live.conclusions(
        sources={"k2_layer": k2.source, "moe_load": moe.source, "pair": pair.source},
        gpu_rows=k2.gpu, rank_gib=float(table.iloc[-1]["GiB (bf16)"]), fit_msg=fit_msg,
        steps=steps, step_ctx=step_ctx, distinct=distinct, rho=rho, sims=sims,
        k2_where=K2_WHERE, local_where=f"{ctx.device} measured", no_load=no_load,
        investigation=INVESTIGATION, scale=scale,
    )
)  # fmt: skip

# %%
fixed_local = [s for s in sims[f"{ctx.device} measured"] if s["policy"].startswith("fixed")]
nb.write_summary(
    {
        "source": {"k2_layer": k2.source, "moe_load": moe.source, "pair": pair.source},
        "gpu_data_shipped": gpu_shipped,
        "rank_GiB_bf16": float(table.iloc[-1]["GiB (bf16)"]),
        "memory_check": fit_msg,
        "providers": {"attention": attn_p, "experts": moe_p},
        "step_context": step_ctx,
        "step_modelled": steps.to_dict("records"),
        "investigation": INVESTIGATION,
        "distinct_experts": distinct.to_dict(),
        "mini_routing": {k: mini[k] for k in ("overlap", "excess_overlap", "rounds")},
        "rho_calibrated": rho,
        "chosen_budget_mean": {
            "k2_step": float(np.mean(sims[K2_WHERE][len(FIXED_BUDGETS)]["chosen"])),
            "k2_step_without_expert_load": float(np.mean(no_load[-1]["chosen"])),
        },
        "acceptance_scale": scale,
        "budget": {w: {s["policy"]: s["tokens_per_s"] for s in ss} for w, ss in sims.items()},
        "live": {s["policy"]: s["tokens_per_s"] for s in live_runs},
    }
)
nb.check(
    all(s["same_tokens"] for s in live_runs), "fixed and cost-aware budgets emit the same tokens"
)
nb.check(all(a["tau_mean"] <= b["tau_mean"] for a, b in zip(fixed_local, fixed_local[1:], strict=False)),
         "τ never decreases with the budget (path truncation)")  # fmt: skip
nb.check(len(steps) < 2 or steps["step_ms"].iloc[-1] > steps["step_ms"].iloc[0],
         "the modelled step at the largest T costs more than at the smallest T")  # fmt: skip
nb.check(((distinct.diff().fillna(0) >= 0).all()).all(), "experts touched never fall as T grows")
nb.check((distinct.max() <= spec.n_experts).all(), "at most 384 experts are touched")
nb.check(all(set(s["chosen"]) <= set(CANDIDATES) for ss in sims.values() for s in ss
             if s["policy"].startswith("cost-aware")), "the policy only picks candidate budgets")  # fmt: skip
