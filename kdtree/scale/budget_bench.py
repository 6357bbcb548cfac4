"""The ``budget`` suite and the mini model's real routing statistics.

* :func:`mini_routing_stats`: from recorded rounds of an MLA+MoE target, per tree size ``T``
  (prefixes of the recorded trees in pop order = the trees of smaller budgets), the distinct
  experts touched per MoE layer, next to two expectations: uniform routing and *independent*
  tokens with the layer's measured expert popularity; plus the parent-child overlap.
* :func:`measure_latency`: a measured latency table of this machine's engine step per budget.
* :func:`run_budget`: record at the largest candidate budget, then compare fixed budgets with
  the cost-aware policy — offline (exact per-round τ by path truncation) under the local latency
  and, given ``k2_layer`` rows, under the modelled K2 step — and live (the engines run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from kdtree.bench.schema import BenchRow
from kdtree.scale.budget import CostAwareEngine, TableLatency, acceptance_scale, simulate
from kdtree.scale.record import Round, record_rounds, verify_backend
from kdtree.scale.routing import excess_overlap, expected_distinct_uniform

__all__ = ["measure_latency", "mini_routing_rows", "mini_routing_stats", "run_budget", "run_live"]

Log = Callable[[str], None]


def mini_routing_stats(rounds: Sequence[Round], n_experts: int, top_k: int) -> dict:
    """``{"curve": [{T, distinct, expected_uniform, expected_independent}], "overlap",
    "excess_overlap", "layers"}`` over every recorded round and MoE layer."""
    with_routing = [r for r in rounds if r.routing]
    if not with_routing:
        raise ValueError("rounds: no routing recorded (is the target an MoE model?)")
    layers = sorted(with_routing[0].routing)
    pop = {layer: np.zeros(n_experts) for layer in layers}
    for r in with_routing:
        for layer in layers:
            pop[layer] += np.bincount(r.routing[layer].reshape(-1), minlength=n_experts)
    incl = {layer: pop[layer] / pop[layer].sum() * top_k for layer in layers}  # P(token picks e)
    max_t = min(r.size for r in with_routing)
    ts = sorted({t for t in (1, 2, 3, 5, 9, 17, 33, 65, 129, 257) if t <= max_t} | {max_t})
    curve = []
    for t in ts:
        d = [len(np.unique(r.routing[layer][:t])) for r in with_routing for layer in layers]
        ind = np.mean([np.sum(1 - (1 - np.clip(incl[la], 0, 1)) ** t) for la in layers])
        curve.append({"T": t, "distinct": float(np.mean(d)),
                      "distinct_p20": float(np.quantile(d, 0.2)),
                      "distinct_p80": float(np.quantile(d, 0.8)),
                      "expected_uniform": expected_distinct_uniform(n_experts, top_k, t),
                      "expected_independent": float(ind)})  # fmt: skip
    overlaps = []
    for r in with_routing:
        for layer in layers:
            idx = r.routing[layer]
            for j in range(1, r.size):
                p = int(r.parents[j])
                overlaps.append(len(set(idx[j]) & set(idx[p])) / top_k)
    ov = float(np.mean(overlaps)) if overlaps else float("nan")
    return {"curve": curve, "overlap": ov, "excess_overlap": excess_overlap(ov, n_experts, top_k),
            "layers": layers, "rounds": len(with_routing)}  # fmt: skip


def mini_routing_rows(config, rounds: Sequence[Round], mode: str, source: str):
    """``moe_load`` rows (name ``mini_routing``) of an MoE target's recorded routing: measured
    distinct experts per T next to the uniform and independent-token expectations."""
    stats = mini_routing_stats(rounds, config.n_routed_experts, config.num_experts_per_tok)
    base = {"source": source, "n_experts": config.n_routed_experts,
            "top_k": config.num_experts_per_tok, "overlap": stats["overlap"],
            "excess_overlap": stats["excess_overlap"], "rounds": stats["rounds"]}  # fmt: skip
    rows = []
    for c in stats["curve"]:
        for prov, key in (("measured", "distinct"), ("expected_uniform", "expected_uniform"),
                          ("expected_independent", "expected_independent")):  # fmt: skip
            rows.append(BenchRow("moe_load", "mini_routing", prov, "count", "experts",
                                 c[key], c.get(f"{key}_p20"), c.get(f"{key}_p80"), mode=mode,
                                 x_name="T", x_value=c["T"], config=base))  # fmt: skip
    return rows, stats


def measure_latency(
    target, drafter, budgets: Sequence[int], *, context: int, top_k: int = 8, steps: int = 3
) -> TableLatency:
    """Median wall ms of one engine step (tree mode, synthetic prefix of ``context``) per
    budget, as a single-context :class:`TableLatency` over ``T = B + 1``."""
    from kdtree.spec.engine import SpecEngine

    dev = target.device
    points = {}
    be = verify_backend(target)
    warm = SpecEngine(target, drafter, mode="tree", budget=min(budgets), top_k=top_k, device=dev,
                      backend=be,
                      max_len=context + 4 * (min(budgets) + 20) + 64)  # fmt: skip
    warm.step(warm.synthetic_state(1, context, torch.Generator().manual_seed(0)))  # lazy inits
    for b in sorted(set(budgets)):
        eng = SpecEngine(target, drafter, mode="tree", budget=b, top_k=top_k, device=dev,
                         backend=be,
                         max_len=context + (steps + 2) * (b + 20) + 64)  # fmt: skip
        st = eng.synthetic_state(1, context, torch.Generator().manual_seed(0))
        eng.step(st)  # warm-up
        ms = []
        for _ in range(steps):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            eng.step(st)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            ms.append((time.perf_counter() - t0) * 1e3)
        points[(b + 1, context)] = float(np.median(ms))
    return TableLatency.from_points(points)


def run_live(
    target,
    drafter,
    prompts,
    *,
    budgets,
    latency,
    candidates,
    top_k=8,
    max_new_tokens=32,
    acceptance_scale: float | None = None,
) -> list[dict]:
    """Greedy decoding with each fixed budget and with :class:`CostAwareEngine` (plus a
    calibrated one when ``acceptance_scale`` is given): tokens/s (decode loop wall time), τ,
    and whether the tokens equal the first fixed budget's."""
    from kdtree.spec.engine import SpecEngine

    def run(make):
        outs, n_tok, steps, wall, chosen = [], 0, 0, 0.0, []
        for p in prompts:
            eng = make()
            st = eng.prefill([list(p)], max_new_tokens=max_new_tokens)
            t0 = time.perf_counter()
            while st.active:
                eng.step(st)
                steps += 1
            if target.device.type == "cuda":
                torch.cuda.synchronize(target.device)
            wall += time.perf_counter() - t0
            n_tok += len(st.tokens[0]) - 1  # the prefill's token is not decode work
            outs.append(list(st.tokens[0]))
            chosen += getattr(eng, "chosen", [])
        return outs, n_tok, steps, wall, chosen

    rows, ref = [], None
    be = verify_backend(target)
    warm = SpecEngine(target, drafter, mode="tree", budget=min(budgets), top_k=top_k, backend=be)
    st = warm.prefill([list(prompts[0])], max_new_tokens=2)  # lazy inits, not timed
    while st.active:
        warm.step(st)
    makers = [(f"fixed B={b}", b, lambda b=b: SpecEngine(target, drafter, mode="tree",
               budget=b, top_k=top_k, backend=be)) for b in budgets]  # fmt: skip
    makers.append(("cost-aware", None, lambda: CostAwareEngine(
        target, drafter, latency=latency, candidates=candidates, top_k=top_k,
        backend=be)))  # fmt: skip
    if acceptance_scale is not None and acceptance_scale > 0:
        makers.append(("cost-aware (calibrated)", None, lambda: CostAwareEngine(
            target, drafter, latency=latency, candidates=candidates, top_k=top_k, backend=be,
            acceptance_scale=acceptance_scale)))  # fmt: skip
    for name, b, make in makers:
        outs, n_tok, steps, wall, chosen = run(make)
        ref = outs if ref is None else ref
        rows.append({"policy": name, "budget": b if b is not None else float(np.mean(chosen)),
                     "tokens": n_tok, "steps": steps, "wall_s": wall,
                     "tokens_per_s": n_tok / wall if wall > 0 else float("nan"),
                     "tau_mean": n_tok / steps if steps else float("nan"),
                     "same_tokens": outs == ref, "chosen": chosen})  # fmt: skip
    return rows


