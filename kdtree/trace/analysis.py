"""Bursts and gaps in a utilisation series, duty cycle, per-step idle and gap attribution.

Conventions:
- A sample at ``t_i`` covers ``[t_i, t_{i+1})``; the last one covers one median step.
- Bursts by hysteresis (scikit-image semantics): a run of samples ``>= low`` is a burst when at
  least one of its samples is ``>= high``. Default thresholds sit at 50 % / 25 % of the way from
  the baseline (5th percentile) to the peak (99th percentile). Then bursts shorter than
  ``min_burst_ns`` are dropped and gaps shorter than ``min_gap_ns`` are closed.
- Gaps are the idle stretches *between* bursts; idle before the first and after the last burst
  is reported separately (``idle_head_ns`` / ``idle_tail_ns``) because its true length is unknown.
- ``duty_cycle`` = burst time / (last burst end - first burst start).
- Attribution: every nanosecond of gap goes to the innermost phase interval (latest start,
  then shortest) that covers it, or to ``"(no phase)"``; shares therefore add up to 1.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kdtree.trace.schema import Trace, make_intervals

NO_PHASE = "(no phase)"
PHASE_KINDS = ("phase", "nvtx")


@dataclass(frozen=True)
class Thresholds:
    high: float
    low: float
    baseline: float
    peak: float
    rule: str


def choose_thresholds(
    values: np.ndarray, high: float | None = None, low: float | None = None
) -> Thresholds:
    """Hysteresis thresholds: given ones win; missing ones come from the signal's range."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("values: expected at least one sample")
    baseline, peak = float(np.percentile(v, 5)), float(np.percentile(v, 99))
    span = peak - baseline
    if high is not None and low is None:
        low = high
    if low is not None and high is None:
        high = max(low, baseline + 0.5 * span)
    if high is not None and low is not None:
        if low > high:
            raise ValueError(f"low={low} > high={high}: expected low <= high")
        return Thresholds(float(high), float(low), baseline, peak, "given")
    if span <= 0.2 * max(abs(peak), 1e-12):
        # flat signal: one level; busy if it is clearly above zero
        level = np.inf if peak <= 1e-9 else -np.inf
        return Thresholds(level, level, baseline, peak, "flat signal")
    return Thresholds(baseline + 0.5 * span, baseline + 0.25 * span, baseline, peak,
                      "50%/25% of baseline(p5)..peak(p99)")  # fmt: skip


def sample_ends(t: np.ndarray) -> tuple[np.ndarray, int]:
    """End of each sample window and the median step (ns)."""
    if t.size == 0:
        return t.copy(), 0
    if t.size == 1:
        return t + 1, 1
    steps = np.diff(t)
    dt = int(np.median(steps[steps > 0])) if (steps > 0).any() else 1
    return np.append(t[1:], t[-1] + dt), dt


def detect_bursts(
    t_ns: np.ndarray,
    values: np.ndarray,
    thresholds: Thresholds,
    *,
    min_burst_ns: int = 0,
    min_gap_ns: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (bursts, gaps) tables from a sorted series."""
    t = np.asarray(t_ns, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if t.shape != v.shape:
        raise ValueError(f"t_ns {t.shape} and values {v.shape}: expected equal shapes")
    if t.size and (np.diff(t) < 0).any():
        raise ValueError("t_ns: expected non-decreasing timestamps")
    ends, _ = sample_ends(t)
    above_low = v >= thresholds.low
    runs = _runs(above_low)
    spans = [(a, b) for a, b in runs if (v[a:b] >= thresholds.high).any()]
    bounds = [(int(t[a]), int(ends[b - 1]), a, b) for a, b in spans]
    if min_burst_ns > 0:
        bounds = [x for x in bounds if x[1] - x[0] >= min_burst_ns]
    if min_gap_ns > 0 and bounds:
        merged = [bounds[0]]
        for s, e, a, b in bounds[1:]:
            ps, pe, pa, _ = merged[-1]
            if s - pe < min_gap_ns:
                merged[-1] = (ps, e, pa, b)
            else:
                merged.append((s, e, a, b))
        bounds = merged
    rows = []
    for s, e, a, b in bounds:
        w = ends[a:b] - t[a:b]
        seg = v[a:b]
        rows.append({"start_ns": s, "end_ns": e, "duration_ns": e - s,
                     "mean_level": float(np.average(seg, weights=np.maximum(w, 1))),
                     "peak_level": float(seg.max()), "n_samples": b - a})  # fmt: skip
    bursts = pd.DataFrame(rows, columns=["start_ns", "end_ns", "duration_ns", "mean_level",
                                         "peak_level", "n_samples"])  # fmt: skip
    gap_rows = [{"start_ns": bounds[i][1], "end_ns": bounds[i + 1][0],
                 "duration_ns": bounds[i + 1][0] - bounds[i][1]}
                for i in range(len(bounds) - 1)]  # fmt: skip
    gaps = pd.DataFrame(gap_rows, columns=["start_ns", "end_ns", "duration_ns"])
    return bursts.astype(
        {"start_ns": "int64", "end_ns": "int64", "duration_ns": "int64"}
    ), gaps.astype("int64")


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, stop)`` index ranges where ``mask`` is True."""
    if mask.size == 0:
        return []
    m = np.concatenate([[False], mask, [False]]).astype(np.int8)
    d = np.diff(m)
    return list(
        zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True)
    )


