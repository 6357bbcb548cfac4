# %% [markdown]
# # 03 · Verify kernel: correct first, then close to the floor
# **Question:** does the tree-verify attention kernel match the reference, how close does it
# get to the physical floor against its peers across L and T, and does the engine produce the
# same tokens with it?
#
# Headless: `kdtree notebooks run 03`. On a GPU the kernel runs compiled; on a CPU it runs in
# Triton's interpreter (correctness only) and the speed section shows shipped GPU rows.

# %%
import ipywidgets as widgets
import torch

from kdtree import attention, nb, nb_live
from kdtree.viz import notebook_figs as nf

# %% tags=["parameters"]
DEVICE: str = "auto"  # "auto", "cpu" or "cuda[:N]"
SEED: int = 0  # seed for every RNG
INTERACTIVE: bool = True  # show widgets (headless runs set False)
OUT_DIR: str = "runs/03_verify_kernel"  # summary.json and figures go here
CASES: list = [[97, 9, 4, 2, 32], [40, 17, 8, 1, 64]]  # correctness cases [L, T, hq, hkv, d]
LENGTHS: list = [1024, 4096, 16384]  # prefix lengths for the live timing
TREE: int = 17  # tree tokens T for the live timing
HEADS: list = [8, 2, 64]  # [hq, hkv, d] for the live timing
NEW_TOKENS: int = 6  # tokens decoded per backend in the engine check

# %%
ctx = nb.setup(device=DEVICE, seed=SEED, out_dir=OUT_DIR)
backends = attention.available_backends("gqa")
dtype = torch.bfloat16 if ctx.live_gpu else torch.float32
gpu_rows = nb.load_bench("verify_attention", gpu_only=True)
print(f"registered GQA backends: {backends}; correctness dtype {dtype}")
if gpu_rows is None and not ctx.live_gpu:
    nb.note(
        "GPU benchmark rows are not shipped yet (data/bench/verify_attention.csv): speed "
        "below is live CPU timing of the torch paths; the Triton kernel runs in the "
        "interpreter here, which checks correctness but says nothing about speed."
    )

# %% [markdown]
# ## 1. Correctness against an fp64 truth
# Every backend, on random paged inputs with a random tree; the pass rule is the conventions'
# (error at most twice the torch reference's own error in the same dtype).

# %%
checks = nb_live.check_backends(
    [tuple(c) for c in CASES],
    [b for b in backends if b != "ref"],
    dtype=dtype,
    device=ctx.device,
    seed=SEED,
)
checks

# %% [markdown]
# ## 2. Speed across L and T, against the floor
# Shipped GPU rows: each provider's fraction of the floor max(bytes / copy bandwidth,
# FLOPs / matrix rate), ceilings measured in the same run. Live: this machine's timings.

# %%
fast = [b for b in backends if b != "triton" or ctx.live_gpu]
live = nb_live.time_backends(LENGTHS, TREE, *HEADS, fast, device=ctx.device)
nb.show(
    nf.make_bar_compare_fig(
        live,
        "L",
        "p50",
        "backend",
        f"Verify attention on {ctx.device} (live, T={TREE})",
        "ms",
        log_y=True,
    ),
    "speed_live",
)
if gpu_rows is not None and "frac_of_floor" in set(gpu_rows["metric"]):
    floor = (
        gpu_rows[gpu_rows["metric"] == "frac_of_floor"]
        .rename(columns={"p50": "frac_of_floor"})
        .assign(L=lambda d: d["x_value"].astype(float))
    )
    nb.show(
        nf.make_roofline_fig(floor, "L", "Fraction of the floor (shipped GPU rows)"),
        "roofline_gpu",
    )
live

# %% [markdown]
# ## 3. Integration: the engine produces the same tokens with every backend
# Greedy tree decoding of the tiny pair; on a GPU this includes the Triton kernel.

# %%
pair = nb_live.load_pair(ctx.device, seed=SEED)
prompt = nb_live.prompt_ids(pair, "import os\n", seed=SEED)
tokens = nb_live.engine_tokens_by_backend(pair, prompt, fast, new_tokens=NEW_TOKENS)
same = len({tuple(t) for t in tokens.values()}) == 1
print({k: v for k, v in tokens.items()}, "identical:", same)
if not ctx.live_gpu:
    print(
        "CUDA-graph capture of the kernel is checked on a GPU only "
        "(python -m kdtree.kernels.selfcheck on the H200)."
    )

# %% [markdown]
# ## 4. L, T and heads (interactive only)

# %%
if INTERACTIVE:
    nb.interact(
        lambda L, T, hq: nf.make_bar_compare_fig(
            nb_live.time_backends([L], T, hq, HEADS[1], HEADS[2], fast, device=ctx.device),
            "L",
            "p50",
            "backend",
            f"L={L}, T={T}, hq={hq}",
            "ms",
        ),
        L=widgets.IntSlider(value=LENGTHS[0], min=64, max=65536, step=64),
        T=widgets.IntSlider(value=TREE, min=1, max=257),
        hq=widgets.IntSlider(value=HEADS[0], min=HEADS[1], max=8 * HEADS[1], step=HEADS[1]),
    )

# %% [markdown]
# ## Conclusions

# %%
worst = checks.sort_values("max_err").iloc[-1]
speed = live.pivot_table(index="L", columns="backend", values="p50")
ratio = (speed["dense_mask"] / speed["ref"]) if {"dense_mask", "ref"} <= set(speed) else None
nb.markdown(
    f"- Correctness: {int(checks['ok'].sum())}/{len(checks)} backend × case checks pass in "
    f"{str(dtype).removeprefix('torch.')}; the largest error is {worst.max_err:.2g} "
    f"({worst['backend']}, L={worst['L']}, T={worst['T']}) against {worst.ref_err:.2g} for the reference.\n"
    + (
        f"- Live on {ctx.device}: the dense-mask path takes {ratio.min():.2f}–{ratio.max():.2f}× "
        f"the time of the reference path over L = {LENGTHS}.\n"
        if ratio is not None
        else ""
    )
    + f"- The engine's greedy tokens are {'identical' if same else 'DIFFERENT'} across "
    f"{list(tokens)}."
)

# %%
nb.write_summary(
    {
        "source": f"live {ctx.device}" + (" + shipped GPU rows" if gpu_rows is not None else ""),
        "gpu_data_shipped": gpu_rows is not None,
        "backends": backends,
        "correctness": [
            {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in checks.to_dict("records")
        ],
        "speed": {f"{r.backend}@L={r.L}": r.p50 for r in live.itertuples()},
        "engine_tokens_identical": same,
    }
)
nb.check(checks["ok"].all(), "every backend passes the 2x-reference error rule")
nb.check(same, "the engine's tokens do not depend on the verify backend")
nb.check((live["p50"] > 0).all(), "timings are positive")
