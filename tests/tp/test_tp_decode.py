"""Greedy decoding with a TP=2 target (two gloo processes) emits exactly the single-process
tokens: ar, DDTree trees (DFlash and oracle drafters), DFlash chains, and the unmodified
``SpecEngine`` on the TP target. Sampled decoding agrees across ranks (rank 0 decides)."""

from __future__ import annotations

import pytest
from _tp_cases import DECODE_CASES, MAX_NEW, PROMPTS, rank_decode, single_decode

from kdtree.tp.testing import run_spawned

WORLD = 2
NAMES = ["tiny-llama", "tiny-mla"]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_spawned(rank_decode, WORLD, NAMES, timeout=300)


@pytest.fixture(scope="module", params=NAMES)
def name(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def single(name) -> dict:
    return single_decode(name)


def _result(ranks, name, rank):
    res = ranks[rank][name]
    if not res["ok"]:
        pytest.fail(f"rank {rank} failed:\n{res['value']}")
    return res["value"]


@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_tp2_greedy_tokens_equal_single_process(ranks, single, name, case):
    ar = single["ar"]
    assert single[case] == ar  # the single-process engine is lossless (sanity)
    for r in range(WORLD):
        got = _result(ranks, name, r)[case]
        assert got["tokens"] == ar, f"rank {r}"
        assert all(len(t) == MAX_NEW for t in got["tokens"])


def test_tp2_oracle_tree_accepts_several_tokens(ranks, name):
    # the oracle's rows are the target's own: a working TP tree path accepts deep paths
    assert _result(ranks, name, 0)["tree-oracle-b6k2"]["tau"] > 2.0


def test_tp2_sampled_tokens_agree_across_ranks(ranks, name):
    toks = [_result(ranks, name, r)["sampled"]["tokens"] for r in range(WORLD)]
    assert toks[0] == toks[1]
    assert [len(t) for t in toks[0]] == [MAX_NEW] * len(PROMPTS)
