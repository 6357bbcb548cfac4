"""Bursts/gaps, duty cycle, periodicity, per-step idle and attribution on synthetic series with
known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kdtree.trace import (
    DRAM_METRIC,
    Trace,
    analyze,
    attribute_gaps,
    choose_thresholds,
    detect_bursts,
)
from kdtree.trace.analysis import estimate_period_ns, gap_histogram, overlap_with, per_step_idle
from kdtree.trace.busy import kernel_busy_series
from kdtree.trace.schema import make_intervals, make_series

DT = 100_000  # 100 us samples
T0 = 1_764_400_000_000_000_000


def bursty(period_ms=10.0, burst_ms=3.0, n_periods=12, level=25.0, idle=1.0, seed=0, noise=0.5):
    """Bursts of ``burst_ms`` every ``period_ms`` at ``level``, idle otherwise, plus noise."""
    rng = np.random.default_rng(seed)
    n = int(n_periods * period_ms * 1e6 / DT)
    t = T0 + np.arange(n, dtype=np.int64) * DT
    phase = ((t - T0) % int(period_ms * 1e6)) < int(burst_ms * 1e6)
    v = np.where(phase, level, idle) + rng.uniform(-noise, noise, n)
    return t, v


def test_thresholds_default_and_given():
    t, v = bursty()
    th = choose_thresholds(v)
    assert 1.0 < th.low < th.high < 25.0
    th2 = choose_thresholds(v, high=20.0, low=5.0)
    assert (th2.high, th2.low, th2.rule) == (20.0, 5.0, "given")
    with pytest.raises(ValueError, match="low=9.0 > high=3.0"):
        choose_thresholds(v, high=3.0, low=9.0)
    flat = choose_thresholds(np.zeros(50))
    assert flat.rule == "flat signal" and flat.high == np.inf


def test_detect_known_bursts_and_gaps():
    t, v = bursty()
    b, g = detect_bursts(t, v, choose_thresholds(v))
    assert len(b) == 12 and len(g) == 11
    assert (b["duration_ns"] == 3_000_000).all()
    assert (g["duration_ns"] == 7_000_000).all()
    assert (b["start_ns"].to_numpy() - T0 == np.arange(12) * 10_000_000).all()
    assert b["mean_level"].mean() == pytest.approx(25.0, abs=0.2)


def test_hysteresis_keeps_a_burst_whole_through_a_dip():
    t = T0 + np.arange(20, dtype=np.int64) * DT
    v = np.array([0, 0, 30, 30, 12, 30, 30, 0, 0, 0, 0, 8, 9, 8, 0, 0, 30, 0, 0, 0], float)
    b, g = detect_bursts(t, v, choose_thresholds(v, high=20.0, low=10.0))
    # the dip to 12 stays above low; the 8-9 bump never reaches high: not a burst
    assert b["n_samples"].tolist() == [5, 1]
    assert b["start_ns"].tolist() == [T0 + 2 * DT, T0 + 16 * DT]
    assert g["duration_ns"].tolist() == [9 * DT]


def test_min_durations_drop_short_bursts_and_close_short_gaps():
    t = T0 + np.arange(30, dtype=np.int64) * DT
    v = np.zeros(30)
    v[2:6] = 30  # 4 samples
    v[7:11] = 30  # gap of 1 sample before it
    v[20] = 30  # a 1-sample spike
    th = choose_thresholds(v, high=20.0, low=10.0)
    b, _ = detect_bursts(t, v, th)
    assert len(b) == 3
    b2, g2 = detect_bursts(t, v, th, min_burst_ns=2 * DT, min_gap_ns=2 * DT)
    assert b2["start_ns"].tolist() == [T0 + 2 * DT] and b2["end_ns"].tolist() == [T0 + 11 * DT]
    assert g2.empty


def test_detect_rejects_bad_input():
    with pytest.raises(ValueError, match="non-decreasing"):
        detect_bursts(
            np.array([2, 1]), np.array([1.0, 2.0]), choose_thresholds(np.array([1.0, 2.0]))
        )


def test_duty_cycle_level_and_histogram():
    t, v = bursty(period_ms=10, burst_ms=4, n_periods=10)
    s = analyze(Trace(make_series(t, DRAM_METRIC, v, "test")))
    # active span = first burst start .. last burst end = 9 periods + one burst
    assert s.duty_cycle == pytest.approx(40 / 94)
    assert s.mean_burst_level == pytest.approx(25.0, abs=0.2)
    h = s.gap_hist
    assert h["count"].sum() == 9 and h["total_ms"].sum() == pytest.approx(54.0)
    js = s.to_json()
    assert js["bursts"] == 10 and js["gaps"] == 9 and js["gap_ms_median"] == pytest.approx(6.0)


def test_periodicity_gives_steps_when_there_are_no_marks():
    t, v = bursty(period_ms=8.0, burst_ms=2.0, n_periods=15)
    mask = v > 10
    assert estimate_period_ns(t, mask) == pytest.approx(8_000_000, rel=0.02)
    s = analyze(Trace(make_series(t, DRAM_METRIC, v, "test")))
    assert s.step_source == "periodicity"
    assert s.period_ns == pytest.approx(8_000_000, rel=0.02)
    assert len(s.steps) == 14
    assert s.steps["idle_ms"].to_numpy() == pytest.approx(6.0)
    assert estimate_period_ns(t, np.ones_like(mask)) is None  # no variation, no period


def test_two_bursts_per_step_still_one_step():
    """A step with a draft burst and a verify burst: the period is the step, not the half."""
    n = 12 * 100
    t = T0 + np.arange(n, dtype=np.int64) * DT
    k = np.arange(n) % 100  # 10 ms steps
    v = np.where((k < 10) | ((k >= 40) & (k < 70)), 25.0, 0.5)
    s = analyze(Trace(make_series(t, DRAM_METRIC, v, "test")))
    assert s.period_ns == pytest.approx(10_000_000, rel=0.02)
    assert len(s.steps) == 11
    assert s.steps["idle_ms"].to_numpy() == pytest.approx(6.0)  # 3 ms + 3 ms


def test_overlap_and_per_step_idle_from_marks():
    gaps = pd.DataFrame({"start_ns": [10, 40, 90], "end_ns": [20, 60, 95]})
    assert overlap_with(gaps, np.array([0, 15, 50, 0]), np.array([100, 45, 100, 5])).tolist() == [
        35, 10, 15, 0,
    ]  # fmt: skip
    steps = pd.DataFrame({"start_ns": [0, 50], "end_ns": [50, 100]})
    ps = per_step_idle(gaps, steps)
    assert ps["idle_ms"].tolist() == [20 / 1e6, 15 / 1e6]
    assert ps["n_gaps"].tolist() == [2, 2]


def test_attribution_on_known_intervals():
    gaps = pd.DataFrame({"start_ns": [100, 300], "end_ns": [200, 400]})
    phases = pd.concat([
        make_intervals([0], [1000], "decode", "phase", "t"),          # outer phase
        make_intervals([120], [170], "prepare_for_verify", "phase", "t"),  # nested inside
        make_intervals([150, 350], [160, 420], ["tiny", "commit"], "nvtx", "t"),
    ], ignore_index=True)  # fmt: skip
    a = attribute_gaps(gaps, phases).set_index("phase")
    # gap 1 [100,200): decode 100-120, pfv 120-150, tiny 150-160, pfv 160-170, decode 170-200
    # gap 2 [300,400): decode 300-350, commit 350-400
    assert a.loc["decode", "idle_ms"] * 1e6 == pytest.approx(20 + 30 + 50)
    assert a.loc["prepare_for_verify", "idle_ms"] * 1e6 == pytest.approx(40)
    assert a.loc["tiny", "idle_ms"] * 1e6 == pytest.approx(10)
    assert a.loc["commit", "idle_ms"] * 1e6 == pytest.approx(50)
    assert a["share"].sum() == pytest.approx(1.0)
    assert a.loc["decode", "n_gaps"] == 2
    only = attribute_gaps(gaps, make_intervals([150], [350], "x", "phase", "t")).set_index("phase")
    assert only.loc["(no phase)", "idle_ms"] * 1e6 == pytest.approx(50 + 50)
    assert only.loc["x", "idle_ms"] * 1e6 == pytest.approx(50 + 50)


def test_analyze_end_to_end_with_phase_trace_and_marks():
    t, v = bursty(period_ms=10, burst_ms=3, n_periods=6)
    starts = T0 + np.arange(6) * 10_000_000
    phases = pd.concat([
        make_intervals(starts, starts + 10_000_000, "step", "step", "prof"),
        make_intervals(starts + 3_000_000, starts + 5_000_000, "tree_build", "phase", "prof"),
        make_intervals(starts + 5_000_000, starts + 10_000_000, "prepare_for_verify", "phase", "prof"),
    ], ignore_index=True)  # fmt: skip
    s = analyze(Trace(make_series(t, DRAM_METRIC, v, "cupti")), Trace(intervals=phases))
    assert s.step_source == "marks" and len(s.steps) == 6
    js = s.to_json()
    assert js["idle_by_phase"]["tree_build"] == pytest.approx(5 * 2.0)
    assert js["idle_by_phase"]["prepare_for_verify"] == pytest.approx(5 * 5.0)
    assert "(no phase)" not in js["idle_by_phase"]
    iv = s.intervals()
    assert set(iv["kind"]) == {"burst", "gap"} and (iv["kind"] == "burst").sum() == 6


def test_kernel_busy_series_union_of_streams():
    iv = make_intervals([0, 50, 300], [100, 150, 350], "k", "kernel", "t")
    s = kernel_busy_series(iv, 100, "t")
    assert s["t_ns"].tolist() == [0, 100, 200, 300]
    assert s["value"].tolist() == [100.0, 50.0, 0.0, 50.0]


def test_gap_histogram_given_bins():
    gaps = pd.DataFrame({"start_ns": [0, 0, 0], "end_ns": [1_000_000, 2_500_000, 9_000_000]})
    gaps["duration_ns"] = gaps["end_ns"] - gaps["start_ns"]
    h = gap_histogram(gaps, bins=np.array([0.0, 2.0, 5.0, 10.0]))
    assert h["count"].tolist() == [1, 1, 1]
    assert h["total_ms"].tolist() == [1.0, 2.5, 9.0]
