"""In-process TP pieces: vocabulary shards, local configs, tensor sharding rules, TP=1 models
(bit-identical to the single-process model), decisions on one rank, env and error handling."""

from __future__ import annotations

import pytest
import torch
from _tp_cases import PROMPTS, make_drafter, make_target

from kdtree.models import get_config
from kdtree.spec import generate
from kdtree.spec.tree import draft_topk
from kdtree.tp import (
    NVLS_OFF_ENV,
    CommTimer,
    TPGroup,
    TPSpecEngine,
    VocabShard,
    build_tp_model,
    disable_nvlink_multicast,
    dist_argmax,
    dist_topk,
    generate_tp,
    init_from_env,
    kv_head_of_rank,
    local_config,
    replicate_drafter,
    shard_model,
    shard_tensor,
)


@pytest.mark.parametrize(("vocab", "size"), [(512, 2), (509, 2), (509, 8), (5, 4), (7, 1)])
def test_vocab_shards_cover_the_vocabulary(vocab, size):
    shards = [VocabShard.of(vocab, r, size) for r in range(size)]
    assert shards[0].start == 0 and shards[-1].end == vocab
    for a, b in zip(shards, shards[1:], strict=False):
        assert a.end == b.start
    assert all(s.per == shards[0].per and 0 <= s.real <= s.per for s in shards)
    full = torch.randn(3, vocab)
    parts = [s.slice_full(full) for s in shards]
    assert all(p.shape == (3, shards[0].per) for p in parts)
    assert torch.equal(
        torch.cat([p[:, : s.real] for p, s in zip(parts, shards, strict=True)], 1), full
    )
    for p, s in zip(parts, shards, strict=True):
        assert torch.isneginf(p[:, s.real :]).all()


def test_vocab_shard_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rank=2"):
        VocabShard.of(10, 2, 2)
    with pytest.raises(ValueError, match="last dim 10"):
        VocabShard.of(10, 0, 2).slice_full(torch.zeros(2, 9))


def test_local_config_divides_heads_and_intermediates():
    llama = local_config(get_config("tiny-llama"), 2)
    assert (llama.num_attention_heads, llama.num_key_value_heads) == (2, 1)
    assert llama.intermediate_size == 64 and llama.head_dim == 16 and llama.vocab_size == 512
    mla = local_config(get_config("tiny-mla"), 4)
    assert mla.num_attention_heads == 1 and mla.moe_intermediate_size == 8
    assert mla.kv_lora_rank == 32 and mla.n_routed_experts == 8  # latent and experts whole
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible"):
        local_config(get_config("tiny-llama"), 3)
    with pytest.raises(ValueError, match="size=0"):
        local_config(get_config("tiny-llama"), 0)
    with pytest.raises(TypeError, match="GQAConfig or MLAConfig"):
        local_config(get_config("tiny-dflash"), 2)


