"""Hypotheses about where step time goes, measured instead of guessed.

A :class:`Hypothesis` names a phase and a gap: "``prepare_for_verify`` grows with context and
explains an idle gap of 200 ms per step at 46k tokens". :func:`sweep` runs a step function over
context lengths (and batch sizes) with the profiler on and keeps one row per (step, phase);
:func:`fit` fits cost against context (slope in ms per 1k tokens, log-log exponent, bootstrap
confidence intervals); :func:`verdict` compares the fitted cost at the observed context with
the gap: *confirmed*, *refuted* or *inconclusive*, with the numbers behind it.
:func:`mask_build_experiment` runs the original investigation on our engine (tree mode, the
generic ``dense_mask`` verify path that builds an O(context) mask in ``prepare_for_verify``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kdtree import profiler

__all__ = [
    "ExperimentResult",
    "Hypothesis",
    "MASK_HYPOTHESIS",
    "Verdict",
    "fit",
    "make_engine",
    "mask_build_experiment",
    "sweep",
    "verdict",
]

OUTCOMES = ("confirmed", "refuted", "inconclusive")
STEP = profiler.STEP


@dataclass(frozen=True)
class Hypothesis:
    """``phase`` costs enough at ``context`` tokens to explain ``gap_ms`` of idle per step.

    Refuted when the upper confidence bound of the fitted cost is below ``refute_below × gap``;
    confirmed when the lower bound reaches ``confirm_above × gap``; inconclusive in between or
    when ``context`` lies more than ``max_extrapolation``× beyond the measured range.
    """

    phase: str
    claim: str
    gap_ms: float
    context: int
    batch_size: int = 1
    refute_below: float = 0.1
    confirm_above: float = 0.5
    max_extrapolation: float = 4.0

    def __post_init__(self) -> None:
        if not self.phase:
            raise ValueError("phase: expected a non-empty phase name")
        if not (self.gap_ms > 0 and math.isfinite(self.gap_ms)):
            raise ValueError(f"gap_ms={self.gap_ms!r}: expected a positive number of ms")
        if self.context < 1 or self.batch_size < 1:
            raise ValueError(
                f"context={self.context}, batch_size={self.batch_size}: expected integers >= 1"
            )
        if not 0 < self.refute_below < self.confirm_above:
            raise ValueError(
                f"refute_below={self.refute_below}, confirm_above="
                f"{self.confirm_above}: expected 0 < refute_below < confirm_above"
            )


MASK_HYPOTHESIS = Hypothesis(
    phase="prepare_for_verify",
    claim="O(context) mask construction explains an idle gap of 200 ms per step",
    gap_ms=200.0,
    context=46_000,
)


# --------------------------------------------------------------------------- sweep


def sweep(
    step_fn_factory: Callable[[int, int], Callable[[], Any]],
    contexts: Sequence[int],
    batch_sizes: Sequence[int] = (1,),
    repeats: int = 10,
    *,
    warmup: int = 2,
    gpu: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Run ``step_fn_factory(batch, context)()`` ``warmup + repeats`` times per configuration.

    The step function runs one decode step with profiler phases inside (it may call
    ``profiler.step()`` itself; otherwise the sweep marks the step). Returns one row per
    measured (batch, context, repeat, phase) with ``host_ms``/``gpu_ms`` summed over the
    phase's calls in that step; the ``step`` row is the whole step. The profiler is reset per
    configuration and left as it was found (on/off) afterwards.
    """
    contexts = _positive_ints(contexts, "contexts")
    batch_sizes = _positive_ints(batch_sizes, "batch_sizes")
    if repeats < 2 or warmup < 1:
        raise ValueError(f"repeats={repeats}, warmup={warmup}: expected repeats >= 2, warmup >= 1")
    was_on = profiler.is_enabled()
    frames = []
    try:
        for batch in batch_sizes:
            for ctx in contexts:
                if log:
                    log(f"sweep: batch={batch} context={ctx}")
                step_fn = step_fn_factory(batch, ctx)
                profiler.reset()
                profiler.enable(gpu=gpu)
                for i in range(warmup + repeats):
                    before = profiler.step_count()
                    step_fn()
                    if profiler.step_count() == before:
                        profiler.step()
                    if i == warmup - 1:
                        first = profiler.step_count()
                raw = profiler.samples(sync=True)
                raw = raw[raw["step"] >= first]
                if raw["step"].nunique() < repeats:
                    raise RuntimeError(
                        f"batch={batch} context={ctx}: the profiler kept samples of only "
                        f"{raw['step'].nunique()} of {repeats} steps; raise "
                        "profiler.enable(max_samples=...)"
                    )
                frames.append(_per_step(raw, batch, ctx, first))
    finally:
        if not was_on:
            profiler.disable()
    return pd.concat(frames, ignore_index=True)


