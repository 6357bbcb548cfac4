"""kdtree logits equal transformers' own implementations with the same weights (fp32)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kdtree.models import build_model, get_config  # noqa: E402
from kdtree.models.checkpoint import load_state_dict  # noqa: E402
from kdtree.models.config import config_from_dict  # noqa: E402

HF = {
    "tiny-llama": ("LlamaConfig", "LlamaForCausalLM"),
    "tiny-qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "tiny-mla": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}


def hf_model(name, cfg, gen, randomize):
    cfg_cls, model_cls = (getattr(transformers, n) for n in HF[name])
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("model_type", "architectures")}
    hf_cfg = cfg_cls(**data)
    hf_cfg._attn_implementation = "eager"
    model = model_cls(hf_cfg).eval()
    randomize(model, gen)
    return model


@pytest.mark.parametrize("name", list(HF))
@pytest.mark.parametrize("variant", ["plain", "tied", "scaled_rope"])
def test_logits_match_transformers(name, variant, gen, randomize):
    cfg = get_config(name)
    if variant == "tied":
        cfg = cfg.replace(tie_word_embeddings=True)
        if name == "tiny-mla":
            cfg = cfg.replace(q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1)
    if variant == "scaled_rope":  # yarn (DeepSeek / Kimi) and llama3 rope scaling
        if name == "tiny-mla":
            scaling = {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            }
        else:
            scaling = {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        cfg = cfg.replace(rope_scaling=scaling, max_position_embeddings=128)
    hf = hf_model(name, cfg, gen, randomize)
    ours = build_model(cfg).eval()
    load_state_dict(ours, hf.state_dict(), source=f"transformers {name}")
    ids = torch.randint(0, cfg.vocab_size, (2, 13), generator=gen)
    with torch.no_grad():
        want = hf(ids).logits
        out = ours.forward_dense(ids, return_taps=True)
        hidden = hf(ids, output_hidden_states=True).hidden_states
    assert out.logits.dtype == torch.float32
    assert want.abs().max() > 0.5  # weights large enough that a mismatch would show
    torch.testing.assert_close(out.logits, want, atol=1e-4, rtol=1e-4)
    taps = torch.cat([hidden[i + 1] for i in ours.tap_layer_ids], dim=-1)
    torch.testing.assert_close(out.taps, taps, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(HF))
def test_config_round_trips_through_transformers(name):
    cfg = get_config(name)
    cfg_cls = getattr(transformers, HF[name][0])
    hf_cfg = cfg_cls(**{k: v for k, v in cfg.to_dict().items() if k not in ("model_type",)})
    back = config_from_dict(hf_cfg.to_dict())
    assert back.replace(extra={}) == cfg.replace(extra={})
    # the HF-only extras (e.g. attention_dropout) are kept for the next round trip
    assert config_from_dict(back.to_dict()) == back


def test_kimi_config_shapes():
    cfg = get_config("kimi-k2-tp8")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (7168, 61, 8)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim) == (1536, 512, 128)
    assert (cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.vocab_size) == (64, 128, 163840)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (384, 8, 1)
    assert (cfg.moe_intermediate_size, cfg.first_k_dense_replace) == (2048, 1)
    hf_cfg = transformers.DeepseekV3Config(**cfg.to_dict())
    back = config_from_dict(hf_cfg.to_dict())
    assert back.replace(extra={}) == cfg.replace(extra={})
    assert back.extra["tp_size"] == 8
