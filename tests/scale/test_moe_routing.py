"""Grouped expert execution and the routing statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtree.models.mla_moe import Experts
from kdtree.scale import routing as rt
from kdtree.scale.moe import distinct_experts, moe_experts, moe_floor_ms


@pytest.fixture
def experts(gen):
    ex = Experts(24, 32, 16)  # 24 experts, hidden 32, width 16
    with torch.no_grad():
        for p in ex.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return ex


@pytest.mark.parametrize("n", [1, 7, 33])
def test_providers_match_the_model_loop(experts, gen, n):
    x = torch.randn(n, 32, generator=gen)
    idx = torch.stack([torch.randperm(24, generator=gen)[:3] for _ in range(n)])
    idx[:, 0] = 5  # one expert shared by every token; most experts get none
    w = torch.rand(n, 3, generator=gen)
    ref = moe_experts(experts, x, idx, w, provider="loop")
    for prov in ("bmm", "grouped"):
        torch.testing.assert_close(moe_experts(experts, x, idx, w, provider=prov), ref)
    assert distinct_experts(idx) == len(set(idx.flatten().tolist()))


def test_provider_errors(experts):
    x, idx, w = torch.randn(2, 32), torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3)
    with pytest.raises(ValueError, match="provider"):
        moe_experts(experts, x, idx, w, provider="magic")
    with pytest.raises(ValueError, match="x: expected"):
        moe_experts(experts, torch.randn(2, 31), idx, w)
    with pytest.raises(ValueError, match="w: expected"):
        moe_experts(experts, x, idx, torch.ones(2, 2))


def test_floor_arithmetic():
    assert moe_floor_ms(100, 11e6, 4.0) == pytest.approx(100 * 11e6 / 4e12 * 1e3)
    with pytest.raises(ValueError):
        moe_floor_ms(1, 1, 0)


def test_expected_distinct_uniform_closed_form():
    assert rt.expected_distinct_uniform(384, 8, 1) == pytest.approx(8)
    assert rt.expected_distinct_uniform(384, 8, 0) == 0
    vals = [rt.expected_distinct_uniform(384, 8, t) for t in (1, 9, 65, 257)]
    assert vals == sorted(vals) and vals[-1] < 384
    curve = rt.routing_curve("uniform", [17], 384, 8, trials=60, seed=1)[0]
    assert curve["distinct_mean"] == pytest.approx(curve["expected_uniform"], rel=0.03)


def test_sample_routing_rows_are_valid(gen):
    idx = rt.sample_routing(50, 64, 6, gen)
    assert idx.shape == (50, 6) and idx.min() >= 0 and idx.max() < 64
    assert all(len(set(r)) == 6 for r in idx.tolist())


def test_correlation_and_skew_reduce_distinct_experts():
    uni = rt.routing_curve("uniform", [65], 384, 8, trials=6, seed=0)[0]["distinct_mean"]
    zipf = rt.routing_curve("zipf", [65], 384, 8, trials=6, seed=0, zipf_s=1.0)[0]
    cor = rt.routing_curve("correlated", [65], 384, 8, trials=6, seed=0, rho=0.9)[0]
    assert zipf["distinct_mean"] < 0.8 * uni and cor["distinct_mean"] < 0.8 * uni


def test_overlap_tracks_rho(gen):
    parents = rt.random_tree_parents(60, gen)
    lo = rt.overlap_with_parent(rt.sample_routing(60, 384, 8, gen, parents=parents), parents)
    hi = rt.overlap_with_parent(
        rt.sample_routing(60, 384, 8, gen, parents=parents, rho=0.995), parents
    )
    assert lo < 0.1 and hi > 0.7
    assert rt.excess_overlap(8 / 384, 384, 8) == pytest.approx(0.0)
    assert rt.excess_overlap(1.0, 384, 8) == pytest.approx(1.0)


def test_calibrate_rho_inverts_the_excess():
    rho = rt.calibrate_rho(0.3, 384, 8, trials=2)
    got = rt._mc_excess(rho, 384, 8, 33, 2, 0)
    assert 0.0 < rho < 1.0 and got == pytest.approx(0.3, abs=0.05)
    assert rt.calibrate_rho(-0.1, 384, 8) == 0.0


def test_routing_argument_errors(gen):
    with pytest.raises(ValueError, match="parents"):
        rt.sample_routing(5, 10, 2, gen, rho=0.5)
    with pytest.raises(ValueError, match="parents\\[2\\]"):
        rt.sample_routing(3, 10, 2, gen, parents=[-1, 0, 2], rho=0.5)
    with pytest.raises(ValueError, match="top_k"):
        rt.expected_distinct_uniform(4, 5, 1)
    with pytest.raises(ValueError, match="kind"):
        rt.routing_curve("normal", [1], 4, 1)
    parents = rt.random_tree_parents(30, gen)
    assert parents[0] == -1 and all(0 <= p < j for j, p in enumerate(parents) if j)
    assert np.isnan(rt.overlap_with_parent(torch.zeros(1, 2, dtype=torch.int64), [-1]))
