"""``kdtree bench decode`` through the graph step runner (its eager mode on the CPU): the same
tokens as the engine path, warm-up/capture outside the clock, rows flagged as graph rows."""

from __future__ import annotations

import json

import pytest
import torch

from kdtree.bench.decode import (
    DecodePoint,
    make_engine,
    run_point,
    run_prompt,
    speedups,
    sweep_points,
)
from kdtree.models import build_model, get_config
from kdtree.spec.testing import OracleDrafter


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = build_model(get_config("tiny-llama")).eval()
    return target, OracleDrafter(target, block_size=4)


def _ids(n=9):
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 200, (n,), generator=g).tolist()


def _steps(records):
    return [(r.mode, r.accepted_len, r.bonus_token, r.emitted) for r in records]


@pytest.mark.parametrize("mode", ["ar", "chain", "tree"])
def test_runner_path_equals_engine_path(pair, mode):
    target, drafter = pair
    p = DecodePoint(mode, 9, 12, budget=6, top_k=2, backend="ref")
    eager, eager_recs = run_prompt(make_engine(target, drafter, p), _ids(), 12)
    graph, graph_recs = run_prompt(
        make_engine(target, drafter, p), _ids(), 12, runner_mode="eager", sync_every=4
    )
    assert _steps(graph_recs) == _steps(eager_recs)  # greedy: the same tokens, step by step
    assert graph.gen_tok == eager.gen_tok == 12
    assert (graph.steps, graph.tau_mean, graph.fwd_per_tok) == (
        eager.steps,
        eager.tau_mean,
        eager.fwd_per_tok,
    )
    # the warm-up + capture steps (warmup=2, then the capture step) are outside the clock
    first3 = sum(sum(r.emitted) for r in graph_recs[:3])
    assert graph.decode_tok == 12 - 1 - first3 and eager.decode_tok is None
    assert graph.decode_tok_s == pytest.approx(graph.decode_tok / graph.decode_wall_s)
    if mode != "ar":
        assert graph.tau_mean > 1.5  # the oracle's blocks are accepted


def test_runner_path_honours_max_new_tokens_inside_the_warmup(pair):
    target, drafter = pair
    p = DecodePoint("chain", 9, 3, backend="ref", graphs=True)
    run, recs = run_prompt(make_engine(target, drafter, p), _ids(), 3, runner_mode="eager")
    assert run.gen_tok == 3 and run.decode_tok == 0 and run.decode_tok_s == 0.0
    assert sum(sum(r.emitted) for r in recs) == 2


def test_graph_point_rows_are_flagged(pair):
    target, drafter = pair
    prompts = [("a", _ids(9)), ("b", _ids(13))]
    res = run_point(
        target,
        drafter,
        prompts,
        DecodePoint("tree", 9, 24, budget=6, top_k=2, backend="ref", graphs=True, sync_every=3),
        phases=False,
        runner_mode="eager",
    )
    s = res.summary()
    assert s["name"] == "tree_B6_graph" and s["graphs"] and s["runner_mode"] == "eager"
    assert s["gen_tok"] == 24 and s["tau"] > 1.5 and s["decode_tok_s"] > 0
    rows = res.rows()
    assert {r.name for r in rows} == {"tree_B6_graph"}
    cfg = json.loads(rows[0].to_record({})["config_json"])
    assert cfg["graphs"] is True and cfg["sync_every"] == 3 and cfg["runner_mode"] == "eager"
    eager = run_point(
        target, drafter, prompts, DecodePoint("tree", 9, 24, 6, 2, backend="ref"), phases=False
    )
    assert eager.summary()["name"] == "tree_B6" and eager.rows()[0].config["graphs"] is False
    assert eager.summary()["tau"] == s["tau"]  # same acceptance either way
    with pytest.raises(ValueError, match="runner_mode"):
        run_point(target, drafter, prompts, DecodePoint("ar", 9, 4), runner_mode="cuda")


def test_graph_points_and_speedups():
    with pytest.raises(ValueError, match="dense_mask"):
        DecodePoint("tree", 1024, 8, graphs=True, dense_mask=True)
    pts = sweep_points(16, (1024, 4096), (8, 64), graphs=True, sync_every=2)
    assert all(p.graphs != p.dense_mask for p in pts)
    assert all(p.sync_every == 2 for p in pts if p.graphs)
    assert {"ar_graph", "chain_graph", "tree_B64_graph", "tree_B64_dense_mask"} <= {
        p.name for p in pts
    }
    s = [
        {"name": "ar", "mode": "ar", "ctx": 1, "temperature": 0.0, "decode_tok_s": 10.0},
        {"name": "ar_graph", "mode": "ar", "ctx": 1, "temperature": 0.0, "decode_tok_s": 20.0,
         "graphs": True},
        {"name": "chain_graph", "mode": "chain", "ctx": 1, "temperature": 0.0,
         "decode_tok_s": 40.0, "graphs": True},
        {"name": "tree_B64_graph", "mode": "tree", "ctx": 1, "temperature": 0.0,
         "decode_tok_s": 60.0, "graphs": True},
        {"name": "tree_B64_dense_mask", "mode": "tree", "ctx": 1, "temperature": 0.0,
         "decode_tok_s": 5.0, "dense_mask": True},
    ]  # fmt: skip
    sp = {x["name"]: x for x in speedups(s)}
    assert sp["tree_B64_graph"]["speedup_vs_ar"] == 3.0  # graph over graph, not over eager ar
    assert sp["tree_B64_graph"]["speedup_vs_chain"] == 1.5
    assert sp["tree_B64_graph"]["vs_ar"] == "ar_graph"
    assert sp["tree_B64_dense_mask"]["speedup_vs_ar"] == 0.5  # eager baseline over eager ar
    assert sp["tree_B64_dense_mask"]["vs_chain"] == "chain_graph"  # no eager chain: fallback
