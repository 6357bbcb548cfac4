"""``kdtree bench decode`` on the toy pair trained by the pipeline fixture (CPU, tiny sizes):
rows land in the CSV, the printed table has the promised columns, figures build."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from kdtree.bench.decode import DecodePoint, speedups, sweep_points


@pytest.fixture(scope="module")
def humaneval_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("he") / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for i in range(164):
            fh.write(
                json.dumps(
                    {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    return x + {i}\n"}
                )
                + "\n"
            )
    return path


@pytest.fixture(scope="module")
def models(trained):
    return trained[0]


def _bench_app():
    import typer

    from kdtree.cli.bench_decode import register

    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from collapsing the group
        pass

    return app


def test_sweep_points_cover_the_grid():
    pts = sweep_points(160, (1024, 65536), (8, 64, 256))
    names = {(p.name, p.temperature, p.ctx) for p in pts}
    for t in (0.0, 1.0):
        assert {
            ("ar", t, 1024),
            ("chain", t, 1024),
            ("tree_B64", t, 1024),
            ("tree_B8", t, 1024),
            ("tree_B256", t, 1024),
        } <= names
    assert {("tree_B64_dense_mask", 0.0, 65536), ("ar", 0.0, 65536)} <= names
    assert len(pts) == len(set(pts))
    only = sweep_points(160, (1024,), (8, 64), parts=("budgets",), temperatures=(1.0,))
    assert {(p.name, p.temperature) for p in only} == {
        ("ar", 1.0),
        ("chain", 1.0),
        ("tree_B8", 1.0),
        ("tree_B64", 1.0),
    }
    with pytest.raises(ValueError, match="unknown"):
        sweep_points(160, parts=("budget",))


def test_speedups_divide_by_ar_at_same_context_and_temperature():
    s = [
        {"name": "ar", "mode": "ar", "ctx": 1, "temperature": 0.0, "decode_tok_s": 10.0},
        {"name": "tree", "mode": "tree", "ctx": 1, "temperature": 0.0, "decode_tok_s": 25.0},
        {"name": "tree", "mode": "tree", "ctx": 2, "temperature": 0.0, "decode_tok_s": 5.0},
    ]
    sp = speedups(s)
    assert sp[1]["speedup_vs_ar"] == 2.5 and sp[2]["speedup_vs_ar"] != sp[2]["speedup_vs_ar"]


def test_bench_decode_cli_writes_rows_and_table(models, humaneval_file, tmp_path):
    out = tmp_path / "bench"
    res = CliRunner().invoke(
        _bench_app(),
        [
            "decode",
            "--models",
            str(models),
            "--humaneval",
            str(humaneval_file),
            "--out",
            str(out),
            "--ctx",
            "48",
            "--gen",
            "6",
            "--mode",
            "tree",
            "--budget",
            "4",
            "--prompts",
            "2",
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    for col in (
        "ctx_req",
        "prompt_tok",
        "TTFT_s",
        "prefill_tok/s",
        "decode_tok/s",
        "gen_tok",
        "decode_wall",
        "tau",
        "fwd/tok",
        "verify",
    ):
        assert col in res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    pt = summary["points"][0]
    assert pt["name"] == "tree_B4" and pt["n_prompts"] == 2 and pt["gen_tok"] == 6
    assert pt["prompt_tok"] >= 48 and 1.0 <= pt["tau"] <= 8.0
    assert 0 < pt["fwd_per_tok"] <= 1.0
    assert set(pt["phase_ms"]) >= {"draft", "tree_build", "verify", "accept", "commit"}
    from kdtree.bench.schema import read_rows

    df = read_rows(out / "decode.csv")
    assert {"decode_tok_s", "ttft_s", "tau", "fwd_per_tok", "tau_count", "phase_verify_ms"} <= set(
        df["metric"]
    )
    assert (df["suite"] == "decode").all()


def test_decode_figures(models, humaneval_file, tmp_path):
    pytest.importorskip("plotly")
    import torch

    from kdtree.bench.decode import load_pair, run_point
    from kdtree.bench.schema import append_rows, read_rows
    from kdtree.viz.decode import make_acceptance_fig, make_budget_fig, make_context_fig

    target, drafter, tok = load_pair(models, torch.device("cpu"))
    prompts = [("p", list(range(5, 40)))]
    rows = []
    for p in (
        DecodePoint("ar", 40, 5),
        DecodePoint("chain", 40, 5),
        DecodePoint("tree", 40, 5, 4),
        DecodePoint("tree", 40, 5, 8),
        DecodePoint("ar", 60, 5),
        DecodePoint("tree", 60, 5, 4),
    ):
        ids = prompts[0][1] + list(range(5, 5 + p.ctx - 35))
        rows += run_point(target, drafter, [("p", ids)], p, warmup=False, phases=False).rows()
    append_rows(tmp_path / "d.csv", rows, command="test")
    df = read_rows(tmp_path / "d.csv")
    assert len(make_acceptance_fig(df).data) >= 2
    assert len(make_budget_fig(df).data) == 2
    assert len(make_context_fig(df).data) == 2  # ar and tree_B4 at two contexts
    with pytest.raises(ValueError, match="missing columns"):
        make_context_fig(df.drop(columns=["config_json"]))


def test_drafter_window_option_sets_the_shipped_drafters_window(tmp_path):
    """``--drafter-window`` overrides the checkpoint's window (0 = whole context) and the
    summary records the window the run used."""
    import json

    from typer.testing import CliRunner

    from kdtree.cli.main import app

    for flag, want in (("0", None), ("64", 64)):
        out = tmp_path / flag
        res = CliRunner().invoke(
            app,
            ["bench", "decode", "--device", "cpu", "--ctx", "0", "--mode", "ar", "--prompts", "1",
             "--gen", "2", "--no-phases", "--drafter-window", flag, "--out", str(out)],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        summary = json.loads((out / "decode_summary.json").read_text())
        assert summary["drafter_context_window"] == want
