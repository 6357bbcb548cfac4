"""DeepSeek-V3 / Kimi-K2 style decoder: MLA attention and a DeepSeek-routed MoE feed-forward.

Decode and verify run the *absorbed* MLA: ``q_nope`` goes through ``W_UK`` into the latent space,
the cache holds ``[c_kv (normed) ; k_pe (roped)]`` per token, and the latent output goes through
``W_UV``. Prefill (and the dense forward) run the plain form — the same latent goes into the
cache either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdtree.attention import causal_attention, gather_batch, tree_attention_mla
from kdtree.models.base import Backbone, CausalLM, StepContext
from kdtree.models.config import MLAConfig
from kdtree.models.layers import (
    MLP,
    RMSNorm,
    RotaryEmbedding,
    _yarn_mscale,
    apply_rope,
    apply_rope_interleave,
)

__all__ = ["MLAAttention", "MLAMoEForCausalLM", "MoE", "Router"]


class MLAAttention(nn.Module):
    def __init__(self, config: MLAConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.h = config.num_attention_heads
        self.nope, self.rope, self.vdim = (
            config.qk_nope_head_dim,
            config.qk_rope_head_dim,
            config.v_head_dim,
        )
        self.rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        qk = self.nope + self.rope
        bias = config.attention_bias
        if self.q_lora_rank:
            self.q_a_proj = nn.Linear(d, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank)
            self.q_b_proj = nn.Linear(self.q_lora_rank, self.h * qk, bias=False)
        else:
            self.q_proj = nn.Linear(d, self.h * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank)
        self.kv_b_proj = nn.Linear(self.rank, self.h * (self.nope + self.vdim), bias=False)
        self.o_proj = nn.Linear(self.h * self.vdim, d, bias=bias)
        self.rope_fn = apply_rope_interleave if config.rope_interleave else apply_rope
        scale = qk**-0.5
        rs = config.rope_scaling or {}
        if config.rope_type != "default" and rs.get("mscale_all_dim"):
            m = _yarn_mscale(rs["factor"], rs["mscale_all_dim"])
            scale = scale * m * m
        self.sm_scale = scale

    def _q(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank:
            return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return self.q_proj(x)

    def latent(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q_nope [B,T,H,nope]``, roped ``q_pe [B,T,H,rope]``, normed ``c_kv [B,T,R]`` and
        roped ``k_pe [B,T,rope]``."""
        b, t, _ = x.shape
        q = self._q(x).view(b, t, self.h, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        q_pe = self.rope_fn(q_pe, cos, sin)
        k_pe = self.rope_fn(k_pe[:, :, None], cos, sin)[:, :, 0]
        return q_nope, q_pe, c_kv, k_pe

    def _expand(self, c_kv: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain form: per-head keys ``[B,S,H,nope+rope]`` and values ``[B,S,H,v]``."""
        b, s, _ = c_kv.shape
        kv = self.kv_b_proj(c_kv).view(b, s, self.h, self.nope + self.vdim)
        k_nope, v = kv.split([self.nope, self.vdim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, :, None].expand(b, s, self.h, self.rope)], dim=-1)
        return k, v

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK [H, nope, R]`` and ``W_UV [H, v, R]`` (views of ``kv_b_proj``)."""
        w = self.kv_b_proj.weight.view(self.h, self.nope + self.vdim, self.rank)
        return w[:, : self.nope], w[:, self.nope :]

    def forward(self, x, cos, sin, ctx: StepContext, layer_idx: int) -> torch.Tensor:
        b, t, _ = x.shape
        q_nope, q_pe, c_kv, k_pe = self.latent(x, cos, sin)
        if ctx.cache is None or ctx.attn.mode == "prefill":
            if ctx.cache is not None:
                ctx.cache.write_latent(layer_idx, ctx.attn.slot_mapping, c_kv, k_pe, keep=ctx.keep)
            q = torch.cat([q_nope, q_pe], dim=-1)
            if ctx.cache is None or ctx.max_prefix == 0:
                k, v = self._expand(c_kv, k_pe)
                out = causal_attention(q, k, v, sm_scale=self.sm_scale)
            else:
                attn = ctx.attn
                lat = gather_batch(
                    ctx.cache.kv[layer_idx],
                    attn.page_table,
                    ctx.max_prefix + t,
                    attn.prefix_lens + t,
                )
                lat = lat.to(q.dtype)
                k, v = self._expand(lat[..., : self.rank], lat[..., self.rank :])
                out = causal_attention(
                    q, k, v, sm_scale=self.sm_scale, q_offset=attn.prefix_lens,
                    kv_lens=attn.prefix_lens + t,
                )  # fmt: skip
            return self.o_proj(out.reshape(b, t, -1))
        attn = ctx.attn
        ctx.cache.write_latent(layer_idx, attn.slot_mapping, c_kv, k_pe, keep=ctx.keep)
        w_uk, w_uv = self.absorbed_weights()
        q_abs = torch.einsum("bthn,hnr->bthr", q_nope, w_uk)
        out_lat = tree_attention_mla(
            q_abs,
            q_pe.contiguous(),
            ctx.cache.kv[layer_idx],
            attn.page_table,
            attn.prefix_lens,
            attn.tree_mask,
            sm_scale=self.sm_scale,
            backend=attn.backend,
            dense_mask=attn.dense_mask,
            validate=False,  # checked once per forward
        )
        out = torch.einsum("bthr,hvr->bthv", out_lat, w_uv)
        return self.o_proj(out.reshape(b, t, -1))


class Router(nn.Module):
    """DeepSeek-V3 routing: sigmoid scores; ``e_score_correction_bias`` only for choosing;
    top-``topk_group`` groups by the sum of their two best scores; top-k inside them; weights
    from the unbiased scores, normalised (``norm_topk_prob``) and scaled."""

    def __init__(self, config: MLAConfig) -> None:
        super().__init__()
        self.n_experts = config.n_routed_experts
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scale = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(self.n_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.n_experts))

    def _apply(self, fn, recurse: bool = True):
        """Dtype casts (``model.to(bf16)``) leave the router in fp32, as transformers keeps it:
        a bf16 correction bias would change which experts win."""
        super()._apply(fn, recurse)
        self.weight.data = self.weight.data.float()
        self.e_score_correction_bias.data = self.e_score_correction_bias.data.float()
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N, d]`` → ``(topk_idx int64 [N, k], topk_weight fp32 [N, k])``."""
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        n = x.shape[0]
        per_group = self.n_experts // self.n_group
        if self.n_group > 1:
            group_scores = choice.view(n, self.n_group, per_group).topk(2, dim=-1)[0].sum(-1)
            group_idx = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
            keep = group_mask[:, :, None].expand(n, self.n_group, per_group).reshape(n, -1)
            choice = choice.masked_fill(keep == 0, float("-inf"))
        idx = choice.topk(self.top_k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scale


class Experts(nn.Module):
    """Routed experts as stacked weights ``gate_proj/up_proj [E, I, d]``, ``down_proj [E, d, I]``
    (checkpoints use HF's per-expert names; see ``checkpoint.py``)."""

    def __init__(self, n: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(n, inter, hidden))
        self.up_proj = nn.Parameter(torch.empty(n, inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(n, hidden, inter))

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(F.linear(x, self.gate_proj[e])) * F.linear(x, self.up_proj[e])
        return F.linear(h, self.down_proj[e])

    def forward(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Run only the experts that got tokens; ``x [N, d]``, ``idx, w [N, k]``. Inside a CUDA
        graph capture (no host sync allowed) every expert runs on every token instead, weighted
        by its routing weight (zero when not chosen): same result, capturable."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return self._forward_all(x, idx, w)
        k = idx.shape[1]
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.gate_proj.shape[0]).tolist()
        out = torch.zeros_like(x)
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            sel = order[start : start + c]
            start += c
            tok = sel // k
            ye = self._expert(e, x[tok])
            out.index_add_(0, tok, (ye * w.reshape(-1)[sel, None]).to(out.dtype))
        return out

    def _forward_all(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n_exp = self.gate_proj.shape[0]
        dense_w = torch.zeros(x.shape[0], n_exp, dtype=w.dtype, device=x.device)
        dense_w.scatter_add_(1, idx, w)
        out = torch.zeros_like(x)
        for e in range(n_exp):
            out += (self._expert(e, x) * dense_w[:, e : e + 1]).to(out.dtype)
        return out


class MoE(nn.Module):
    """Shared experts plus routed experts; keeps the last routing (``last_topk_idx``)."""

    def __init__(self, config: MLAConfig) -> None:
        super().__init__()
        self.gate = Router(config)
        self.experts = Experts(
            config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        )
        self.shared_experts = (
            MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
            if config.n_shared_experts
            else None
        )
        self.last_topk_idx: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, w = self.gate(flat)
        self.last_topk_idx = idx.detach().view(*shape[:-1], -1)
        out = self.experts(flat, idx, w).view(shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class MLADecoderLayer(nn.Module):
    def __init__(self, config: MLAConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = MLAAttention(config)
        if layer_idx >= config.first_k_dense_replace:
            self.mlp = MoE(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, cos, sin, ctx: StepContext, layer_idx: int) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx, layer_idx)
        return h + self.mlp(self.post_attention_layernorm(h))


class MLAMoEForCausalLM(CausalLM):
    """DeepSeek-V3 / Kimi-K2 causal LM (MLA + MoE) with HF tensor names."""

    def __init__(self, config: MLAConfig) -> None:
        super().__init__()
        if not isinstance(config, MLAConfig):
            raise TypeError(f"config: expected an MLAConfig, got {type(config).__name__}")
        self.config = config
        self.model = Backbone(
            config, [MLADecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.rotary = RotaryEmbedding(
            config.qk_rope_head_dim,
            config.rope_theta,
            config.rope_scaling,
            config.max_position_embeddings,
        )
        self._finish_init(config)

    @property
    def last_routing(self) -> dict[int, torch.Tensor]:
        """Expert ids chosen in the last forward: ``{layer: int64 [B, T, top_k]}`` (MoE layers)."""
        return {
            i: layer.mlp.last_topk_idx
            for i, layer in enumerate(self.model.layers)
            if isinstance(layer.mlp, MoE) and layer.mlp.last_topk_idx is not None
        }