def test_kv_heads_split_or_replicate():
    assert [kv_head_of_rank(8, 4, r, 2) for r in range(2)] == [(0, 2), (2, 2)]
    assert [kv_head_of_rank(8, 2, r, 4) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    with pytest.raises(ValueError, match="num_key_value_heads=3"):
        kv_head_of_rank(12, 3, 0, 2)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
def test_shards_of_all_ranks_rebuild_the_tensor(name):
    model = make_target(name)
    cfg = model.config
    state = model.state_dict()
    for key, full in state.items():
        parts = [shard_tensor(key, full, cfg, r, 2) for r in range(2)]
        if parts[0].shape == full.shape and parts[1].shape == full.shape:
            assert torch.equal(parts[0], full) and torch.equal(parts[1], full), key
            continue
        dims = [d for d in range(full.dim()) if parts[0].shape[d] != full.shape[d]]
        assert len(dims) == 1, key  # split along exactly one dim
        joined = torch.cat(parts, dims[0])
        assert torch.equal(joined.narrow(dims[0], 0, full.shape[dims[0]]), full), key


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3-tied", "tiny-mla"])
def test_tp1_model_is_bit_identical(name):
    model = make_target(name)
    tp_model = shard_model(model, TPGroup.single())
    ids = torch.randint(
        0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(tp_model.forward_dense(ids).logits, model.forward_dense(ids).logits)
    local = tp_model.forward_dense(ids, gather_logits=False).logits
    assert torch.equal(local, model.forward_dense(ids).logits)
    assert tp_model.lm_head.gather  # restored after the call


def test_tp1_engine_decodes_like_generate():
    target = make_target("tiny-llama")
    drafter = make_drafter(target)
    ref = generate(target, drafter, PROMPTS, mode="tree", budget=8, top_k=3, max_new_tokens=8)
    tp_target = shard_model(target, TPGroup.single())
    tp_drafter = replicate_drafter(drafter, tp_target)
    got = generate_tp(tp_target, tp_drafter, PROMPTS, mode="tree", budget=8, top_k=3,
                      max_new_tokens=8)  # fmt: skip
    assert got.tokens == ref.tokens
    assert [r.accepted_len for r in got.steps] == [r.accepted_len for r in ref.steps]


def test_single_rank_decisions_match_torch():
    logits = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(3))
    shard = VocabShard.of(300, 0, 1)
    lp, tok = dist_topk(logits, 7, shard, TPGroup.single())
    lp_ref, tok_ref = draft_topk(logits, 7)
    assert torch.equal(tok, tok_ref)
    torch.testing.assert_close(lp, lp_ref, atol=1e-6, rtol=1e-6)
    assert torch.equal(dist_argmax(logits, shard, TPGroup.single()), logits.argmax(-1))
    with pytest.raises(ValueError, match="k=301"):
        dist_topk(logits, 301, shard, TPGroup.single())
    with pytest.raises(ValueError, match="last dim 300"):
        dist_argmax(logits[..., :10], shard, TPGroup.single())


def test_build_tp_model_is_deterministic():
    cfg = get_config("tiny-mla")
    a = build_tp_model(cfg, TPGroup.single(), seed=3)
    b = build_tp_model(cfg, TPGroup.single(), seed=3)
    for (na, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), na
    ids = torch.randint(0, cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    logits = a.forward_dense(ids).logits
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_errors_name_the_bad_argument():
    with pytest.raises(RuntimeError, match="not initialised"):
        TPGroup(rank=0, size=2, ranks=(0, 1))
    with pytest.raises(TypeError, match="TP model"):
        TPSpecEngine(make_target("tiny-llama"), None, mode="ar")
    with pytest.raises(TypeError, match="GQAForCausalLM or MLAMoEForCausalLM"):
        shard_model(torch.nn.Linear(2, 2), TPGroup.single())
    group = TPGroup.single()
    group.size = 2  # past the process-group check: ``op`` is validated before communicating
    with pytest.raises(ValueError, match="op='min'"):
        group.all_reduce(torch.ones(2), op="min")


def test_nvlink_multicast_env_defaults(monkeypatch):
    for key in NVLS_OFF_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # an explicit setting wins (setdefault)
    got = disable_nvlink_multicast()
    assert got == {**NVLS_OFF_ENV, "NCCL_NVLS_ENABLE": "1"}
    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    assert disable_nvlink_multicast()["NCCL_NVLS_ENABLE"] == "0"


def test_init_from_env_needs_torchrun(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        init_from_env()


def test_comm_timer_counts_regions():
    timer = CommTimer("cpu")
    for _ in range(3):
        with timer.region("all_reduce_sum"):
            pass
    ms, counts = timer.collect()
    assert counts == {"all_reduce_sum": 3} and ms["all_reduce_sum"] >= 0
    assert timer.collect() == ({}, {})


def test_tp1_keeps_a_half_precision_model_bit_identical():
    """RoPE tables (non-persistent buffers) come from the source, dtype included."""
    model = make_target("tiny-mla").to(torch.float16)
    tp_model = shard_model(model, TPGroup.single())
    assert tp_model.rotary.inv_freq.dtype == model.rotary.inv_freq.dtype
    ids = torch.randint(0, 512, (1, 7), generator=torch.Generator().manual_seed(1))
    assert torch.equal(tp_model.forward_dense(ids).logits, model.forward_dense(ids).logits)
