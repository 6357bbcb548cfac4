"""Build TP models: shard a loaded single-process model by rank (``shard_model``), or give each
rank random weights of its shard directly (``build_tp_model``, for benchmarks of models that do
not fit one process). Both build the module tree on the meta device and materialise only the
local shard."""

from __future__ import annotations

import zlib

import torch
from torch import nn

from kdtree.models.config import GQAConfig, MLAConfig, ModelConfig
from kdtree.models.dflash import DFlashDrafter
from kdtree.tp.dist import TPGroup
from kdtree.tp.layers import VocabShard
from kdtree.tp.model import kv_head_of_rank, reset_rotary, tp_model_class

__all__ = ["build_tp_model", "replicate_drafter", "shard_model", "shard_tensor"]

# (suffix of the HF tensor name, how it is split). Dims are of the tensor as stored.
_RULES: tuple[tuple[str, str], ...] = (
    ("embed_tokens.weight", "vocab"),
    ("lm_head.weight", "vocab"),
    ("self_attn.q_proj.weight", "rows"),
    ("self_attn.q_proj.bias", "rows"),
    ("self_attn.q_b_proj.weight", "rows"),
    ("self_attn.kv_b_proj.weight", "rows"),
    ("self_attn.k_proj.weight", "kv_rows"),
    ("self_attn.k_proj.bias", "kv_rows"),
    ("self_attn.v_proj.weight", "kv_rows"),
    ("self_attn.v_proj.bias", "kv_rows"),
    ("self_attn.o_proj.weight", "cols"),
    ("mlp.gate_proj.weight", "rows"),
    ("mlp.gate_proj.bias", "rows"),
    ("mlp.up_proj.weight", "rows"),
    ("mlp.up_proj.bias", "rows"),
    ("mlp.down_proj.weight", "cols"),
    ("shared_experts.gate_proj.weight", "rows"),
    ("shared_experts.up_proj.weight", "rows"),
    ("shared_experts.down_proj.weight", "cols"),
    ("mlp.experts.gate_proj", "dim1"),
    ("mlp.experts.up_proj", "dim1"),
    ("mlp.experts.down_proj", "dim2"),
)


def _rule(name: str) -> str:
    for suffix, rule in _RULES:
        if name == suffix or name.endswith("." + suffix):
            return rule
    return "replicate"  # norms, q_a_proj, kv_a_proj_with_mqa, router, biases after all-reduce


def _chunk(t: torch.Tensor, dim: int, name: str, rank: int, size: int) -> torch.Tensor:
    n = t.shape[dim]
    if n % size:
        raise ValueError(f"{name}: dim {dim} of size {n} is not divisible by TP size {size}")
    per = n // size
    return t.narrow(dim, rank * per, per)


def shard_tensor(name: str, full: torch.Tensor, config: ModelConfig, rank: int, size: int):
    """Rank ``rank``'s part of the single-process tensor ``name`` (HF name) of ``config``."""
    rule = _rule(name)
    if rule == "replicate" or (size == 1 and rule != "vocab"):
        return full
    if rule == "vocab":
        shard = VocabShard.of(config.vocab_size, rank, size)
        if full.shape[0] != config.vocab_size:
            raise ValueError(
                f"{name}: expected {config.vocab_size} vocabulary rows, got {full.shape[0]}"
            )
        out = full.new_zeros(shard.per, *full.shape[1:])
        out[: shard.real] = full[shard.start : shard.end]
        return out
    if rule == "kv_rows":
        if not isinstance(config, GQAConfig):
            raise TypeError(f"{name}: k/v projections belong to a GQA model")
        first, count = kv_head_of_rank(
            config.num_attention_heads, config.num_key_value_heads, rank, size
        )
        hd = config.head_dim
        return full.narrow(0, first * hd, count * hd)
    dim = {"rows": 0, "cols": 1, "dim1": 1, "dim2": 2}[rule]
    return _chunk(full, dim, name, rank, size)


