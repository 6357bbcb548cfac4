"""Build a shape-faithful slice of one TP8 rank (random weights) and its verify inputs.

The slice *is* a kdtree ``MLAMoEForCausalLM`` whose config carries the per-rank shapes of
:class:`~kdtree.scale.spec.K2RankSpec` (8 heads, all 384 experts at width 256, dense width 2304,
vocab shard 20480), so timing it times the model code the engine runs. Weights are created
directly in the target dtype on the target device (no fp32 copy on the way), after a memory
check that fails with the bytes the slice would need.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from kdtree.scale.spec import K2RankSpec, check_fits

__all__ = ["VerifyBatch", "build_k2_slice", "make_verify_batch", "random_tree_mask"]


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_k2_slice(
    spec: K2RankSpec,
    n_layers: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    context: int = 0,
    tree: int = 1,
    free_bytes: int | None = None,
):
    """A random ``MLAMoEForCausalLM`` holding ``n_layers`` layers of one rank (the first
    ``spec.first_dense`` dense, the rest MoE), in eval mode. Raises
    :class:`~kdtree.scale.spec.ShapeDoesNotFitError` before allocating anything when the
    weights plus a cache for ``context + tree`` tokens would not fit."""
    from kdtree.models.mla_moe import MLAMoEForCausalLM

    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype={dtype}: expected bfloat16, float16 or float32")
    dev = torch.device(device)
    elem = torch.finfo(dtype).bits // 8
    need = spec.slice_bytes(n_layers, context, tree, elem_bytes=elem)["total"]
    check_fits(
        f"{spec.label}: {n_layers} layers + cache for {context}+{tree} tokens",
        need,
        dev,
        free=free_bytes,
    )
    cfg = spec.config(n_layers)
    gen = torch.Generator(device=dev).manual_seed(seed)
    with _default_dtype(dtype), torch.device(dev):
        model = MLAMoEForCausalLM(cfg)  # params created in ``dtype`` on ``dev`` directly
    model.to(dtype=dtype)  # routers back to fp32 (as transformers keeps them)
    model.init_weights(generator=gen)  # reproducible, independent of the global RNG
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.zero_()
    return model.eval()


def random_tree_mask(t: int, gen: torch.Generator, *, branching: float = 0.5) -> torch.Tensor:
    """``bool [T, T]`` ancestor-or-self visibility of a random tree in pop order (node ``j``'s
    parent drawn from ``0..j-1``; with probability ``branching`` a uniform earlier node, else
    ``j - 1``, so trees look like a DDTree: a long main chain with side branches)."""
    from kdtree.scale.routing import random_tree_parents

    parents = random_tree_parents(t, gen, branching=branching)
    vis = torch.eye(t, dtype=torch.bool)
    for j in range(1, t):
        vis[j] |= vis[parents[j]]
    return vis


@dataclass
class VerifyBatch:
    """Everything one verify forward of the slice needs: ``T`` tree tokens at context ``L``."""

    input_ids: torch.Tensor  # int64 [1, T]
    positions: torch.Tensor  # int64 [1, T]
    cache: object  # PagedKVCache with every layer's latent filled for L tokens
    attn: object  # AttnMetadata (mode "tree")
    vis: torch.Tensor  # bool [1, T, T]
    context: int
    tree: int


def make_verify_batch(
    model,
    context: int,
    tree: int,
    *,
    backend: str = "auto",
    page_size: int = 64,
    seed: int = 0,
) -> VerifyBatch:
    """A paged latent cache for ``model`` holding ``context`` random committed tokens per layer
    (N(0,1) values; never zeros) plus room for the tree, a random tree of ``tree`` tokens at
    positions ``context + depth`` and the ``AttnMetadata`` of a verify forward."""
    from kdtree.attention import AttnMetadata
    from kdtree.cache import PagedKVCache
    from kdtree.spec.bitmask import pack_bits

    if context < 0 or tree < 1:
        raise ValueError(f"context={context}, tree={tree}: expected context >= 0 and tree >= 1")
    dev, dtype = model.device, model.dtype
    cfg = model.config
    cache = PagedKVCache.for_model(
        cfg, max_batch=1, max_len=context + tree, page_size=page_size, dtype=dtype, device=dev
    )
    cache.reserve([0], context + tree)
    cache.set_length(0, context)
    dgen = torch.Generator(device=dev).manual_seed(seed)
    for kv in cache.kv:
        kv.normal_(generator=dgen)
    gen = torch.Generator().manual_seed(seed + 7919 * tree)
    vis = random_tree_mask(tree, gen)
    depth = vis.sum(-1) - 1  # ancestors-or-self count − 1
    ids = torch.randint(0, cfg.vocab_size, (1, tree), generator=gen)
    positions = (context + depth)[None].to(torch.int64)
    slots = cache.slot_mapping([0], [context], tree)
    attn = AttnMetadata(
        mode="tree",
        slot_mapping=slots.to(dev),
        page_table=cache.batch_page_table([0]),
        prefix_lens=torch.tensor([context], dtype=torch.int32, device=dev),
        tree_mask=pack_bits(vis[None]).to(dev),
        backend=backend,
    )
    return VerifyBatch(
        ids.to(dev), positions.to(dev), cache, attn, vis[None].to(dev), context, tree
    )
