"""Checkpoint I/O: ``config.json`` + ``model.safetensors`` with Hugging Face tensor names.

Only the MoE experts are renamed: kdtree stacks them (``mlp.experts.gate_proj [E, I, d]``), HF
checkpoints store ``mlp.experts.{e}.gate_proj.weight`` per expert (and transformers 5 keeps
``mlp.experts.gate_up_proj [E, 2I, d]`` in memory; both are accepted on load). Drafter
checkpoints hold only the drafter's own weights; their config names the target.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from kdtree.models.config import DFlashConfig, ModelConfig, load_config

__all__ = [
    "from_hf_state_dict",
    "load_model",
    "load_state_dict",
    "save_pretrained",
    "to_hf_state_dict",
]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
_STACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)$")
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^(.*\.mlp\.experts)\.gate_up_proj$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def to_hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Our ``state_dict`` under HF names (experts split per expert, a tied ``lm_head`` left out)."""
    out: dict[str, torch.Tensor] = {}
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    for name, t in model.state_dict().items():
        m = _STACKED.match(name)
        if m:
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.{m.group(2)}.weight"] = t[e]
        elif not (tied and name == "lm_head.weight"):
            out[name] = t
    return out


def from_hf_state_dict(
    sd: dict[str, torch.Tensor], num_layers: int | None = None
) -> dict[str, torch.Tensor]:
    """HF names (per-expert or transformers-5 fused experts) to ours. Layers at or past
    ``num_layers`` (e.g. DeepSeek's MTP layer 61) are dropped."""
    out: dict[str, torch.Tensor] = {}
    per_expert: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        lm = _LAYER.match(name)
        if num_layers is not None and lm and int(lm.group(1)) >= num_layers:
            continue
        if name.endswith("rotary_emb.inv_freq"):
            continue
        m = _PER_EXPERT.match(name)
        if m:
            per_expert.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = t
            continue
        m = _FUSED.match(name)
        if m:
            gate, up = t.chunk(2, dim=1)
            out[f"{m.group(1)}.gate_proj"] = gate
            out[f"{m.group(1)}.up_proj"] = up
            continue
        out[name] = t
    for (prefix, proj), experts in per_expert.items():
        n = max(experts) + 1
        missing = sorted(set(range(n)) - set(experts))
        if missing:
            raise ValueError(f"{prefix}: experts {missing[:8]} missing for {proj}")
        out[f"{prefix}.{proj}"] = torch.stack([experts[e] for e in range(n)])
    return out


def load_state_dict(
    model: nn.Module, sd: dict[str, torch.Tensor], *, source: str = "state dict"
) -> None:
    """Load HF-named tensors into ``model`` strictly, with errors naming ``source``."""
    num_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(getattr(model, "config", None), DFlashConfig):
        num_layers = None  # drafter names have no "model." prefix
    ours = from_hf_state_dict(sd, num_layers)
    own = model.state_dict()
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied:
        ours.pop("lm_head.weight", None)
        own.pop("lm_head.weight", None)
    missing = sorted(set(own) - set(ours))
    unexpected = sorted(set(ours) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"{source}: tensors do not match the model: missing {missing[:6]}"
            f"{'...' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}"
            f"{'...' if len(unexpected) > 6 else ''}"
        )
    for name, t in ours.items():
        if tuple(t.shape) != tuple(own[name].shape):
            raise ValueError(
                f"{source}: tensor {name} has shape {tuple(t.shape)}, the model expects "
                f"{tuple(own[name].shape)}"
            )
    model.load_state_dict(ours, strict=not tied)


def save_pretrained(model: nn.Module, directory: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``directory`` (created)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config: ModelConfig = model.config
    config.save(directory / CONFIG_NAME)
    tensors = {k: v.detach().contiguous().cpu() for k, v in to_hf_state_dict(model).items()}
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    return directory


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file missing")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise ValueError(f"{path}: cannot read safetensors ({exc})") from exc


def load_model(
    directory: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    target: nn.Module | None = None,
) -> nn.Module:
    """Load a target model, or a DFlash drafter (then ``target`` is required), from
    ``directory``."""
    from kdtree.models import build_model
    from kdtree.models.dflash import DFlashDrafter

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: checkpoint directory missing")
    config = load_config(directory / CONFIG_NAME)
    sd = _read_weights(directory / WEIGHTS_NAME)
    with torch.device(device):
        if isinstance(config, DFlashConfig):
            if target is None:
                raise ValueError(
                    f"{directory}: a DFlash drafter checkpoint (target {config.target!r}); "
                    "pass target= the loaded target model"
                )
            model = DFlashDrafter(config, target)
        else:
            model = build_model(config)
    model.to(dtype)
    load_state_dict(model, sd, source=str(directory / WEIGHTS_NAME))
    return model.eval()
