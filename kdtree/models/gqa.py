"""Llama / Qwen3 style GQA decoder (Qwen3: per-head q/k RMSNorm before RoPE)."""

from __future__ import annotations

import torch
from torch import nn

from kdtree.attention import causal_attention, gather_batch, tree_attention
from kdtree.models.base import Backbone, CausalLM, StepContext
from kdtree.models.config import GQAConfig
from kdtree.models.layers import MLP, RMSNorm, RotaryEmbedding, apply_rope

__all__ = ["GQAAttention", "GQAForCausalLM", "attend_paged"]


def attend_paged(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: StepContext,
    layer_idx: int,
    sm_scale: float,
) -> torch.Tensor:
    """Write ``k, v`` of the new tokens into the paged cache, then attend ``q`` (prefill: causal
    over prefix + new tokens; tree: through ``tree_attention``)."""
    cache, attn = ctx.cache, ctx.attn
    cache.write(layer_idx, attn.slot_mapping, k, v, keep=ctx.keep)
    if attn.mode == "tree":
        return tree_attention(
            q,
            cache.k[layer_idx],
            cache.v[layer_idx],
            attn.page_table,
            attn.prefix_lens,
            attn.tree_mask,
            sm_scale=sm_scale,
            backend=attn.backend,
            dense_mask=attn.dense_mask,
            validate=False,  # checked once per forward
        )
    if ctx.max_prefix == 0:
        return causal_attention(q, k.to(q.dtype), v.to(q.dtype), sm_scale=sm_scale)
    n = ctx.max_prefix + q.shape[1]
    lens = attn.prefix_lens + q.shape[1]
    keys = gather_batch(cache.k[layer_idx], attn.page_table, n, lens).to(q.dtype)
    vals = gather_batch(cache.v[layer_idx], attn.page_table, n, lens).to(q.dtype)
    return causal_attention(
        q,
        keys,
        vals,
        sm_scale=sm_scale,
        q_offset=attn.prefix_lens,
        kv_lens=attn.prefix_lens + q.shape[1],
    )


class GQAAttention(nn.Module):
    def __init__(self, config: GQAConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            hd,
        )
        bias = config.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.sm_scale = hd**-0.5

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Roped ``q [B, T, Hq, D]``, ``k [B, T, Hkv, D]`` and ``v``."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx: StepContext, layer_idx: int) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        if ctx.cache is None:
            out = causal_attention(q, k, v, sm_scale=self.sm_scale)
        else:
            out = attend_paged(q, k, v, ctx, layer_idx, self.sm_scale)
        return self.o_proj(out.reshape(*x.shape[:2], -1))


class GQADecoderLayer(nn.Module):
    def __init__(self, config: GQAConfig) -> None:
        super().__init__()
        self.self_attn = GQAAttention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, cos, sin, ctx: StepContext, layer_idx: int) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx, layer_idx)
        return h + self.mlp(self.post_attention_layernorm(h))


class GQAForCausalLM(CausalLM):
    """Llama / Qwen3 causal LM with HF tensor names (``model.layers.{i}.self_attn.q_proj`` ...)."""

    def __init__(self, config: GQAConfig) -> None:
        super().__init__()
        if not isinstance(config, GQAConfig):
            raise TypeError(f"config: expected a GQAConfig, got {type(config).__name__}")
        self.config = config
        self.model = Backbone(
            config, [GQADecoderLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        self._finish_init(config)
