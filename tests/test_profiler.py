"""The env-gated phase profiler: off really off, counts, nesting, logs, exports, parsing."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from kdtree import profiler as P
from kdtree.profiling import core

PROFILING_DIR = Path(core.__file__).parent

LINE = re.compile(
    r"^\[kdtree-prof\] (?P<name>\S+): n=(?P<n>\d+) mean=\S+ms last=\S+ms p50=\S+ms p99=\S+ms"
)


@pytest.fixture(autouse=True)
def clean_profiler():
    was_on = P.is_enabled()
    P.disable()
    P.reset()
    yield
    P.disable()
    P.reset()
    if was_on:
        P.enable()


def _busy(us: float) -> None:
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


def _run_steps(n_steps: int = 6) -> None:
    for _ in range(n_steps):
        with P.phase("outer"):
            _busy(1000)  # outer dominates its step even on a loaded machine (share > 0.5)
            with P.phase("inner"):
                _busy(20)
            with P.phase("inner"):
                pass
        P.step()


# --------------------------------------------------------------------------- off


def test_off_returns_one_shared_noop_and_records_nothing():
    assert not P.is_enabled()
    a, b = P.phase("a"), P.phase("b")
    assert a is b is P._NOOP
    with P.phase("a") as value:
        assert not value
    P.step()

    @P.profiled("f")
    def f(x):
        return x + 1

    assert f(1) == 2
    assert P.step_count() == 0
    assert P.report().empty
    assert P.samples().empty


def test_off_noop_lets_exceptions_through():
    with pytest.raises(KeyError), P.phase("x"):
        raise KeyError("boom")


def test_off_allocates_nothing_in_the_profiler():
    with P.phase("warm"):
        pass
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(2000):
            with P.phase("x"):
                pass
            P.step()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # every file of the profiler: the facade and the package that holds the hot path
    flt = [tracemalloc.Filter(True, P.__file__), tracemalloc.Filter(True, f"{PROFILING_DIR}/*")]
    diff = after.filter_traces(flt).compare_to(before.filter_traces(flt), "filename")
    assert sum(d.size_diff for d in diff) == 0
    assert sum(d.count_diff for d in diff) == 0


def test_import_needs_neither_torch_nor_pandas():
    code = (
        "import sys; import kdtree.profiler as p; "
        "assert 'pandas' not in sys.modules, 'pandas imported'; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "p.enable(gpu=False, nvtx=False); "
        "assert 'torch' not in sys.modules, 'torch imported by enable'; "
        "exec('with p.phase(\"x\"):\\n    pass'); p.step(); print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "", "KDTREE_PROFILE": "0"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_facade_reexports_the_hot_path_objects_themselves():
    # no wrapper between users and the hot path: kdtree.profiler.phase *is* core.phase
    for name in ("phase", "profiled", "step", "enable", "disable", "reset", "is_enabled"):
        assert getattr(P, name) is getattr(core, name), name
    assert P._S is core._S and P._NOOP is core._NOOP
    assert set(P.__all__) <= set(dir(P))
    for name in P.__all__:
        assert not name.startswith("_")


def test_core_alone_is_a_drop_in_profiler(tmp_path):
    """``core.py`` copied on its own into another engine logs lines that ``parse_log`` reads."""
    (tmp_path / "kprof.py").write_text((PROFILING_DIR / "core.py").read_text())
    code = (
        "import logging, sys; sys.path.insert(0, '.'); import kprof; "
        "logging.basicConfig(level=logging.INFO, format='worker %(message)s', stream=sys.stdout); "
        "kprof.enable(gpu=False, nvtx=False, every=2); "
        'exec(\'for _ in range(4):\\n    with kprof.phase("draft"):\\n        pass\\n'
        "    kprof.step()'); "
        "assert 'pandas' not in sys.modules and 'torch' not in sys.modules"
    )
    out = subprocess.run(
        # -I -S: no site-packages, so neither kdtree nor torch nor pandas can be imported
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "", "KDTREE_PROFILE": "0"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    parsed = P.parse_log(out.stdout, latest=True).set_index("phase")
    assert parsed.loc["draft", "n"] == 4
    assert parsed.loc["step", "n"] == 4  # the first step starts with the first phase


# --------------------------------------------------------------------------- on


def test_counts_nesting_and_share():
    P.enable(gpu=False, every=1000)
    _run_steps(6)
    rep = P.report().set_index("phase")
    assert rep.loc["outer", "n"] == 6
    assert rep.loc["inner", "n"] == 12
    assert rep.loc["step", "n"] == 6  # the first step starts with the first phase
    assert P.step_count() == 6
    assert rep.loc["inner", "depth"] == 1 and rep.loc["inner", "parent"] == "outer"
    assert rep.loc["outer", "depth"] == 0 and rep.loc["outer", "parent"] == ""
    assert rep.loc["inner", "total_ms"] < rep.loc["outer", "total_ms"]
    assert 0.5 < rep.loc["outer", "share"] <= 1.0  # outer is most of each step
    assert rep.loc["outer", "p50_ms"] <= rep.loc["outer", "p99_ms"]
    assert rep["gpu_n"].eq(0).all() and rep["gpu_mean_ms"].isna().all()

    s = P.samples()
    inner = s[s["phase"] == "inner"]
    assert (inner["parent"] == "outer").all() and (inner["depth"] == 1).all()
    assert sorted(s.loc[s["phase"] == "outer", "step"]) == list(range(6))
    assert (s["host_ms"] > 0).all()
    # every inner interval lies within an outer one of the same step
    for _, r in inner.iterrows():
        o = s[(s["phase"] == "outer") & (s["step"] == r["step"])].iloc[0]
        assert o["start_ns"] <= r["start_ns"]
        assert r["start_ns"] + r["dur_ns"] <= o["start_ns"] + o["dur_ns"]


def test_profiled_decorator_names_and_exceptions():
    P.enable(gpu=False)

    @P.profiled
    def bare(x):
        return x * 2

    @P.profiled("named")
    def named():
        raise ValueError("inside")

    assert bare(3) == 6
    with pytest.raises(ValueError, match="inside"):
        named()
    rep = P.report().set_index("phase")
    assert rep.loc[bare.__wrapped__.__qualname__, "n"] == 1
    assert rep.loc["named", "n"] == 1
    with pytest.raises(TypeError, match="profiled"):
        P.profiled(3)


def test_enable_rejects_bad_arguments():
    with pytest.raises(ValueError, match="every"):
        P.enable(every=0)
    with pytest.raises(ValueError, match="max_samples"):
        P.enable(max_samples=0)


def test_reset_and_disable_keep_data_until_reset():
    P.enable(gpu=False)
    _run_steps(2)
    P.disable()
    with P.phase("ignored"):
        pass
    assert "ignored" not in set(P.report()["phase"])
    assert P.report().set_index("phase").loc["outer", "n"] == 2
    P.reset()
    assert P.report().empty and P.step_count() == 0


def test_max_samples_bounds_raw_samples_but_not_counts():
    P.enable(gpu=False, max_samples=10, every=1000)
    for _ in range(25):
        with P.phase("x"):
            pass
    assert len(P.samples()) == 10
    assert P.report().set_index("phase").loc["x", "n"] == 25
    P.enable(max_samples=200_000)


def test_log_cadence(caplog):
    P.enable(gpu=False, every=3)
    with caplog.at_level(logging.INFO, logger="kdtree.profiler"):
        for _ in range(7):
            with P.phase("prepare_for_verify"):
                pass
    lines = [r.getMessage() for r in caplog.records if r.name == "kdtree.profiler"]
    assert len(lines) == 2
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m["n"]) for m in matches] == [3, 6]
    assert {m["name"] for m in matches} == {"prepare_for_verify"}
    assert "gpu_mean" not in lines[0]


def test_thread_safety():
    P.enable(gpu=False, every=50)
    n_threads, n_calls = 4, 150
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work():
        try:
            barrier.wait()
            for _ in range(n_calls):
                with P.phase("t"):
                    with P.phase("u"):
                        pass
                    with P.phase("u"):
                        pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, name=f"w{i}") for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    rep = P.report().set_index("phase")
    assert rep.loc["t", "n"] == n_threads * n_calls
    assert rep.loc["u", "n"] == 2 * n_threads * n_calls
    s = P.samples()
    assert s["seq"].is_unique
    assert s["tid"].nunique() == n_threads
    u = s[s["phase"] == "u"]
    assert (u["parent"] == "t").all() and (u["depth"] == 1).all()
    assert (s.loc[s["phase"] == "t", "depth"] == 0).all()


# --------------------------------------------------------------------------- exports


def test_export_round_trip(tmp_path):
    P.enable(gpu=False)
    _run_steps(4)
    paths = P.save(tmp_path)
    live = P.samples()
    back = P.load_samples(paths["samples"])
    assert list(back.columns) == P.SAMPLE_COLUMNS
    assert back[["phase", "parent", "depth", "step", "dur_ns", "start_ns"]].equals(
        live[["phase", "parent", "depth", "step", "dur_ns", "start_ns"]]
    )

    doc = json.loads(paths["trace"].read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(live)
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "M"} >= {"process_name"}
    # ts is µs since the Unix epoch: close to now
    assert abs(xs[0]["ts"] / 1e6 - time.time()) < 600
    trace = P.load_chrome_trace(paths["trace"]).sort_values("seq").reset_index(drop=True)
    live = live.sort_values("seq").reset_index(drop=True)
    assert (trace["phase"] == live["phase"]).all()
    assert ((trace["dur_ns"] - live["dur_ns"]).abs() <= 1).all()
    assert ((trace["start_ns"] - live["start_ns"]).abs() <= 1000).all()
    assert (trace["step"] == live["step"]).all()

    summary = P.summarize(back).set_index("phase")
    rep = P.report().set_index("phase")
    for name in ("outer", "inner", "step"):
        assert summary.loc[name, "n"] == rep.loc[name, "n"]
        assert summary.loc[name, "total_ms"] == pytest.approx(rep.loc[name, "total_ms"])
    assert (tmp_path / paths["report"].name).exists()


def test_load_chrome_trace_rejects_non_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        P.load_chrome_trace(bad)


# --------------------------------------------------------------------------- parse_log


def test_parse_log_round_trip(caplog, tmp_path):
    P.enable(gpu=False, every=2)
    with caplog.at_level(logging.INFO, logger="kdtree.profiler"):
        _run_steps(8)
    lines = [r.getMessage() for r in caplog.records if r.name == "kdtree.profiler"]
    text = "some unrelated line\n" + "\n".join(f"INFO {line}" for line in lines) + "\n"
    parsed = P.parse_log(text, latest=True).set_index("phase")
    rep = P.report().set_index("phase")
    for name in ("outer", "inner", "step"):
        n = parsed.loc[name, "n"]
        assert n == rep.loc[name, "n"] - rep.loc[name, "n"] % 2
        assert parsed.loc[name, "mean_ms"] > 0
    assert parsed.loc["outer", "share"] > 0
    assert parsed["pid"].isna().all() and parsed["rank"].isna().all()

    path = tmp_path / "worker.log"
    path.write_text(text)
    from_path = P.parse_log(path)
    from_str_path = P.parse_log(str(path))
    assert len(from_path) == len(from_str_path) == len(lines)
    assert list(from_path.columns[: len(P.REPORT_COLUMNS)]) == P.REPORT_COLUMNS


JOURNAL = """\
-- Logs begin at Sun 2026-11-29 07:00:00 UTC. --
Nov 29 08:00:01 gpu-node-3 python3[4242]: [kdtree-prof] verify: n=50 mean=1.5ms last=1.4ms p50=1.45ms p99=2.1ms gpu_mean=1.2ms
Nov 29 08:00:01 gpu-node-3 python3[4343]: [kdtree-prof] verify: n=50 mean=3ms last=3.1ms p50=2.9ms p99=4ms
Nov 29 08:00:02 gpu-node-3 python3[4242]: [kdtree-prof] step: n=50 mean=10ms last=9ms p50=9.5ms p99=12ms
Nov 29 08:00:02 gpu-node-3 python3[4343]: [kdtree-prof] step: n=50 mean=20ms last=19ms p50=19ms p99=25ms
Nov 29 08:00:03 gpu-node-3 python3[4242]: some other message
Nov 29 08:00:04 gpu-node-3 python3[4242]: [kdtree-prof] verify: n=100 mean=1.6ms last=1.7ms p50=1.5ms p99=2.2ms gpu_mean=1.25ms
"""


def test_parse_log_journalctl_keeps_processes_apart():
    df = P.parse_log(JOURNAL)
    assert len(df) == 5
    assert set(df["pid"].dropna()) == {4242, 4343}
    assert set(df["host"].dropna()) == {"gpu-node-3"}
    assert df["time"].notna().all()
    a = df[df["pid"] == 4242]
    b = df[df["pid"] == 4343]
    assert a.loc[a["phase"] == "verify", "mean_ms"].tolist() == [1.5, 1.6]
    assert b.loc[b["phase"] == "verify", "gpu_mean_ms"].isna().all()
    # share against the same process' step line: 4343 -> 150 / 1000
    share_b = b.loc[b["phase"] == "verify", "share"].iloc[0]
    assert share_b != share_b  # the verify line precedes 4343's first step line: NaN
    last = P.parse_log(JOURNAL, latest=True)
    assert len(last) == 4
    va = last[(last["pid"] == 4242) & (last["phase"] == "verify")].iloc[0]
    assert va["n"] == 100 and va["gpu_mean_ms"] == 1.25
    assert va["total_ms"] == pytest.approx(160.0)
    assert va["share"] == pytest.approx(160.0 / 500.0)


def test_parse_log_ranks_and_prefixes():
    text = (
        "[2026-11-29 08:00:01 TP0] [kdtree-prof] draft: n=50 mean=0.5ms last=0.4ms p50=0.5ms "
        "p99=0.9ms\n"
        "[2026-11-29 08:00:01 TP1] [kdtree-prof] draft: n=50 mean=0.7ms last=0.6ms p50=0.7ms "
        "p99=1.0ms\n"
        "[rank3]: pid=77 [kdtree-prof] tree_build: n=10 mean=2.5e-03ms last=1e-3ms p50=nanms "
        "p99=nanms\n"
    )
    df = P.parse_log(text)
    assert df["rank"].tolist() == [0, 1, 3]
    assert df["pid"].isna().tolist() == [True, True, False]
    assert int(df["pid"].iloc[2]) == 77
    assert df["time"].iloc[0] == "2026-11-29 08:00:01"
    assert df["mean_ms"].iloc[2] == pytest.approx(2.5e-3)
    assert df["p50_ms"].isna().iloc[2]


def test_parse_log_bad_input():
    with pytest.raises(ValueError, match="line 2"):
        P.parse_log("ok\n[kdtree-prof] x: n=3 oops\n")
    with pytest.raises(TypeError, match="parse_log"):
        P.parse_log(12)
    assert P.parse_log("nothing here\n").empty


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_events_and_graph_capture():
    P.enable(gpu=True, every=1000)
    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(3):
        with P.phase("mm"):
            y = x @ x
        P.step()
    assert P.flush(sync=True) == 0
    rep = P.report().set_index("phase")
    assert rep.loc["mm", "gpu_n"] == 3 and rep.loc["mm", "gpu_mean_ms"] > 0

    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g), P.phase("captured"):
        y = x @ x
    torch.cuda.current_stream().wait_stream(s)
    with P.phase("replay"):
        g.replay()
    P.flush(sync=True)
    rep = P.report().set_index("phase")
    assert "captured" not in rep.index
    assert rep.loc["replay", "gpu_n"] == 1
    del y


# --------------------------------------------------------------------------- cost bench


def test_cost_bench_rows_and_state_restored(tmp_path):
    from kdtree.bench import profiler_cost
    from kdtree.bench.schema import COLUMNS, append_rows, read_rows

    P.enable(gpu=False)
    res = profiler_cost.measure(number=200, repeat=3, gpu=False)
    assert P.is_enabled()  # restored
    providers = {r.provider for r in res}
    assert providers == {"baseline", "off", "on_host"}
    assert {r.name for r in res if r.provider == "off"} == {
        "phase",
        "nested_phase",
        "profiled",
        "step",
    }
    assert all(r.per_call_us.p50 > 0 for r in res)
    rows = profiler_cost.to_rows(res, 200, 3)
    path = tmp_path / "profiler.csv"
    append_rows(path, rows, command="kdtree bench profiler --out x")
    df = read_rows(path)
    assert list(df.columns) == COLUMNS
    assert (df["suite"] == "profiler").all() and (df["unit"] == "us").all()
    assert (df["command"] == "kdtree bench profiler --out x").all()


def test_cli_bench_and_parse(tmp_path):
    import typer
    from typer.testing import CliRunner

    from kdtree.cli import bench_profiler
    from kdtree.cli.profile import app as profile_app

    bench = typer.Typer()
    bench_profiler.register(bench)
    bench.command("noop")(lambda: None)  # keeps "profiler" a sub-command
    runner = CliRunner()
    r = runner.invoke(
        bench, ["profiler", "--out", str(tmp_path), "--number", "200", "--repeat", "3"]
    )
    assert r.exit_code == 0, r.output
    last = json.loads(r.output.strip().splitlines()[-1])
    assert last["suite"] == "profiler" and last["rows"] > 0
    assert (tmp_path / "profiler.csv").exists()

    log = tmp_path / "j.log"
    log.write_text(JOURNAL)
    r = runner.invoke(profile_app, ["parse", str(log), "--out", str(tmp_path / "p.csv")])
    assert r.exit_code == 0, r.output
    last = json.loads(r.output.strip().splitlines()[-1])
    assert last["processes"] == 2 and last["phases"] == ["step", "verify"]

    P.enable(gpu=False)
    _run_steps(3)
    paths = P.save(tmp_path / "prof")
    r = runner.invoke(profile_app, ["show", str(paths["samples"])])
    assert r.exit_code == 0, r.output
    shown = {p["phase"]: p for p in json.loads(r.output.strip().splitlines()[-1])["phases"]}
    assert shown["outer"]["n"] == 3 and shown["inner"]["n"] == 6


def test_viz_builders():
    from kdtree.viz.profile import (
        make_phase_share_fig,
        make_phase_table_fig,
        make_phase_timeline_fig,
        make_step_breakdown_fig,
    )

    P.enable(gpu=False)
    _run_steps(3)
    rep = P.report()
    assert len(make_phase_table_fig(rep).data) == 1
    assert [t.y[0] for t in make_phase_share_fig(rep).data][0] in {"outer", "inner"}
    fig = make_step_breakdown_fig(P.samples())
    assert {t.name for t in fig.data} == {"outer", "whole step"}
    with pytest.raises(ValueError, match="missing columns"):
        make_step_breakdown_fig(rep)
    timeline = make_phase_timeline_fig(P.samples())
    assert {t.name for t in timeline.data} == {"outer", "inner"}
    assert min(min(t.base) for t in timeline.data) == 0.0


class _FakeEvent:
    """Stands in for torch.cuda.Event: a recorded clock tick, completion under test control."""

    clock = 0.0
    made = 0

    def __init__(self, enable_timing: bool = True) -> None:
        assert enable_timing
        _FakeEvent.made += 1
        self.t = None
        self.done = False

    def record(self) -> None:
        _FakeEvent.clock += 0.5
        self.t = _FakeEvent.clock
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end) -> float:
        assert self.t is not None and end.t is not None
        return end.t - self.t


@pytest.fixture
def fake_cuda(monkeypatch):
    """Route the profiler's CUDA side through fakes so event pooling/harvest/capture run on CPU."""
    from types import SimpleNamespace

    state = {"capturing": False, "nvtx": []}
    cuda = SimpleNamespace(
        Event=_FakeEvent,
        is_initialized=lambda: True,
        is_current_stream_capturing=lambda: state["capturing"],
        nvtx=SimpleNamespace(
            range_push=lambda name: state["nvtx"].append(("push", name)),
            range_pop=lambda: state["nvtx"].append(("pop", None)),
        ),
    )
    P.enable(gpu=False, every=1000)
    monkeypatch.setattr(P._S, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(P._S, "gpu", True)
    monkeypatch.setattr(P._S, "nvtx", True)
    monkeypatch.setattr(P._S, "cuda", True)
    _FakeEvent.made = 0
    yield state


def test_gpu_events_are_pooled_harvested_lazily_and_skipped_in_capture(fake_cuda):
    for _ in range(3):
        with P.phase("verify"):
            pass
        P.step()
    assert _FakeEvent.made == 6
    assert P.flush(sync=False) == 3  # nothing completed yet: no waiting on the hot path
    assert P.report(sync=False).set_index("phase").loc["verify", "gpu_n"] == 0
    for ev in list(p[3] for p in P._S.pending):
        ev.done = True
    assert P.flush(sync=False) == 0
    rep = P.report(sync=False).set_index("phase")
    assert rep.loc["verify", "gpu_n"] == 3
    assert rep.loc["verify", "gpu_mean_ms"] == pytest.approx(0.5)
    assert len(P._S.pool) == 6
    with P.phase("verify"):  # reuses pooled events
        pass
    assert _FakeEvent.made == 6
    assert P.flush(sync=True) == 0  # sync harvest waits on the end event
    assert P.samples()["gpu_ms"].notna().sum() == 4

    pushes = [n for kind, n in fake_cuda["nvtx"] if kind == "push"]
    pops = [n for kind, n in fake_cuda["nvtx"] if kind == "pop"]
    assert pushes == ["verify"] * 4 and len(pops) == 4

    fake_cuda["capturing"] = True
    n_before = len(P.samples())
    steps_before = P.step_count()
    assert P.phase("captured") is P._NOOP
    with P.phase("captured"):
        pass
    P.step()
    assert len(P.samples()) == n_before and P.step_count() == steps_before
    fake_cuda["capturing"] = False


def test_log_line_carries_gpu_mean(fake_cuda, caplog, monkeypatch):
    monkeypatch.setattr(P._S, "every", 2)
    with caplog.at_level(logging.INFO, logger="kdtree.profiler"):
        with P.phase("draft"):
            pass
        for _, _, _, ev1 in P._S.pending:
            ev1.done = True
        with P.phase("draft"):
            pass
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kdtree.profiler"]
    assert LINE.match(line) and "gpu_mean=0.5ms" in line
    parsed = P.parse_log(line)
    assert parsed["gpu_mean_ms"].iloc[0] == pytest.approx(0.5)
