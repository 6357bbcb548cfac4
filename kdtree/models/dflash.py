"""DFlash block drafter (``research/ddtree_spec.md`` §1.1-1.3).

Qwen3-style layers at the target's width. Tapped target hidden states are fused once per
committed token, ``H_ctx = hidden_norm(fc(concat(taps)))``, and injected as keys/values into
*every* layer (the layer's own ``k_proj`` + ``k_norm`` + RoPE at absolute positions, and
``v_proj``). The block ``[bonus, MASK x (bs - 1)]`` attends non-causally to the context and to
itself; rows ``1 .. bs - 1`` give the next ``bs - 1`` distributions. Embedding and LM head are
the target's own modules (shared, not copied; not part of the drafter's parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kdtree.models.config import DFlashConfig
from kdtree.models.layers import MLP, RMSNorm, RotaryEmbedding, apply_rope

__all__ = ["DFlashContext", "DFlashDrafter", "DFlashTrainOutput"]


@dataclass
class DFlashContext:
    """Per-request context K/V of every drafter layer: ``k[i], v[i]`` are
    ``[B, max_len + 1, Hkv, D]`` (the last row is a write sink for padding), ``lengths`` is
    ``int64 [B]`` (context tokens held per request)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    lengths: torch.Tensor
    max_len: int

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def reset(self, rows: list[int] | None = None) -> None:
        """Forget the context of ``rows`` (all when ``None``)."""
        if rows is None:
            self.lengths.zero_()
        else:
            self.lengths[torch.tensor(rows, device=self.lengths.device)] = 0


