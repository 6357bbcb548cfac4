"""Tensor-parallel variants of the target models: the same module tree (and HF tensor names) as
``GQAForCausalLM`` / ``MLAMoEForCausalLM``, built from a *local* config, with the parallel
modules swapped in.

Split (as serving stacks do it):

* attention heads: GQA q/k/v heads split (k/v heads replicated when ``size > n_kv``), ``o_proj``
  row-parallel + all-reduce. MLA: q heads and ``kv_b_proj`` (``W_UK``/``W_UV``) split;
  ``q_a_proj``, ``kv_a_proj_with_mqa`` and their norms replicated, so every rank computes the same
  latent and holds the whole latent cache; ``o_proj`` row-parallel + all-reduce.
* dense MLP: ``gate``/``up`` column-parallel, ``down`` row-parallel + all-reduce.
* MoE: TP-style, not EP — the router is replicated (every rank picks the same experts), each
  routed and shared expert's intermediate dim is split; one all-reduce per MoE layer after the
  routed and shared partial sums are added.
* embedding and LM head vocabulary-parallel (see ``kdtree.tp.layers``).

The local config divides the head counts and intermediate sizes by the TP size and keeps
everything else (vocab, hidden, layers), so ``PagedKVCache.for_model(model.config)`` gives the
per-rank cache and ``model.config.vocab_size`` is still the whole vocabulary.
"""

from __future__ import annotations

import torch

from kdtree.models.config import GQAConfig, MLAConfig, ModelConfig
from kdtree.models.gqa import GQAForCausalLM
from kdtree.models.layers import MLP, ModelOutput, RotaryEmbedding, rope_inv_freq
from kdtree.models.mla_moe import MLAMoEForCausalLM, MoE
from kdtree.tp.dist import TPGroup
from kdtree.tp.layers import RowParallelLinear, VocabParallelEmbedding, VocabParallelLMHead

__all__ = [
    "TPGQAForCausalLM",
    "TPMLAMoEForCausalLM",
    "TPMoE",
    "kv_head_of_rank",
    "local_config",
    "reset_rotary",
    "tp_model_class",
]


def _split(name: str, value: int, size: int) -> int:
    if value % size:
        raise ValueError(f"{name}={value} is not divisible by the tensor-parallel size {size}")
    return value // size


def kv_head_of_rank(n_heads: int, n_kv: int, rank: int, size: int) -> tuple[int, int]:
    """The GQA key/value heads ``[first, first + count)`` rank ``rank`` holds. ``n_kv >= size``:
    an even split; ``n_kv < size``: one head, replicated over ``size / n_kv`` ranks."""
    _split("num_attention_heads", n_heads, size)
    if n_kv % size == 0:
        per = n_kv // size
        return rank * per, per
    if size % n_kv:
        raise ValueError(
            f"num_key_value_heads={n_kv} and tensor-parallel size {size}: expected one to divide "
            "the other"
        )
    return rank // (size // n_kv), 1


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The per-rank config: head counts and intermediate sizes divided by ``size``."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r}: expected a positive int")
    if isinstance(config, GQAConfig):
        n_kv = config.num_key_value_heads
        _, kv_local = kv_head_of_rank(config.num_attention_heads, n_kv, 0, size)
        return config.replace(
            num_attention_heads=_split("num_attention_heads", config.num_attention_heads, size),
            num_key_value_heads=kv_local,
            head_dim=config.head_dim,
            intermediate_size=_split("intermediate_size", config.intermediate_size, size),
        )
    if isinstance(config, MLAConfig):
        heads = _split("num_attention_heads", config.num_attention_heads, size)
        return config.replace(
            num_attention_heads=heads,
            num_key_value_heads=heads,
            intermediate_size=_split("intermediate_size", config.intermediate_size, size),
            moe_intermediate_size=_split(
                "moe_intermediate_size", config.moe_intermediate_size, size
            ),
        )
    raise TypeError(f"config: expected a GQAConfig or MLAConfig, got {type(config).__name__}")


