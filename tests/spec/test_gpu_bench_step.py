"""Step/tree-build benchmark plumbing: idle accounting, CLI rows and the final JSON line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kdtree.bench.step import idle_from_spans


def test_idle_from_spans_unions_overlaps():
    out = idle_from_spans([(0, 10), (5, 12), (20, 30), (25, 26)])
    assert out["busy_us"] == 22 and out["span_us"] == 30 and out["kernels"] == 4
    assert out["idle_fraction"] == pytest.approx(8 / 30)
    assert idle_from_spans([])["kernels"] == 0
    # a kernel nested in an earlier long one does not shorten the span
    assert idle_from_spans([(0, 40), (5, 10)])["span_us"] == 40


def test_tree_build_cli_writes_rows(tmp_path):
    typer_testing = pytest.importorskip("typer.testing")
    from kdtree.cli.main import app

    res = typer_testing.CliRunner().invoke(
        app,
        [
            "bench",
            "tree-build",
            "--out",
            str(tmp_path),
            "--batches",
            "1,2",
            "--budgets",
            "4,9",
            "--depth",
            "3",
            "--vocab",
            "64",
            "--device",
            "cpu",
            "--fast",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    df = pd.read_csv(tmp_path / "tree_build.csv")
    assert summary["rows"] == len(df) > 0
    times = df[df["metric"] == "time"]
    assert set(times["provider"]) == {"heap", "device_torch", "device_torch+topk"}
    assert (times["p50"] > 0).all() and (df["mode"] == "CPU").all()
    assert len(df[df["metric"] == "speedup_vs_heap"]) == 2 * 4