def _per_step(raw: pd.DataFrame, batch: int, ctx: int, first: int) -> pd.DataFrame:
    g = raw.groupby(["step", "phase"], sort=True)
    out = g.agg(host_ms=("host_ms", "sum"), calls=("host_ms", "size")).reset_index()
    gpu = g["gpu_ms"].agg(lambda s: s.sum() if s.notna().all() else math.nan)
    out["gpu_ms"] = gpu.to_numpy()
    out.insert(0, "context", ctx)
    out.insert(0, "batch", batch)
    out["repeat"] = out.pop("step") - first
    return out[["batch", "context", "repeat", "phase", "host_ms", "gpu_ms", "calls"]]


def _positive_ints(values: Sequence[int], name: str) -> list[int]:
    vals = list(values)
    if not vals or any(isinstance(v, bool) or int(v) != v or v < 1 for v in vals):
        raise ValueError(f"{name}={values!r}: expected a non-empty list of integers >= 1")
    return [int(v) for v in vals]


# --------------------------------------------------------------------------- fit


def fit(
    df: pd.DataFrame,
    phase: str,
    *,
    y: str = "host_ms",
    at_context: int | None = None,
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Fit ``y`` of ``phase`` against context, one row per batch size.

    Least squares on the per-context medians (robust to the odd slow step of a busy host):
    ``y = a + b·L`` (``slope_ms_per_1k`` = 1000·b) and ``log y = c + e·log L`` (``exponent``
    e); CIs from a stratified bootstrap (steps resampled within each context). With ``at_context``, adds the fitted cost there
    (``cost_ms`` and its CI) plus the median measured at the nearest context.
    """
    need = {"batch", "context", "phase", y}
    if missing := need - set(df.columns):
        raise ValueError(f"df: missing columns {sorted(missing)} (expected sweep() output)")
    sel = df[(df["phase"] == phase) & df[y].notna()]
    if sel.empty:
        raise ValueError(
            f"phase={phase!r}: no {y} samples; phases present: {sorted(df['phase'].unique())}"
        )
    rng = np.random.default_rng(seed)
    alpha = (1 - ci) / 2
    rows = []
    for batch, part in sel.groupby("batch", sort=True):
        groups = [g[y].to_numpy(dtype=np.float64) for _, g in part.groupby("context", sort=True)]
        xs = np.array(sorted(part["context"].unique()), dtype=np.float64)
        if len(xs) < 2:
            raise ValueError(
                f"batch={batch}: need at least 2 context lengths to fit, got {xs.tolist()}"
            )
        point = _fit_once(xs, groups, at_context)
        boot = np.array(
            [
                _fit_once(xs, [g[rng.integers(0, len(g), len(g))] for g in groups], at_context)
                for _ in range(n_boot)
            ]
        )
        lo, hi = _ci(boot, alpha)
        medians = np.array([np.median(g) for g in groups])
        row = {
            "phase": phase,
            "metric": y,
            "batch": int(batch),
            "n_contexts": len(xs),
            "n_samples": int(sum(len(g) for g in groups)),
            "context_min": int(xs[0]),
            "context_max": int(xs[-1]),
            "intercept_ms": point[0],
            "slope_ms_per_1k": point[1] * 1e3,
            "slope_lo": lo[1] * 1e3,
            "slope_hi": hi[1] * 1e3,
            "exponent": point[2],
            "exponent_lo": lo[2],
            "exponent_hi": hi[2],
            "r2": _r2(xs, groups, point[0], point[1]),
        }
        if at_context is not None:
            near = int(np.argmin(np.abs(xs - at_context)))
            row.update(
                {
                    "at_context": int(at_context),
                    "cost_ms": point[3],
                    "cost_lo": lo[3],
                    "cost_hi": hi[3],
                    "nearest_context": int(xs[near]),
                    "nearest_median_ms": float(medians[near]),
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _ci(boot: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval per column, NaN for columns without finite values."""
    lo = np.full(boot.shape[1], math.nan)
    hi = np.full(boot.shape[1], math.nan)
    for j in range(boot.shape[1]):
        col = boot[:, j][np.isfinite(boot[:, j])]
        if col.size:
            lo[j], hi[j] = np.quantile(col, [alpha, 1 - alpha])
    return lo, hi


def _fit_once(xs: np.ndarray, groups: list[np.ndarray], at: int | None) -> np.ndarray:
    """[intercept, slope, log-log exponent, cost at ``at``] from the per-context medians."""
    med = np.array([np.median(g) for g in groups])
    slope, intercept = np.polyfit(xs, med, 1)
    exponent = np.polyfit(np.log(xs), np.log(med), 1)[0] if np.all(med > 0) else math.nan
    cost = intercept + slope * at if at is not None else math.nan
    return np.array([intercept, slope, exponent, cost])


def _r2(xs: np.ndarray, groups: list[np.ndarray], a: float, b: float) -> float:
    med = np.array([np.median(g) for g in groups])
    ss_tot = float(np.sum((med - med.mean()) ** 2))
    ss_res = float(np.sum((med - (a + b * xs)) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan


# --------------------------------------------------------------------------- verdict


@dataclass
class Verdict:
    """Outcome for the hypothesis' batch size, the numbers per batch size, and one line."""

    outcome: str
    table: pd.DataFrame
    summary: str

    def __str__(self) -> str:
        return self.summary


def verdict(
    hyp: Hypothesis, df: pd.DataFrame, *, y: str = "host_ms", n_boot: int = 2000, seed: int = 0
) -> Verdict:
    """Compare the fitted cost of ``hyp.phase`` at ``hyp.context`` with ``hyp.gap_ms``."""
    f = fit(df, hyp.phase, y=y, at_context=hyp.context, n_boot=n_boot, seed=seed)
    steps = df[df["phase"] == STEP]
    rows = []
    for r in f.to_dict("records"):
        s = steps[(steps["batch"] == r["batch"]) & (steps["context"] == r["nearest_context"])]
        step_ms = float(s[y].median()) if len(s) and s[y].notna().any() else math.nan
        outcome, reason = _decide(hyp, r)
        rows.append(
            {
                "phase": hyp.phase,
                "claim": hyp.claim,
                "batch": r["batch"],
                "context": hyp.context,
                "gap_ms": hyp.gap_ms,
                "cost_ms": r["cost_ms"],
                "cost_lo": r["cost_lo"],
                "cost_hi": r["cost_hi"],
                "gap_share": r["cost_ms"] / hyp.gap_ms,
                "nearest_context": r["nearest_context"],
                "nearest_median_ms": r["nearest_median_ms"],
                "step_ms": step_ms,
                "step_share": r["nearest_median_ms"] / step_ms,
                "slope_ms_per_1k": r["slope_ms_per_1k"],
                "slope_lo": r["slope_lo"],
                "slope_hi": r["slope_hi"],
                "exponent": r["exponent"],
                "exponent_lo": r["exponent_lo"],
                "exponent_hi": r["exponent_hi"],
                "metric": y,
                "verdict": outcome,
                "reason": reason,
            }
        )
    table = pd.DataFrame(rows)
    main = table[table["batch"] == hyp.batch_size]
    if main.empty:
        raise ValueError(
            f"hyp.batch_size={hyp.batch_size}: not among the measured batch sizes "
            f"{sorted(table['batch'].tolist())}"
        )
    m = main.iloc[0]
    summary = (
        f"{m['verdict']}: '{hyp.claim}' — {hyp.phase} costs {m['cost_ms']:.3g} ms "
        f"[{m['cost_lo']:.3g}, {m['cost_hi']:.3g}] at {hyp.context} tokens (batch {m['batch']}, "
        f"{y}) = {m['gap_share']:.2%} of the {hyp.gap_ms:g} ms gap; slope "
        f"{m['slope_ms_per_1k']:.3g} ms/1k tokens [{m['slope_lo']:.3g}, {m['slope_hi']:.3g}], "
        f"log-log exponent {m['exponent']:.2f} [{m['exponent_lo']:.2f}, {m['exponent_hi']:.2f}];"
        f" whole step {m['step_ms']:.4g} ms at {m['nearest_context']} tokens. {m['reason']}"
    )
    return Verdict(str(m["verdict"]), table, summary)


def _decide(hyp: Hypothesis, r: dict) -> tuple[str, str]:
    if hyp.context > hyp.max_extrapolation * r["context_max"]:
        return "inconclusive", (
            f"context {hyp.context} is more than {hyp.max_extrapolation:g}x "
            f"the largest measured ({r['context_max']}); measure closer"
        )
    if r["cost_hi"] < hyp.refute_below * hyp.gap_ms:
        return "refuted", (f"upper CI bound {r['cost_hi']:.3g} ms < {hyp.refute_below:g} x gap")
    if r["cost_lo"] >= hyp.confirm_above * hyp.gap_ms:
        return "confirmed", (
            f"lower CI bound {r['cost_lo']:.3g} ms >= {hyp.confirm_above:g} x gap"
        )
    return "inconclusive", (
        f"CI [{r['cost_lo']:.3g}, {r['cost_hi']:.3g}] ms straddles "
        f"{hyp.refute_below:g}-{hyp.confirm_above:g} x gap"
    )


# --------------------------------------------------------------------------- the experiment


@dataclass
class ExperimentResult:
    """What ``mask_build_experiment`` measured and concluded."""

    steps: pd.DataFrame
    fits: pd.DataFrame
    verdict: Verdict
    config: dict[str, Any] = field(default_factory=dict)


def make_engine(
    model: str = "tiny-mla",
    *,
    device: str = "auto",
    dtype: str = "auto",
    budget: int = 64,
    top_k: int = 8,
    max_len: int | None = None,
    seed: int = 0,
):
    """A ``SpecEngine`` in tree mode on the generic ``dense_mask`` verify path.

    Random weights (from ``seed``) for ``model`` and a DFlash drafter of the same width: timing
    does not depend on what the weights say.
    """
    import torch

    from kdtree.models import DFlashDrafter, build_model, dflash_config_for, get_config
    from kdtree.spec.engine import SpecEngine

    dev = torch.device(resolve_device(device))
    dt = {
        "auto": torch.bfloat16 if dev.type == "cuda" else torch.float32,
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
    }
    if dtype not in dt:
        raise ValueError(f"dtype={dtype!r}: expected one of {sorted(dt)}")
    cfg = get_config(model)
    gen = torch.Generator().manual_seed(seed)
    target = build_model(cfg)
    with torch.no_grad():
        target.init_weights(gen)
    drafter = DFlashDrafter(dflash_config_for(cfg), target)
    with torch.no_grad():
        drafter.init_weights(gen)
    target = target.to(device=dev, dtype=dt[dtype]).eval()
    drafter = drafter.to(device=dev, dtype=dt[dtype]).eval()
    return SpecEngine(
        target,
        drafter,
        mode="tree",
        budget=budget,
        top_k=top_k,
        dense_mask=True,
        device=target.device,  # "cuda" resolved to "cuda:N", as the engine compares them
        max_len=max_len,
    )


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r}: CUDA is not available on this machine")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device={device!r}: expected 'auto', 'cpu' or 'cuda[:N]'")
    return device


def mask_build_experiment(
    contexts: Sequence[int] = (2048, 4096, 16384, 46000),
    batch_sizes: Sequence[int] = (1,),
    *,
    repeats: int = 8,
    warmup: int = 2,
    model: str = "tiny-mla",
    budget: int = 64,
    top_k: int = 8,
    device: str = "auto",
    dtype: str = "auto",
    hypothesis: Hypothesis = MASK_HYPOTHESIS,
    n_boot: int = 2000,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> ExperimentResult:
    """Does the O(context) mask built in ``prepare_for_verify`` explain a 200 ms gap per step?

    Runs ``SpecEngine`` (tree mode, ``dense_mask`` path) from ``synthetic_state`` at each
    context, times every phase (host; CUDA events too on a GPU), fits ``prepare_for_verify``
    and the whole step against context and returns the verdict (on host time).
    """
    import torch

    dev = resolve_device(device)
    _positive_ints(contexts, "contexts")
    steps_per_config = warmup + repeats

    def factory(batch: int, ctx: int):
        # room for every step of this configuration (a tree of budget+1 per step at most)
        room = (steps_per_config + 4) * (budget + 1 + 16)
        eng = make_engine(
            model,
            device=dev,
            dtype=dtype,
            budget=budget,
            top_k=top_k,
            max_len=ctx + room,
            seed=seed,
        )
        state = eng.synthetic_state(batch, ctx, torch.Generator().manual_seed(seed + ctx))
        return lambda: eng.step(state)

    df = sweep(
        factory, contexts, batch_sizes, repeats, warmup=warmup, gpu=dev.startswith("cuda"), log=log
    )
    fits = [
        fit(df, p, at_context=hypothesis.context, n_boot=n_boot, seed=seed)
        for p in (hypothesis.phase, STEP)
    ]
    if df["gpu_ms"].notna().any():
        fits += [
            fit(df, p, y="gpu_ms", at_context=hypothesis.context, n_boot=n_boot, seed=seed)
            for p in (hypothesis.phase, STEP)
            if df.loc[df["phase"] == p, "gpu_ms"].notna().any()
        ]
    v = verdict(hypothesis, df, n_boot=n_boot, seed=seed)
    config = {
        "model": model,
        "budget": budget,
        "top_k": top_k,
        "device": dev,
        "dtype": dtype,
        "repeats": repeats,
        "warmup": warmup,
        "seed": seed,
        "contexts": list(contexts),
        "batch_sizes": list(batch_sizes),
        "backend": "dense_mask",
        "mode": "tree",
    }
    return ExperimentResult(df, pd.concat(fits, ignore_index=True), v, config)


def to_bench_rows(res: ExperimentResult) -> list:
    """``kdtree.bench.schema`` rows: per-context quantiles of every phase, then the fits and
    the verdict (point estimate in ``p50``, the 95 % CI in ``config_json``)."""
    from kdtree.bench.schema import BenchRow

    base = {
        k: res.config[k]
        for k in ("model", "budget", "top_k", "device", "dtype", "repeats", "warmup", "seed")
    }
    rows = []
    for metric in ("host_ms", "gpu_ms"):
        data = res.steps.dropna(subset=[metric])
        for (batch, ctx, ph), g in data.groupby(["batch", "context", "phase"], sort=True):
            p20, p50, p80 = np.quantile(g[metric].to_numpy(), [0.2, 0.5, 0.8])
            rows.append(
                BenchRow(
                    suite="hypothesis",
                    name=ph,
                    provider="dense_mask",
                    metric=metric,
                    unit="ms",
                    p50=float(p50),
                    p20=float(p20),
                    p80=float(p80),
                    mode="tree",
                    x_name="context",
                    x_value=int(ctx),
                    config={**base, "batch": int(batch), "n": len(g)},
                )
            )
    for f in res.fits.to_dict("records"):
        cfg = {**base, "batch": f["batch"], "y": f["metric"], "ci": 0.95}
        for metric, unit, key, x in (
            ("slope", "ms/1k tokens", "slope", ""),
            ("loglog_exponent", "1", "exponent", ""),
            ("fitted_cost", "ms", "cost", f["at_context"]),
        ):
            point = {
                "slope": f["slope_ms_per_1k"],
                "exponent": f["exponent"],
                "cost": f["cost_ms"],
            }[key]
            rows.append(
                BenchRow(
                    suite="hypothesis",
                    name=f["phase"],
                    provider="dense_mask",
                    metric=f"{metric}_{f['metric']}",
                    unit=unit,
                    p50=float(point),
                    mode="tree",
                    x_name="context" if x != "" else "",
                    x_value=x,
                    config={**cfg, "ci_lo": float(f[f"{key}_lo"]), "ci_hi": float(f[f"{key}_hi"])},
                )
            )
    v = res.verdict
    for r in v.table.to_dict("records"):
        rows.append(
            BenchRow(
                suite="hypothesis",
                name=r["phase"],
                provider="dense_mask",
                metric="gap_share",
                unit="fraction",
                p50=float(r["gap_share"]),
                mode="tree",
                x_name="context",
                x_value=int(r["context"]),
                config={
                    **base,
                    "batch": r["batch"],
                    "verdict": r["verdict"],
                    "claim": r["claim"],
                    "gap_ms": r["gap_ms"],
                    "cost_ms": r["cost_ms"],
                    "ci_lo": r["cost_lo"] / r["gap_ms"],
                    "ci_hi": r["cost_hi"] / r["gap_ms"],
                    "summary": v.summary if r["batch"] == v.table["batch"].iloc[0] else "",
                },
            )
        )
    return rows
