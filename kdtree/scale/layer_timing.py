"""The parts of one verify layer of the slice, as zero-argument callables to time.

For layer ``i`` with ``T`` tree tokens at context ``L`` (``VerifyBatch``), the parts are:

* ``attn_in``: input RMSNorm, q LoRA (``q_a`` → norm → ``q_b``), ``kv_a`` → norm, RoPE, the
  latent write into the paged cache, and the ``W_UK`` absorption;
* ``attn_kernel`` per provider: ``triton`` (our kernel, through ``tree_attention_mla``) or
  ``eager`` (absorbed einsum → dense additive mask → softmax → einsum on the contiguous latent,
  the eager peer of the verify benchmark);
* ``attn_out``: ``W_UV``, ``o_proj``, residual;
* ``mlp_norm``: the post-attention RMSNorm;
* dense layers: ``dense_mlp``; MoE layers: ``router``, ``experts`` per provider (see
  :mod:`kdtree.scale.moe`), ``shared_expert``;
* ``layer_model``: the model's own ``MLADecoderLayer.forward`` (triton backend, loop experts),
  a check that the parts add up;
* ``lm_head`` (once per step): final norm and the vocab-parallel LM head shard.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kdtree.scale.moe import moe_experts
from kdtree.scale.slice import VerifyBatch

__all__ = ["ATTN_PROVIDERS", "LayerParts", "layer_parts"]

ATTN_PROVIDERS = ("triton", "eager")


class LayerParts:
    """Callables for one layer and one ``VerifyBatch``; ``routing`` overrides the router's
    expert choice for the ``experts`` parts (``int64 [T, k]``)."""

    def __init__(
        self,
        model,
        layer_idx: int,
        vb: VerifyBatch,
        *,
        seed: int = 0,
        routing: torch.Tensor | None = None,
    ) -> None:
        from kdtree.models.mla_moe import MoE

        if not 0 <= layer_idx < len(model.model.layers):
            raise ValueError(
                f"layer_idx={layer_idx}: the slice has {len(model.model.layers)} layers"
            )
        self.model, self.idx, self.vb = model, layer_idx, vb
        self.layer = model.model.layers[layer_idx]
        self.is_moe = isinstance(self.layer.mlp, MoE)
        dev, dtype = model.device, model.dtype
        gen = torch.Generator(device=dev).manual_seed(seed)
        d = model.config.hidden_size
        self.h = torch.randn(1, vb.tree, d, generator=gen, device=dev).to(dtype)
        self.cos, self.sin = model.rotary(vb.positions, dtype)
        attn = self.layer.self_attn
        with torch.no_grad():
            x = self.layer.input_layernorm(self.h)
            q_nope, self.q_pe, c_kv, k_pe = attn.latent(x, self.cos, self.sin)
            vb.cache.write_latent(layer_idx, vb.attn.slot_mapping, c_kv, k_pe, keep=None)
            w_uk, self.w_uv = attn.absorbed_weights()
            self.q_abs = torch.einsum("bthn,hnr->bthr", q_nope, w_uk).contiguous()
            self.q_pe = self.q_pe.contiguous()
            self.out_lat = torch.randn(
                self.q_abs.shape, generator=gen, device=dev, dtype=torch.float32
            ).to(dtype)
            self.x_mlp = self.layer.post_attention_layernorm(self.h)
            flat = self.x_mlp.reshape(-1, d)
            if self.is_moe:
                idx, w = self.layer.mlp.gate(flat)
                if routing is not None:
                    if routing.shape != idx.shape:
                        raise ValueError(
                            f"routing: expected {tuple(idx.shape)}, got {tuple(routing.shape)}"
                        )
                    idx = routing.to(dev, torch.int64)
                self.route_idx, self.route_w = idx, w
        # eager peer: the request's pages are 0..n-1 of a fresh cache, so the latent is contiguous
        n_keys = vb.context + vb.tree
        pages = vb.attn.page_table[0, : -(-n_keys // vb.cache.page_size)].cpu()
        if not torch.equal(pages, torch.arange(pages.numel(), dtype=pages.dtype)):
            raise RuntimeError("make_verify_batch: expected the request's pages in order")
        self.latent = vb.cache.kv[layer_idx].view(-1, vb.cache.kv[layer_idx].shape[-1])[:n_keys]
        vis = torch.ones(vb.tree, n_keys, dtype=torch.bool, device=dev)
        vis[:, vb.context :] = vb.vis[0]
        zero = torch.zeros((), dtype=torch.float32, device=dev)
        self.additive = torch.where(vis, zero, torch.full_like(zero, float("-inf")))

    @property
    def distinct_experts(self) -> int:
        return int(torch.unique(self.route_idx).numel()) if self.is_moe else 0

    # ------------------------------------------------------------------ parts

    def attn_in(self) -> torch.Tensor:
        attn = self.layer.self_attn
        x = self.layer.input_layernorm(self.h)
        q_nope, q_pe, c_kv, k_pe = attn.latent(x, self.cos, self.sin)
        self.vb.cache.write_latent(self.idx, self.vb.attn.slot_mapping, c_kv, k_pe, keep=None)
        w_uk, _ = attn.absorbed_weights()
        return torch.einsum("bthn,hnr->bthr", q_nope, w_uk)

    def attn_kernel(self, provider: str) -> Callable[[], torch.Tensor]:
        from kdtree.attention import tree_attention_mla

        attn, vb = self.layer.self_attn, self.vb
        if provider == "triton":

            def fn() -> torch.Tensor:
                return tree_attention_mla(
                    self.q_abs,
                    self.q_pe,
                    vb.cache.kv[self.idx],
                    vb.attn.page_table,
                    vb.attn.prefix_lens,
                    vb.attn.tree_mask,
                    sm_scale=attn.sm_scale,
                    backend="triton",
                    validate=False,
                )

            return fn
        if provider == "eager":
            rank = attn.rank

            def fn() -> torch.Tensor:
                c, kp = self.latent[:, :rank], self.latent[:, rank:]
                s = torch.einsum("bthr,nr->bhtn", self.q_abs, c).float()
                s = s + torch.einsum("bthp,np->bhtn", self.q_pe, kp).float()
                p = (s * attn.sm_scale + self.additive).softmax(-1).to(c.dtype)
                return torch.einsum("bhtn,nr->bthr", p, c)

            return fn
        raise ValueError(f"provider={provider!r}: expected one of {ATTN_PROVIDERS}")

    def attn_out(self) -> torch.Tensor:
        out = torch.einsum("bthr,hvr->bthv", self.out_lat, self.w_uv)
        return self.h + self.layer.self_attn.o_proj(out.reshape(1, self.vb.tree, -1))

    def mlp_norm(self) -> torch.Tensor:
        return self.layer.post_attention_layernorm(self.h)

    def dense_mlp(self) -> torch.Tensor:
        if self.is_moe:
            raise ValueError(f"layer {self.idx} is an MoE layer (no dense MLP)")
        return self.layer.mlp(self.x_mlp)

    def _require_moe(self) -> None:
        if not self.is_moe:
            raise ValueError(f"layer {self.idx} is dense (no router / experts)")

    def router(self):
        self._require_moe()
        return self.layer.mlp.gate(self.x_mlp.reshape(-1, self.x_mlp.shape[-1]))

    def experts(self, provider: str) -> Callable[[], torch.Tensor]:
        self._require_moe()
        flat = self.x_mlp.reshape(-1, self.x_mlp.shape[-1])
        experts = self.layer.mlp.experts
        return lambda: moe_experts(experts, flat, self.route_idx, self.route_w, provider=provider)

    def shared_expert(self) -> torch.Tensor:
        self._require_moe()
        return self.layer.mlp.shared_experts(self.x_mlp)

    def layer_model(self) -> torch.Tensor:
        """The model's own layer forward (triton backend, loop experts, the router's choice)."""
        from dataclasses import replace

        from kdtree.models.base import StepContext

        attn = replace(self.vb.attn, backend="triton")
        ctx = StepContext(cache=self.vb.cache, attn=attn, max_prefix=0, keep=None)
        return self.layer(self.h, self.cos, self.sin, ctx, self.idx)

    def lm_head(self) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(self.h)).float()

    def parts(
        self, attn_providers=ATTN_PROVIDERS, moe_providers=("loop",)
    ) -> dict[tuple[str, str], Callable[[], object]]:
        """``{(part, provider): fn}`` for this layer (provider ``"model"`` for fixed parts)."""
        out: dict[tuple[str, str], Callable[[], object]] = {
            ("attn_in", "model"): self.attn_in,
            ("attn_out", "model"): self.attn_out,
            ("mlp_norm", "model"): self.mlp_norm,
        }
        for p in attn_providers:
            out[("attn_kernel", p)] = self.attn_kernel(p)
        if self.is_moe:
            out[("router", "model")] = self.router
            out[("shared_expert", "model")] = self.shared_expert
            for p in moe_providers:
                out[("experts", p)] = self.experts(p)
        else:
            out[("dense_mlp", "model")] = self.dense_mlp
        return out


def layer_parts(model, layer_idx: int, vb: VerifyBatch, **kwargs) -> LayerParts:
    """:class:`LayerParts` for ``model.model.layers[layer_idx]`` on ``vb``."""
    return LayerParts(model, layer_idx, vb, **kwargs)