def _copy_nonpersistent_buffers(src: nn.Module, dst: nn.Module) -> None:
    """Copy buffers left out of ``state_dict`` (RoPE tables) as they are in ``src`` (dtype
    included, so a bf16-cast source gives the very same tables)."""
    saved = src.state_dict()
    for name, buf in src.named_buffers():
        if name in saved:
            continue
        owner, _, leaf = name.rpartition(".")
        setattr(dst.get_submodule(owner) if owner else dst, leaf, buf.detach().clone())


def _materialize(config: ModelConfig, tp: TPGroup, device, dtype) -> nn.Module:
    cls = tp_model_class(config)
    with torch.device("meta"):
        model = cls(config, tp)
    model = model.to(dtype).to_empty(device=device)  # cast on meta: no fp32 copy on device
    reset_rotary(model, config)
    return model.eval()


@torch.no_grad()
def shard_model(model: nn.Module, tp: TPGroup) -> nn.Module:
    """This rank's TP model holding its shard of ``model``'s weights (same device and dtype).

    Every process of the group calls it with an identical ``model`` (loaded from the same
    checkpoint or built from the same seed)."""
    config = getattr(model, "config", None)
    if not isinstance(config, GQAConfig | MLAConfig):
        raise TypeError(
            f"model: expected a GQAForCausalLM or MLAMoEForCausalLM, got {type(model).__name__}"
        )
    if not isinstance(tp, TPGroup):
        raise TypeError(f"tp: expected a TPGroup, got {type(tp).__name__}")
    out = _materialize(config, tp, model.device, model.dtype)
    src = model.state_dict()
    for name, dst in out.state_dict().items():
        if name not in src:
            raise KeyError(f"{name}: missing from the single-process model's state_dict")
        part = shard_tensor(name, src[name], config, tp.rank, tp.size)
        if part.shape != dst.shape:
            raise ValueError(
                f"{name}: shard of shape {tuple(part.shape)} does not fit the TP tensor "
                f"{tuple(dst.shape)}"
            )
        dst.copy_(part)
    _copy_nonpersistent_buffers(model, out)
    out.tap_layer_ids = list(model.tap_layer_ids)
    return out


@torch.no_grad()
def build_tp_model(
    config: ModelConfig,
    tp: TPGroup,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> nn.Module:
    """A TP model with random weights of this rank's shard only (benchmarks: the model need
    not fit one device). Replicated tensors get the same values on every rank (same seed);
    sharded ones differ per rank, as a slice of some random full model would."""
    model = _materialize(config, tp, torch.device(device), dtype)
    gen = torch.Generator(device=torch.device(device))
    std = config.initializer_range
    for name, p in model.named_parameters():
        # a stable per-tensor seed (str hash() differs between processes)
        sharded = _rule(name) != "replicate"
        gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()) + (tp.rank + 1) * sharded)
        if p.dim() >= 2:
            p.normal_(0.0, std, generator=gen)
        elif name.endswith("norm.weight") or "layernorm" in name:
            p.fill_(1.0)
        else:
            p.zero_()
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()
    return model


def replicate_drafter(drafter: DFlashDrafter, tp_target: nn.Module) -> DFlashDrafter:
    """A copy of ``drafter`` on top of the TP target: its own layers replicated on every rank,
    the embedding and LM head the target's vocabulary-parallel ones (shared, as in
    ``DFlashDrafter``). Sets ``tp_target.tap_layer_ids`` to the drafter's taps."""
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"drafter: expected a DFlashDrafter, got {type(drafter).__name__}")
    with torch.device("meta"):
        out = DFlashDrafter(drafter.config, tp_target)
    out = out.to(drafter.fc.weight.dtype).to_empty(device=drafter.device)
    out.load_state_dict(drafter.state_dict())
    _copy_nonpersistent_buffers(drafter, out)
    return out.eval()
