"""DeepSeek-V3 routing and the expert loop against brute force."""

from __future__ import annotations

import torch

from kdtree.models import get_config
from kdtree.models.mla_moe import MoE


def brute_moe(moe: MoE, x: torch.Tensor, cfg) -> tuple[torch.Tensor, list[set[int]]]:
    """Per token: every expert evaluated, DeepSeek-V3 selection spelled out."""
    r = moe.gate
    out = torch.zeros_like(x)
    chosen = []
    per = cfg.n_routed_experts // cfg.n_group
    for n in range(x.shape[0]):
        s = torch.sigmoid(r.weight @ x[n])
        c = s + r.e_score_correction_bias
        groups = sorted(
            range(cfg.n_group),
            key=lambda g: -float(c[g * per : (g + 1) * per].topk(2).values.sum()),
        )[: cfg.topk_group]
        allowed = [e for g in groups for e in range(g * per, (g + 1) * per)]
        top = sorted(allowed, key=lambda e: -float(c[e]))[: cfg.num_experts_per_tok]
        w = s[top] / s[top].sum() * cfg.routed_scaling_factor
        chosen.append(set(top))
        for e, we in zip(top, w, strict=True):
            h = torch.nn.functional.silu(moe.experts.gate_proj[e] @ x[n])
            h = h * (moe.experts.up_proj[e] @ x[n])
            out[n] += we * (moe.experts.down_proj[e] @ h)
    return out + moe.shared_experts(x), chosen


def test_moe_matches_brute_force_and_records_routing(gen, randomize):
    cfg = get_config("tiny-mla").replace(
        n_routed_experts=12, n_group=3, topk_group=2, num_experts_per_tok=3
    )
    moe = MoE(cfg)
    randomize(moe, gen, std=0.3)
    x = torch.randn(2, 7, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        got = moe(x)
        want, chosen = brute_moe(moe, x.view(-1, cfg.hidden_size), cfg)
    torch.testing.assert_close(got.view(-1, cfg.hidden_size), want, atol=1e-5, rtol=1e-5)
    idx = moe.last_topk_idx
    assert idx.shape == (2, 7, 3)
    assert [set(row.tolist()) for row in idx.view(-1, 3)] == chosen
    # the correction bias steers selection only: a huge bias on expert 0 selects it everywhere
    # while its weight still comes from the unbiased score
    moe.gate.e_score_correction_bias.zero_()
    moe.gate.e_score_correction_bias[0] = 100.0
    with torch.no_grad():
        moe(x)
    assert (moe.last_topk_idx == 0).any(-1).all()


def test_last_routing_per_moe_layer(gen, random_model):
    model = random_model("tiny-mla", gen)
    ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=gen)
    with torch.no_grad():
        model.forward_dense(ids)
    routing = model.last_routing
    assert sorted(routing) == list(range(1, model.config.num_hidden_layers))  # layer 0 dense
    for idx in routing.values():
        assert idx.shape == (2, 5, model.config.num_experts_per_tok)
        assert idx.min() >= 0 and idx.max() < model.config.n_routed_experts


def test_capturable_all_experts_path_matches_the_loop(gen, randomize):
    cfg = get_config("tiny-mla")
    moe = MoE(cfg)
    randomize(moe, gen, std=0.3)
    x = torch.randn(9, cfg.hidden_size, generator=gen)
    with torch.no_grad():
        idx, w = moe.gate(x)
        loop = moe.experts(x, idx, w)
        dense = moe.experts._forward_all(x, idx, w)
    torch.testing.assert_close(dense, loop, atol=1e-5, rtol=1e-5)
