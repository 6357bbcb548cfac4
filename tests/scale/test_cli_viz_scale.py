"""``kdtree bench k2-layer | moe-load | budget`` on tiny CPU shapes, and the figures of their rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from kdtree.cli.bench_scale import app
from kdtree.viz import scale as vs

runner = CliRunner()


def _run(args):
    res = runner.invoke(app, args)
    return res, json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale")
    res, doc = _run(["k2-layer", "--out", str(out), "--reduce", "32", "--contexts", "64,160",
                     "--trees", "1,3", "--attn-providers", "eager",
                     "--moe-providers", "loop,grouped", "--layers", "2", "--rep-ms", "1",
                     "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert doc["suite"] == "k2_layer" and doc["rows"] > 0 and not doc["skipped"]
    res, doc = _run(["moe-load", "--out", str(out), "--reduce", "32", "--trees", "1,5",
                     "--kinds", "uniform,correlated", "--providers", "loop", "--trials", "2",
                     "--no-mini", "--rep-ms", "1", "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert doc["rho_source"] == "assumed" and doc["distinct"]["uniform"]["1"] == 8
    res, doc = _run(["budget", "--out", str(out), "--fixed", "2", "--candidates", "0,2",
                     "--prompts", "1", "--new-tokens", "4", "--k2-csv",
                     str(out / "k2_layer.csv"), "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert doc["live_same_tokens"] is True and "cost-aware" in doc["simulated_k2_modelled"]
    return out


def test_k2_layer_rows(bench_dir):
    df = pd.read_csv(bench_dir / "k2_layer.csv")
    names = set(df["name"])
    assert {"attn_kernel", "experts", "layer_model", "lm_head", "step_61_layers"} <= names
    assert {"dense_mlp", "router", "shared_expert", "step_what_if_rtx_int4"} <= names
    step = df[(df["name"] == "step_61_layers") & (df["metric"] == "time")]
    assert step["mode"].str.endswith("-modelled").all() and (step["p50"] > 0).all()
    assert set(step["provider"]) == {"eager+loop", "eager+grouped"}


def test_memory_error_names_the_bytes(tmp_path):
    res, doc = _run(["k2-layer", "--out", str(tmp_path), "--reduce", "1", "--layers", "61",
                     "--contexts", "185k", "--trees", "257", "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 2
    assert doc["error"] == "ShapeDoesNotFitError" and "GiB" in doc["message"]
    assert not (tmp_path / "k2_layer.csv").exists()


def test_bad_list_argument(tmp_path):
    res = runner.invoke(app, ["k2-layer", "--out", str(tmp_path), "--trees", "a,b"])
    assert res.exit_code != 0 and "trees" in res.output


def test_figures_from_rows(bench_dir):
    k2 = pd.read_csv(bench_dir / "k2_layer.csv")
    moe = pd.read_csv(bench_dir / "moe_load.csv")
    figs = [
        vs.make_layer_parts_fig(k2, 160, attn_provider="eager"),
        vs.make_layer_parts_fig(k2, 64, layer="dense", attn_provider="eager"),
        vs.make_attention_fig(k2),
        vs.make_step_fig(k2, 160, provider="eager+loop"),
        vs.make_expert_load_fig(moe),
        vs.make_moe_time_fig(moe, "correlated"),
    ]
    for fig in figs:
        assert len(fig.data) >= 2
    sim = pd.DataFrame({"policy": ["fixed B=2", "cost-aware"], "tokens_per_s": [1.0, 2.0],
                        "where": ["x", "x"]})  # fmt: skip
    assert list(vs.make_budget_fig(sim).data[0].y) == [0.5, 1.0]


def test_figure_errors(bench_dir):
    k2 = pd.read_csv(bench_dir / "k2_layer.csv")
    with pytest.raises(ValueError, match="suite"):
        vs.make_expert_load_fig(k2)
    with pytest.raises(ValueError, match="missing columns"):
        vs.make_attention_fig(k2.drop(columns=["config_json"]))
    with pytest.raises(ValueError, match="no rows"):
        vs.make_step_fig(k2, 160, provider="triton+loop")
    with pytest.raises(ValueError, match="missing"):
        vs.make_budget_fig(pd.DataFrame({"policy": []}))
