"""Checkpoints: round trips, HF names, drafter-only weights, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from kdtree.models import (
    DFlashConfig,
    DFlashDrafter,
    dflash_config_for,
    get_config,
    load_config,
    load_model,
    save_pretrained,
)
from kdtree.models.config import config_from_dict


def test_round_trip(target_name, tmp_path, gen, random_model):
    model = random_model(target_name, gen)
    save_pretrained(model, tmp_path)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "model.layers.0.self_attn.o_proj.weight" in names and "lm_head.weight" in names
    if target_name == "tiny-mla":
        assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
        assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
        assert "model.layers.0.mlp.gate_proj.weight" in names  # first layer dense
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=gen)
    with torch.no_grad():
        assert torch.equal(loaded.forward_dense(ids).logits, model.forward_dense(ids).logits)
    half = load_model(tmp_path, dtype=torch.float16)
    assert half.lm_head.weight.dtype == torch.float16


def test_drafter_checkpoint_holds_only_its_weights(tmp_path, gen, random_model, randomize):
    target = random_model("tiny-llama", gen)
    cfg = dflash_config_for(target.config, target_name="tiny-llama")
    drafter = DFlashDrafter(cfg, target)
    randomize(drafter, gen)
    save_pretrained(drafter, tmp_path)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "fc.weight" in names and "layers.0.self_attn.k_norm.weight" in names
    assert not any("embed" in n or "lm_head" in n for n in names)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "dflash" and data["target"] == "tiny-llama"
    with pytest.raises(ValueError, match="target="):
        load_model(tmp_path)
    back = load_model(tmp_path, target=target)
    for (k, a), (_, b) in zip(
        back.state_dict().items(), drafter.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), k
    assert back.embed_tokens is target.embed_tokens


def test_missing_and_corrupt_files_name_the_file(tmp_path, gen, random_model):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(tmp_path / "nowhere")
    model = random_model("tiny-qwen3", gen)
    save_pretrained(model, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(tmp_path)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        load_config(tmp_path)


def test_wrong_shapes_and_names_are_reported(tmp_path, gen, random_model):
    model = random_model("tiny-llama", gen)
    save_pretrained(model, tmp_path)
    other = get_config("tiny-llama").replace(intermediate_size=96)
    other.save(tmp_path / "config.json")
    with pytest.raises(ValueError, match="shape"):
        load_model(tmp_path)


def test_unknown_config_lists_names():
    with pytest.raises(ValueError, match="tiny-llama.*kimi-k2-tp8"):
        get_config("tiny-gpt")


def test_zlab_style_drafter_config_loads():
    data = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 512,
        "block_size": 16,
        "num_target_layers": 6,
        "dflash_config": {"mask_token_id": 511, "target_layer_ids": [1, 2, 3]},
    }
    cfg = config_from_dict(data)
    assert isinstance(cfg, DFlashConfig)
    assert cfg.mask_token_id == 511 and cfg.target_layer_ids == [1, 2, 3]
