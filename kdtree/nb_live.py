"""Live measurements the notebooks make themselves: the model pair they run, profiled decode
steps, and the CPU stand-in for a DRAM trace when no GPU trace is shipped.

Nothing here invents numbers: every value comes from running the engine on this machine (or
from the files shipped in ``data/``). What the numbers are is said in each function's return.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from kdtree import env

COMPUTE_PHASES = ("draft", "verify")
CPU_BUSY_METRIC = "cpu_model_busy_pct"


@dataclass
class Pair:
    """A target and its DFlash drafter, with where they came from."""

    target: Any
    drafter: Any
    source: str  # "shipped" (data/models, trained) or "random" (tiny config, random weights)
    tokenizer: Any = None

    @property
    def trained(self) -> bool:
        return self.source == "shipped"

    def describe(self) -> str:
        cfg = self.target.config
        kind = "trained, shipped in data/models" if self.trained else "random weights"
        return (
            f"target {type(self.target).__name__} ({cfg.num_hidden_layers} layers, hidden "
            f"{cfg.hidden_size}, vocab {cfg.vocab_size}; {kind}) + DFlash drafter "
            f"(block {self.drafter.block_size})"
        )


def models_dir() -> Path:
    return Path(env.DATA_DIR) / "models"


def load_pair(
    device: str, *, config: str = "tiny-llama", seed: int = 0, prefer_shipped: bool = True
) -> Pair:
    """The trained pair from ``data/models`` when shipped (target/, drafter/, tokenizer.json),
    else ``config`` with a random DFlash drafter (acceptance is then near 1, and said so)."""
    from kdtree.models import DFlashDrafter, build_model, dflash_config_for, load_model

    dev = torch.device(device)
    root = models_dir()
    if (
        prefer_shipped
        and (root / "target" / "config.json").exists()
        and (root / "drafter" / "config.json").exists()
    ):
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        target = load_model(root / "target", device=dev, dtype=dtype)
        drafter = load_model(root / "drafter", device=dev, dtype=dtype, target=target)
        tok = None
        if (root / "tokenizer.json").exists():
            from kdtree.train.tokenizer import load_tokenizer

            tok = load_tokenizer(root / "tokenizer.json")
        return Pair(target, drafter, "shipped", tok)
    torch.manual_seed(seed)
    with torch.device(dev):
        target = build_model(config).eval()
        drafter = DFlashDrafter(dflash_config_for(target.config), target).eval()
    return Pair(target, drafter, "random")


def prompt_ids(pair: Pair, text: str, n_random: int = 32, seed: int = 0) -> list[int]:
    """``text`` tokenized with the shipped tokenizer, else ``n_random`` seeded random ids."""
    if pair.tokenizer is not None:
        from kdtree.train.tokenizer import encode

        return encode(pair.tokenizer, text)
    g = torch.Generator().manual_seed(seed)
    vocab = pair.target.config.vocab_size - 1  # the last id is the drafter's mask token
    return torch.randint(3, vocab, (n_random,), generator=g).tolist()


def decode_text(pair: Pair, ids: list[int]) -> list[str]:
    """Token strings for display (``#id`` without a tokenizer)."""
    if pair.tokenizer is None:
        return [f"#{i}" for i in ids]
    return [pair.tokenizer.decode([i]) for i in ids]


# ---------------------------------------------------------------------------------------------
# profiled steps
# ---------------------------------------------------------------------------------------------


def profile_steps(
    pair: Pair,
    *,
    contexts: list[int],
    steps: int,
    mode: str = "tree",
    budget: int = 16,
    top_k: int = 4,
    dense_mask: bool = False,
    backend: str = "auto",
    seed: int = 0,
    warmup: int = 1,
) -> pd.DataFrame:
    """Time ``steps`` engine steps (after ``warmup``) at each context on synthetic prefix KV.

    Returns one row per (context, step, phase) with ``ms`` (host wall time; the engine runs
    with ``timings=True`` so device work is synchronised inside each phase) plus a ``step``
    pseudo-phase holding the whole step.
    """
    from kdtree.spec.engine import SpecEngine

    rows: list[dict[str, Any]] = []
    dev = pair.target.device if hasattr(pair.target, "device") else torch.device("cpu")
    for ctx in contexts:
        eng = SpecEngine(pair.target, pair.drafter, mode=mode, budget=budget, top_k=top_k,
                         dense_mask=dense_mask, backend=backend, timings=True, device=dev,
                         max_len=ctx + (steps + warmup + 2) * 64 + 64)  # fmt: skip
        state = eng.synthetic_state(1, ctx, torch.Generator().manual_seed(seed))
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            rec = eng.step(state)
            wall = (time.perf_counter() - t0) * 1e3
            if i < warmup:
                continue
            base = {"context": ctx, "step": i - warmup, "mode": mode, "dense_mask": dense_mask,
                    "tau": rec.accepted_len[0]}  # fmt: skip
            rows += [{**base, "phase": k, "ms": v} for k, v in rec.phase_ms.items()]
            rows.append({**base, "phase": "step", "ms": wall})
    return pd.DataFrame(rows)


def phase_means(df: pd.DataFrame) -> pd.DataFrame:
    """Mean ms per (context, phase) as a wide table (contexts as rows)."""
    return df.groupby(["context", "phase"])["ms"].mean().unstack("phase")


# ---------------------------------------------------------------------------------------------
# the CPU stand-in for a DRAM trace
# ---------------------------------------------------------------------------------------------


def profiled_decode_trace(
    pair: Pair,
    *,
    context: int,
    steps: int,
    out_dir: Path,
    budget: int = 16,
    top_k: int = 4,
    dense_mask: bool = False,
):
    """Run ``steps`` decode steps with the profiler on and return its phases as a Trace (the
    profiler's Chrome trace, loaded with ``kdtree.trace.load_trace``)."""
    from kdtree import profiler
    from kdtree.spec.engine import SpecEngine
    from kdtree.trace import load_trace

    was_on = profiler.is_enabled()
    profiler.reset()
    profiler.enable(every=10**9)
    try:
        eng = SpecEngine(pair.target, pair.drafter, mode="tree", budget=budget, top_k=top_k,
                         dense_mask=dense_mask, timings=True,
                         max_len=context + (steps + 2) * 64 + 64)  # fmt: skip
        state = eng.synthetic_state(1, context, torch.Generator().manual_seed(0))
        eng.step(state)  # warm-up, not recorded
        profiler.reset()
        for _ in range(steps):
            eng.step(state)
        path = profiler.export_chrome_trace(Path(out_dir) / "phases.chrome.json")
    finally:
        if not was_on:
            profiler.disable()
    return load_trace(path)


def cpu_busy_trace(phases, *, compute: tuple[str, ...] = COMPUTE_PHASES, bin_us: float = 100.0):
    """A series stand-in for DRAM throughput on a machine with no GPU: the percentage of each
    ``bin_us`` bin the host spent inside the model-compute phases (``draft``, ``verify``).

    Bursts are then model compute and gaps are everything between (tree build, verify inputs,
    acceptance, commit, Python). It measures host time, not memory traffic, and the metric name
    (``cpu_model_busy_pct``) says so.
    """
    from kdtree.trace.busy import kernel_busy_series
    from kdtree.trace.schema import Trace

    iv = phases.intervals
    comp = iv[(iv["kind"] == "phase") & iv["name"].isin(compute)].copy()
    if comp.empty:
        raise ValueError(f"phases: no intervals named {compute} to build the busy series from")
    comp["kind"] = "kernel"
    series = kernel_busy_series(comp, int(bin_us * 1e3), "kdtree.profiler")
    series["metric"] = CPU_BUSY_METRIC
    meta = {
        "units": {CPU_BUSY_METRIC: "% of bin"},
        "stand_in": True,
        "compute_phases": list(compute),
        "bin_us": bin_us,
    }
    return Trace(series=series, intervals=iv.copy(), meta=meta)


#: The shipped trace notebook 01 opens by default: the CUDA-graph decode loop at 46k context.
DEFAULT_SHIPPED_TRACE = "graph_46000"


def shipped_traces() -> list[Path]:
    """Native DRAM traces shipped under ``data/traces`` (``NAME.trace.json``), sorted."""
    root = Path(env.DATA_DIR) / "traces"
    return sorted(root.rglob("*.trace.json")) if root.is_dir() else []


def phases_for(trace_path: Path) -> Path | None:
    """The profiler Chrome trace shipped beside a DRAM trace (``phases*.json``), if any."""
    hits = sorted(
        p
        for p in Path(trace_path).parent.glob("phases*.json")
        if not p.name.endswith(".trace.json")
    )
    return hits[0] if hits else None


def load_trace_pair(trace_path: Path):
    """A shipped DRAM trace and its phases (None when the trace carries its own intervals)."""
    from kdtree.trace import load_trace

    ph = phases_for(trace_path)
    return load_trace(trace_path), (load_trace(ph) if ph is not None else None)


def live_gpu_trace(
    pair: Pair,
    *,
    context: int,
    steps: int,
    out_dir: Path,
    interval_us: int = 100,
    budget: int = 16,
    top_k: int = 4,
):
    """On a GPU: DRAM throughput sampled with CUPTI while the profiler records the phases of
    ``steps`` decode steps. Returns (trace, phases)."""
    from kdtree.trace import dram_sampler

    with dram_sampler(interval_us=interval_us) as sampler:
        phases = profiled_decode_trace(pair, context=context, steps=steps, out_dir=out_dir,
                                       budget=budget, top_k=top_k)  # fmt: skip
    return sampler.trace, phases


def open_trace(
    ctx,
    trace: str,
    *,
    context: int,
    steps: int,
    config: str = "tiny-llama",
    bin_us: float = 1000.0,
):
    """Pick what notebook 01 analyses: ``trace`` (a path) if given, else a live CUPTI capture
    on a GPU, else the first trace shipped in ``data/traces``, else the CPU stand-in (the
    model-busy share of a live profiled decode). Returns (trace, phases, source, note,
    thresholds): ``thresholds`` are (high, low) defaults for the stand-in, whose signal sits at
    0 or 100 % so data-driven thresholds would see it as flat; None otherwise."""
    if trace:
        path = Path(trace)
        path = path if path.exists() else Path(env.DATA_DIR) / "traces" / trace
        tr, ph = load_trace_pair(path)
        return tr, ph, f"file {path}", "", None
    if ctx.live_gpu:
        pair = load_pair(ctx.device, config=config)
        tr, ph = live_gpu_trace(pair, context=context, steps=steps, out_dir=ctx.out_dir)
        return tr, ph, f"live CUPTI capture on {ctx.versions.get('device_name')}", "", None
    shipped = shipped_traces()
    if shipped:
        pick = next((p for p in shipped if p.parent.name == DEFAULT_SHIPPED_TRACE), shipped[0])
        tr, ph = load_trace_pair(pick)
        return tr, ph, f"shipped H200 trace {pick.relative_to(env.DATA_DIR)}", "", None
    pair = load_pair(ctx.device, config=config)
    ph = profiled_decode_trace(pair, context=context, steps=steps, out_dir=ctx.out_dir)
    note = (
        "No GPU here and no DRAM trace shipped in data/traces yet, so this run analyses a "
        f"live CPU stand-in: the share of each {bin_us:.0f} µs bin the host spent in the model's "
        f"forward passes ({', '.join(COMPUTE_PHASES)}) during {steps} decode steps of "
        f"{pair.describe()} at context {context}. It is host time, not DRAM traffic."
    )
    trace = cpu_busy_trace(ph, bin_us=bin_us)
    return trace, None, "live CPU stand-in (profiled decode)", note, (50.0, 50.0)


def timed(fn, *, repeat: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median / p20 / p80 wall time of ``fn()`` in ms on the host (CPU numbers, say so)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    a = np.asarray(ts)
    return {"p50": float(np.median(a)), "p20": float(np.quantile(a, 0.2)),
            "p80": float(np.quantile(a, 0.8))}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the suspects of notebook 02
# ---------------------------------------------------------------------------------------------

#: Engine phase -> the suspect it stands for. ``other`` is the step minus its phases: Python,
#: scheduling and everything no phase covers.
SUSPECTS = {
    "prepare_for_verify": "O(context) mask construction (verify inputs)",
    "tree_build": "heap tree build on the host",
    "commit": "KV index rebuild / commit",
    "verify": "verify attention (target forward over the tree)",
    "draft": "draft forward",
    "other": "Python and scheduling overhead (step minus phases)",
}


def with_overhead(steps: pd.DataFrame, y: str = "host_ms") -> pd.DataFrame:
    """Add an ``other`` phase per measured step: the whole step minus its top-level phases."""
    keys = ["batch", "context", "repeat"]
    top = steps[steps["phase"].isin([p for p in SUSPECTS if p != "other"])]
    parts = top.groupby(keys)[y].sum()
    whole = steps[steps["phase"] == "step"].set_index(keys)[y]
    other = (whole - parts.reindex(whole.index).fillna(0.0)).clip(lower=0.0).reset_index()
    other["phase"] = "other"
    return pd.concat([steps, other], ignore_index=True)


def judge_suspects(
    steps: pd.DataFrame,
    *,
    gap_ms: float,
    context: int,
    n_boot: int = 300,
    seed: int = 0,
    y: str = "host_ms",
) -> pd.DataFrame:
    """One verdict row per suspect: does the phase's fitted cost at ``context`` explain a gap
    of ``gap_ms`` per step? (``kdtree.hypothesis.verdict`` on each phase.)"""
    from kdtree.hypothesis import Hypothesis, verdict

    df = with_overhead(steps, y)
    rows = []
    for phase, what in SUSPECTS.items():
        if not (df["phase"] == phase).any():
            continue
        hyp = Hypothesis(phase=phase, claim=f"{what} explains the {gap_ms:g} ms gap",
                         gap_ms=gap_ms, context=context)  # fmt: skip
        t = verdict(hyp, df, y=y, n_boot=n_boot, seed=seed).table
        rows.append(t[t["batch"] == t["batch"].min()].iloc[0].to_dict() | {"suspect": what})
    cols = [
        "suspect",
        "phase",
        "verdict",
        "cost_ms",
        "cost_lo",
        "cost_hi",
        "gap_share",
        "nearest_median_ms",
        "step_share",
        "slope_ms_per_1k",
        "exponent",
        "reason",
    ]
    return pd.DataFrame(rows)[cols]


# ---------------------------------------------------------------------------------------------
# notebook 04: one tree for a real prompt
# ---------------------------------------------------------------------------------------------


@dataclass
class PromptTree:
    """The drafter's per-depth top-K for one prompt, the target's greedy continuation, and the
    engine state after prefill (so trees of any budget / top-K can be rebuilt cheaply)."""

    prompt: list[int]
    bonus: int
    logits: torch.Tensor  # [1, bs-1, V] draft logits after the prompt
    greedy: list[int]  # the target's greedy continuation, starting with the bonus token


@torch.no_grad()
def draft_after_prompt(pair: Pair, prompt: list[int], *, depth: int | None = None) -> PromptTree:
    """Prefill the engine on ``prompt``, run one draft pass, and decode the target greedily for
    as many tokens as the draft block is deep (the reference the accepted path follows)."""
    from kdtree.spec.engine import SpecEngine
    from kdtree.spec.loop import generate

    eng = SpecEngine(pair.target, pair.drafter, mode="tree", budget=1, top_k=1)
    state = eng.prefill([prompt])
    dev = eng.device
    bonus = torch.tensor(state.bonus, dtype=torch.int64, device=dev)
    start = torch.tensor(state.context_lens, dtype=torch.int64, device=dev)
    logits = pair.drafter.draft(state.draft_ctx, bonus, start)
    n = (depth or logits.shape[1]) + 1
    ar = generate(pair.target, None, [prompt], mode="ar", max_new_tokens=n)
    return PromptTree(list(prompt), int(state.bonus[0]), logits.float().cpu(), ar.tokens[0])


def tree_for(pt: PromptTree, budget: int, top_k: int):
    """The reference (heap) tree of ``budget`` nodes from the prompt's draft, and the accepted
    path under greedy verification: follow the child whose token is the target's next greedy
    token (the root is the bonus); returns (tree, accepted node indices)."""
    from kdtree.spec.tree import build_tree_ref, draft_topk

    lp, tok = draft_topk(pt.logits, top_k)
    tree = build_tree_ref(lp[0], tok[0], budget, pt.bonus)
    path = [0]
    for want in pt.greedy[1:]:
        nxt = tree.children[path[-1]].get(int(want))
        if nxt is None:
            break
        path.append(nxt)
    return tree, path


def tau_by_budget(
    pair: Pair, prompt: list[int], budgets: list[int], *, top_k: int, new_tokens: int
) -> pd.DataFrame:
    """Mean acceptance length τ of greedy ``tree`` decoding per budget (plus ``chain``)."""
    from kdtree.spec.loop import generate

    rows = []
    for mode, b in [("chain", 0)] + [("tree", b) for b in budgets]:
        res = generate(pair.target, pair.drafter, [prompt], mode=mode, budget=max(b, 1),
                       top_k=top_k, max_new_tokens=new_tokens)  # fmt: skip
        rows.append({"mode": mode, "budget": b if mode == "tree" else None,
                     "tau": res.tau_mean, "steps": res.num_steps,
                     "tokens": len(res.tokens[0])})  # fmt: skip
    return pd.DataFrame(rows)


def builders_agree(
    batch: int, budget: int, top_k: int, depth: int = 15, vocab: int = 512, seed: int = 0
) -> bool:
    """The device builder reproduces the heap's trees exactly (tokens, parents, depths) on
    random draft logits on this machine."""
    from kdtree.spec.gpu.tree_build import build_trees_device
    from kdtree.spec.tree import build_trees, draft_topk

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, vocab, generator=g) * 3
    bonus = torch.randint(0, vocab, (batch,), generator=g)
    lp, tok = draft_topk(logits, top_k)
    ref = build_trees(lp, tok, budget, bonus)
    dev = build_trees_device(lp, tok, budget, bonus, backend="torch")
    return all(
        torch.equal(getattr(ref, k).cpu(), getattr(dev, k).cpu())
        for k in ("tokens", "parents", "depths")
    )


def bench_frame(rows) -> pd.DataFrame:
    """``BenchRow`` objects as a DataFrame (the long-format columns, config flattened)."""
    from dataclasses import asdict

    return pd.DataFrame([asdict(r) for r in rows])


# ---------------------------------------------------------------------------------------------
# notebook 03: verify attention
# ---------------------------------------------------------------------------------------------


def attention_case(
    L: int,
    T: int,
    hq: int,
    hkv: int,
    d: int,
    *,
    page_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
):
    """Random GQA verify inputs: a shuffled page table, a random tree (parent < child) as the
    packed ancestor mask. Returns the positional arguments of ``tree_attention``."""
    from kdtree.spec.bitmask import pack_bits

    g = torch.Generator().manual_seed(seed)
    n_pages = -(-(L + T) // page_size)
    pool = n_pages + 2
    table = torch.randperm(pool, generator=g)[:n_pages].to(torch.int32)[None]
    vis = torch.eye(T, dtype=torch.bool)
    for j in range(1, T):
        vis[j] |= vis[int(torch.randint(0, j, (1,), generator=g))]
    args = [
        torch.randn(1, T, hq, d, generator=g),
        torch.randn(pool, page_size, hkv, d, generator=g),
        torch.randn(pool, page_size, hkv, d, generator=g),
        table,
        torch.tensor([L], dtype=torch.int32),
        pack_bits(vis[None]),
    ]
    return [a.to(device=device, dtype=dtype) if a.is_floating_point() else a.to(device)
            for a in args]  # fmt: skip


def check_backends(
    cases: list[tuple[int, int, int, int, int]],
    backends: list[str],
    *,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> pd.DataFrame:
    """Each backend against an fp64 truth (``ref`` run in float64) on each (L, T, hq, hkv, d);
    pass = error ≤ 2 × the error of ``ref`` in the same dtype + 1e-5 (the conventions' rule)."""
    from kdtree.attention import tree_attention

    rows = []
    for i, (L, T, hq, hkv, d) in enumerate(cases):
        args = attention_case(L, T, hq, hkv, d, dtype=dtype, device=device, seed=seed + i)
        scale = d**-0.5
        truth = tree_attention(*[a.double() if a.is_floating_point() else a for a in args],
                               sm_scale=scale, backend="ref")  # fmt: skip
        ref_err = tree_attention(*args, sm_scale=scale, backend="ref").double() - truth
        ref_err = float(ref_err.abs().max())
        for be in backends:
            err = float((tree_attention(*args, sm_scale=scale, backend=be).double() - truth)
                        .abs().max())  # fmt: skip
            rows.append({"L": L, "T": T, "hq": hq, "hkv": hkv, "d": d, "backend": be,
                         "dtype": str(dtype).removeprefix("torch."), "max_err": err,
                         "ref_err": ref_err, "ok": err <= 2 * ref_err + 1e-5})  # fmt: skip
    return pd.DataFrame(rows)


def time_backends(
    lengths: list[int],
    T: int,
    hq: int,
    hkv: int,
    d: int,
    backends: list[str],
    *,
    device: str,
    repeat: int = 5,
) -> pd.DataFrame:
    """Median wall time of one verify-attention call per backend and prefix length, on this
    machine (host timer, device synchronised). Label the result with the device: CPU numbers
    never share a chart with GPU numbers."""
    from kdtree.attention import tree_attention

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    for L in lengths:
        args = attention_case(
            L,
            T,
            hq,
            hkv,
            d,
            device=device,
            dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32,
        )
        for be in backends:

            def call(be=be, args=args):
                tree_attention(*args, sm_scale=d**-0.5, backend=be)
                sync()

            t = timed(call, repeat=repeat)
            rows.append({"L": L, "T": T, "backend": be, "device": device, **t})
    return pd.DataFrame(rows)


def engine_tokens_by_backend(
    pair: Pair,
    prompt: list[int],
    backends: list[str],
    *,
    budget: int = 8,
    top_k: int = 4,
    new_tokens: int = 8,
) -> dict:
    """Greedy ``tree`` decoding with each verify backend: the token lists (they must agree)."""
    from kdtree.spec.loop import generate

    return {be: generate(pair.target, pair.drafter, [prompt], mode="tree", budget=budget,
                         top_k=top_k, max_new_tokens=new_tokens, backend=be).tokens[0]
            for be in backends}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# notebook 05: end-to-end decode
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def decode_modes(
    pair: Pair, prompt: list[int], modes: list[str], *, budget: int, top_k: int, new_tokens: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Prefill + greedy decode of ``new_tokens`` per mode on this machine. Returns a table per
    mode (TTFT, prefill and decode tokens/s, τ, target forwards per token) and the mean ms per
    step of each phase per mode."""
    from kdtree.spec.engine import SpecEngine

    dev = pair.target.device if hasattr(pair.target, "device") else torch.device("cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows, phases = [], {}
    for mode in modes:
        eng = SpecEngine(pair.target, pair.drafter, mode=mode, budget=budget, top_k=top_k,
                         timings=True)  # fmt: skip
        sync()
        t0 = time.perf_counter()
        state = eng.prefill([prompt], max_new_tokens=new_tokens)
        sync()
        ttft = time.perf_counter() - t0
        recs = []
        t1 = time.perf_counter()
        while state.active:
            recs.append(eng.step(state))
        sync()
        wall = time.perf_counter() - t1
        gen = len(state.tokens[0])
        taus = [r.accepted_len[0] for r in recs]
        rows.append({
            "mode": mode, "prompt_tok": len(prompt), "TTFT_s": ttft,
            "prefill_tok_s": len(prompt) / ttft, "gen_tok": gen, "steps": len(recs),
            "decode_tok_s": gen / wall if wall > 0 else float("nan"), "decode_wall_s": wall,
            "tau": float(np.mean(taus)) if taus else float("nan"),
            "forwards_per_token": len(recs) / gen if gen else float("nan"),
        })  # fmt: skip
        per = pd.DataFrame([r.phase_ms for r in recs]).mean()
        per["step wall (unphased)"] = max(0.0, wall * 1e3 / max(len(recs), 1) - per.sum())
        phases[mode] = per
    return pd.DataFrame(rows), pd.DataFrame(phases).T.fillna(0.0)


def before_after(
    generic: pd.DataFrame,
    fixed: pd.DataFrame,
    builds: pd.DataFrame,
    step_rows: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per fix with the measured time before and after it (ms) and where it was
    measured: verify inputs and the whole step from ``profile_steps`` (dense_mask vs not), the
    tree build from ``run_tree_build`` rows, and — from shipped GPU ``step`` rows — the decode
    step in eager vs CUDA-graph mode at the largest shipped context."""
    g = generic.groupby("phase")["ms"].mean()
    f = fixed.groupby("phase")["ms"].mean()
    dev = str(generic["context"].iloc[0])
    where = f"live, context {dev}"
    rows = [
        {"fix": "verify inputs without the O(context) mask", "before_ms": g["prepare_for_verify"],
         "after_ms": f["prepare_for_verify"], "where": where},
        {"fix": "verify attention without the dense mask", "before_ms": g["verify"],
         "after_ms": f["verify"], "where": where},
        {"fix": "whole decode step (both of the above)", "before_ms": g["step"],
         "after_ms": f["step"], "where": where},
    ]  # fmt: skip
    t = builds[builds["metric"] == "time"].set_index("provider")["p50"]
    if {"heap", "device_torch"} <= set(t.index):
        rows.append(
            {
                "fix": "tree build on the device",
                "before_ms": t["heap"],
                "after_ms": t["device_torch"],
                "where": f"live, {builds['mode'].iloc[0]}, B={builds['x_value'].iloc[0]}",
            }
        )
    if step_rows is not None and len(step_rows):
        s = step_rows[(step_rows["name"] == "decode_step") & (step_rows["metric"] == "time")]
        if len(s):
            top = s[s["x_value"].astype(float) == s["x_value"].astype(float).max()]
            p = top.groupby("provider")["p50"].median()
            for before, after, what in (
                ("generic", "eager", "device step (eager)"),
                ("eager", "graph", "CUDA graphs"),
            ):
                if {before, after} <= set(p.index):
                    rows.append(
                        {
                            "fix": what,
                            "before_ms": p[before],
                            "after_ms": p[after],
                            "where": f"shipped GPU rows, context {top['x_value'].iloc[0]}",
                        }
                    )
    return pd.DataFrame(rows)
