"""Capture: clear errors on a machine without a GPU or CUPTI, and the sampler's bookkeeping
(metric combinations, clock mapping, decode) against a fake PM-sampling collector."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from trace_fakes import FakeCollector  # tests/trace is on sys.path (rootdir conftest)

from kdtree.trace import (
    DRAM_METRIC,
    CaptureError,
    CounterPermissionError,
    CuptiUnavailableError,
    DramSampler,
    MetricConfigError,
    NoGpuError,
    dram_sampler,
)
from kdtree.trace.cupti import ClockPair, choose_mapping, find_edges, import_pm_sampling

SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
L2 = "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"


def _run(sampler, seconds=0.02):
    with sampler:
        time.sleep(seconds)
    return sampler.trace


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_clear_error_without_gpu():
    with pytest.raises(NoGpuError, match="needs a CUDA GPU"), dram_sampler():
        pass
    assert issubclass(NoGpuError, CaptureError)


def test_clear_error_without_cupti(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_cupti(name, *a, **k):
        if name.startswith("cupti"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cupti)
    monkeypatch.setattr("importlib.import_module", lambda name: no_cupti(name))
    with pytest.raises(CuptiUnavailableError, match=r"cupti\.pm_sampling.*pip install"):
        import_pm_sampling()


def test_permission_error_is_explained():
    s = DramSampler(calibrate=False, collector_factory=lambda d: FakeCollector(d, perm=True),
                    cupti_clock=time.time_ns)  # fmt: skip
    with pytest.raises(CounterPermissionError, match="NVreg_RestrictProfilingToAdminUsers=0"):
        s.start()


def test_sampler_maps_cupti_clock_to_epoch():
    skew = -1_700_000_000_000_000_000  # CUPTI clock far from the epoch
    fake = {}

    def factory(d):
        fake["c"] = FakeCollector(d, skew=skew)
        return fake["c"]

    s = DramSampler([DRAM_METRIC], 100.0, calibrate=False, collector_factory=factory,
                    cupti_clock=lambda: time.time_ns() + skew)  # fmt: skip
    t_before = time.time_ns()
    tr = _run(s)
    t_after = time.time_ns()
    assert fake["c"].disabled
    al = tr.meta["alignment"]
    assert al["mapping"] == "cupti"
    assert abs(al["offset_ns"] + skew) < 2_000_000
    ts = tr.series["t_ns"].to_numpy()
    assert t_before - 2_000_000 <= ts.min() and ts.max() <= t_after
    assert np.all(np.diff(ts) == 100_000)
    assert tr.meta["clock"] == "unix_epoch_ns" and tr.meta["n_samples"] == len(ts) > 100
    assert tr.meta["metrics_collected"] == [DRAM_METRIC] and tr.meta["metrics_refused"] == []
    assert al["error_estimate_ns"] >= 100_000  # no bursts: pair width + one interval


def test_sampler_identity_and_anchor_mappings():
    tr = _run(DramSampler(calibrate=False, collector_factory=lambda d: FakeCollector(d),
                          cupti_clock=lambda: 123))  # fmt: skip
    assert tr.meta["alignment"]["mapping"] == "identity"
    weird = 42_000_000_000  # an unrelated clock, and no usable pairs
    tr2 = _run(DramSampler(calibrate=False, collector_factory=lambda d: FakeCollector(d, skew=weird - time.time_ns()),
                           cupti_clock=None))  # fmt: skip
    assert tr2.meta["alignment"]["mapping"] == "anchor"
    assert abs(int(tr2.series["t_ns"].iloc[0]) - tr2.meta["host_start_ns"]) < 1000


def test_sampler_reports_refused_combinations():
    s = DramSampler([DRAM_METRIC, SM, L2], 200.0, calibrate=False,
                    collector_factory=lambda d: FakeCollector(d, refuse=frozenset({DRAM_METRIC, L2})),
                    cupti_clock=time.time_ns)  # fmt: skip
    tr = _run(s)
    assert s.accepted == [DRAM_METRIC, SM]
    refused = [r["metrics"] for r in tr.meta["metrics_refused"]]
    assert refused == [[DRAM_METRIC, SM, L2], [DRAM_METRIC, SM, L2]]
    assert "not supported" in tr.meta["metrics_refused"][0]["reason"]
    assert sorted(tr.metrics) == sorted([DRAM_METRIC, SM])
    assert tr.metric(SM)["value"].min() >= 20.0


def test_sampler_refuses_all_metrics_clearly():
    s = DramSampler([DRAM_METRIC], calibrate=False,
                    collector_factory=lambda d: FakeCollector(d, refuse=frozenset({DRAM_METRIC})),
                    cupti_clock=time.time_ns)  # fmt: skip
    with pytest.raises(MetricConfigError, match="refused every requested metric"):
        s.start()


def test_sampler_argument_checks():
    with pytest.raises(ValueError, match="interval_us=0: expected > 0"):
        DramSampler(interval_us=0)
    with pytest.raises(ValueError, match="metrics: expected at least one"):
        DramSampler(metrics=[])
    with pytest.raises(RuntimeError, match="was not started"):
        DramSampler().stop()


def test_choose_mapping_and_edges():
    starts = np.array([1000, 2000, 3000], dtype=np.int64)
    pairs = [ClockPair(epoch_ns=10_000_000, other_ns=9_000_000, width_ns=100)]
    assert (
        choose_mapping(starts + 10_000_000, 10_000_000, 10_010_000, pairs, 5000)[0] == "identity"
    )
    name, off = choose_mapping(starts + 9_000_000, 10_000_000, 10_010_000, pairs, 5000)
    assert (name, off) == ("cupti", 1_000_000)
    assert choose_mapping(starts, 10_000_000, 10_010_000, [], 5000) == (
        "anchor",
        10_000_000 - 1000,
    )
    t = np.arange(0, 100, 10, dtype=np.int64)
    v = np.array([0, 0, 0, 90, 91, 90, 0, 0, 0, 0], float)
    assert find_edges(t, t + 10, v, 25, 55, margin_ns=20) == (30, 60)
    assert find_edges(t, t + 10, np.zeros(10), 25, 55, margin_ns=20) is None


@pytest.mark.gpu
def test_real_capture_on_gpu():  # runs on the H200 with the CUPTI wheels installed
    x = torch.empty(64 * 2**20, device="cuda")
    with dram_sampler(interval_us=100) as s:
        for _ in range(50):
            x.mul_(1.0001)
        torch.cuda.synchronize()
    tr = s.trace
    assert tr.meta["n_samples"] > 10
    assert tr.metric()["value"].max() > 10.0
    assert tr.meta["alignment"]["error_estimate_ns"] < 5_000_000


class _BurstCollector(FakeCollector):
    """Values are 90 while a registered burst (on the collector's clock) is running, else 1."""

    def __init__(self, device, **kw):
        super().__init__(device, **kw)
        self.bursts: list[tuple[int, int]] = []

    def stop(self):
        super().stop()
        for s in self.buffer:
            hot = any(s.start_timestamp < b and s.end_timestamp > a for a, b in self.bursts)
            s.metric_values = [90.0 if hot else 1.0]


class _FakeMarkerSampler(DramSampler):
    """Calibration bursts without torch: the 'copy' starts 50 us after the host launch."""

    def _prepare_marker(self):
        self._marker_buf = ("fake", "fake")

    def _marker(self):
        time.sleep(0.003)
        t0 = time.time_ns()
        time.sleep(0.004)
        t1 = time.time_ns()
        c = self._collector
        c.bursts.append((t0 + c.skew + 50_000, t1 + c.skew))
        time.sleep(0.003)
        return t0, t1


def test_calibration_bursts_measure_alignment_and_are_trimmed():
    skew = -5_000_000_000
    s = _FakeMarkerSampler([DRAM_METRIC], 100.0, calibrate=True,
                           collector_factory=lambda d: _BurstCollector(d, skew=skew),
                           cupti_clock=lambda: time.time_ns() + skew)  # fmt: skip
    tr = _run(s, seconds=0.01)
    al = tr.meta["alignment"]
    assert al["mapping"] == "cupti"
    for k in ("marker0", "marker1"):
        r = al[k]["rise_residual_ns"]
        assert -100_000 <= r <= 250_000  # 50 us launch delay, +- one 100 us sample
    assert al["error_estimate_ns"] <= 250_000 and al["drift_ns"] is not None
    assert "burst rise" in al["how"]
    # the calibration bursts are outside the kept window
    assert tr.series["value"].max() == 1.0
    lo, hi = tr.meta["window_ns"]
    assert tr.series["t_ns"].min() >= lo and tr.series["t_ns"].max() < hi
    keep_all = _FakeMarkerSampler([DRAM_METRIC], 100.0, calibrate=True, keep_calibration=True,
                                  collector_factory=lambda d: _BurstCollector(d, skew=skew),
                                  cupti_clock=lambda: time.time_ns() + skew)  # fmt: skip
    assert _run(keep_all, 0.01).series["value"].max() == 90.0
