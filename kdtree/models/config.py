"""Model configs with Hugging Face field names, so ``config.json`` round-trips with transformers'
``LlamaConfig`` / ``Qwen3Config`` / ``DeepseekV3Config``; named configs via ``get_config``.

RoPE: ``rope_theta`` + ``rope_scaling`` (the legacy HF fields real checkpoints carry); a
transformers-5 ``rope_parameters`` dict is accepted on load and written back next to them.
Keys this module does not model are kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "CONFIG_NAMES",
    "DFlashConfig",
    "GQAConfig",
    "MLAConfig",
    "ModelConfig",
    "config_from_dict",
    "dflash_config_for",
    "get_config",
    "load_config",
    "target_layer_ids",
]

_HF_ONLY_KEYS = {  # written by transformers, meaningless here; dropped on load
    "transformers_version", "_name_or_path", "dtype", "torch_dtype", "output_attentions",
    "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder",
    "id2label", "label2id", "problem_type", "use_cache", "qk_head_dim", "rope_parameters",
}  # fmt: skip


def target_layer_ids(n_target_layers: int, n_taps: int) -> list[int]:
    """DFlash tap rule: one tap → ``L // 2``; else ``round(1 + i (L - 4) / (n - 1))``.
    Taps are layer *outputs* (HF ``hidden_states[l + 1]``)."""
    if n_target_layers < 1 or n_taps < 1:
        raise ValueError(
            f"n_target_layers={n_target_layers}, n_taps={n_taps}: expected positive counts"
        )
    if n_taps == 1:
        return [n_target_layers // 2]
    ids = [round(1 + i * (n_target_layers - 4) / (n_taps - 1)) for i in range(n_taps)]
    return [min(max(i, 0), n_target_layers - 1) for i in ids]


@dataclass
class ModelConfig:
    """Fields shared by every family; subclasses add their own."""

    model_type: ClassVar[str] = ""
    architecture: ClassVar[str] = ""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rope_scaling:  # normalise the legacy "type" key to "rope_type"
            scaling = {
                k: v for k, v in self.rope_scaling.items() if k not in ("type", "rope_theta")
            }
            scaling["rope_type"] = self.rope_scaling.get(
                "rope_type", self.rope_scaling.get("type")
            )
            self.rope_scaling = None if scaling["rope_type"] in (None, "default") else scaling
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r}: only 'silu' is implemented")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected a positive int")

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))

    def rope_parameters(self) -> dict:
        """transformers-5 style ``rope_parameters``."""
        params = {k: v for k, v in (self.rope_scaling or {}).items() if k != "type"}
        params["rope_type"] = self.rope_type
        params["rope_theta"] = self.rope_theta
        return params

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` content (HF names, ``model_type`` and ``architectures`` set)."""
        out: dict[str, Any] = {"model_type": self.model_type, "architectures": [self.architecture]}
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name] = copy.deepcopy(getattr(self, f.name))
        out["rope_parameters"] = self.rope_parameters()
        for k, v in self.extra.items():
            out.setdefault(k, copy.deepcopy(v))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        data.pop("model_type", None)
        data.pop("architectures", None)
        rope_params = data.get("rope_parameters")
        if isinstance(rope_params, dict):
            data.setdefault("rope_theta", rope_params.get("rope_theta", cls.rope_theta))
            if rope_params.get("rope_type", "default") != "default" and not data.get(
                "rope_scaling"
            ):
                data["rope_scaling"] = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = dict(data.get("extra") or {})
        extra.update({k: v for k, v in data.items() if k not in names and k not in _HF_ONLY_KEYS})
        extra.pop("extra", None)
        return cls(**known, extra=extra)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


@dataclass
class GQAConfig(ModelConfig):
    """Llama (``model_type="llama"``) or Qwen3 (``"qwen3"``: per-head q/k RMSNorm)."""

    model_type: ClassVar[str] = "llama"
    family: str = "llama"
    head_dim: int | None = None
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.family not in ("llama", "qwen3"):
            raise ValueError(f"family={self.family!r}: expected 'llama' or 'qwen3'")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.pop("family")
        out["model_type"] = self.family
        out["architectures"] = [
            "Qwen3ForCausalLM" if self.family == "qwen3" else "LlamaForCausalLM"
        ]
        return out


@dataclass
class MLAConfig(ModelConfig):
    """DeepSeek-V3 / Kimi-K2: MLA attention (optional q LoRA) with MoE (first layers dense)."""

    model_type: ClassVar[str] = "deepseek_v3"
    architecture: ClassVar[str] = "DeepseekV3ForCausalLM"
    num_key_value_heads: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    moe_intermediate_size: int = 32
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    first_k_dense_replace: int = 1
    rope_interleave: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.scoring_func != "sigmoid":
            raise ValueError(f"scoring_func={self.scoring_func!r}: only 'sigmoid' is implemented")
        if self.n_routed_experts % self.n_group:
            raise ValueError(
                f"n_routed_experts={self.n_routed_experts} not divisible by n_group={self.n_group}"
            )
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group={self.topk_group} > n_group={self.n_group}")
        per_group = self.n_routed_experts // self.n_group
        if self.num_experts_per_tok > self.topk_group * per_group:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds the "
                f"{self.topk_group * per_group} experts of the chosen groups"
            )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def head_dim(self) -> int:  # what HF's rotary embedding sees
        return self.qk_rope_head_dim


