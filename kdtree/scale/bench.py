"""Benchmark rows for the scale suites: ``k2_layer`` (per-layer verify timing of the slice and
the modelled 61-layer step), ``moe_load`` (experts touched and time per MoE layer against T).
The ``budget`` suite lives in :mod:`kdtree.scale.budget_bench`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from kdtree.bench.schema import BenchRow
from kdtree.bench.timing import time_cpu, time_cuda
from kdtree.scale.spec import K2RankSpec

__all__ = ["measure_bandwidth", "run_k2_layer", "run_moe_load", "time_ms"]

Log = Callable[[str], None]


def _mode(device: torch.device, spec: K2RankSpec) -> str:
    return ("gpu" if device.type == "cuda" else "cpu") + ("" if spec.is_full_size else "-reduced")


def time_ms(fn: Callable[[], object], device: torch.device, *, rep_ms: float = 60.0):
    """p50/p20/p80 ms of ``fn`` under ``no_grad`` (CUDA events with an L2 flush on a GPU)."""

    def run():
        with torch.no_grad():
            return fn()

    if device.type == "cuda":
        return time_cuda(run, warmup_ms=rep_ms / 4, rep_ms=rep_ms)
    return time_cpu(run, min_run_time=rep_ms / 1e3)


def measure_bandwidth(device: torch.device, nbytes: int | None = None) -> float:
    """Streaming rate in TB/s of a large copy, read + write bytes counted (on a GPU the same
    measurement as ``kdtree.bench.roofline.measure_copy_bandwidth``)."""
    if device.type == "cuda":
        from kdtree.bench.roofline import measure_copy_bandwidth

        return measure_copy_bandwidth(device, nbytes or 2 << 30)
    nbytes = nbytes or 256 << 20
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    t = time_cpu(lambda: dst.copy_(src), min_run_time=0.2)
    return 2 * nbytes / (t.p50 * 1e-3) / 1e12


def _row(suite, name, provider, mode, metric, unit, t, value=None, **cfg) -> BenchRow:
    if value is not None:
        return BenchRow(suite, name, provider, metric, unit, float(value), mode=mode,
                        x_name="T", x_value=cfg.pop("T"), config=cfg)  # fmt: skip
    return BenchRow(suite, name, provider, metric, unit, t.p50, t.p20, t.p80, mode=mode,
                    x_name="T", x_value=cfg.pop("T"), config=cfg)  # fmt: skip


# ------------------------------------------------------------------------------ k2_layer


def run_k2_layer(
    spec: K2RankSpec,
    *,
    n_layers: int = 3,
    contexts: Sequence[int] = (4096, 46000, 91000, 185000),
    trees: Sequence[int] = (1, 9, 17, 65, 257),
    attn_providers: Sequence[str] = ("triton", "eager"),
    moe_providers: Sequence[str] = ("loop", "bmm", "grouped"),
    device: torch.device | str = "cuda",
    rep_ms: float = 60.0,
    max_seconds: float = 150.0,
    seed: int = 0,
    whole_layer: bool = True,
    log: Log | None = None,
) -> tuple[list[BenchRow], dict]:
    """Time every part of a dense and an MoE layer of the slice for verify at each (T, L), the
    model's own whole-layer forward as a check, and the LM head; then the modelled 61-layer
    step (rows with ``mode`` ending in ``-modelled``). Returns rows and a summary."""
    from kdtree.scale.layer_timing import LayerParts
    from kdtree.scale.slice import build_k2_slice, make_verify_batch

    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    mode = _mode(dev, spec)
    log = log or (lambda s: None)
    t_start = time.perf_counter()
    model = build_k2_slice(
        spec, n_layers, device=dev, dtype=dtype, seed=seed, context=max(contexts), tree=max(trees)
    )
    log(f"built {spec.label}: {n_layers} layers in {time.perf_counter() - t_start:.1f} s")
    moe_idx = spec.first_dense if n_layers > spec.first_dense else None
    layer_ids = [(0, "dense" if spec.first_dense else "moe")]
    if moe_idx is not None and moe_idx != 0:
        layer_ids.append((moe_idx, "moe"))
    base = {
        "spec": spec.label,
        "dtype": str(dtype).replace("torch.", ""),
        "layers_built": n_layers,
    }
    rows: list[BenchRow] = []
    skipped: list[str] = []
    timed_fixed: set[tuple[str, int]] = set()
    for ctx_len in contexts:
        for t in trees:
            if time.perf_counter() - t_start > max_seconds:
                skipped.append(f"L={ctx_len} T={t}: wall budget spent")
                continue
            vb = make_verify_batch(model, ctx_len, t, backend="triton", seed=seed)
            for idx, kind in layer_ids:
                lp = LayerParts(model, idx, vb, seed=seed + idx)
                cfg = {**base, "layer": kind, "distinct_experts": lp.distinct_experts}
                # attention has the same shapes in every layer: timed once, on the last kind
                attn_here = attn_providers if idx == layer_ids[-1][0] else ()
                for (part, prov), fn in lp.parts(attn_here, moe_providers).items():
                    fixed = part != "attn_kernel"
                    if fixed and (kind, t) in timed_fixed:
                        continue
                    try:
                        tm = time_ms(fn, dev, rep_ms=rep_ms)
                    except (RuntimeError, torch.OutOfMemoryError) as exc:
                        skipped.append(f"{kind} {part}[{prov}] L={ctx_len} T={t}: {exc!r:.120}")
                        if dev.type == "cuda":
                            torch.cuda.empty_cache()
                        continue
                    rows.append(_row("k2_layer", part, prov, mode, "time", "ms", tm, T=t,
                                     context=None if fixed else ctx_len, **cfg))  # fmt: skip
                if kind == "moe" and whole_layer:
                    tm = time_ms(lp.layer_model, dev, rep_ms=rep_ms)
                    rows.append(_row("k2_layer", "layer_model", "triton+loop", mode, "time",
                                     "ms", tm, T=t, context=ctx_len, **cfg))  # fmt: skip
                if (kind, t) not in timed_fixed and idx == layer_ids[0][0]:
                    tm = time_ms(lp.lm_head, dev, rep_ms=rep_ms)
                    rows.append(_row("k2_layer", "lm_head", "model", mode, "time", "ms", tm,
                                     T=t, context=None, **{**cfg, "layer": "head"}))  # fmt: skip
                timed_fixed.add((kind, t))
            log(f"L={ctx_len} T={t}: {time.perf_counter() - t_start:.0f} s")
            del vb
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    summary = {"spec": spec.label, "mode": mode, "skipped": skipped}
    rows += modelled_step_rows(rows, spec, contexts, trees, mode, summary)
    return rows, summary


def modelled_step_rows(rows, spec, contexts, trees, mode, summary) -> list[BenchRow]:
    """The 61-layer step modelled from measured rows (H200 + NVLink model, and the what-if for
    the investigation's machine), per (T, L) and per provider choice."""
    import pandas as pd

    from kdtree.bench.schema import run_env
    from kdtree.scale.extrapolate import INVESTIGATION, RTX_PRO_6000_INT4, what_if
    from kdtree.scale.tables import step_model_from_rows

    env = run_env("")
    df = pd.DataFrame([r.to_record(env) for r in rows])
    out: list[BenchRow] = []
    summary["step_ms"], summary["what_if_rtx_ms"] = {}, {}
    attn_provs = sorted(set(df.loc[df["name"] == "attn_kernel", "provider"]))
    moe_provs = sorted(set(df.loc[df["name"] == "experts", "provider"]))
    for ap in attn_provs:
        for mp in moe_provs:
            try:
                model = step_model_from_rows(df, spec, attn_provider=ap, moe_provider=mp)
            except ValueError as exc:
                summary["skipped"].append(f"step model {ap}+{mp}: {exc}")
                continue
            prov = f"{ap}+{mp}"
            for ctx_len in contexts:
                for t in trees:
                    parts = model.parts(t, ctx_len)
                    cfg = {"spec": spec.label, "context": ctx_len, "link": model.link.as_dict(),
                           "parts_ms": parts}  # fmt: skip
                    out.append(_row("k2_layer", "step_61_layers", prov, f"{mode}-modelled",
                                    "time", "ms", None, value=parts["total"], T=t, **cfg))  # fmt: skip
                    out.append(_row("k2_layer", "step_61_layers", prov, f"{mode}-modelled",
                                    "tokens_per_s_at_tau1", "tok/s", None,
                                    value=1e3 / parts["total"], T=t, **cfg))  # fmt: skip
                    wi = what_if(parts, RTX_PRO_6000_INT4, model, t)
                    out.append(_row("k2_layer", "step_what_if_rtx_int4", prov, f"{mode}-modelled",
                                    "time", "ms", None, value=wi["total"], T=t,
                                    **{**cfg, "parts_ms": wi,
                                       "machine": RTX_PRO_6000_INT4.name,
                                       "investigation": INVESTIGATION}))  # fmt: skip
                    summary["step_ms"].setdefault(prov, {})[f"T{t}_L{ctx_len}"] = parts["total"]
                    summary["what_if_rtx_ms"].setdefault(prov, {})[f"T{t}_L{ctx_len}"] = wi[
                        "total"
                    ]
    return out


# ------------------------------------------------------------------------------ moe_load


def run_moe_load(
    spec: K2RankSpec,
    *,
    trees: Sequence[int] = (1, 2, 5, 9, 17, 33, 65, 129, 257),
    kinds: Sequence[str] = ("uniform", "zipf", "correlated"),
    providers: Sequence[str] = ("loop", "bmm", "grouped"),
    device: torch.device | str = "cuda",
    trials: int = 8,
    zipf_s: float = 1.0,
    rho: float = 0.6,
    rep_ms: float = 40.0,
    seed: int = 0,
    mini_excess: float | None = None,
    time_kinds: Sequence[str] | None = None,
    log: Log | None = None,
) -> tuple[list[BenchRow], dict]:
    """Experts touched by ``T`` verify tokens under each routing case (Monte Carlo), and the
    time of one MoE layer's routed experts per provider with that routing, next to the byte
    floor at the bandwidth measured in this run. ``mini_excess`` (the mini model's excess
    parent-child overlap) calibrates ``rho`` for the correlated case when given;
    ``time_kinds`` limits the timed cases (default: all of ``kinds``)."""
    from kdtree.scale.moe import moe_experts, moe_floor_ms
    from kdtree.scale.routing import (
        calibrate_rho,
        random_tree_parents,
        routing_curve,
        sample_routing,
        zipf_log_popularity,
    )
    from kdtree.scale.slice import build_k2_slice

    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    mode = _mode(dev, spec)
    log = log or (lambda s: None)
    if mini_excess is not None and np.isfinite(mini_excess):
        rho = calibrate_rho(mini_excess, spec.n_experts, spec.top_k)
        rho_src = f"calibrated to the mini model's excess overlap {mini_excess:.3f}"
    else:
        rho_src = "assumed"
    model = build_k2_slice(spec, spec.first_dense + 1, device=dev, dtype=dtype, seed=seed)
    experts = model.model.layers[spec.first_dense].mlp.experts
    elem = torch.finfo(dtype).bits // 8
    e_bytes = spec.expert_bytes(elem)
    bw = measure_bandwidth(dev, None if dev.type == "cuda" else 64 << 20)
    log(f"bandwidth {bw:.2f} TB/s (copy, read + write); expert {e_bytes / 2**20:.1f} MiB")
    gen = torch.Generator().manual_seed(seed)
    dgen = torch.Generator(device=dev).manual_seed(seed)
    log_pop = zipf_log_popularity(spec.n_experts, zipf_s, gen)
    rows: list[BenchRow] = []
    summary: dict = {"bandwidth_TBps": bw, "expert_MiB": e_bytes / 2**20, "rho": rho,
                     "rho_source": rho_src, "distinct": {}, "ms": {}}  # fmt: skip
    base = {"spec": spec.label, "zipf_s": zipf_s, "rho": rho, "rho_source": rho_src,
            "bandwidth_TBps": bw, "expert_bytes": e_bytes}  # fmt: skip
    for kind in kinds:
        curve = routing_curve(kind, trees, spec.n_experts, spec.top_k, trials=trials, seed=seed,
                              zipf_s=zipf_s, rho=rho)  # fmt: skip
        for c in curve:
            t = c["T"]
            cfg = {**base, "kind": kind}
            rows.append(BenchRow("moe_load", "distinct_experts", kind, "count", "experts",
                                 c["distinct_mean"], c["distinct_p20"], c["distinct_p80"],
                                 mode=mode, x_name="T", x_value=t, config=cfg))  # fmt: skip
            rows.append(_row("moe_load", "distinct_experts", "expected_uniform", mode, "count",
                             "experts", None, value=c["expected_uniform"], T=t, **cfg))  # fmt: skip
            rows.append(_row("moe_load", "expert_bytes", kind, mode, "bytes", "MB", None,
                             value=c["distinct_mean"] * e_bytes / 1e6, T=t, **cfg))  # fmt: skip
            summary["distinct"].setdefault(kind, {})[t] = c["distinct_mean"]
            if time_kinds is not None and kind not in time_kinds:
                continue
            # one routing sample to time
            parents = random_tree_parents(t, gen) if kind == "correlated" else None
            idx = sample_routing(t, spec.n_experts, spec.top_k, gen,
                                 log_pop=log_pop if kind == "zipf" else None, parents=parents,
                                 rho=rho if kind == "correlated" else 0.0).to(dev)  # fmt: skip
            n_d = int(torch.unique(idx).numel())
            x = torch.randn(t, spec.hidden, generator=dgen, device=dev).to(dtype)
            w = torch.rand(t, spec.top_k, generator=dgen, device=dev) + 0.1
            w = w / w.sum(-1, keepdim=True)
            tcfg = {**cfg, "distinct_experts": n_d}
            rows.append(_row("moe_load", "experts_time", "floor", mode, "time", "ms", None,
                             value=moe_floor_ms(n_d, e_bytes, bw), T=t, **tcfg))  # fmt: skip
            for prov in providers:
                try:
                    tm = time_ms(
                        lambda prov=prov, idx=idx, x=x, w=w: moe_experts(
                            experts, x, idx, w, provider=prov
                        ),
                        dev,
                        rep_ms=rep_ms,
                    )
                except RuntimeError as exc:
                    summary.setdefault("skipped", []).append(f"{prov} T={t}: {exc!r:.120}")
                    continue
                rows.append(_row("moe_load", "experts_time", prov, mode, "time", "ms", tm,
                                 T=t, **tcfg))  # fmt: skip
                summary["ms"].setdefault(f"{kind}/{prov}", {})[t] = tm.p50
        log(f"{kind}: done")
    return rows, summary
