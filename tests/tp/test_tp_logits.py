"""TP=2 (two gloo processes) forward passes equal the single-process model's in fp32: dense,
cached prefill over ragged prompts, a tree verify on the paged cache, taps and the cache."""

from __future__ import annotations

import pytest
import torch
from _tp_cases import MODELS, forward_suite, make_target, rank_logits

from kdtree.tp.testing import run_spawned

WORLD = 2


def assert_close(got: torch.Tensor, ref: torch.Tensor, msg: str = "") -> None:
    """fp32 agreement up to reordered sums: ~30 ulp of the tensor's largest magnitude."""
    scale = float(ref.abs().max())
    torch.testing.assert_close(got, ref, atol=4e-6 * scale + 1e-7, rtol=1e-5, msg=msg or None)


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return run_spawned(rank_logits, WORLD, list(MODELS), timeout=240)


@pytest.fixture(scope="module")
def single() -> dict[str, dict[str, torch.Tensor]]:
    return {name: forward_suite(make_target(name)) for name in MODELS}


def _result(ranks, name, rank):
    res = ranks[rank][name]
    if not res["ok"]:
        pytest.fail(f"rank {rank} failed:\n{res['value']}")
    return res["value"]


@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_logits_equal_single_process(ranks, single, name):
    ref = single[name]
    got = [_result(ranks, name, r) for r in range(WORLD)]
    for key in ("dense", "prefill", "tree", "prefill_taps", "tree_taps"):
        assert ref[key].abs().max() > 0
        for r in range(WORLD):
            assert_close(got[r][key], ref[key], f"{key}, rank {r}")
        assert torch.equal(got[0][key], got[1][key]), f"{key}: ranks disagree"


@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_local_logits_are_the_vocab_shard(ranks, name):
    for r in range(WORLD):
        res = _result(ranks, name, r)
        start, end, per = res["shard"]
        local = res["tree_local"]
        assert local.shape[-1] == per
        torch.testing.assert_close(local[..., : end - start], res["tree"][..., start:end])
        assert torch.isneginf(local[..., end - start :]).all()
    vocab = make_target(name).config.vocab_size
    assert _result(ranks, name, 0)["shard"][0] == 0
    assert _result(ranks, name, WORLD - 1)["shard"][1] == vocab


@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_cache_holds_the_rank_heads(ranks, single, name):
    ref = single[name]["cache"]
    model = make_target(name)
    cfg = model.config
    for r in range(WORLD):
        got = _result(ranks, name, r)["cache"]
        if cfg.model_type == "deepseek_v3":  # latent replicated: the same cache on every rank
            assert_close(got, ref)
            continue
        n_kv = cfg.num_key_value_heads
        if n_kv >= WORLD:  # an even split of the k/v heads
            count = n_kv // WORLD
            first = r * count
        else:  # one head per rank, replicated over WORLD / n_kv ranks
            first, count = r // (WORLD // n_kv), 1
        assert_close(got, ref[:, :, :, first : first + count])
