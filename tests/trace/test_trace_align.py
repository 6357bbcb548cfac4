"""Clock alignment of PM samples: the H200 failure (first start 0, GPU clock unrelated to the
host clock, calibration bursts not found -> every sample dropped) must keep the samples."""

from __future__ import annotations

import json
import time

import numpy as np
from test_trace_capture import _BurstCollector, _FakeMarkerSampler, _run  # noqa: I001
from trace_fakes import FakeCollector  # tests/trace is on sys.path
from typer.testing import CliRunner

from kdtree.trace import DRAM_METRIC, DramSampler
from kdtree.trace.align import align_samples, repair_timestamps, window_keep

H0 = 1_795_943_640_514_564_342  # host start of the failed H200 recording


class _FlatMarkerSampler(_FakeMarkerSampler):
    """Calibration 'bursts' that leave no trace in the series (markers not detectable)."""

    def _marker(self):
        t0, t1 = super()._marker()
        self._collector.bursts.clear()
        return t0, t1


def _observed_condition(**kw) -> DramSampler:
    # GPU clock unrelated to both the host clock and the CUPTI clock pairs; first start = 0
    skew = 42_000_000_000 - time.time_ns()
    return _FlatMarkerSampler(
        [DRAM_METRIC], 100.0, calibrate=True,
        collector_factory=lambda d: _BurstCollector(d, skew=skew, zero_first=True),
        cupti_clock=lambda: time.time_ns() - 7_000_000_000_000, **kw,
    )  # fmt: skip


def test_h200_condition_keeps_samples_and_says_so():
    tr = _run(_observed_condition(), seconds=0.03)
    m, al = tr.meta, tr.meta["alignment"]
    assert m["n_samples_raw"] > 300
    # the window between the bursts covers most of the recording: most samples survive
    lo, hi = m["window_ns"]
    share = (hi - lo) / (m["host_stop_ns"] - m["host_start_ns"])
    assert m["n_samples"] >= 0.8 * share * m["n_samples_raw"] > 0
    assert al["mapping"] == "anchor" and al["approximate"] is True
    assert "not measured" in al["how"]
    assert any("placed by index" in w for w in m["warnings"])
    assert any("calibration bursts not found" in w for w in m["warnings"])
    raw = m["raw_timestamps"]
    assert raw["first_start"] == 0 and raw["n_zero_start"] == 1 and raw["n_repaired"] == 1
    assert raw["delta_ns"]["median"] == 100_000 and raw["delta_ns"]["max"] > 10**9
    assert len(raw["clock_pairs"]) == 2 and raw["head"][1][0] > 0
    # kept samples lie on the host clock, evenly spaced, inside the host window
    ts = tr.series["t_ns"].to_numpy()
    assert m["host_start_ns"] <= ts.min() and ts.max() <= m["host_stop_ns"]
    assert np.all(np.diff(ts) == 100_000)


def test_zero_first_sample_on_an_epoch_gpu_clock_is_identity_with_measured_bursts():
    s = _FakeMarkerSampler([DRAM_METRIC], 100.0, calibrate=True,
                           collector_factory=lambda d: _BurstCollector(d, zero_first=True),
                           cupti_clock=time.time_ns)  # fmt: skip
    tr = _run(s, seconds=0.01)
    al = tr.meta["alignment"]
    assert al["mapping"] == "identity" and al["approximate"] is False
    assert "burst rise" in al["how"] and al["error_estimate_ns"] <= 250_000
    assert tr.series["value"].max() == 1.0  # bursts trimmed by the window filter
    assert tr.meta["window_filter"]["applied"] is True and tr.meta["n_samples"] > 0


def test_timestamps_in_microseconds_fall_back_to_a_synthetic_timeline():
    s = DramSampler(calibrate=False, collector_factory=lambda d: FakeCollector(d, unit_ns=1000),
                    cupti_clock=None)  # fmt: skip
    tr = _run(s)
    al = tr.meta["alignment"]
    assert al["mapping"] == "synthetic" and al["approximate"] is True
    assert any("not in ns" in w for w in tr.meta["warnings"])
    ts = tr.series["t_ns"].to_numpy()
    assert ts[0] == tr.meta["host_start_ns"] and np.all(np.diff(ts) == 100_000)
    assert tr.meta["n_samples"] == tr.meta["n_samples_raw"] > 100


def test_repair_timestamps_places_bad_samples_by_index():
    iv = 100
    s = np.array([0, 5000, 5100, 5200, 5300, 3, 5500], dtype=np.int64)
    e = s + iv
    e[0] = 0
    rs, re, n = repair_timestamps(s, e, iv, max_jump_ns=10_000)
    assert n == 2  # the zero start and the foreign '3'
    assert rs.tolist() == [4900, 5000, 5100, 5200, 5300, 5400, 5500]
    assert (re - rs).tolist() == [iv] * 7
    rs, _, n = repair_timestamps(np.zeros(3, np.int64), np.zeros(3, np.int64), iv, 10_000)
    assert n == 3 and rs.tolist() == [0, 100, 200]


def test_window_filter_that_would_drop_most_samples_keeps_all():
    t = np.arange(100, dtype=np.int64) * 10
    keep, rec = window_keep(t, t + 10, (2000, 3000), 0, 1000)
    assert keep.all() and rec["applied"] is False and rec["would_keep"] == 0
    assert "kept all" in rec["skipped"]
    keep, rec = window_keep(t, t + 10, (100, 900), 0, 1000)
    assert rec["applied"] is True and keep.sum() == rec["kept"] == 80


def test_align_never_drops_everything_when_nothing_fits():
    # a stray first sample on another clock, the rest on a clock unrelated to the host's
    starts = np.concatenate([[10**12], 10**12 + 10**11 + np.arange(50) * 100_000])
    res = align_samples(starts, starts + 100_000, np.ones(51), interval_ns=100_000,
                        host_start_ns=H0, host_stop_ns=H0 + 6_000_000,
                        window_ns=(H0 + 100_000, H0 + 5_900_000), markers=[(H0, H0 + 50_000)])  # fmt: skip
    assert res.keep.sum() >= 45
    assert res.alignment["approximate"] is True
    assert res.t.min() >= H0 and res.t.max() <= H0 + 6_000_000


def test_record_decode_cli_empty_series_exits_nonzero_with_json(tmp_path, monkeypatch):
    import kdtree.trace.record as rec
    from kdtree.cli.trace import app

    class _EmptySampler(DramSampler):
        def __init__(self, metrics, interval_us, **kw):
            super().__init__(metrics, interval_us, calibrate=False, cupti_clock=time.time_ns,
                             collector_factory=lambda d: FakeCollector(d, empty=True))  # fmt: skip

    monkeypatch.setattr(rec, "DramSampler", _EmptySampler)
    monkeypatch.setattr(rec, "engine_decode_step",
                        lambda **kw: (lambda: time.sleep(0.001), {"workload": "fake"}))  # fmt: skip
    out = tmp_path / "rec"
    res = CliRunner().invoke(app, ["record-decode", "--out", str(out), "--steps", "3",
                                   "--warmup", "0"])  # fmt: skip
    assert res.exit_code == 3, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["ok"] is False and "no series samples" in doc["message"]
    assert doc["n_samples_raw"] == 0 and "the collector returned no samples" in doc["warnings"]
    for name in ("dram.trace.json", "phases.chrome.json", "summary.json"):
        assert (out / name).exists(), name
    assert json.loads((out / "summary.json").read_text())["ok"] is False
