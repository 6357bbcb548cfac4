"""The context-decode benchmark: real prefill + decode with the trained pair on HumanEval.

One *point* = (mode, budget, temperature, context, backend path) over ``n_prompts`` HumanEval
prompts (each behind ``ctx`` tokens of stdlib source when ``ctx`` exceeds the prompt). Per
prompt: TTFT (the prefill, first token included), then decode steps until ``gen`` tokens;
decode tokens/s counts the tokens after the first. τ, target forwards per generated token and
the acceptance histogram come from the engine's step records; the per-phase breakdown from one
extra run with device-synchronised phase timings (so the timed runs are not slowed by syncs).

``graphs=True`` points (name suffix ``_graph``; ``graphs``, ``runner_mode`` and ``sync_every``
in the row config) decode through :class:`~kdtree.spec.gpu.runner.GraphStepRunner` after the
same prefill: every mode (``ar``, ``chain``, ``tree``) replays one CUDA graph per step and the
host syncs every ``sync_every`` steps to stream tokens. A runner, and so a graph capture, is
built per prompt (its static buffers belong to that prompt's cache), so its construction and
its first ``warmup + 1`` steps (eager warm-up, then capture + first replay) run *before* the
decode clock starts and their tokens are left out of decode tokens/s (``decode_tok``); τ and
forwards per token still count every step. The clock then includes the host syncs and, at the
end, the steps a window runs past the last token (up to ``sync_every - 1``: the cost of not
syncing every step). The per-phase breakdown still comes from the eager engine. On the CPU
(tests) ``runner_mode="eager"`` runs the same runner path without a graph.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from kdtree.bench.schema import BenchRow

SUITE = "decode"
BUDGETS = (8, 16, 32, 64, 128, 256)
CONTEXTS = (1024, 4096, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class DecodePoint:
    mode: str  # ar | chain | tree
    ctx: int  # requested prompt tokens (0: the bare HumanEval prompt)
    gen: int
    budget: int = 64
    top_k: int = 8
    temperature: float = 0.0
    dense_mask: bool = False
    backend: str = "auto"
    graphs: bool = False  # decode through GraphStepRunner (CUDA graphs) instead of the engine
    sync_every: int = 4  # graphs: steps between host syncs (token streaming)

    def __post_init__(self) -> None:
        if self.graphs and self.dense_mask:
            raise ValueError(
                "graphs=True, dense_mask=True: the generic dense-mask path runs on the eager "
                "engine only; expected graphs=False for a dense_mask point"
            )
        if self.sync_every < 1:
            raise ValueError(f"sync_every={self.sync_every}: expected >= 1")

    @property
    def name(self) -> str:
        base = f"tree_B{self.budget}" if self.mode == "tree" else self.mode
        return (
            base + ("_dense_mask" if self.dense_mask else "") + ("_graph" if self.graphs else "")
        )


@dataclass
class PromptRun:
    task_id: str
    prompt_tok: int
    ttft_s: float
    decode_wall_s: float
    gen_tok: int
    steps: int
    tau_mean: float
    fwd_per_tok: float
    histogram: dict[int, int]
    #: tokens generated inside ``decode_wall_s`` (default: all after the first); graph runs
    #: leave out the warm-up/capture steps' tokens, whose time is not in ``decode_wall_s``
    decode_tok: int | None = None

    @property
    def timed_tok(self) -> int:
        return self.gen_tok - 1 if self.decode_tok is None else self.decode_tok

    @property
    def decode_tok_s(self) -> float:
        return self.timed_tok / self.decode_wall_s if self.decode_wall_s > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tok / self.ttft_s if self.ttft_s > 0 else 0.0


@dataclass
class PointResult:
    point: DecodePoint
    runs: list[PromptRun]
    phase_ms: dict[str, float] = field(default_factory=dict)  # mean per step, synced run
    runner_mode: str | None = None  # graphs: the GraphStepRunner mode ("graph" | "eager")

    def summary(self) -> dict:
        r = self.runs
        hist: Counter = Counter()
        for x in r:
            hist.update(x.histogram)
        steps = sum(x.steps for x in r)
        gen_after_first = sum(x.gen_tok - 1 for x in r)
        return {
            **asdict(self.point),
            "name": self.point.name,
            "runner_mode": self.runner_mode,
            "n_prompts": len(r),
            "prompt_tok": statistics.mean(x.prompt_tok for x in r),
            "ttft_s": statistics.median(x.ttft_s for x in r),
            "prefill_tok_s": statistics.median(x.prefill_tok_s for x in r),
            # pooled: all timed tokens (after the first) over all decode time
            "decode_tok_s": sum(x.timed_tok for x in r)
            / max(sum(x.decode_wall_s for x in r), 1e-12),
            "decode_tok_s_p50": statistics.median(x.decode_tok_s for x in r),
            "gen_tok": sum(x.gen_tok for x in r) / len(r),
            "decode_wall_s": sum(x.decode_wall_s for x in r),
            "tau": (sum(k * v for k, v in hist.items()) / sum(hist.values())) if hist else 1.0,
            "fwd_per_tok": steps / gen_after_first if gen_after_first else float("nan"),
            "histogram": {str(k): v for k, v in sorted(hist.items())},
            "phase_ms": self.phase_ms,
        }

    def rows(self) -> list[BenchRow]:
        s = self.summary()
        p = self.point
        cfg = {
            k: s[k]
            for k in (
                "ctx",
                "gen",
                "budget",
                "top_k",
                "temperature",
                "dense_mask",
                "graphs",
                "runner_mode",
                "sync_every",
                "n_prompts",
                "prompt_tok",
            )
        }
        provider = "dense_mask" if p.dense_mask else p.backend
        base = dict(
            suite=SUITE,
            name=p.name,
            provider=provider,
            mode=p.mode,
            x_name="ctx",
            x_value=p.ctx,
            config=cfg,
        )
        per = {
            "decode_tok_s": ([x.decode_tok_s for x in self.runs], "tok/s"),
            "ttft_s": ([x.ttft_s for x in self.runs], "s"),
            "prefill_tok_s": ([x.prefill_tok_s for x in self.runs], "tok/s"),
            "tau": ([x.tau_mean for x in self.runs], "tokens/step"),
            "fwd_per_tok": ([x.fwd_per_tok for x in self.runs], "forwards/token"),
        }
        rows = [
            BenchRow(
                metric=m,
                unit=u,
                p50=_quantile(v, 0.5),
                p20=_quantile(v, 0.2),
                p80=_quantile(v, 0.8),
                **base,
            )
            for m, (v, u) in per.items()
        ]
        rows.append(
            BenchRow(metric="decode_tok_s_pooled", unit="tok/s", p50=s["decode_tok_s"], **base)
        )
        for name, ms in self.phase_ms.items():
            rows.append(BenchRow(metric=f"phase_{name}_ms", unit="ms/step", p50=ms, **base))
        for k, v in s["histogram"].items():
            rows.append(
                BenchRow(
                    metric="tau_count",
                    unit="steps",
                    p50=float(v),
                    **{**base, "x_name": "tau", "x_value": int(k)},
                )
            )
        return rows


def _quantile(values: list[float], q: float) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(q))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_engine(target, drafter, p: DecodePoint, timings: bool = False, seed: int = 0):
    from kdtree.spec.engine import SpecEngine

    gen = torch.Generator(device=target.device).manual_seed(seed)
    return SpecEngine(
        target,
        drafter if p.mode != "ar" else None,
        mode=p.mode,
        budget=p.budget,
        top_k=p.top_k,
        temperature=p.temperature,
        backend=p.backend,
        dense_mask=p.dense_mask,
        timings=timings,
        generator=gen,
    )


@torch.no_grad()
def run_prompt(
    engine,
    ids: list[int],
    gen: int,
    task_id: str = "",
    *,
    runner_mode: str | None = None,
    sync_every: int = 4,
) -> tuple[PromptRun, list]:
    """Prefill + decode one prompt; returns the run and the step records.

    ``runner_mode`` ``None``: decode with ``engine.step``. ``"graph"`` / ``"eager"`` / ``"auto"``:
    decode through a :class:`~kdtree.spec.gpu.runner.GraphStepRunner` of that mode (host sync
    every ``sync_every`` steps); its warm-up and capture steps run before the decode clock
    starts and their tokens are not in ``decode_tok`` (module docstring)."""
    dev = engine.device
    _sync(dev)
    t0 = time.perf_counter()
    state = engine.prefill([ids], max_new_tokens=gen)
    _sync(dev)
    t1 = time.perf_counter()
    t_dec = t1  # decode clock start
    decode_tok = None
    if runner_mode is None:
        records = []
        while state.active:
            records.append(engine.step(state))
    else:
        from kdtree.spec.gpu.runner import GraphStepRunner

        records = []
        if state.active:
            runner = GraphStepRunner(engine, state, mode=runner_mode, sync_every=sync_every)
            # warm-up steps, then capture + first replay (graph mode), outside the clock
            for _ in range(runner.warmup + 1):
                if not state.active:
                    break
                runner.step()
            runner.flush()
            _sync(dev)
            t_dec = time.perf_counter()
            before = len(state.tokens[0])
            # every active step emits >= 1 token: gen steps always finish the prompt
            runner.run(max(gen, 1) + sync_every)
            if state.active:
                raise RuntimeError(f"runner: prompt {task_id!r} unfinished after {gen} steps")
            decode_tok = len(state.tokens[0]) - before
            records = runner.records
    _sync(dev)
    t2 = time.perf_counter()
    hist = Counter(t for r in records for t in r.accepted_len)
    emitted = sum(sum(r.emitted) for r in records)
    taus = [t for r in records for t in r.accepted_len]
    run = PromptRun(
        task_id=task_id,
        prompt_tok=len(ids),
        ttft_s=t1 - t0,
        decode_wall_s=t2 - t_dec,
        gen_tok=len(state.tokens[0]),
        steps=len(records),
        tau_mean=sum(taus) / len(taus) if taus else 1.0,
        fwd_per_tok=len(records) / emitted if emitted else float("nan"),
        histogram=dict(hist),
        decode_tok=decode_tok,
    )
    return run, records


def run_point(
    target,
    drafter,
    prompts: list[tuple[str, list[int]]],
    p: DecodePoint,
    warmup: bool = True,
    phases: bool = True,
    seed: int = 0,
    runner_mode: str = "graph",
) -> PointResult:
    """All prompts of one point (after a short warm-up), plus one synced run for phases.

    ``runner_mode``: the ``GraphStepRunner`` mode of a ``graphs`` point (``"graph"``; the CPU
    tests pass ``"eager"``); ignored otherwise. The warm-up prompt goes through the same path
    (Triton compiles, allocator and first capture happen there)."""
    if runner_mode not in ("graph", "eager", "auto"):
        raise ValueError(f"runner_mode={runner_mode!r}: expected 'graph', 'eager' or 'auto'")
    engine = make_engine(target, drafter, p, timings=False, seed=seed)
    kw = dict(runner_mode=runner_mode if p.graphs else None, sync_every=p.sync_every)
    if warmup:
        run_prompt(engine, prompts[0][1], min(p.gen, 8), **kw)
    runs = [run_prompt(engine, ids, p.gen, tid, **kw)[0] for tid, ids in prompts]
    phase_ms: dict[str, float] = {}
    if phases:
        synced = make_engine(target, drafter, p, timings=True, seed=seed)
        _, recs = run_prompt(synced, prompts[0][1], p.gen)
        for name in {k for r in recs for k in r.phase_ms}:
            vals = [r.phase_ms[name] for r in recs if name in r.phase_ms]
            phase_ms[name] = sum(vals) / len(vals)
    return PointResult(p, runs, phase_ms, runner_mode=runner_mode if p.graphs else None)


def load_pair(
    models_dir: str | Path,
    device: torch.device,
    dtype: torch.dtype | None = None,
    drafter_name: str = "drafter",
):
    """(target, drafter, tokenizer) from ``models_dir`` (``target/``, ``drafter/`` or
    ``drafter_name/``, ``tokenizer.json``); bf16 on CUDA, fp32 on the CPU unless ``dtype``
    says otherwise."""
    from kdtree.models import load_model
    from kdtree.train.tokenizer import load_tokenizer

    models_dir = Path(models_dir)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    tok = load_tokenizer(models_dir / "tokenizer.json")
    target = load_model(models_dir / "target", device=device, dtype=dtype)
    drafter = load_model(models_dir / drafter_name, device=device, dtype=dtype, target=target)
    return target, drafter, tok


def sweep_points(
    gen: int,
    contexts: tuple[int, ...] = CONTEXTS,
    budgets: tuple[int, ...] = BUDGETS,
    top_k: int = 8,
    parts: tuple[str, ...] = ("modes", "budgets", "contexts"),
    temperatures: tuple[float, ...] = (0.0, 1.0),
    graphs: bool = False,
    sync_every: int = 4,
) -> list[DecodePoint]:
    """The sweep. ``modes``: ar, chain, tree@64 per temperature at the first context;
    ``budgets``: tree at every budget (plus ar and chain as references) per temperature at the
    first context; ``contexts``: ar, chain, tree@64 (kernels) and tree@64 through the dense
    mask at every context, T = the first temperature. ``graphs``: every point but the
    dense-mask baseline decodes through the CUDA-graph runner."""
    bad = set(parts) - {"modes", "budgets", "contexts"}
    if bad:
        raise ValueError(
            f"parts={parts}: unknown {sorted(bad)}; expected modes, budgets, contexts"
        )
    if not contexts or not temperatures:
        raise ValueError("contexts, temperatures: expected at least one value each")
    pts: list[DecodePoint] = []
    base = contexts[0]
    if "modes" in parts or "budgets" in parts:
        for t in temperatures:
            pts += [
                DecodePoint("ar", base, gen, temperature=t),
                DecodePoint("chain", base, gen, temperature=t),
            ]
            want = budgets if "budgets" in parts else ()
            for b in sorted({64, *want} if "modes" in parts else set(want)):
                pts.append(DecodePoint("tree", base, gen, b, top_k, temperature=t))
    if "contexts" in parts:
        t = temperatures[0]
        for c in contexts:
            pts += [
                DecodePoint("ar", c, gen, temperature=t),
                DecodePoint("chain", c, gen, temperature=t),
                DecodePoint("tree", c, gen, 64, top_k, temperature=t),
                DecodePoint("tree", c, gen, 64, top_k, temperature=t, dense_mask=True),
            ]
    if graphs:
        pts = [p if p.dense_mask else replace(p, graphs=True, sync_every=sync_every) for p in pts]
    seen, out = set(), []
    for p in pts:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def speedups(summaries: list[dict]) -> list[dict]:
    """decode tok/s of each point over ``ar`` (and ``chain``) at the same context and
    temperature, run the same way (both with CUDA graphs or both eager); a point without such a
    reference (the eager dense-mask baseline in a graph sweep) is compared with the other
    way's, and ``vs_ar`` / ``vs_chain`` name the reference used."""

    def refs(mode: str) -> dict:
        return {
            (s["ctx"], s["temperature"], bool(s.get("graphs", False))): s
            for s in summaries
            if s["mode"] == mode and not s.get("dense_mask", False)
        }

    by_mode = {m: refs(m) for m in ("ar", "chain")}
    out = []
    for s in summaries:
        key = (s["ctx"], s["temperature"], bool(s.get("graphs", False)))
        row = {"name": s["name"], "ctx": s["ctx"], "temperature": s["temperature"]}
        for m, table in by_mode.items():
            ref = table.get(key) or table.get((*key[:2], not key[2]))
            base = ref["decode_tok_s"] if ref else None
            row[f"speedup_vs_{m}"] = s["decode_tok_s"] / base if base else float("nan")
            row[f"vs_{m}"] = ref["name"] if ref else None
        out.append(row)
    return out
