"""``kdtree trace summarize|convert|capture`` through Typer's runner; the last stdout line is JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from kdtree.cli.trace import app
from kdtree.trace import DRAM_METRIC, Trace, load_trace, save_trace
from kdtree.trace.schema import make_intervals, make_series

FIX = Path(__file__).parent / "fixtures"
T0 = 1_764_400_000_000_000_000
runner = CliRunner()


def _last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def _write_pair(tmp_path: Path) -> tuple[Path, Path]:
    t = T0 + np.arange(600, dtype=np.int64) * 100_000  # 60 ms at 100 us
    v = np.where(((t - T0) % 10_000_000) < 2_000_000, 24.0, 0.5)
    dram = save_trace(Trace(make_series(t, DRAM_METRIC, v, "cupti")), tmp_path / "dram")
    starts = T0 + np.arange(6) * 10_000_000
    events = []
    for s in starts:
        events.append({"name": "step", "cat": "kdtree", "ph": "X", "pid": 1, "tid": 1,
                       "ts": s / 1e3, "dur": 10_000.0})  # fmt: skip
        events.append({"name": "prepare_for_verify", "cat": "kdtree", "ph": "X", "pid": 1,
                       "tid": 1, "ts": (s + 2_000_000) / 1e3, "dur": 6_000.0})  # fmt: skip
    phases = tmp_path / "phases.chrome.json"
    phases.write_text(json.dumps({"traceEvents": events}))
    return dram, phases


def test_summarize_prints_table_and_json_line(tmp_path):
    dram, phases = _write_pair(tmp_path)
    res = runner.invoke(app, ["summarize", str(dram), "--phases", str(phases)])
    assert res.exit_code == 0, res.output
    doc = _last_json(res.output)
    assert doc["bursts"] == 6 and doc["gaps"] == 5
    assert doc["duty_cycle"] == pytest.approx(12 / 52, abs=1e-6)
    assert doc["mean_burst_level"] == pytest.approx(24.0)
    assert doc["step_source"] == "marks"
    # epoch microseconds as JSON floats carry ~0.25 us of rounding per timestamp
    assert doc["idle_by_phase"]["prepare_for_verify"] == pytest.approx(5 * 6.0, abs=1e-2)
    assert doc["idle_by_phase"]["(no phase)"] == pytest.approx(5 * 2.0, abs=1e-2)
    assert "idle time by phase" in res.output


def test_summarize_without_phases_uses_periodicity(tmp_path):
    dram, _ = _write_pair(tmp_path)
    res = runner.invoke(app, ["summarize", str(dram), "--min-gap-us", "50"])
    doc = _last_json(res.output)
    assert doc["step_source"] == "periodicity" and doc["period_ms"] == pytest.approx(
        10.0, rel=0.02
    )
    assert doc["idle_by_phase"] == {}


def test_summarize_foreign_formats():
    res = runner.invoke(app, ["summarize", str(FIX / "plain_ns_noheader.csv")])
    assert res.exit_code == 0, res.output
    assert _last_json(res.output)["bursts"] == 1
    res = runner.invoke(app, ["summarize", str(FIX / "kineto.json")])
    doc = _last_json(res.output)
    # kernels 20-170, 750-1000 + 1020-1170 (adjacent 100 us bins), 1750-2000 us
    assert doc["metric"] == "gpu_busy_pct" and doc["bursts"] == 3


def test_summarize_malformed_input_exits_2_with_json(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("t_us,v\n0,1\n100,oops\n")
    res = runner.invoke(app, ["summarize", str(p)])
    assert res.exit_code == 2
    doc = _last_json(res.stdout)
    assert doc["ok"] is False and doc["error"] == "TraceFormatError"
    assert "bad.csv:3: field 'v'" in doc["message"]


def test_convert_to_native(tmp_path):
    res = runner.invoke(app, ["convert", str(FIX / "ncu_raw.csv"), "--out", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    doc = _last_json(res.output)
    assert doc["intervals"] == 3 and DRAM_METRIC in doc["metrics"]
    back = load_trace(tmp_path / "k.trace.json")
    assert back.meta["format"] == "ncu-csv-raw"
    assert back.metric(DRAM_METRIC)["value"].tolist() == [88.12, 21.40, 87.90]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_capture_on_cpu_machine_fails_clearly(tmp_path):
    res = runner.invoke(app, ["capture", "--out", str(tmp_path / "x"), "--", "true"])
    assert res.exit_code == 2
    doc = _last_json(res.stdout)
    assert doc["error"] == "NoGpuError" and "CUDA GPU" in doc["message"]
    assert not (tmp_path / "x.trace.json").exists()


def test_capture_needs_a_command(tmp_path):
    res = runner.invoke(app, ["capture", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0
    assert "expected a command after '--'" in res.output


def test_phase_intervals_kinds_in_chrome_file(tmp_path):
    _, phases = _write_pair(tmp_path)
    tr = load_trace(phases)
    assert set(tr.intervals["kind"]) == {"step", "phase"}
    assert make_intervals([0], [1], "x", "gap", "t")["kind"].iloc[0] == "gap"
