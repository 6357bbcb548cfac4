"""The K2 TP8 rank: per-rank shapes, bytes, the memory check, and the random slice."""

from __future__ import annotations

import pytest
import torch

from kdtree.scale.layer_timing import LayerParts
from kdtree.scale.slice import build_k2_slice, make_verify_batch, random_tree_mask
from kdtree.scale.spec import K2_REFERENCE, ShapeDoesNotFitError, check_fits

SMALL = K2_REFERENCE.reduced(32)


def test_per_rank_shapes_follow_tp8_without_ep():
    s = K2_REFERENCE
    assert (s.heads, s.expert_width_rank, s.dense_width_rank, s.vocab_rank) == (
        8,
        256,
        2304,
        20480,
    )
    assert s.n_moe_layers == 60
    assert s.expert_bytes() == 3 * 256 * 7168 * 2
    cfg = s.config(3)
    assert cfg.num_attention_heads == 8 and cfg.n_routed_experts == 384
    assert cfg.moe_intermediate_size == 256 and cfg.intermediate_size == 2304
    assert cfg.vocab_size == 20480 and cfg.first_k_dense_replace == 1
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (1536, 512, 64)


def test_bytes_add_up():
    s = K2_REFERENCE
    moe = s.layer_weight_bytes(1)
    assert moe > 385 * s.expert_bytes()  # all experts + shared + attention
    assert s.layer_weight_bytes(0) < moe  # the dense layer is far smaller
    parts = s.slice_bytes(3, 4096, 17)
    assert parts["total"] == parts["weights"] + parts["kv_cache"] + parts["workspace"]
    assert parts["kv_cache"] == 3 * (4096 + 64) * 576 * 2  # rounded up to 64-token pages


def test_reduced_keeps_routing_shape_and_kernel_friendly_dims():
    r = K2_REFERENCE.reduced(16)
    assert (r.n_experts, r.top_k, r.heads) == (384, 8, 8)
    assert r.kv_lora_rank >= 16 and r.kv_lora_rank & (r.kv_lora_rank - 1) == 0
    assert r.qk_rope >= 16 and not r.is_full_size and "CPU stand-in" in r.label
    with pytest.raises(ValueError, match="factor"):
        K2_REFERENCE.reduced(0)


def test_check_fits_names_the_bytes():
    with pytest.raises(ShapeDoesNotFitError, match=r"needs 2\.00 GiB .*2,147,483,648 bytes"):
        check_fits("thing", 2 * 2**30, "cpu", free=2**30)
    check_fits("thing", 10, "cpu", free=100)
    assert issubclass(ShapeDoesNotFitError, MemoryError)


def test_build_refuses_before_allocating():
    with pytest.raises(ShapeDoesNotFitError, match="61 layers") as err:
        build_k2_slice(K2_REFERENCE, 61, device="cpu", context=185_000, tree=257, free_bytes=2**30)
    assert err.value.needed > 200 * 2**30  # the whole rank at bf16


def test_slice_is_shape_faithful_and_seeded():
    a = build_k2_slice(SMALL, 2, dtype=torch.float32, seed=3)
    b = build_k2_slice(SMALL, 2, dtype=torch.float32, seed=3)
    moe = a.model.layers[1].mlp
    assert tuple(moe.experts.gate_proj.shape) == (384, SMALL.expert_width_rank, SMALL.hidden)
    assert tuple(moe.experts.down_proj.shape) == (384, SMALL.hidden, SMALL.expert_width_rank)
    assert moe.gate.weight.dtype == torch.float32
    assert torch.equal(moe.experts.up_proj, b.model.layers[1].mlp.experts.up_proj)
    assert a.lm_head.weight.shape[0] == SMALL.vocab_rank


def test_random_tree_mask_is_ancestor_closed():
    vis = random_tree_mask(40, torch.Generator().manual_seed(0))
    assert vis.diagonal().all() and vis[:, 0].all()
    assert not vis.triu(1).any()
    for j in range(40):  # every visible node's own ancestors are visible too
        anc = vis[j].nonzero().flatten()
        assert vis[anc].logical_and(~vis[j]).sum() == 0


def test_layer_parts_attention_providers_agree_with_ref():
    from kdtree.attention import tree_attention_mla

    model = build_k2_slice(SMALL, 2, dtype=torch.float32, seed=1)
    vb = make_verify_batch(model, 70, 7, seed=2)
    lp = LayerParts(model, 1, vb, seed=4)
    with torch.no_grad():
        ref = tree_attention_mla(lp.q_abs, lp.q_pe, vb.cache.kv[1], vb.attn.page_table,
                                 vb.attn.prefix_lens, vb.attn.tree_mask,
                                 sm_scale=model.model.layers[1].self_attn.sm_scale, backend="ref")  # fmt: skip
        for prov in ("eager", "triton"):
            out = lp.attn_kernel(prov)()
            torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
        for fn in lp.parts(moe_providers=("loop", "grouped")).values():
            fn()  # every part runs at these shapes
        assert lp.layer_model().shape == (1, 7, SMALL.hidden)
    assert 8 <= lp.distinct_experts <= 7 * 8
    with pytest.raises(ValueError, match="dense"):
        LayerParts(model, 0, vb).router()
