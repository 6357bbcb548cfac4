"""record-decode on the CPU: the real engine loop, the real profiler, a fake PM collector."""

from __future__ import annotations

import json
import time

import pytest
from trace_fakes import FakeCollector  # tests/trace is on sys.path

from kdtree.trace import load_trace


@pytest.mark.slow
def test_record_decode_writes_dram_and_phases_side_by_side(tmp_path):
    from kdtree import profiler
    from kdtree.trace.record import record_decode

    was_on = profiler.is_enabled()
    doc = record_decode(
        tmp_path, context=32, mode="eager-dense", steps=3, warmup=1, budget=4, top_k=2,
        device="cpu", interval_us=1000.0,
        sampler_kwargs={"calibrate": False, "collector_factory": lambda d: FakeCollector(d),
                        "cupti_clock": time.time_ns},
    )  # fmt: skip
    assert profiler.is_enabled() == was_on or not profiler.is_enabled()
    for name in ("dram.trace.json", "dram.series.csv.gz", "phases.chrome.json",
                 "phase_report.csv", "summary.json"):  # fmt: skip
        assert (tmp_path / name).exists(), name
    dram = load_trace(tmp_path / "dram.trace.json")
    phases = load_trace(tmp_path / "phases.chrome.json")
    names = set(phases.intervals["name"])
    assert {"draft", "tree_build", "prepare_for_verify", "verify", "accept", "commit"} <= names
    assert (phases.intervals["kind"] == "step").sum() >= 2
    # the same clock: the phases lie inside the sampled window
    lo, hi = dram.series["t_ns"].min(), dram.series["t_ns"].max()
    ph = phases.intervals[phases.intervals["kind"] == "phase"]
    assert ph["start_ns"].min() >= lo - 5_000_000 and ph["end_ns"].max() <= hi + 5_000_000
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["workload"]["mode"] == "eager-dense" and saved["steps"] == 3
    assert doc["files"]["phases"] == "phases.chrome.json"


def test_measure_overhead_structure_with_fake_sampler(tmp_path):
    from kdtree.cli.trace import _write_overhead
    from kdtree.trace.workloads import measure_overhead

    calls = []

    def step():
        calls.append(1)

    res = measure_overhead(
        step, steps=5, repeats=3, warmup=2,
        sampler_kwargs={"calibrate": False, "collector_factory": lambda d: FakeCollector(d),
                        "cupti_clock": time.time_ns, "interval_us": 100.0},
    )  # fmt: skip
    assert len(calls) == 2 + 3 * 2 * 5
    assert len(res["ms_per_step_off"]) == len(res["ms_per_step_on"]) == 3
    assert len(res["overhead_pct_per_repeat"]) == 3
    assert res["metrics"] == ["dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    res.update(workload={"workload": "fixed"}, interval_us=100.0)
    _write_overhead(tmp_path, res)
    rows = (tmp_path / "trace_overhead.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("suite,name,provider")
    assert ",overhead,%," in rows[3]