@dataclass
class DFlashConfig(ModelConfig):
    """DFlash block drafter: Qwen3-style layers at the target's width and head layout."""

    model_type: ClassVar[str] = "dflash"
    architecture: ClassVar[str] = "DFlashDraftModel"
    num_hidden_layers: int = 1
    head_dim: int | None = None
    block_size: int = 16
    mask_token_id: int = 0
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    num_target_layers: int = 6
    target: str = ""
    #: at inference the block attends to the last ``context_window`` context rows only (None:
    #: all). Set it to the context length the drafter was trained on: beyond it the drafter
    #: meets relative positions it never saw and its acceptance collapses.
    context_window: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.block_size < 2:
            raise ValueError(f"block_size={self.block_size}: expected >= 2")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids: expected at least one tap layer")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ValueError(
                f"target_layer_ids={self.target_layer_ids}: {bad} outside the target's "
                f"{self.num_target_layers} layers"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id={self.mask_token_id}: outside the vocabulary [0, {self.vocab_size})"
            )
        if self.context_window is not None and self.context_window < 1:
            raise ValueError(f"context_window={self.context_window}: expected >= 1 or None")

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)


def dflash_config_for(
    target: ModelConfig,
    *,
    num_layers: int = 1,
    n_taps: int = 3,
    block_size: int = 16,
    mask_token_id: int | None = None,
    target_name: str = "",
    intermediate_size: int | None = None,
) -> DFlashConfig:
    """A drafter config at ``target``'s width and head layout (GQA targets: same heads and
    head_dim; MLA targets: ``num_attention_heads`` heads of ``v_head_dim``). The mask token
    defaults to the last id of the vocabulary."""
    if isinstance(target, GQAConfig):
        heads, kv_heads, head_dim = (
            target.num_attention_heads,
            target.num_key_value_heads,
            target.head_dim,
        )
    else:
        heads = kv_heads = target.num_attention_heads
        head_dim = getattr(target, "v_head_dim", target.hidden_size // heads)
    return DFlashConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=intermediate_size or target.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=target.max_position_embeddings,
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta,
        rope_scaling=None if isinstance(target, MLAConfig) else target.rope_scaling,
        block_size=block_size,
        mask_token_id=target.vocab_size - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=target_layer_ids(target.num_hidden_layers, n_taps),
        num_target_layers=target.num_hidden_layers,
        target=target_name,
    )


# ----------------------------------------------------------------------------- named configs


def _tiny_llama() -> GQAConfig:
    return GQAConfig(
        family="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )


def _tiny_qwen3() -> GQAConfig:
    return GQAConfig(
        family="qwen3",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )


def _tiny_mla() -> MLAConfig:
    return MLAConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=6,
        num_attention_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
    )


def _tiny_dflash() -> DFlashConfig:
    return dflash_config_for(
        _tiny_llama(), num_layers=1, n_taps=3, block_size=16, target_name="tiny-llama"
    )


def _kimi_k2_tp8() -> MLAConfig:
    """One TP8 rank of a Kimi-K2-class model: 64 heads / 8 = 8 per rank, the rest at full size
    (expert width 2048 as published; how experts are split across ranks is the caller's choice).
    """
    return MLAConfig(
        vocab_size=163840,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=384,
        n_shared_experts=1,
        num_experts_per_tok=8,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.827,
        first_k_dense_replace=1,
        max_position_embeddings=131072,
        rope_theta=50000.0,
        rope_scaling={
            "type": "yarn",
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        bos_token_id=163584,
        eos_token_id=163585,
        extra={"tp_size": 8, "tp_rank_of": "kimi-k2 (64 heads)"},
    )


_NAMED = {
    "tiny-llama": _tiny_llama,
    "tiny-qwen3": _tiny_qwen3,
    "tiny-mla": _tiny_mla,
    "tiny-dflash": _tiny_dflash,
    "kimi-k2-tp8": _kimi_k2_tp8,
}
CONFIG_NAMES: tuple[str, ...] = tuple(_NAMED)


def get_config(name: str) -> ModelConfig:
    """A fresh config by name (see ``CONFIG_NAMES``)."""
    try:
        return _NAMED[name]()
    except KeyError:
        raise ValueError(f"unknown config {name!r}; known: {', '.join(CONFIG_NAMES)}") from None


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """Build the right config class from a ``config.json`` dict (by ``model_type``)."""
    model_type = data.get("model_type")
    if "DFlashDraftModel" in (data.get("architectures") or []) or model_type == "dflash":
        data = {**data, **(data.get("dflash_config") or {})}  # z-lab nests these two
        data.pop("dflash_config", None)
        return DFlashConfig.from_dict(data)
    if model_type in ("llama", "qwen3"):
        return GQAConfig.from_dict({**data, "family": model_type})
    if model_type in ("deepseek_v3", "kimi_k2"):
        return MLAConfig.from_dict(data)
    raise ValueError(
        f"model_type={model_type!r}: expected one of llama, qwen3, deepseek_v3, kimi_k2, dflash"
    )


def load_config(path: str | Path) -> ModelConfig:
    """Read a ``config.json`` (a file or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json there")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return config_from_dict(data)
