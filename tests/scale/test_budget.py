"""Cost-aware budget: the policy, the latency table, recorded rounds, replay and the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtree.models import DFlashDrafter, build_model, dflash_config_for
from kdtree.scale.budget import CostAwareEngine, TableLatency, choose_budget, simulate
from kdtree.scale.record import Round, record_rounds, tau_at_budget
from kdtree.spec.loop import generate
from kdtree.spec.testing import OracleDrafter


def _linear(base: float, per_token: float):
    return lambda t, context: base + per_token * t


def test_choose_budget_greedy_matches_exhaustive_when_unimodal():
    exp = 1.0 + np.cumsum(np.r_[0.0, 0.9 ** np.arange(1, 64)])  # concave
    lat = _linear(10.0, 0.5)  # convex (linear)
    cands = list(range(64))
    g = choose_budget(exp, lat, 0, cands, greedy=True)
    a = choose_budget(exp, lat, 0, cands, greedy=False)
    assert g.budget == a.budget and g.evaluated < a.evaluated
    rates = [exp[b] / lat(b + 1, 0) for b in cands]
    assert g.budget == int(np.argmax(rates))


def test_choose_budget_extremes_and_errors():
    exp = 1.0 + np.arange(17.0)  # every node certain to be accepted
    assert choose_budget(exp, _linear(10.0, 0.0), 0, [0, 4, 16, 64]).budget == 16  # 64 dropped
    assert choose_budget(exp, _linear(0.0, 1.0), 0, [0, 4, 16]).budget == 0  # cost ∝ T
    with pytest.raises(ValueError, match="candidates"):
        choose_budget(exp, _linear(1, 0), 0, [99])
    with pytest.raises(ValueError, match="positive"):
        choose_budget(exp, lambda t, c: 0.0, 0, [0])


def test_table_latency():
    lat = TableLatency.from_points({(1, 100): 1.0, (9, 100): 2.0, (1, 300): 3.0, (9, 300): 6.0},
                                   fixed_ms=0.5)  # fmt: skip
    assert lat(5, 100) == pytest.approx(2.0)
    assert lat(5, 200) == pytest.approx(0.5 + (1.5 + 4.5) / 2)
    assert lat(17, 100) == pytest.approx(0.5 + 3.0)  # extrapolated in T
    assert lat(5, 10_000) == pytest.approx(0.5 + 4.5)  # clamped in L
    with pytest.raises(ValueError, match="incomplete"):
        TableLatency.from_points({(1, 100): 1.0, (9, 300): 2.0})
    with pytest.raises(ValueError, match="positive"):
        TableLatency(np.array([1, 2]), np.array([0]), np.array([1.0, -1.0]))


def test_round_expectation_and_truncation():
    r = Round(np.log(np.array([1.0, 0.5, 0.25, 0.5])), np.array([-1, 0, 1, 0]), (0, 1, 2), 10)
    np.testing.assert_allclose(r.expected_accepted, [1.0, 1.5, 1.75, 2.25])
    assert [tau_at_budget(r.path, b) for b in range(4)] == [1, 2, 3, 3]
    with pytest.raises(ValueError):
        tau_at_budget(r.path, -1)


def test_simulate_fixed_and_policy():
    rounds = [
        Round(np.log(np.r_[1.0, 0.9 ** np.arange(1, 9)]), np.arange(-1, 8), tuple(range(k)), 50)
        for k in (2, 5, 9)
    ]
    out = simulate(rounds, _linear(5.0, 1.0), fixed_budgets=[0, 4, 8], candidates=[0, 2, 4, 8])
    fixed = {o["policy"]: o for o in out}
    assert [fixed[f"fixed B={b}"]["tokens"] for b in (0, 4, 8)] == [3, 2 + 5 + 5, 2 + 5 + 9]
    assert fixed["fixed B=8"]["time_ms"] == pytest.approx(3 * 14.0)
    assert set(fixed["cost-aware"]["chosen"]) <= {0, 2, 4, 8}
    with pytest.raises(ValueError, match="outside"):
        simulate(rounds, _linear(1, 1), fixed_budgets=[9])


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    target = build_model("tiny-mla").eval()
    return target


def test_recording_engine_paths_match_acceptance(tiny):
    oracle = OracleDrafter(tiny, block_size=6)
    rounds = record_rounds(tiny, oracle, [[5, 6, 7, 8]], budget=8, top_k=2, max_new_tokens=10)
    assert rounds and all(r.size == 9 for r in rounds)
    for r in rounds:
        assert r.path[0] == 0 and list(r.path) == sorted(r.path)
        assert all(r.parents[j] == i for i, j in zip(r.path, r.path[1:], strict=False))
        assert tau_at_budget(r.path, r.size - 1) == len(r.path) > 1  # the oracle is accepted
        assert set(r.routing) == {1, 2, 3, 4, 5} and r.routing[1].shape == (9, 2)


@pytest.mark.parametrize(
    ("per_token", "expect"), [(0.0, "max"), (10.0, "zero")], ids=["flat", "steep"]
)
def test_cost_aware_engine_is_lossless_and_follows_cost(tiny, per_token, expect):
    drafter = OracleDrafter(tiny, block_size=6)
    prompt = [[5, 6, 7, 8]]
    ref = generate(tiny, None, prompt, mode="ar", max_new_tokens=10).tokens[0]
    eng = CostAwareEngine(tiny, drafter, latency=_linear(1.0, per_token), candidates=(0, 2, 8),
                          top_k=2)  # fmt: skip
    st = eng.prefill(prompt, max_new_tokens=10)
    while st.active:
        eng.step(st)
    assert st.tokens[0] == ref
    assert set(eng.chosen) == ({8} if expect == "max" else {0})


def test_cost_aware_engine_random_drafter_lossless(tiny):
    drafter = DFlashDrafter(dflash_config_for(tiny.config), tiny).eval()
    prompt = [[9, 3, 4]]
    ref = generate(tiny, None, prompt, mode="ar", max_new_tokens=6).tokens[0]
    eng = CostAwareEngine(tiny, drafter, latency=_linear(2.0, 0.01), candidates=(0, 4, 16))
    st = eng.prefill(prompt, max_new_tokens=6)
    while st.active:
        eng.step(st)
    assert st.tokens[0] == ref and set(eng.chosen) <= {0, 4, 16}
    with pytest.raises(ValueError, match="candidates"):
        CostAwareEngine(tiny, drafter, latency=_linear(1, 1), candidates=(-1, 2))


def test_acceptance_scale_and_scaled_policy():
    from kdtree.scale.budget import acceptance_scale

    # expected 0.5 extra per round at B=2, but the whole path (2 extra) is accepted: ×4
    rounds = [Round(np.log(np.array([1.0, 0.5, 1e-9])), np.array([-1, 0, 1]), (0, 1, 2), 5)] * 3
    assert acceptance_scale(rounds) == pytest.approx(2.0 / 0.5, rel=1e-6)
    out = simulate(rounds, _linear(1.0, 1.0), fixed_budgets=[0], candidates=[0, 1, 2],
                   scales={"cost-aware": 1.0, "x4": 4.0})  # fmt: skip
    by = {o["policy"]: o for o in out}
    assert by["x4"]["budget"] >= by["cost-aware"]["budget"]
    with pytest.raises(ValueError, match="positive factor"):
        simulate(rounds, _linear(1, 1), fixed_budgets=[0], scales={"bad": 0.0})
    with pytest.raises(ValueError):
        acceptance_scale([])