def run_budget(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    source: str,
    fixed_budgets: Sequence[int] = (4, 16, 64),
    candidates: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64),
    top_k: int = 8,
    max_new_tokens: int = 24,
    latency_steps: int = 3,
    k2_model=None,
    k2_context: int = 46_000,
    k2_fixed_ms: float = 0.0,
    live: bool = True,
    log: Log | None = None,
) -> tuple[list[BenchRow], dict]:
    """Rows of suite ``budget`` and a summary (see the module docstring). ``source`` says
    which pair this is (``shipped`` trained pair or ``random``)."""
    log = log or (lambda s: None)
    dev = target.device
    mode = "gpu" if dev.type == "cuda" else "cpu"
    b_max = max(max(candidates), max(fixed_budgets))
    t0 = time.perf_counter()
    rounds = record_rounds(target, drafter, prompts, budget=b_max, top_k=top_k,
                           max_new_tokens=max_new_tokens)  # fmt: skip
    log(f"recorded {len(rounds)} rounds at B={b_max} in {time.perf_counter() - t0:.1f} s")
    ctx = int(np.median([r.context for r in rounds]))
    lat = measure_latency(target, drafter, sorted(set(candidates) | set(fixed_budgets)),
                          context=ctx, top_k=top_k, steps=latency_steps)  # fmt: skip
    base = {"source": source, "top_k": top_k, "b_max": b_max, "rounds": len(rounds),
            "candidates": list(candidates)}  # fmt: skip
    rows: list[BenchRow] = []
    for t, ms in zip(lat.ts, lat.ms[:, 0], strict=True):
        rows.append(BenchRow("budget", "latency_table", "measured", "step_time", "ms", float(ms),
                             mode=mode, x_name="T", x_value=int(t),
                             config={**base, "context": ctx}))  # fmt: skip
    summary: dict = {"source": source, "rounds": len(rounds), "context": ctx}
    scale = acceptance_scale(rounds)
    scales = {"cost-aware": 1.0}
    if np.isfinite(scale) and scale > 0:
        scales["cost-aware (calibrated)"] = scale
    summary["acceptance_scale"] = scale
    sims = {"local": simulate(rounds, lat, fixed_budgets=fixed_budgets, candidates=candidates,
                              scales=scales)}  # fmt: skip
    if k2_model is not None:
        k2_rounds = [Round(r.scores, r.parents, r.path, k2_context, r.routing) for r in rounds]
        k2_lat = _k2_latency(k2_model, k2_fixed_ms)
        sims["k2_modelled"] = simulate(k2_rounds, k2_lat, fixed_budgets=fixed_budgets,
                                       candidates=candidates, scales=scales)  # fmt: skip
    for where, sim in sims.items():
        for s in sim:
            cfg = {**base, "latency": where, "chosen_hist": _hist(s["chosen"])}
            for metric, unit in (("tokens_per_s", "tok/s"), ("tau_mean", "tokens"),
                                 ("expected_tau_mean", "tokens")):  # fmt: skip
                rows.append(BenchRow("budget", f"simulated_{where}", s["policy"], metric, unit,
                                     float(s[metric]), mode=mode if where == "local" else
                                     "modelled", x_name="budget", x_value=s["budget"],
                                     config=cfg))  # fmt: skip
        summary[f"simulated_{where}"] = {s["policy"]: s["tokens_per_s"] for s in sim}
    if live:
        live_rows = run_live(target, drafter, prompts, budgets=fixed_budgets, latency=lat,
                             candidates=candidates, top_k=top_k,
                             max_new_tokens=max_new_tokens,
                             acceptance_scale=scales.get("cost-aware (calibrated)"))  # fmt: skip
        for s in live_rows:
            cfg = {**base, "same_tokens": s["same_tokens"], "chosen_hist": _hist(s["chosen"])}
            for metric, unit in (("tokens_per_s", "tok/s"), ("tau_mean", "tokens")):
                rows.append(BenchRow("budget", "live", s["policy"], metric, unit,
                                     float(s[metric]), mode=mode, x_name="budget",
                                     x_value=s["budget"], config=cfg))  # fmt: skip
        summary["live"] = {s["policy"]: s["tokens_per_s"] for s in live_rows}
        summary["live_same_tokens"] = all(s["same_tokens"] for s in live_rows)
    return rows, summary


def _k2_latency(k2_model, fixed_ms: float):
    def lat(t: int, context: int) -> float:
        return k2_model.step_ms(t, context) + fixed_ms

    return lat


def _hist(chosen: Sequence[int]) -> dict[str, int]:
    vals, counts = np.unique(np.asarray(chosen, dtype=np.int64), return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(vals, counts, strict=True)}
