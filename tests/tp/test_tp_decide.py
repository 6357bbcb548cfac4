"""Decisions on vocabulary-sharded logits over two gloo processes equal the single-process ones:
log-sum-exp, per-depth top-K (K below and above the shard width), argmax with ties, greedy and
sampled target tokens (rank 0's generator decides)."""

from __future__ import annotations

import pytest
import torch
from _tp_cases import decide_inputs, rank_decide

from kdtree.spec.accept import target_tokens
from kdtree.spec.tree import draft_topk
from kdtree.tp.testing import run_spawned

WORLD = 2


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_spawned(rank_decide, WORLD, timeout=180)


@pytest.fixture(scope="module")
def full() -> torch.Tensor:
    return decide_inputs()["logits"]


def _values(ranks, key):
    out = []
    for r, res in enumerate(ranks):
        if not res[key]["ok"]:
            pytest.fail(f"{key}: rank {r} failed:\n{res[key]['value']}")
        out.append(res[key]["value"])
    return out


def test_logsumexp(ranks, full):
    for lse in _values(ranks, "lse"):
        torch.testing.assert_close(lse, torch.logsumexp(full, dim=-1), atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("k", [8, 300])
def test_topk_equals_single_process(ranks, full, k):
    lp_ref, tok_ref = draft_topk(full, k)
    for lp, tok in _values(ranks, f"topk{k}"):
        assert tok.dtype == torch.int64 and lp.dtype == torch.float32
        assert torch.equal(tok[1:], tok_ref[1:]), "token ids differ"
        # row (0, 0) and (0, 1) hold exact ties, whose order topk leaves open
        assert set(tok[0].flatten().tolist()) == set(tok_ref[0].flatten().tolist())
        torch.testing.assert_close(lp, lp_ref, atol=2e-6, rtol=1e-6)


def test_argmax_takes_the_lowest_id_on_ties(ranks, full):
    ref = full.argmax(dim=-1)
    assert int(ref[0, 0]) == 3 and int(ref[0, 1]) == 10
    for got in _values(ranks, "argmax") + _values(ranks, "greedy"):
        assert torch.equal(got, ref)


def test_sampling_is_rank0s_draw_broadcast(ranks, full):
    ref = target_tokens(full, 0.8, torch.Generator().manual_seed(5))
    got = _values(ranks, "sample")
    assert torch.equal(got[0], ref)
    assert torch.equal(got[1], ref)  # rank 1's own generator was seeded differently
