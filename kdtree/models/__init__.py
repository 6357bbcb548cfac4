"""Target models (GQA: Llama / Qwen3; MLA + MoE: DeepSeek-V3 / Kimi-K2), the DFlash drafter,
configs by name and safetensors checkpoints with Hugging Face tensor names."""

from __future__ import annotations

from kdtree.models.checkpoint import load_model, save_pretrained
from kdtree.models.config import (
    CONFIG_NAMES,
    DFlashConfig,
    GQAConfig,
    MLAConfig,
    ModelConfig,
    dflash_config_for,
    get_config,
    load_config,
    target_layer_ids,
)
from kdtree.models.dflash import DFlashContext, DFlashDrafter
from kdtree.models.gqa import GQAForCausalLM
from kdtree.models.layers import ModelOutput
from kdtree.models.mla_moe import MLAMoEForCausalLM

__all__ = [
    "CONFIG_NAMES",
    "DFlashConfig",
    "DFlashContext",
    "DFlashDrafter",
    "GQAConfig",
    "GQAForCausalLM",
    "MLAConfig",
    "MLAMoEForCausalLM",
    "ModelConfig",
    "ModelOutput",
    "build_model",
    "dflash_config_for",
    "get_config",
    "load_config",
    "load_model",
    "save_pretrained",
    "target_layer_ids",
]


def build_model(config: ModelConfig | str) -> GQAForCausalLM | MLAMoEForCausalLM:
    """A randomly initialised target model for ``config`` (or a config name)."""
    if isinstance(config, str):
        config = get_config(config)
    if isinstance(config, GQAConfig):
        return GQAForCausalLM(config)
    if isinstance(config, MLAConfig):
        return MLAMoEForCausalLM(config)
    if isinstance(config, DFlashConfig):
        raise TypeError(
            "build_model: a DFlashConfig needs a target; use DFlashDrafter(cfg, target)"
        )
    raise TypeError(f"config: expected a model config, got {type(config).__name__}")