@dataclass
class DFlashTrainOutput:
    """``logits [B, N, bs, V]`` fp32 (``None`` when only hidden states were asked for) and
    ``hidden [B, N, bs, d]`` (after the final norm)."""

    logits: torch.Tensor | None
    hidden: torch.Tensor


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.h, self.hkv, self.hd = config.num_attention_heads, config.num_key_value_heads, hd
        bias = config.attention_bias
        self.q_proj = nn.Linear(d, self.h * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.hkv * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.hkv * hd, bias=bias)
        self.o_proj = nn.Linear(self.h * hd, d, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.sm_scale = hd**-0.5

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Roped, normed keys and values ``[B, S, Hkv, D]`` of ``x [B, S, d]``."""
        b, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, s, self.hkv, self.hd))
        v = self.v_proj(x).view(b, s, self.hkv, self.hd)
        return apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """Block queries over ``[context ; block]`` keys; ``mask`` bool ``[B, 1, T, S + T]``."""
        b, t, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(b, t, self.h, self.hd)), cos, sin)
        k, v = self.kv(x, cos, sin)
        keys = torch.cat([ctx_k, k], dim=1).transpose(1, 2)
        vals = torch.cat([ctx_v, v], dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys.to(q.dtype),
            vals.to(q.dtype),
            attn_mask=mask,
            scale=self.sm_scale,
            enable_gqa=self.h != self.hkv,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """DFlash drafter on top of ``target`` (whose ``tap_layer_ids`` it sets to its own taps)."""

    def __init__(self, config: DFlashConfig, target: nn.Module) -> None:
        super().__init__()
        if not isinstance(config, DFlashConfig):
            raise TypeError(f"config: expected a DFlashConfig, got {type(config).__name__}")
        tcfg = target.config
        if tcfg.hidden_size != config.hidden_size or tcfg.vocab_size != config.vocab_size:
            raise ValueError(
                f"target: hidden {tcfg.hidden_size} / vocab {tcfg.vocab_size} differ from the "
                f"drafter's {config.hidden_size} / {config.vocab_size}"
            )
        if tcfg.num_hidden_layers != config.num_target_layers:
            raise ValueError(
                f"target: {tcfg.num_hidden_layers} layers, the drafter was built for "
                f"{config.num_target_layers}"
            )
        self.config = config
        self._target = [target]  # a list keeps the target out of this module's parameters
        target.tap_layer_ids = list(config.target_layer_ids)
        d = config.hidden_size
        self.fc = nn.Linear(config.n_taps * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings
        )
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std, generator=generator)
            elif name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.zero_()

    # ------------------------------------------------------------------ shared target parts

    @property
    def target(self) -> nn.Module:
        return self._target[0]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.target.embed_tokens

    @property
    def lm_head(self) -> nn.Linear:
        return self.target.lm_head

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def context_features(self, taps: torch.Tensor) -> torch.Tensor:
        """``H_ctx = hidden_norm(fc(taps))``: ``[..., n_taps * d]`` → ``[..., d]``."""
        want = self.fc.in_features
        if taps.shape[-1] != want:
            raise ValueError(f"taps: expected last dim n_taps * d = {want}, got {taps.shape[-1]}")
        return self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))

    # ------------------------------------------------------------------ inference

    def new_context(
        self,
        batch: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DFlashContext:
        """Empty per-request context K/V for ``batch`` requests of up to ``max_len`` tokens."""
        if batch < 1 or max_len < 1:
            raise ValueError(f"batch={batch}, max_len={max_len}: expected positive sizes")
        device = torch.device(device) if device is not None else self.device
        dtype = dtype or self.fc.weight.dtype
        c = self.config
        shape = (batch, max_len + 1, c.num_key_value_heads, c.head_dim)
        return DFlashContext(
            k=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers],
            v=[torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers],
            lengths=torch.zeros(batch, dtype=torch.int64, device=device),
            max_len=max_len,
        )

    @torch.no_grad()
    def append_context(
        self,
        ctx: DFlashContext,
        taps_new: torch.Tensor,
        positions_new: torch.Tensor,
        lengths_new: torch.Tensor | None = None,
    ) -> None:
        """Project ``taps_new [B, n, n_taps * d]`` (at ``positions_new [B, n]``) into every
        layer's context K/V and append the first ``lengths_new[b]`` rows of each request."""
        b, n = positions_new.shape
        if taps_new.dim() != 3 or taps_new.shape[:2] != (b, n) or b != ctx.batch:
            raise ValueError(
                f"taps_new: expected [{ctx.batch}, n, n_taps*d] matching positions_new "
                f"{tuple(positions_new.shape)}, got {tuple(taps_new.shape)}"
            )
        if positions_new.dtype != torch.int64:
            raise TypeError(f"positions_new: expected int64, got {positions_new.dtype}")
        dev = ctx.lengths.device
        if lengths_new is None:
            lengths_new = torch.full((b,), n, dtype=torch.int64, device=dev)
        lengths_new = lengths_new.to(dev, torch.int64)
        if tuple(lengths_new.shape) != (b,):
            raise ValueError(f"lengths_new: expected [{b}], got {tuple(lengths_new.shape)}")
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if not capturing:
            if bool(((lengths_new < 0) | (lengths_new > n)).any()):
                raise ValueError(f"lengths_new: expected values in [0, {n}]")
            over = int((ctx.lengths + lengths_new).max())
            if over > ctx.max_len:
                raise ValueError(
                    f"drafter context overflow: {over} tokens > max_len={ctx.max_len}"
                )
        h_ctx = self.context_features(taps_new)
        cos, sin = self.rotary(positions_new, h_ctx.dtype)
        step = torch.arange(n, device=dev)
        dest = ctx.lengths[:, None] + step[None]  # [B, n]
        dest = torch.where(step[None] < lengths_new[:, None], dest, ctx.max_len)  # sink row
        rows = torch.arange(b, device=dev)[:, None].expand(b, n)
        for layer, kbuf, vbuf in zip(self.layers, ctx.k, ctx.v, strict=True):
            k, v = layer.self_attn.kv(h_ctx, cos, sin)
            kbuf[rows, dest] = k.to(kbuf.dtype)
            vbuf[rows, dest] = v.to(vbuf.dtype)
        ctx.lengths += lengths_new

    def forward_block(
        self, ctx: DFlashContext, block_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states ``[B, bs, d]`` (after the final norm) of a block over the context."""
        b, t = block_ids.shape
        h = self.embed_tokens(block_ids).to(self.fc.weight.dtype)
        cos, sin = self.rotary(positions, h.dtype)
        window = self.config.context_window
        if window is not None and window < ctx.max_len + 1:
            # only the last ``window`` rows: gather them (a fixed [B, window] index, so a CUDA
            # graph stays valid) instead of masking the whole buffer, which made every draft
            # cost O(max_len) (4 ms a step at 64k on the H200)
            idx = ctx.lengths[:, None] - window + torch.arange(window, device=h.device)
            visible = idx >= 0  # rows before the request's first token
            rows = idx.clamp(min=0)[:, :, None, None].expand(b, window, *ctx.k[0].shape[2:])
            ctx_k = [kbuf.gather(1, rows) for kbuf in ctx.k]
            ctx_v = [vbuf.gather(1, rows) for vbuf in ctx.v]
        else:
            key = torch.arange(ctx.max_len + 1, device=h.device)
            visible = key[None] < ctx.lengths[:, None]
            ctx_k, ctx_v = ctx.k, ctx.v
        n_ctx = visible.shape[1]
        ctx_visible = visible[:, None, None, :]  # [B, 1, 1, n_ctx]
        mask = torch.cat(
            [
                ctx_visible.expand(b, 1, t, n_ctx),
                torch.ones(b, 1, t, t, dtype=torch.bool, device=h.device),
            ],
            dim=-1,
        )
        for layer, kbuf, vbuf in zip(self.layers, ctx_k, ctx_v, strict=True):
            h = layer(h, cos, sin, kbuf, vbuf, mask)
        return self.norm(h)

    def draft(
        self,
        ctx: DFlashContext,
        bonus: torch.Tensor,
        start_positions: torch.Tensor,
        block_size: int | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, bs - 1, V]`` fp32 for positions ``start + 1 .. start + bs - 1``, from the
        block ``[bonus, MASK x (bs - 1)]`` at positions ``start .. start + bs - 1``."""
        bs = block_size or self.config.block_size
        b = ctx.batch
        if bonus.shape != (b,) or start_positions.shape != (b,):
            raise ValueError(
                f"bonus, start_positions: expected [{b}] each, got {tuple(bonus.shape)}, "
                f"{tuple(start_positions.shape)}"
            )
        dev = ctx.lengths.device
        block = torch.full((b, bs), self.config.mask_token_id, dtype=torch.int64, device=dev)
        block[:, 0] = bonus.to(dev, torch.int64)
        positions = start_positions.to(dev, torch.int64)[:, None] + torch.arange(bs, device=dev)
        hidden = self.forward_block(ctx, block, positions)
        return self.lm_head(hidden[:, 1:]).float()

    # ------------------------------------------------------------------ training

    def forward_train(
        self,
        taps: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
        anchor_valid: torch.Tensor | None = None,
        return_logits: bool = True,
    ) -> DFlashTrainOutput:
        """Packed training forward (§1.3). ``taps [B, S, n_taps * d]`` of the clean sequence,
        ``input_ids [B, S]``, ``anchors int64 [B, N]``. Block ``n`` = ``[x_{a_n}, MASK ...]`` at
        positions ``a_n + j``; it sees context keys ``i < a_n`` and its own block, both ways.
        Invalid blocks (``anchor_valid`` False) see only their own block: give them weight 0.
        Label of ``(n, j)`` is ``x_{a_n + j}`` for ``j >= 1`` (the caller builds the loss)."""
        b, s = input_ids.shape
        if taps.shape[:2] != (b, s):
            raise ValueError(f"taps: expected [{b}, {s}, n_taps*d], got {tuple(taps.shape)}")
        if anchors.dtype != torch.int64 or anchors.dim() != 2 or anchors.shape[0] != b:
            raise ValueError(
                f"anchors: expected int64 [{b}, N], got {anchors.dtype} {tuple(anchors.shape)}"
            )
        n_blk, bs = anchors.shape[1], self.config.block_size
        dev = input_ids.device
        if anchor_valid is None:
            anchor_valid = torch.ones_like(anchors, dtype=torch.bool)
        anchors_c = anchors.clamp(0, s - 1)
        h_ctx = self.context_features(taps)  # [B, S, d]
        ctx_pos = torch.arange(s, device=dev).expand(b, s)
        cos_c, sin_c = self.rotary(ctx_pos, h_ctx.dtype)

        block = torch.full(
            (b, n_blk, bs), self.config.mask_token_id, dtype=torch.int64, device=dev
        )
        block[:, :, 0] = input_ids.gather(1, anchors_c)
        pos = (anchors_c[:, :, None] + torch.arange(bs, device=dev)).reshape(b, n_blk * bs)
        h = self.embed_tokens(block.reshape(b, n_blk * bs)).to(h_ctx.dtype)
        cos, sin = self.rotary(pos, h.dtype)

        blk_of = torch.arange(n_blk, device=dev).repeat_interleave(bs)  # [N*bs]
        a_q = anchors_c.repeat_interleave(bs, dim=1)  # [B, N*bs]
        v_q = anchor_valid.repeat_interleave(bs, dim=1)
        ctx_mask = (torch.arange(s, device=dev)[None, None] < a_q[:, :, None]) & v_q[:, :, None]
        blk_mask = (blk_of[:, None] == blk_of[None, :]).expand(b, -1, -1)
        mask = torch.cat([ctx_mask, blk_mask], dim=-1)[:, None]  # [B, 1, N*bs, S + N*bs]

        for layer in self.layers:
            ctx_k, ctx_v = layer.self_attn.kv(h_ctx, cos_c, sin_c)
            h = layer(h, cos, sin, ctx_k, ctx_v, mask)
        hidden = self.norm(h).view(b, n_blk, bs, -1)
        logits = self.lm_head(hidden).float() if return_logits else None
        return DFlashTrainOutput(logits=logits, hidden=hidden)