def gap_histogram(gaps: pd.DataFrame, bins: int | np.ndarray = 20) -> pd.DataFrame:
    """Counts and total idle per gap-length bin (log-spaced in ms when ``bins`` is an int)."""
    ms = gaps["duration_ns"].to_numpy(np.float64) / 1e6
    if ms.size == 0:
        return pd.DataFrame(columns=["lo_ms", "hi_ms", "count", "total_ms"])
    if isinstance(bins, int):
        lo, hi = max(ms.min(), 1e-4), max(ms.max(), 1e-4)
        edges = (
            np.logspace(np.log10(lo), np.log10(hi * 1.0001 + 1e-12), bins + 1)
            if hi > lo
            else (np.array([lo * 0.999, hi * 1.001]))
        )
    else:
        edges = np.asarray(bins, dtype=np.float64)
    counts, _ = np.histogram(ms, edges)
    totals, _ = np.histogram(ms, edges, weights=ms)
    return pd.DataFrame(
        {"lo_ms": edges[:-1], "hi_ms": edges[1:], "count": counts, "total_ms": totals}
    )


def estimate_period_ns(t_ns: np.ndarray, busy: np.ndarray, *, min_corr: float = 0.2) -> int | None:
    """Dominant period of a busy mask (autocorrelation on a uniform grid), or ``None``."""
    t = np.asarray(t_ns, dtype=np.int64)
    if t.size < 8:
        return None
    _, dt = sample_ends(t)
    grid = t[0] + np.arange(int((t[-1] - t[0]) // dt) + 1, dtype=np.int64) * dt
    idx = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, t.size - 1)
    x = np.asarray(busy, dtype=np.float64)[idx]
    x = x - x.mean()
    n = x.size
    if n < 8 or not np.any(x):
        return None
    f = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[:n]
    acf = acf / acf[0]
    half = acf[: n // 2]
    below = np.flatnonzero(half < 0)
    if below.size == 0:
        return None
    first = int(below[0])
    lag = first + int(np.argmax(half[first:]))
    if half[lag] < min_corr or lag <= 0:
        return None
    return int(lag * dt)


def steps_from_marks(intervals: pd.DataFrame) -> pd.DataFrame:
    """Step intervals (kind ``step``) sorted by start."""
    s = intervals[intervals["kind"] == "step"].sort_values("start_ns")
    return pd.DataFrame({"start_ns": s["start_ns"].to_numpy(np.int64),
                         "end_ns": s["end_ns"].to_numpy(np.int64)})  # fmt: skip


def steps_from_period(bursts: pd.DataFrame, period_ns: int) -> pd.DataFrame:
    """Complete steps between burst starts spaced at least half a period apart."""
    if bursts.empty or period_ns <= 0:
        return pd.DataFrame({"start_ns": [], "end_ns": []}, dtype="int64")
    bounds: list[int] = []
    for s in bursts["start_ns"].to_numpy(np.int64):
        if not bounds or s - bounds[-1] >= period_ns // 2:
            bounds.append(int(s))
    return pd.DataFrame({"start_ns": bounds[:-1], "end_ns": bounds[1:]}, dtype="int64")


def overlap_with(gaps: pd.DataFrame, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Gap time (ns) inside each ``[start, end)`` window (gaps must not overlap)."""
    gs = gaps["start_ns"].to_numpy(np.int64)
    ge = gaps["end_ns"].to_numpy(np.int64)
    order = np.argsort(gs)
    gs, ge = gs[order], ge[order]
    cum = np.concatenate([[0], np.cumsum(ge - gs)])

    def before(x: np.ndarray) -> np.ndarray:  # total gap time before x
        k = np.searchsorted(gs, x, side="left")  # gaps starting before x
        partial = np.where(k > 0, np.maximum(ge[np.maximum(k - 1, 0)] - x, 0), 0)
        return cum[k] - partial

    s = np.asarray(start_ns, dtype=np.int64)
    e = np.asarray(end_ns, dtype=np.int64)
    if gs.size == 0:
        return np.zeros(s.shape, dtype=np.int64)
    return before(e) - before(s)


def per_step_idle(gaps: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Idle (gap) time inside each step."""
    s = steps["start_ns"].to_numpy(np.int64)
    e = steps["end_ns"].to_numpy(np.int64)
    idle = overlap_with(gaps, s, e)
    dur = np.maximum(e - s, 1)
    gs = gaps["start_ns"].to_numpy(np.int64)
    ge = gaps["end_ns"].to_numpy(np.int64)
    n_gaps = [int(((ge > a) & (gs < b)).sum()) for a, b in zip(s, e, strict=True)]
    return pd.DataFrame({"step": np.arange(len(s)), "start_ns": s, "end_ns": e,
                         "duration_ms": (e - s) / 1e6, "idle_ms": idle / 1e6,
                         "idle_share": idle / dur, "n_gaps": n_gaps})  # fmt: skip


def attribute_gaps(gaps: pd.DataFrame, phases: pd.DataFrame) -> pd.DataFrame:
    """Split all gap time over the innermost covering phase; columns phase, idle_ms, share, n_gaps."""
    cols = ["phase", "idle_ms", "share", "n_gaps"]
    if gaps.empty:
        return pd.DataFrame(columns=cols)
    # events at equal times: ends (0) before starts (1), so intervals are half-open
    ev: list[tuple[int, int, int, int]] = []  # (t, order, what, idx); what 0=gap 1=phase
    for i, (a, b) in enumerate(zip(gaps["start_ns"], gaps["end_ns"], strict=True)):
        ev += [(int(a), 1, 0, i), (int(b), 0, 0, i)]
    ps = phases["start_ns"].to_numpy(np.int64)
    pe = phases["end_ns"].to_numpy(np.int64)
    names = phases["name"].tolist()
    gmin, gmax = int(gaps["start_ns"].min()), int(gaps["end_ns"].max())
    for j in np.flatnonzero((pe > gmin) & (ps < gmax)):
        ev += [(int(ps[j]), 1, 1, int(j)), (int(pe[j]), 0, 1, int(j))]
    ev.sort()
    acc: dict[str, int] = defaultdict(int)
    touched: dict[str, set[int]] = defaultdict(set)
    active: dict[int, tuple[int, int]] = {}
    gap_now: int | None = None
    last = None
    for t, order, what, idx in ev:
        if gap_now is not None and last is not None and t > last:
            if active:
                j = max(active, key=lambda k: (active[k][0], -active[k][1]))
                name = names[j]
            else:
                name = NO_PHASE
            acc[name] += t - last
            touched[name].add(gap_now)
        if what == 0:
            gap_now = idx if order == 1 else None
        elif order == 1:
            active[idx] = (int(ps[idx]), int(pe[idx]))
        else:
            active.pop(idx, None)
        last = t
    total = sum(acc.values()) or 1
    rows = [{"phase": k, "idle_ms": v / 1e6, "share": v / total, "n_gaps": len(touched[k])}
            for k, v in acc.items()]  # fmt: skip
    return (
        pd.DataFrame(rows, columns=cols)
        .sort_values("idle_ms", ascending=False)
        .reset_index(drop=True)
    )


@dataclass
class TraceSummary:
    """Everything :func:`analyze` found; ``to_json()`` is the CLI's last line."""

    metric: str
    thresholds: Thresholds
    n_samples: int
    interval_ns: int
    span_ns: int
    bursts: pd.DataFrame
    gaps: pd.DataFrame
    duty_cycle: float
    duty_cycle_total: float
    mean_burst_level: float
    idle_head_ns: int
    idle_tail_ns: int
    gap_hist: pd.DataFrame
    steps: pd.DataFrame
    step_source: str
    period_ns: int | None
    attribution: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def intervals(self) -> pd.DataFrame:
        """Bursts and gaps as ``burst``/``gap`` intervals (to save next to the trace)."""
        b = make_intervals(
            self.bursts["start_ns"], self.bursts["end_ns"], "burst", "burst", "analysis"
        )
        g = make_intervals(self.gaps["start_ns"], self.gaps["end_ns"], "gap", "gap", "analysis")
        return pd.concat([b, g], ignore_index=True)

    def to_json(self) -> dict[str, Any]:
        gms = self.gaps["duration_ns"].to_numpy(np.float64) / 1e6
        idle = {r.phase: round(float(r.idle_ms), 6) for r in self.attribution.itertuples()}
        return {
            "metric": self.metric,
            "n_samples": self.n_samples,
            "interval_us": self.interval_ns / 1e3,
            "span_ms": self.span_ns / 1e6,
            "bursts": len(self.bursts),
            "gaps": len(self.gaps),
            "duty_cycle": _r(self.duty_cycle),
            "duty_cycle_total": _r(self.duty_cycle_total),
            "mean_burst_level": _r(self.mean_burst_level),
            "threshold_high": _r(self.thresholds.high),
            "threshold_low": _r(self.thresholds.low),
            "gap_ms_total": _r(gms.sum()) if gms.size else 0.0,
            "gap_ms_median": _r(np.median(gms)) if gms.size else None,
            "gap_ms_max": _r(gms.max()) if gms.size else None,
            "step_source": self.step_source,
            "period_ms": _r(self.period_ns / 1e6) if self.period_ns else None,
            "n_steps": len(self.steps),
            "step_idle_ms_mean": _r(self.steps["idle_ms"].mean()) if len(self.steps) else None,
            "idle_by_phase": idle,
        }


def _r(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return round(x, 6) if np.isfinite(x) else None


def analyze(
    trace: Trace,
    phases: Trace | pd.DataFrame | None = None,
    *,
    metric: str | None = None,
    high: float | None = None,
    low: float | None = None,
    min_burst_ns: int = 0,
    min_gap_ns: int = 0,
    phase_kinds: tuple[str, ...] = PHASE_KINDS,
    hist_bins: int = 20,
) -> TraceSummary:
    """Bursts, gaps, duty cycle, per-step idle and attribution of one metric of ``trace``."""
    rows = trace.metric(metric)
    name = str(rows["metric"].iloc[0])
    t = rows["t_ns"].to_numpy(np.int64)
    v = rows["value"].to_numpy(np.float64)
    th = choose_thresholds(v, high, low)
    bursts, gaps = detect_bursts(t, v, th, min_burst_ns=min_burst_ns, min_gap_ns=min_gap_ns)
    ends, dt = sample_ends(t)
    t0, t1 = int(t[0]), int(ends[-1])
    busy_ns = int(bursts["duration_ns"].sum()) if len(bursts) else 0
    if len(bursts):
        active = int(bursts["end_ns"].iloc[-1] - bursts["start_ns"].iloc[0])
        head = int(bursts["start_ns"].iloc[0]) - t0
        tail = t1 - int(bursts["end_ns"].iloc[-1])
    else:
        active, head, tail = 0, t1 - t0, 0
    in_burst = np.zeros(t.size, dtype=bool)
    for s, e in zip(bursts["start_ns"], bursts["end_ns"], strict=True):
        in_burst |= (t >= s) & (t < e)
    mean_level = float(v[in_burst].mean()) if in_burst.any() else float("nan")
    intervals = trace.intervals
    if isinstance(phases, Trace):
        intervals = pd.concat([intervals, phases.intervals], ignore_index=True)
    elif isinstance(phases, pd.DataFrame):
        intervals = pd.concat([intervals, phases], ignore_index=True)
    steps = steps_from_marks(intervals)
    period = None
    if len(steps):
        source = "marks"
    else:
        period = estimate_period_ns(t, in_burst)
        steps = steps_from_period(bursts, period) if period else steps
        source = "periodicity" if period else "none"
    step_idle = per_step_idle(gaps, steps) if len(steps) else per_step_idle(gaps, steps.iloc[:0])
    phase_rows = intervals[intervals["kind"].isin(phase_kinds)]
    attribution = (
        attribute_gaps(gaps, phase_rows)
        if len(phase_rows)
        else attribute_gaps(gaps.iloc[:0], phase_rows)
    )
    return TraceSummary(
        metric=name, thresholds=th, n_samples=int(t.size), interval_ns=int(dt), span_ns=t1 - t0,
        bursts=bursts, gaps=gaps, duty_cycle=busy_ns / active if active else 0.0,
        duty_cycle_total=busy_ns / (t1 - t0) if t1 > t0 else 0.0, mean_burst_level=mean_level,
        idle_head_ns=head, idle_tail_ns=tail, gap_hist=gap_histogram(gaps, hist_bins),
        steps=step_idle, step_source=source, period_ns=period, attribution=attribution,
        meta=dict(trace.meta),
    )  # fmt: skip
