"""The hypothesis harness: sweep structure, fits on known data, verdicts, the engine experiment."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kdtree import profiler as P
from kdtree.hypothesis import (
    MASK_HYPOTHESIS,
    OUTCOMES,
    Hypothesis,
    fit,
    mask_build_experiment,
    sweep,
    to_bench_rows,
    verdict,
)


@pytest.fixture(autouse=True)
def clean_profiler():
    P.disable()
    P.reset()
    yield
    P.disable()
    P.reset()


@pytest.fixture
def one_thread():
    """Engine runs on one thread: a tiny model on a busy 2-core machine is far steadier."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def synthetic_steps(
    ms_per_token: float,
    contexts=(1024, 4096, 16384, 46000),
    repeats=12,
    step_ms=50.0,
    noise=0.05,
    seed=0,
    batches=(1,),
) -> pd.DataFrame:
    """Per-step rows as sweep() returns them, with a known linear phase cost."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in batches:
        for L in contexts:
            for r in range(repeats):
                cost = (0.02 + ms_per_token * L * b) * (1 + noise * rng.standard_normal())
                rows.append((b, L, r, "prepare_for_verify", cost, np.nan, 1))
                rows.append((b, L, r, "step", step_ms + cost, np.nan, 1))
    return pd.DataFrame(
        rows, columns=["batch", "context", "repeat", "phase", "host_ms", "gpu_ms", "calls"]
    )


# --------------------------------------------------------------------------- fit


def test_fit_recovers_known_slope_and_exponent():
    df = synthetic_steps(ms_per_token=2e-5, noise=0.02)
    f = fit(df, "prepare_for_verify", at_context=46000, n_boot=300).iloc[0]
    assert f["slope_lo"] <= 0.02 <= f["slope_hi"]  # 2e-5 ms/token = 0.02 ms per 1k tokens
    assert f["slope_ms_per_1k"] == pytest.approx(0.02, rel=0.1)
    assert 0.6 < f["exponent"] < 1.0  # sub-linear in log-log because of the intercept
    assert f["exponent_lo"] <= f["exponent"] <= f["exponent_hi"]
    assert f["cost_lo"] <= 0.02 + 2e-5 * 46000 <= f["cost_hi"]
    assert f["nearest_context"] == 46000 and f["n_contexts"] == 4 and f["n_samples"] == 48
    assert f["r2"] > 0.95


def test_fit_pure_power_law_exponent():
    rng = np.random.default_rng(1)
    rows = [
        (1, L, r, "x", 1e-6 * L**2 * (1 + 0.01 * rng.standard_normal()), np.nan, 1)
        for L in (1000, 2000, 4000, 8000)
        for r in range(6)
    ]
    df = pd.DataFrame(
        rows, columns=["batch", "context", "repeat", "phase", "host_ms", "gpu_ms", "calls"]
    )
    f = fit(df, "x", n_boot=200).iloc[0]
    assert f["exponent"] == pytest.approx(2.0, abs=0.05)


def test_fit_per_batch_and_errors():
    df = synthetic_steps(1e-5, batches=(1, 4), repeats=4)
    f = fit(df, "prepare_for_verify", n_boot=100)
    assert f["batch"].tolist() == [1, 4]
    assert f.loc[1, "slope_ms_per_1k"] > 3 * f.loc[0, "slope_ms_per_1k"]
    with pytest.raises(ValueError, match="no host_ms samples"):
        fit(df, "nope")
    with pytest.raises(ValueError, match="at least 2 context"):
        fit(df[df["context"] == 1024], "prepare_for_verify")
    with pytest.raises(ValueError, match="missing columns"):
        fit(df.drop(columns=["batch"]), "prepare_for_verify")


# --------------------------------------------------------------------------- verdict


def test_verdict_refuted_when_cost_is_tiny():
    df = synthetic_steps(ms_per_token=4e-6)  # ~0.2 ms at 46k
    v = verdict(MASK_HYPOTHESIS, df, n_boot=300)
    assert v.outcome == "refuted"
    row = v.table.iloc[0]
    assert row["cost_hi"] < 20.0 and row["gap_share"] < 0.01
    assert row["step_ms"] == pytest.approx(50.2, abs=1.0)
    assert v.summary.startswith("refuted:") and "200 ms gap" in v.summary
    assert str(v) == v.summary


def test_verdict_confirmed_when_cost_explains_gap():
    df = synthetic_steps(ms_per_token=5e-3, step_ms=300.0)  # ~230 ms at 46k
    v = verdict(MASK_HYPOTHESIS, df, n_boot=300)
    assert v.outcome == "confirmed"
    assert v.table.iloc[0]["gap_share"] > 0.5


def test_verdict_inconclusive_between_bounds_and_when_extrapolating():
    df = synthetic_steps(ms_per_token=1e-3, noise=0.02)  # ~46 ms at 46k: 0.1..0.5 of the gap
    assert verdict(MASK_HYPOTHESIS, df, n_boot=200).outcome == "inconclusive"
    small = synthetic_steps(ms_per_token=4e-6, contexts=(256, 1024))
    v = verdict(MASK_HYPOTHESIS, small, n_boot=200)
    assert v.outcome == "inconclusive" and "largest measured" in v.table.iloc[0]["reason"]


def test_hypothesis_validation():
    with pytest.raises(ValueError, match="gap_ms"):
        Hypothesis("p", "c", gap_ms=0, context=10)
    with pytest.raises(ValueError, match="refute_below"):
        Hypothesis("p", "c", gap_ms=1, context=10, refute_below=0.6, confirm_above=0.5)
    with pytest.raises(ValueError, match="phase"):
        Hypothesis("", "c", gap_ms=1, context=10)
    with pytest.raises(ValueError, match="batch_size=2"):
        verdict(
            Hypothesis("prepare_for_verify", "c", 200.0, 46000, batch_size=2),
            synthetic_steps(1e-5, repeats=3),
            n_boot=50,
        )


# --------------------------------------------------------------------------- sweep


def test_sweep_structure_with_a_fake_engine():
    made = []

    def factory(batch, ctx):
        made.append((batch, ctx))
        mask = []

        def step_fn():
            with P.phase("prepare_for_verify"):
                mask[:] = [True] * (ctx * batch)  # O(context) host work
            with P.phase("verify"):
                with P.phase("attn"):
                    pass
                with P.phase("attn"):
                    pass

        return step_fn

    df = sweep(factory, [100, 1000], batch_sizes=[1, 2], repeats=3, warmup=2)
    assert made == [(1, 100), (1, 1000), (2, 100), (2, 1000)]
    assert not P.is_enabled()  # left as found
    assert len(df) == 4 * 3 * 4  # configs x repeats x {prepare, verify, attn, step}
    assert set(df["phase"]) == {"prepare_for_verify", "verify", "attn", "step"}
    assert sorted(df["repeat"].unique()) == [0, 1, 2]
    assert (df.loc[df["phase"] == "attn", "calls"] == 2).all()
    assert (df.loc[df["phase"] != "attn", "calls"] == 1).all()
    assert df["gpu_ms"].isna().all() and (df["host_ms"] > 0).all()
    per = df.pivot_table(index=["batch", "context", "repeat"], columns="phase", values="host_ms")
    assert (per["step"] >= per["prepare_for_verify"] + per["verify"]).all()


def test_sweep_keeps_profiler_on_when_it_was_on():
    P.enable(gpu=False)
    df = sweep(lambda b, c: lambda: None, [1, 2], repeats=2, warmup=1)
    assert P.is_enabled()
    assert set(df["phase"]) == {"step"}
    with pytest.raises(ValueError, match="contexts"):
        sweep(lambda b, c: lambda: None, [0], repeats=2)
    with pytest.raises(ValueError, match="repeats"):
        sweep(lambda b, c: lambda: None, [1, 2], repeats=1)


# --------------------------------------------------------------------------- the experiment


def test_mask_build_experiment_on_the_engine(tmp_path, one_thread):
    hyp = Hypothesis("prepare_for_verify", "tiny check", gap_ms=200.0, context=256)
    res = mask_build_experiment(
        [64, 256], repeats=2, warmup=1, budget=8, top_k=2, device="cpu", hypothesis=hyp, n_boot=100
    )
    engine_phases = {"draft", "tree_build", "prepare_for_verify", "verify", "accept", "commit"}
    assert engine_phases | {"step"} <= set(res.steps["phase"])
    assert set(res.steps["context"]) == {64, 256}
    assert res.verdict.outcome in OUTCOMES
    assert set(res.fits["phase"]) == {"prepare_for_verify", "step"}
    assert res.config["backend"] == "dense_mask" and res.config["device"] == "cpu"

    from kdtree.bench.schema import COLUMNS, append_rows, read_rows

    path = tmp_path / "hyp.csv"
    append_rows(path, to_bench_rows(res), command="kdtree profile hypothesis --contexts 64,256")
    df = read_rows(path)
    assert list(df.columns) == COLUMNS
    assert (df["suite"] == "hypothesis").all()
    assert {
        "host_ms",
        "slope_host_ms",
        "loglog_exponent_host_ms",
        "fitted_cost_host_ms",
        "gap_share",
    } <= set(df["metric"])
    meas = df[(df["metric"] == "host_ms") & (df["name"] == "prepare_for_verify")]
    assert sorted(meas["x_value"].astype(int)) == [64, 256]
    v = df[df["metric"] == "gap_share"].iloc[0]
    assert json.loads(v["config_json"])["verdict"] == res.verdict.outcome


@pytest.mark.gpu
def test_mask_build_experiment_on_cuda_records_gpu_time():
    hyp = Hypothesis("prepare_for_verify", "tiny check", gap_ms=200.0, context=1024)
    res = mask_build_experiment(
        [256, 1024],
        repeats=3,
        warmup=1,
        budget=8,
        top_k=2,
        device="cuda",
        hypothesis=hyp,
        n_boot=100,
    )
    verify = res.steps[res.steps["phase"] == "verify"]
    assert verify["gpu_ms"].notna().all() and (verify["gpu_ms"] > 0).all()
    assert {"host_ms", "gpu_ms"} == set(res.fits["metric"])
    assert res.config["dtype"] == "auto" and res.config["device"].startswith("cuda")


@pytest.mark.slow
def test_cli_hypothesis(tmp_path, one_thread):
    from typer.testing import CliRunner

    from kdtree.cli.profile import app

    r = CliRunner().invoke(
        app,
        [
            "hypothesis",
            "--contexts",
            "64,128",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--budget",
            "8",
            "--top-k",
            "2",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--observed-context",
            "128",
            "--threads",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    last = json.loads(r.output.strip().splitlines()[-1])
    assert last["verdict"] in OUTCOMES
    assert last["command"].startswith("kdtree profile hypothesis --contexts 64,128")
    assert last["command"].endswith("--threads 1")
    assert (tmp_path / "hypothesis_cpu.csv").exists()
    steps = pd.read_csv(tmp_path / "hypothesis_cpu_steps.csv")
    assert set(steps["context"]) == {64, 128}


def test_fit_fig():
    from kdtree.viz.profile import make_fit_fig

    df = synthetic_steps(1e-5, repeats=3)
    f = fit(df, "prepare_for_verify", at_context=46000, n_boot=50)
    fig = make_fit_fig(df, f, "prepare_for_verify", gap_ms=200.0)
    names = [t.name for t in fig.data]
    assert names[:2] == ["B=1 steps", "B=1 median"] and names[2].startswith("B=1 fit")
    assert fig.layout.xaxis.type == "log"
    with pytest.raises(ValueError, match="no host_ms"):
        make_fit_fig(df, f, "nope")
