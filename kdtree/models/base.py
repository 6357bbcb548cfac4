"""What every target model shares: the decoder-stack loop, taps, logits, the cached and the
dense (no cache) forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kdtree.attention import AttnMetadata, check_prefix_capacity
from kdtree.cache import PagedKVCache
from kdtree.models.config import ModelConfig, target_layer_ids
from kdtree.models.layers import ModelOutput, RMSNorm

__all__ = ["Backbone", "CausalLM", "StepContext"]


@dataclass
class StepContext:
    """Per-forward attention context handed to every layer. ``cache is None``: dense causal
    forward over ``input_ids`` alone. ``max_prefix``: host copy of ``max(prefix_lens)`` (prefill
    only). ``keep``: padding mask of the slot mapping (``None``: no padding)."""

    cache: PagedKVCache | None = None
    attn: AttnMetadata | None = None
    max_prefix: int = 0
    keep: torch.Tensor | None = None  # cache.check_slots result, validated once per forward


class Backbone(nn.Module):
    """``embed_tokens``, ``layers``, ``norm``: the HF ``model.`` prefix."""

    def __init__(self, config: ModelConfig, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Base for ``GQAForCausalLM`` and ``MLAMoEForCausalLM``. Subclasses build ``self.model``
    (a ``Backbone``) and ``self.rotary`` and implement nothing else."""

    config: ModelConfig
    model: Backbone
    rotary: nn.Module

    def _finish_init(self, config: ModelConfig) -> None:
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.tap_layer_ids: list[int] = target_layer_ids(config.num_hidden_layers, 3)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, initializer_range) for matrices and embeddings, ones for norms."""
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std, generator=generator)
            elif name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            else:
                p.zero_()

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    def _check_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor | None) -> None:
        if input_ids.dtype != torch.int64 or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids: expected int64 [B, T], got {input_ids.dtype} {tuple(input_ids.shape)}"
            )
        if positions is not None and (
            positions.dtype != torch.int64 or positions.shape != input_ids.shape
        ):
            raise ValueError(
                f"positions: expected int64 {tuple(input_ids.shape)}, got {positions.dtype} "
                f"{tuple(positions.shape)}"
            )
        if input_ids.device != self.device:
            raise ValueError(f"input_ids: on {input_ids.device}, model on {self.device}")

    def _run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: StepContext, return_taps: bool
    ) -> ModelOutput:
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, h.dtype)
        taps: dict[int, torch.Tensor] = {}
        want = set(self.tap_layer_ids) if return_taps else set()
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, ctx, i)
            if i in want:
                taps[i] = h
        logits = self.lm_head(self.model.norm(h)).float()
        tap = torch.cat([taps[i] for i in self.tap_layer_ids], dim=-1) if return_taps else None
        return ModelOutput(logits=logits, taps=tap)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        attn: AttnMetadata,
        return_taps: bool = False,
    ) -> ModelOutput:
        """Cached forward: writes the new K/V at ``attn.slot_mapping`` in every layer, then
        attends (``prefill``: causal over the prefix; ``tree``: prefix + tree bitmask)."""
        self._check_inputs(input_ids, positions)
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")
        if cache.num_layers != self.num_layers:
            raise ValueError(f"cache: {cache.num_layers} layers, the model has {self.num_layers}")
        if attn.slot_mapping.shape != input_ids.shape:
            raise ValueError(
                f"attn.slot_mapping: expected {tuple(input_ids.shape)}, got "
                f"{tuple(attn.slot_mapping.shape)}"
            )
        max_prefix = 0
        if attn.mode == "prefill" and attn.prefix_lens.numel():
            max_prefix = int(attn.prefix_lens.max())
        else:  # tree: one capacity check here instead of one per layer
            capacity = attn.page_table.shape[1] * cache.page_size
            check_prefix_capacity(attn.prefix_lens, input_ids.shape[1], capacity)
        keep = cache.check_slots(attn.slot_mapping)
        ctx = StepContext(cache, attn, max_prefix, keep)
        return self._run(input_ids, positions, ctx, return_taps)

    def forward_dense(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        return_taps: bool = False,
    ) -> ModelOutput:
        """Plain causal forward without a cache (parity tests, training)."""
        self._check_inputs(input_ids, positions)
        if positions is None:
            b, t = input_ids.shape
            positions = torch.arange(t, device=input_ids.device).expand(b, t)
        return self._run(input_ids, positions, StepContext(), return_taps)
