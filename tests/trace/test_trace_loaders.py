"""Every loader: real-format fixtures in, the common schema out; malformed input names the
file, the line/field and what was expected."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kdtree.trace import (
    DRAM_METRIC,
    Trace,
    TraceFormatError,
    detect_format,
    load_trace,
    save_trace,
)
from kdtree.trace.plaincsv import guess_unit, unit_from_header
from kdtree.trace.schema import make_intervals, make_series

FIX = Path(__file__).parent / "fixtures"
BASE = 1764400000000000000


# ----------------------------------------------------------------- native format


def _sample_trace() -> Trace:
    t = BASE + np.arange(5, dtype=np.int64) * 100_000
    s = make_series(t, DRAM_METRIC, [1.0, 25.5, 24.0, 2.0, 1.0], "cupti")
    iv = make_intervals([t[1]], [t[3]], "verify", "phase", "kdtree")
    return Trace(s, iv, {"clock": "unix_epoch_ns", "alignment": {"error_estimate_ns": 1234}})


def test_native_round_trip_keeps_exact_epoch_ns(tmp_path):
    tr = _sample_trace()
    side = save_trace(tr, tmp_path / "cap")
    assert side.name == "cap.trace.json"
    assert (tmp_path / "cap.series.csv").exists() and (tmp_path / "cap.intervals.csv").exists()
    for p in (tmp_path / "cap", side, tmp_path / "cap.series.csv"):
        back = load_trace(p)
        assert detect_format(p) == "native"
        pd.testing.assert_frame_equal(back.series, tr.series)
        pd.testing.assert_frame_equal(back.intervals, tr.intervals)
        assert back.meta == tr.meta
    assert int(back.series["t_ns"].iloc[-1]) == BASE + 400_000  # no float rounding
    gz = save_trace(tr, tmp_path / "z", compress=True)
    assert (tmp_path / "z.series.csv.gz").exists()
    for p in (gz, tmp_path / "z", tmp_path / "z.series.csv.gz"):
        pd.testing.assert_frame_equal(load_trace(p).series, tr.series)


def test_native_bad_value_names_line_and_field(tmp_path):
    save_trace(_sample_trace(), tmp_path / "cap")
    p = tmp_path / "cap.series.csv"
    lines = p.read_text().splitlines()
    lines[3] = lines[3].replace("24.0", "lots")
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        TraceFormatError, match=r"cap\.series\.csv:4: field 'value': expected a number"
    ):
        load_trace(tmp_path / "cap")


def test_native_bad_kind_and_sidecar(tmp_path):
    save_trace(_sample_trace(), tmp_path / "cap")
    p = tmp_path / "cap.intervals.csv"
    p.write_text(p.read_text().replace(",phase,", ",weird,"))
    with pytest.raises(TraceFormatError, match=r"cap\.intervals\.csv:2: field 'kind'"):
        load_trace(tmp_path / "cap")
    side = tmp_path / "cap.trace.json"
    doc = json.loads(side.read_text())
    doc["version"] = 99
    side.write_text(json.dumps(doc, indent=1))
    with pytest.raises(TraceFormatError, match="field 'version': expected version 1"):
        load_trace(side)


# ----------------------------------------------------------------- plain CSV


def test_plain_csv_header_unit_and_metric_name():
    tr = load_trace(FIX / "plain_ms_header.csv")
    assert tr.metrics == ["dram_pct"]
    assert tr.meta["time_unit"] == "ms" and tr.meta["time_unit_from"].startswith("header")
    assert tr.series["t_ns"].tolist() == [0, 100_000, 200_000, 300_000]
    assert tr.series["value"].tolist() == [1.0, 25.0, 24.0, 1.5]


def test_plain_csv_no_header_guesses_ns_and_given_unit_wins():
    tr = load_trace(FIX / "plain_ns_noheader.csv")
    assert tr.meta["time_unit"] == "ns"
    assert tr.series["t_ns"].tolist() == [0, 100_000, 200_000, 300_000]
    tr_us = load_trace(FIX / "plain_ns_noheader.csv", time_unit="us")
    assert tr_us.meta["time_unit_from"] == "given"
    assert tr_us.series["t_ns"].tolist() == [0, 100_000_000, 200_000_000, 300_000_000]


@pytest.mark.parametrize(
    ("times", "unit"),
    [
        (np.arange(10) * 1e-4, "s"),  # 100 us steps in seconds
        (np.arange(10) * 0.1, "ms"),
        (np.arange(10) * 100.0, "us"),
        (np.arange(10) * 100_000.0, "ns"),
        (1.7644e9 + np.arange(10) * 0.5, "s"),  # epoch magnitude beats the step rule
        (1.7644e12 + np.arange(10), "ms"),
        (1.7644e15 + np.arange(10), "us"),
        (1.7644e18 + np.arange(10) * 1e6, "ns"),
    ],
)
def test_guess_unit(times, unit):
    assert guess_unit(np.asarray(times))[0] == unit


def test_unit_from_header():
    assert unit_from_header("t_ns") == "ns"
    assert unit_from_header("time (ms)") == "ms"
    assert unit_from_header("Timestamp [us]") == "us"
    assert unit_from_header("seconds") == "s"
    assert unit_from_header("time") is None


def test_plain_csv_epoch_seconds_are_epoch_ns(tmp_path):
    p = tmp_path / "epoch.csv"
    p.write_text("1764400000.0,1\n1764400000.0001,2\n1764400000.0002,3\n")
    tr = load_trace(p)
    assert tr.meta["clock"] == "unix_epoch_ns"
    assert abs(int(tr.series["t_ns"].iloc[1]) - (BASE + 100_000)) < 1000


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("t_us,v\n0,1\n100,x\n", r"bad\.csv:3: field 'v': expected a number, got 'x'"),
        ("t_us,v\n0,1\n1oo,2\n", r"bad\.csv:3: field 't_us': expected a number"),
        ("t_us,v\n0,1\n100,2,3\n", r"bad\.csv:3: expected 2 columns, got 3"),
        ("0\n1\n", r"bad\.csv:1: expected at least 2 columns"),
        ("", r"bad\.csv:1: expected a time column and a value column"),
    ],
)
def test_plain_csv_malformed(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match=match):
        load_trace(p, "csv")


def test_plain_csv_bad_unit(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("0,1\n1,2\n")
    with pytest.raises(ValueError, match="time_unit='fortnights': expected one of s, ms, us, ns"):
        load_trace(p, time_unit="fortnights")


# ----------------------------------------------------------------- Nsight Compute


def test_ncu_raw_wide_with_units_row():
    assert detect_format(FIX / "ncu_raw.csv") == "ncu-raw"
    tr = load_trace(FIX / "ncu_raw.csv")
    assert tr.meta["clock"] == "kernel_sequence_ns"
    assert tr.meta["units"][DRAM_METRIC] == "%"
    assert "device__attribute_display_name" not in tr.metrics  # text column skipped
    dram = tr.metric(DRAM_METRIC)
    assert dram["value"].tolist() == [88.12, 21.40, 87.90]
    # kernels laid end to end by gpu__time_duration.sum (usecond)
    assert dram["t_ns"].tolist() == [0, 250_500, 290_500]
    k = tr.intervals
    assert k["name"].tolist() == ["gemv_kernel", "tree_attention_kernel", "gemv_kernel"]
    assert (k["kind"] == "kernel").all()
    assert k["end_ns"].tolist() == [250_500, 290_500, 541_500]
    rd = tr.metric("dram__bytes_read.sum")
    # thousands separator parsed, Mbyte -> byte, n/a dropped
    assert rd["value"].tolist() == [1_024_500_000.0, 12_250_000.0]
    assert tr.meta["units"]["dram__bytes_read.sum"] == "byte"
    assert tr.meta["n_missing_values"] == 1


def test_ncu_details_long_format():
    assert detect_format(FIX / "ncu_details.csv") == "ncu-details"
    tr = load_trace(FIX / "ncu_details.csv")
    mt = tr.metric("Memory Throughput")
    assert mt["value"].tolist() == [88.12, 21.40]
    assert mt["t_ns"].tolist() == [0, 1_250_000]  # Duration 1.25 msecond
    other = tr.metric("Memory Throughput [byte/second]")
    assert other["value"].tolist() == [1.02e12]
    # ncu scales units per row: msecond and usecond durations both end up in ns
    assert tr.metric("Duration")["value"].tolist() == [1_250_000.0, 40_000.0]
    assert tr.metric("DRAM Frequency")["value"].tolist() == [3.2e9, 3.2e9]
    assert "Function Cache Configuration" not in tr.metrics
    assert tr.intervals["end_ns"].tolist() == [1_250_000, 1_290_000]


def test_ncu_malformed(tmp_path):
    lines = (FIX / "ncu_raw.csv").read_text().splitlines()
    bad = list(lines)
    bad[8] = bad[8].replace('"21.40"', '"fast"')
    p = tmp_path / "raw.csv"
    p.write_text("\n".join(bad) + "\n")
    with pytest.raises(
        TraceFormatError,
        match=r"raw\.csv:9: field 'dram__throughput\.avg\.pct_of_peak_sustained_elapsed': "
        r"expected a number or n/a, got 'fast'",
    ):
        load_trace(p, "ncu-raw")
    short = list(lines)
    short[9] = short[9].rsplit(",", 1)[0]
    p.write_text("\n".join(short) + "\n")
    with pytest.raises(TraceFormatError, match=r"raw\.csv:10: expected 15 fields like the header"):
        load_trace(p, "ncu-raw")
    det = (FIX / "ncu_details.csv").read_text().splitlines()
    det[5] = det[5].replace('"0","4242"', '"zero","4242"', 1)
    p.write_text("\n".join(det) + "\n")
    with pytest.raises(
        TraceFormatError, match=r"raw\.csv:6: field 'ID': expected an integer kernel ID"
    ):
        load_trace(p, "ncu-details")


# ----------------------------------------------------------------- Nsight Systems


def _make_nsys(path: Path, *, with_start_time=True, bad_metric_id=False) -> Path:
    con = sqlite3.connect(path)
    c = con.cursor()
    c.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    c.executemany("INSERT INTO StringIds VALUES (?, ?)",
                  [(1, "gemv_kernel"), (2, "verify_kernel"), (3, "prepare_for_verify"), (4, "step")])  # fmt: skip
    c.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER "
              "NOT NULL, typeName TEXT NOT NULL, metricId INTEGER NOT NULL, metricName TEXT NOT NULL)")  # fmt: skip
    c.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?,?,?,?,?)", [
        (65792, 0, "GH100", 10, "DRAM Read Bandwidth [Throughput %]"),
        (65792, 0, "GH100", 11, "SMs Active [Throughput %]"),
    ])  # fmt: skip
    c.execute("CREATE TABLE GPU_METRICS (typeId INTEGER NOT NULL, timestamp INTEGER, "
              "metricId INTEGER NOT NULL, value INTEGER NOT NULL)")  # fmt: skip
    rows = []
    for i in range(10):
        ts = 1_000_000 + i * 100_000
        rows.append((65792, ts, 10, 30 if 2 <= i < 5 else 1))
        rows.append((65792, ts, 99 if bad_metric_id and i == 7 else 11, 50))
    c.executemany("INSERT INTO GPU_METRICS VALUES (?,?,?,?)", rows)
    c.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT "
              "NULL, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, "
              "demangledName INTEGER, shortName INTEGER, mangledName INTEGER)")  # fmt: skip
    c.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?)", [
        (1_200_000, 1_350_000, 0, 7, 1, 1, 1, None),
        (1_380_000, 1_500_000, 0, 7, 2, 2, 2, None),
    ])  # fmt: skip
    c.execute("CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER "
              "NOT NULL, rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, "
              "globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER)")  # fmt: skip
    c.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?,?,?,?,?,?)", [
        (1_500_000, 1_900_000, 59, None, None, None, None, 1, None, 3, 0),
        (1_000_000, 2_000_000, 59, None, None, None, "step", 1, None, None, 0),
        (1_100_000, None, 34, None, None, None, "a mark", 1, None, None, 0),
    ])  # fmt: skip
    if with_start_time:
        c.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime "
                  "TEXT, localTime TEXT)")  # fmt: skip
        c.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (BASE,))
    con.commit()
    con.close()
    return path


def test_nsys_sqlite(tmp_path):
    p = _make_nsys(tmp_path / "rep.sqlite")
    assert detect_format(p) == "nsys"
    tr = load_trace(p)
    assert tr.meta["clock"] == "unix_epoch_ns"
    dram = tr.metric()  # picks the DRAM metric among two
    assert dram["metric"].iloc[0] == "DRAM Read Bandwidth [Throughput %]"
    assert len(dram) == 10 and int(dram["t_ns"].iloc[0]) == BASE + 1_000_000
    assert dram["value"].tolist()[2:5] == [30.0, 30.0, 30.0]
    iv = tr.intervals.set_index("name")
    assert iv.loc["gemv_kernel", "kind"] == "kernel"
    assert iv.loc["prepare_for_verify", "kind"] == "nvtx"
    assert iv.loc["step", "kind"] == "step"
    assert "a mark" not in iv.index
    assert int(iv.loc["prepare_for_verify", "start_ns"]) == BASE + 1_500_000


def test_nsys_without_metrics_derives_busy_and_keeps_session_clock(tmp_path):
    p = _make_nsys(tmp_path / "rep.sqlite", with_start_time=False)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE GPU_METRICS")
    con.commit()
    con.close()
    tr = load_trace(p, busy_bin_us=100)
    assert tr.meta["clock"] == "nsys_session_ns"
    busy = tr.metric("gpu_busy_pct")
    # kernel 1_200_000..1_350_000 covers bin 1.2-1.3 ms fully and half of 1.3-1.4 ms
    v = dict(zip(busy["t_ns"], busy["value"], strict=True))
    assert v[1_200_000] == pytest.approx(100.0)
    assert v[1_300_000] == pytest.approx(50.0 + 20.0)  # 1.30-1.35 and 1.38-1.40


def test_nsys_malformed(tmp_path):
    p = _make_nsys(tmp_path / "rep.sqlite", bad_metric_id=True)
    with pytest.raises(TraceFormatError, match=r"rep\.sqlite:\d+: field 'GPU_METRICS\.metricId'"):
        load_trace(p)
    q = tmp_path / "empty.sqlite"
    sqlite3.connect(q).execute("CREATE TABLE other (x INTEGER)").connection.commit()
    with pytest.raises(TraceFormatError, match="expected at least one of the tables"):
        load_trace(q, "nsys")
    r = tmp_path / "notdb.sqlite"
    r.write_text("hello")
    with pytest.raises(TraceFormatError, match=r"notdb\.sqlite:1: expected an SQLite database"):
        load_trace(r, "nsys")


# ----------------------------------------------------------------- Kineto / Chrome trace


def test_kineto_chrome_trace():
    assert detect_format(FIX / "kineto.json") == "chrome"
    tr = load_trace(FIX / "kineto.json")
    assert tr.meta["clock"] == "unix_epoch_ns"
    iv = tr.intervals
    kinds = dict(zip(iv["name"], iv["kind"], strict=False))
    assert kinds["gemv_kernel"] == "kernel" and kinds["Memcpy DtoD"] == "kernel"
    assert kinds["ProfilerStep#0"] == "step" and kinds["prepare_for_verify"] == "phase"
    assert "aten::mm" not in kinds and "cudaLaunchKernel" not in kinds
    assert (iv[iv["name"] == "draft"]["source"] == "kineto:user_annotation").all()
    assert len(iv[iv["name"] == "draft"]) == 1  # gpu_user_annotation copy skipped
    pfv = iv[iv["name"] == "prepare_for_verify"].iloc[0]
    assert int(pfv["start_ns"]) == BASE + 200_000 and int(pfv["end_ns"]) == BASE + 700_000
    busy = tr.metric("gpu_busy_pct")
    assert busy["value"].max() == pytest.approx(100.0)
    assert tr.meta["skipped_categories"] == {
        "cpu_op": 1,
        "cuda_runtime": 1,
        "gpu_user_annotation": 1,
    }


def test_kdtree_profiler_chrome_export_loads(tmp_path):
    doc = {"traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "kdtree"}},
        {"name": "verify", "cat": "kdtree", "ph": "X", "pid": 1, "tid": 2,
         "ts": BASE / 1e3 + 10.0, "dur": 5.0, "args": {"step": 0}},
        {"name": "step", "cat": "kdtree", "ph": "X", "pid": 1, "tid": 2,
         "ts": BASE / 1e3, "dur": 20.0, "args": {"step": 0}},
    ], "displayTimeUnit": "ms", "otherData": {"clock": "unix_epoch"}}  # fmt: skip
    p = tmp_path / "kdtree-prof-1.trace.json"  # the profiler's own file name
    p.write_text(json.dumps(doc))
    assert detect_format(p) == "chrome"
    tr = load_trace(p)
    assert tr.meta["clock"] == "unix_epoch_ns"
    iv = tr.intervals.set_index("name")
    assert iv.loc["verify", "kind"] == "phase" and iv.loc["step", "kind"] == "step"
    assert abs(int(iv.loc["verify", "start_ns"]) - (BASE + 10_000)) < 1000


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}',
         r"field 'traceEvents\[0\]\.ts': expected a number \(microseconds\)"),
        ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": "long"}]}',
         r"field 'traceEvents\[0\]\.dur'"),
        ('{"events": []}', r"field 'traceEvents': expected a \"traceEvents\" list"),
        ('{"traceEvents": [\n{"ph": "X",,}]}', r"bad\.json:2: expected valid JSON"),
    ],
)  # fmt: skip
def test_chrome_malformed(tmp_path, doc, match):
    p = tmp_path / "bad.json"
    p.write_text(doc)
    with pytest.raises(TraceFormatError, match=match):
        load_trace(p, "chrome")


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="fmt='xls': expected one of"):
        load_trace(FIX / "kineto.json", "xls")
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")