def reset_rotary(module: torch.nn.Module, config: ModelConfig) -> None:
    """Recompute every RoPE table of ``module`` from ``config`` (the tables are non-persistent
    buffers, so ``to_empty`` from the meta device leaves them uninitialised)."""
    for mod in module.modules():
        if isinstance(mod, RotaryEmbedding):
            dim = 2 * mod.inv_freq.numel()
            inv, scale = rope_inv_freq(
                dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
            )
            mod.inv_freq = inv.to(mod.inv_freq.device)
            mod.attention_scaling = scale


class TPMoE(MoE):
    """``MoE`` whose experts hold a slice of each expert's intermediate dim; the routed and
    shared partial outputs are summed locally, then all-reduced once."""

    def __init__(self, config: MLAConfig, tp: TPGroup) -> None:
        super().__init__(config)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))


class _TPCausalLM:
    """Mixin: TP wiring shared by both families (first base, before the model class)."""

    tp: TPGroup
    full_config: ModelConfig

    def _parallelize(self, full: ModelConfig, tp: TPGroup) -> None:
        self.tp, self.full_config = tp, full
        d, vocab = full.hidden_size, full.vocab_size
        self.model.embed_tokens = VocabParallelEmbedding(vocab, d, tp)
        self.lm_head = VocabParallelLMHead(vocab, d, tp)
        if full.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for layer in self.model.layers:
            attn = layer.self_attn
            attn.o_proj = RowParallelLinear.like(attn.o_proj, tp)
            if isinstance(layer.mlp, MoE):
                layer.mlp = TPMoE(self.config, tp)
            elif isinstance(layer.mlp, MLP):
                layer.mlp.down_proj = RowParallelLinear.like(layer.mlp.down_proj, tp)
            else:  # pragma: no cover - the model families have no other feed-forward
                raise TypeError(f"unexpected feed-forward {type(layer.mlp).__name__}")

    @property
    def vocab_shard(self):
        """This rank's :class:`~kdtree.tp.layers.VocabShard` of the LM head."""
        return self.lm_head.shard

    def forward(self, input_ids, positions, cache, attn, return_taps=False, gather_logits=True):
        """The cached forward of the wrapped family. ``gather_logits=False``: ``logits`` are
        this rank's vocabulary shard ``[B, T, per]`` (padding ``-inf``), not all-gathered."""
        self.lm_head.gather = gather_logits
        try:
            return super().forward(input_ids, positions, cache, attn, return_taps)
        finally:
            self.lm_head.gather = True

    def forward_dense(
        self, input_ids, positions=None, return_taps=False, gather_logits=True
    ) -> ModelOutput:
        self.lm_head.gather = gather_logits
        try:
            return super().forward_dense(input_ids, positions, return_taps)
        finally:
            self.lm_head.gather = True


class TPGQAForCausalLM(_TPCausalLM, GQAForCausalLM):
    """Llama / Qwen3 with heads, MLP and vocabulary split over ``tp``. Build it with
    :func:`kdtree.tp.shard_model` (from a loaded model) or :func:`kdtree.tp.build_tp_model`."""

    def __init__(self, config: GQAConfig, tp: TPGroup) -> None:
        GQAForCausalLM.__init__(self, local_config(config, tp.size))
        self._parallelize(config, tp)


class TPMLAMoEForCausalLM(_TPCausalLM, MLAMoEForCausalLM):
    """DeepSeek-V3 / Kimi-K2 with heads, experts and vocabulary split over ``tp`` (latent cache
    replicated)."""

    def __init__(self, config: MLAConfig, tp: TPGroup) -> None:
        MLAMoEForCausalLM.__init__(self, local_config(config, tp.size))
        self._parallelize(config, tp)


def tp_model_class(config: ModelConfig) -> type:
    if isinstance(config, GQAConfig):
        return TPGQAForCausalLM
    if isinstance(config, MLAConfig):
        return TPMLAMoEForCausalLM
    raise TypeError(f"config: expected a GQAConfig or MLAConfig, got {type(config).__name__}")
