"""``kdtree bench tp``: a single-process CPU smoke run of the CLI (rows, table, JSON line), its
argument errors, and (slow) a two-process gloo run under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from kdtree.cli.bench_tp import register
from kdtree.tp import NVLS_OFF_ENV

SMALL = ["--steps", "2", "--warmup", "1", "--budget", "4", "--block-size", "3", "--top-k", "2",
         "--backend", "ref"]  # fmt: skip


@pytest.fixture
def app(monkeypatch) -> typer.Typer:
    for key, value in NVLS_OFF_ENV.items():  # the command sets them; undo afterwards
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    root, bench = typer.Typer(), typer.Typer()
    root.add_typer(bench, name="bench")
    register(bench)

    @root.callback()
    def _root() -> None:
        pass

    return root


def test_single_process_run_writes_rows_and_a_json_line(app, tmp_path):
    res = CliRunner().invoke(
        app, ["bench", "tp", "--model", "tiny-llama", "--tp", "1", "--contexts", "24",
              "--out", str(tmp_path), *SMALL],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["suite"] == "tp" and summary["world_size"] == 1
    assert summary["nvls_env"] == NVLS_OFF_ENV
    assert summary["step_ms"]["tp1_ctx24"] > 0
    rows = pd.read_csv(tmp_path / "tp.csv")
    assert len(rows) == summary["rows"]
    metrics = set(rows["metric"])
    for m in ("step_ms", "tokens_per_s", "phase_verify_ms", "comm_ms_per_step",
              "verify_attention_layer_ms", "verify_attention_step_ms"):  # fmt: skip
        assert m in metrics
    assert (rows["provider"] == "tp1").all() and (rows["x_value"] == 24).all()
    assert rows.loc[rows.metric == "comm_ms_per_step", "p50"].iloc[0] == 0  # TP1: no comm


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--tp", "2"], "outside [1, world size 1]"), (["--contexts", "0"], "positive integers"),
     (["--dtype", "nope"], "dtype='nope'")],
)  # fmt: skip
def test_bad_arguments_are_named(app, tmp_path, args, message):
    res = CliRunner().invoke(
        app, ["bench", "tp", "--model", "tiny-llama", "--out", str(tmp_path), *SMALL, *args]
    )
    assert res.exit_code != 0
    assert message in res.output


LAUNCHER = textwrap.dedent(
    """
    import typer
    from kdtree.cli.bench_tp import register

    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    register(bench)

    @app.callback()
    def _root() -> None:
        pass

    app()
    """
)


@pytest.mark.slow
def test_torchrun_two_gloo_processes(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(script), "bench", "tp", "--model", "tiny-mla", "--tp", "1,2", "--contexts",
           "24", "--out", str(tmp_path), *SMALL]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and set(summary["step_ms"]) == {"tp1_ctx24", "tp2_ctx24"}
    assert summary["comm_ms_per_step"]["tp2_ctx24"] > 0
    rows = pd.read_csv(tmp_path / "tp.csv")
    tp2 = rows[rows.provider == "tp2"]
    assert {"tiny-mla/rank0", "tiny-mla/rank1"} <= set(tp2["name"])
    assert (tp2["metric"].str.startswith("comm_verify/all_reduce_sum")).any()
