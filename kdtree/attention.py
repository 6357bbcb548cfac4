"""Verify-attention entry points, the backend registry, and the torch backends.

``tree_attention`` (GQA) and ``tree_attention_mla`` (absorbed MLA) attend ``T`` new tokens to a
paged prefix that is fully visible plus the ``T`` tree tokens themselves through an ancestor
bitmask. Backends register per kind (``"gqa"``, ``"mla"``) and share one signature::

    fn(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, *, sm_scale, **extra)  # gqa
    fn(q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, *, sm_scale, **extra)  # mla

``extra`` carries ``dense_mask`` only when the caller passed one. Two torch backends live here:
``ref`` (readable, fp32, one request at a time) and ``dense_mask`` (the deliberately generic
O(context) custom-mask path: materialise the full mask, call SDPA). ``causal_attention`` serves
prefill.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from kdtree import env
from kdtree.spec.bitmask import num_words, unpack_bits

__all__ = [
    "AttnMetadata",
    "available_backends",
    "build_dense_mask",
    "causal_attention",
    "check_prefix_capacity",
    "get_backend",
    "gather_batch",
    "gather_prefix",
    "register_backend",
    "resolve_backend",
    "tree_attention",
    "tree_attention_mla",
]

KINDS = ("gqa", "mla")


@dataclass
class AttnMetadata:
    """What one model forward needs to know about attention.

    ``mode="prefill"``: new tokens sit at logical positions ``prefix_lens[b] + i`` and attend
    causally (to the whole prefix and to earlier new tokens). ``mode="tree"``: new tokens attend
    to the whole prefix and to each other through ``tree_mask`` (``int64 [B, T, W]``).
    ``slot_mapping`` (``int64 [B, T]``) is where each new token's K/V is written (``-1``: a
    padding token, not written). ``page_table`` is ``int32 [B, max_pages]`` (the rows of this
    batch), ``prefix_lens`` ``int32 [B]``. ``dense_mask`` (``bool [B, T, max(L) + T]``, key
    ``j`` = logical position ``j`` of the request) is only used by the ``dense_mask`` backend.
    """

    mode: Literal["prefill", "tree"]
    slot_mapping: torch.Tensor
    page_table: torch.Tensor
    prefix_lens: torch.Tensor
    tree_mask: torch.Tensor | None = None
    backend: str = "auto"
    dense_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("prefill", "tree"):
            raise ValueError(f"mode={self.mode!r}: expected 'prefill' or 'tree'")
        if self.mode == "tree" and self.tree_mask is None:
            raise ValueError("tree_mask: required when mode='tree'")
        if self.slot_mapping.dtype != torch.int64 or self.slot_mapping.dim() != 2:
            raise ValueError(
                f"slot_mapping: expected int64 [B, T], got {self.slot_mapping.dtype} "
                f"{tuple(self.slot_mapping.shape)}"
            )


# ----------------------------------------------------------------------------- registry

_BACKENDS: dict[str, dict[str, Callable[..., torch.Tensor]]] = {k: {} for k in KINDS}
_KERNELS_IMPORTED = False


def register_backend(kind: str, name: str, fn: Callable[..., torch.Tensor]) -> None:
    """Register ``fn`` as backend ``name`` for ``kind`` (``"gqa"`` or ``"mla"``); re-registering
    a name replaces it."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    if not name or name == "auto":
        raise ValueError(f"name={name!r}: expected a non-empty backend name other than 'auto'")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    _BACKENDS[kind][name] = fn


def _import_kernels() -> None:
    """Let ``kdtree.kernels`` register its backends; absence or a CPU-only failure is fine."""
    global _KERNELS_IMPORTED
    if _KERNELS_IMPORTED:
        return
    _KERNELS_IMPORTED = True
    try:
        importlib.import_module("kdtree.kernels")
    except ModuleNotFoundError as exc:
        if exc.name not in ("kdtree.kernels", "triton"):
            warnings.warn(
                f"kdtree.kernels: import failed ({exc}); only torch backends", stacklevel=3
            )
    except Exception as exc:  # a broken kernel module must not take the torch backends down
        warnings.warn(
            f"kdtree.kernels: import failed ({exc!r}); only torch backends", stacklevel=3
        )


def available_backends(kind: str) -> list[str]:
    """Names registered for ``kind``, sorted."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    _import_kernels()
    return sorted(_BACKENDS[kind])


def get_backend(kind: str, name: str) -> Callable[..., torch.Tensor]:
    """The backend function registered as ``name`` for ``kind``."""
    names = available_backends(kind)
    if name not in _BACKENDS[kind]:
        raise ValueError(f"backend={name!r} is not registered for kind={kind!r}; have {names}")
    return _BACKENDS[kind][name]


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def triton_supports(kind: str, dims: tuple[int, ...]) -> bool:
    """Head dims the Triton kernels are compiled for: GQA ``(d,)`` a power of two in
    [16, 256]; MLA ``(kv_lora_rank, rope_dim)`` powers of two >= 16 (512 + 64 in DeepSeek)."""
    if kind == "gqa":
        return _pow2(dims[0]) and 16 <= dims[0] <= 256
    return all(_pow2(x) and x >= 16 for x in dims)


def resolve_backend(
    kind: str,
    backend: str,
    device: torch.device,
    dims: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
    rows: int | None = None,
    max_len: int | None = None,
    batch_heads: int | None = None,
) -> str:
    """Resolve ``"auto"`` via ``KDTREE_VERIFY_BACKEND``, else by measurement on the H200 (rows in
    ``data/bench/verify_attention.csv``):

    * MLA with DeepSeek's dims (512 + 64) in bf16 / fp16 on an sm_90 GPU whose nvcc builds it:
      ``cuda`` (0.52 ms at h=16, L=128k, T=65, session 12, against the Triton kernel's 1.50 ms
      in session 6);
    * GQA with head dim 128 in bf16 / fp16 on such a GPU when the packed query rows ``rows =
      G * T`` number at least 64 (1.04-1.76x the Triton kernel at 32q/8kv and 8q/1kv, T=17 and
      65, L 16k-256k, session 14, call e; session 26's whole grid, call a: 1.25-4.8x at T=17 /
      65 / 257 from 1k at batch 1, 8 and 32, and 1.29-2.24x at 8q/1kv, T=17 at 1k / 4k, where
      it used to be the Triton kernel's), or fewer rows where the requests times the KV heads
      (``batch_heads``) are below 128: ``cuda`` (call a, T=1: 1.06-1.36x at 32q/8kv, batch 1
      and 8, 1.08-1.34x at 8q/1kv, every batch; with 256 such pairs, 32q/8kv at batch 32, the
      Triton kernel was 2-4 % faster; at 32q/8kv, T=9 (36 rows) the CUDA kernel is 1.07-2.1x
      the Triton one up to 16k and 3-5 % slower from 128k at batch 1 and 64k at batch 8).
      ``max_len`` (the page table's keys) no longer decides anything (kept for callers);
    * else ``triton`` on CUDA if registered and it supports the head dims (``dims``, when
      given), else ``ref``.

    Any other name is returned as is (an explicit ``triton`` on unsupported dims then fails with
    the kernel's own error)."""
    if backend != "auto":
        return backend
    chosen = env.VERIFY_BACKEND
    if chosen != "auto":
        return chosen
    if (
        kind == "mla"
        and device.type == "cuda"
        and dims == (512, 64)
        and dtype in (torch.bfloat16, torch.float16)
        and "cuda" in available_backends(kind)
    ):
        from kdtree.kernels import cuda_mla

        if cuda_mla.available_on(device):
            return "cuda"
    if (
        kind == "gqa"
        and device.type == "cuda"
        and dims == (128,)
        and dtype in (torch.bfloat16, torch.float16)
        and rows is not None
        and (rows >= 64 or (batch_heads is not None and batch_heads < 128))
        and "cuda" in available_backends(kind)
    ):
        from kdtree.kernels import cuda_gqa

        if cuda_gqa.available_on(device):
            return "cuda"
    if (
        device.type == "cuda"
        and "triton" in available_backends(kind)
        and (dims is None or triton_supports(kind, dims))
    ):
        return "triton"
    return "ref"


# ----------------------------------------------------------------------------- validation


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_common(
    q: torch.Tensor,
    caches: list[tuple[str, torch.Tensor]],
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    page_size: int,
    validate: bool = True,
) -> None:
    b, t = q.shape[:2]
    for name, c in caches:
        if c.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {c.dtype} differs from the query's {q.dtype}")
        if c.device != q.device:
            raise ValueError(f"{name}: on {c.device}, expected the query's device {q.device}")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != b:
        raise ValueError(
            f"page_table: expected int32 [{b}, max_pages], got {page_table.dtype} "
            f"{tuple(page_table.shape)}"
        )
    if prefix_lens.dtype != torch.int32 or tuple(prefix_lens.shape) != (b,):
        raise ValueError(
            f"prefix_lens: expected int32 [{b}], got {prefix_lens.dtype} {tuple(prefix_lens.shape)}"
        )
    w = num_words(t)
    if tree_mask.dtype != torch.int64 or tuple(tree_mask.shape) != (b, t, w):
        raise ValueError(
            f"tree_mask: expected int64 [{b}, {t}, {w}], got {tree_mask.dtype} "
            f"{tuple(tree_mask.shape)}"
        )
    for name, x in (
        ("page_table", page_table),
        ("prefix_lens", prefix_lens),
        ("tree_mask", tree_mask),
    ):
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, expected the query's device {q.device}")
    if t == 0 or b == 0:
        raise ValueError(f"q: expected B >= 1 and T >= 1, got B={b}, T={t}")
    if validate:
        check_prefix_capacity(prefix_lens, t, page_table.shape[1] * page_size)


def check_prefix_capacity(prefix_lens: torch.Tensor, t: int, capacity: int) -> None:
    """``0 <= prefix_lens`` and ``prefix_lens + t <= capacity`` (one host sync; skipped inside
    a CUDA graph capture)."""
    if _capturing() or prefix_lens.numel() == 0:
        return
    lo, hi = (int(x) for x in torch.stack([prefix_lens.min(), prefix_lens.max()]).tolist())
    if lo < 0:
        raise ValueError(f"prefix_lens: expected non-negative lengths, got {lo}")
    if hi + t > capacity:
        raise ValueError(
            f"prefix_lens + T = {hi + t} tokens exceed the page table's capacity ({capacity})"
        )


def _check_gqa(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, validate=True) -> None:
    if not q.is_floating_point() or q.dim() != 4:
        raise ValueError(
            f"q: expected a float [B, T, Hq, D] tensor, got {q.dtype} {tuple(q.shape)}"
        )
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(
            "k_cache, v_cache: expected [num_pages, page_size, Hkv, D] each with equal leading "
            f"dims, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    hq, d = q.shape[2:]
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} differs from the query's {d}")
    if hq % hkv:
        raise ValueError(f"q: {hq} query heads are not a multiple of {hkv} kv heads")
    _check_common(
        q,
        [("k_cache", k_cache), ("v_cache", v_cache)],
        page_table,
        prefix_lens,
        tree_mask,
        k_cache.shape[1],
        validate,
    )


def _check_mla(q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, validate=True) -> None:
    if not q_nope.is_floating_point() or q_nope.dim() != 4:
        raise ValueError(
            f"q_nope: expected a float [B, T, H, kv_lora_rank] tensor, got {q_nope.dtype} "
            f"{tuple(q_nope.shape)}"
        )
    if q_pe.dim() != 4 or q_pe.shape[:3] != q_nope.shape[:3] or q_pe.dtype != q_nope.dtype:
        raise ValueError(
            f"q_pe: expected {q_nope.dtype} [{', '.join(map(str, q_nope.shape[:3]))}, rope_dim], "
            f"got {q_pe.dtype} {tuple(q_pe.shape)}"
        )
    want = q_nope.shape[3] + q_pe.shape[3]
    if kv_cache.dim() != 3 or kv_cache.shape[2] != want:
        raise ValueError(
            f"kv_cache: expected [num_pages, page_size, {want}] (kv_lora_rank + rope_dim), "
            f"got {tuple(kv_cache.shape)}"
        )
    _check_common(
        q_nope,
        [("kv_cache", kv_cache)],
        page_table,
        prefix_lens,
        tree_mask,
        kv_cache.shape[1],
        validate,
    )


def _check_dense_mask(dense_mask: torch.Tensor, b: int, t: int, device: torch.device) -> None:
    if dense_mask.dtype != torch.bool or dense_mask.dim() != 3 or dense_mask.shape[:2] != (b, t):
        raise ValueError(
            f"dense_mask: expected bool [{b}, {t}, max(L) + {t}], got {dense_mask.dtype} "
            f"{tuple(dense_mask.shape)}"
        )
    if dense_mask.shape[2] < t:
        raise ValueError(f"dense_mask: last dim {dense_mask.shape[2]} is shorter than T={t}")
    if dense_mask.device != device:
        raise ValueError(f"dense_mask: on {dense_mask.device}, expected {device}")


# ----------------------------------------------------------------------------- entry points


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    *,
    sm_scale: float,
    backend: str = "auto",
    dense_mask: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """GQA verify attention: ``q [B, T, Hq, D]`` over a paged prefix plus the tree; returns
    ``[B, T, Hq, D]`` in ``q``'s dtype. The new tokens' K/V must already be in the cache at
    logical positions ``prefix_lens .. prefix_lens + T - 1``. ``validate=False`` skips
    the value check that needs a host sync (prefix + T within the page table), for callers that
    ran ``check_prefix_capacity`` once per forward."""
    _check_gqa(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, validate)
    extra = {}
    if dense_mask is not None:
        _check_dense_mask(dense_mask, q.shape[0], q.shape[1], q.device)
        extra["dense_mask"] = dense_mask
    g = q.shape[2] // k_cache.shape[2]
    capacity = page_table.shape[1] * k_cache.shape[1]
    name = resolve_backend(
        "gqa", backend, q.device, (q.shape[3],), q.dtype, g * q.shape[1], capacity,
        q.shape[0] * k_cache.shape[2],
    )  # fmt: skip
    fn = get_backend("gqa", name)
    return fn(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale=sm_scale, **extra)


def tree_attention_mla(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    tree_mask: torch.Tensor,
    *,
    sm_scale: float,
    backend: str = "auto",
    dense_mask: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Absorbed-MLA verify attention: scores ``q_nope·c + q_pe·k_pe`` over the latent cache;
    returns ``[B, T, H, kv_lora_rank]`` in ``q_nope``'s dtype (the caller applies W_UV).
    ``validate`` as for ``tree_attention``."""
    _check_mla(q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, validate)
    extra = {}
    if dense_mask is not None:
        _check_dense_mask(dense_mask, q_nope.shape[0], q_nope.shape[1], q_nope.device)
        extra["dense_mask"] = dense_mask
    name = resolve_backend(
        "mla", backend, q_nope.device, (q_nope.shape[3], q_pe.shape[3]), q_nope.dtype
    )
    fn = get_backend("mla", name)
    return fn(
        q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, sm_scale=sm_scale, **extra
    )


# ----------------------------------------------------------------------------- helpers


def gather_prefix(cache: torch.Tensor, page_table_row: torch.Tensor, n: int) -> torch.Tensor:
    """Logical positions ``0 .. n-1`` of one request, gathered from a paged cache
    ``[num_pages, page_size, ...]`` through its page-table row: returns ``[n, ...]``."""
    page_size = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    slots = page_table_row.to(torch.int64)[pos // page_size] * page_size + pos % page_size
    return cache.reshape(-1, *cache.shape[2:]).index_select(0, slots)


def gather_batch(
    cache: torch.Tensor,
    page_table: torch.Tensor,
    n: int,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logical positions ``0 .. n-1`` of every request: ``[B, n, ...]``. With ``lengths``
    (``[B]``), rows at or past ``lengths[b]`` are zeros (stale or unwritten slots must not leak
    NaN/Inf through a masked softmax); without it they hold whatever the slots hold."""
    page_size = cache.shape[1]
    pos = torch.arange(n, device=cache.device)
    page_idx = (pos // page_size).clamp_max(page_table.shape[1] - 1)
    pages = page_table.to(torch.int64)[:, page_idx]  # [B, n]
    slots = pages * page_size + pos % page_size
    flat = cache.reshape(-1, *cache.shape[2:])
    out = flat.index_select(0, slots.reshape(-1)).reshape(page_table.shape[0], n, *cache.shape[2:])
    if lengths is not None:
        valid = pos[None] < lengths.to(cache.device, torch.int64)[:, None]  # [B, n]
        valid = valid.view(*valid.shape, *([1] * (cache.dim() - 2)))
        out = torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


def tree_visibility(prefix_len: int, tree_mask_row: torch.Tensor, t: int) -> torch.Tensor:
    """``bool [T, prefix_len + T]``: the whole prefix, then the tree through the bitmask."""
    prefix = torch.ones(t, prefix_len, dtype=torch.bool, device=tree_mask_row.device)
    return torch.cat([prefix, unpack_bits(tree_mask_row, t)], dim=1)


def build_dense_mask(
    prefix_lens: torch.Tensor, tree_mask: torch.Tensor, max_prefix: int | None = None
) -> torch.Tensor:
    """The O(context) mask ``bool [B, T, max(L) + T]`` the generic custom-mask path consumes:
    key ``j`` is logical position ``j`` of the request (``j < L``: visible; ``L <= j < L + T``:
    tree bit ``j - L``; beyond: hidden)."""
    b, t, _ = tree_mask.shape
    if max_prefix is None:
        max_prefix = int(prefix_lens.max()) if b else 0
    n = max_prefix + t
    tree_bits = unpack_bits(tree_mask, t)  # [B, T, T]
    key = torch.arange(n, device=tree_mask.device)
    lens = prefix_lens.to(torch.int64)[:, None]  # [B, 1]
    rel = key[None, :] - lens  # [B, n]: position relative to the tree start
    in_tree = (rel >= 0) & (rel < t)
    gathered = torch.gather(
        tree_bits, 2, rel.clamp(0, t - 1)[:, None, :].expand(b, t, n)
    )  # [B, T, n]
    return (rel < 0)[:, None, :] | (in_tree[:, None, :] & gathered)


# ----------------------------------------------------------------------------- ref backends


def tree_attention_ref(
    q, k_cache, v_cache, page_table, prefix_lens, tree_mask, *, sm_scale, dense_mask=None
):
    """Readable reference: one request at a time, fp32, prefix fully visible."""
    b, t, hq, _ = q.shape
    hkv = k_cache.shape[2]
    out = torch.empty(b, t, hq, v_cache.shape[3], dtype=q.dtype, device=q.device)
    for i in range(b):
        length = int(prefix_lens[i])
        keys = gather_prefix(k_cache, page_table[i], length + t).float()  # [S, Hkv, D]
        vals = gather_prefix(v_cache, page_table[i], length + t).float()
        keys = keys.repeat_interleave(hq // hkv, dim=1)
        vals = vals.repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("thd,shd->hts", q[i].float(), keys) * sm_scale
        visible = tree_visibility(length, tree_mask[i], t)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[i] = torch.einsum("hts,shd->thd", scores.softmax(dim=-1), vals).to(q.dtype)
    return out


def tree_attention_mla_ref(
    q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, *, sm_scale, dense_mask=None
):
    """Readable absorbed-MLA reference: one request at a time, fp32."""
    b, t, h, rank = q_nope.shape
    out = torch.empty(b, t, h, rank, dtype=q_nope.dtype, device=q_nope.device)
    for i in range(b):
        length = int(prefix_lens[i])
        lat = gather_prefix(kv_cache, page_table[i], length + t).float()  # [S, R + P]
        c, k_pe = lat[:, :rank], lat[:, rank:]
        scores = torch.einsum("thr,sr->hts", q_nope[i].float(), c)
        scores = (scores + torch.einsum("thp,sp->hts", q_pe[i].float(), k_pe)) * sm_scale
        visible = tree_visibility(length, tree_mask[i], t)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[i] = torch.einsum("hts,sr->thr", scores.softmax(dim=-1), c).to(q_nope.dtype)
    return out


# ----------------------------------------------------------------------------- dense_mask backends


def _additive(dense_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=dense_mask.device)
    neg = torch.full((), float("-inf"), dtype=dtype, device=dense_mask.device)
    return torch.where(dense_mask, zero, neg)[:, None]  # [B, 1, T, N]


def tree_attention_dense_mask(
    q, k_cache, v_cache, page_table, prefix_lens, tree_mask, *, sm_scale, dense_mask=None
):
    """Generic custom-mask path: gather ``max(L) + T`` keys for every request, materialise the
    additive ``[B, 1, T, max(L) + T]`` mask, call SDPA. Builds the mask itself when not given."""
    if dense_mask is None:
        dense_mask = build_dense_mask(prefix_lens, tree_mask)
    n = dense_mask.shape[2]
    hq, hkv = q.shape[2], k_cache.shape[2]
    lens = prefix_lens + q.shape[1]
    keys = gather_batch(k_cache, page_table, n, lens).transpose(1, 2)  # [B, Hkv, N, D]
    vals = gather_batch(v_cache, page_table, n, lens).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys,
        vals,
        attn_mask=_additive(dense_mask, q.dtype),
        scale=sm_scale,
        enable_gqa=hq != hkv,
    )
    return out.transpose(1, 2)


def tree_attention_mla_dense_mask(
    q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, *, sm_scale, dense_mask=None
):
    """Generic custom-mask path for absorbed MLA (one shared latent "head", SDPA)."""
    if dense_mask is None:
        dense_mask = build_dense_mask(prefix_lens, tree_mask)
    n = dense_mask.shape[2]
    rank = q_nope.shape[3]
    lat = gather_batch(kv_cache, page_table, n, prefix_lens + q_nope.shape[1])[
        :, None
    ]  # [B, 1, N, R + P]
    q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)  # [B, H, T, R + P]
    out = F.scaled_dot_product_attention(
        q,
        lat,
        lat[..., :rank],
        attn_mask=_additive(dense_mask, q.dtype),
        scale=sm_scale,
        enable_gqa=q.shape[1] != 1,
    )
    return out.transpose(1, 2)


register_backend("gqa", "ref", tree_attention_ref)
register_backend("mla", "ref", tree_attention_mla_ref)
register_backend("gqa", "dense_mask", tree_attention_dense_mask)
register_backend("mla", "dense_mask", tree_attention_mla_dense_mask)


# ----------------------------------------------------------------------------- prefill


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float,
    q_offset: int | torch.Tensor = 0,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention for prefill: ``q [B, T, Hq, D]`` at logical positions ``q_offset + i``
    over ``k, v [B, S, Hkv, D(v)]`` at positions ``0 .. S-1``. ``q_offset`` is an int or an
    ``int [B]`` tensor (chunked prefill with per-request prefixes); keys at ``j >= kv_lens[b]``
    are hidden. Returns ``[B, T, Hq, Dv]`` in ``q``'s dtype."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v: expected 4-d [B, T|S, H, D] tensors, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, t, hq, _ = q.shape
    s, hkv = k.shape[1], k.shape[2]
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k, v: expected [{b}, S, Hkv, {q.shape[3]}] and [{b}, S, Hkv, Dv], got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if hq % hkv:
        raise ValueError(f"q: {hq} heads are not a multiple of {hkv} kv heads")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k, v: expected q's dtype {q.dtype}, got {k.dtype} and {v.dtype}")
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = hq != hkv
    if isinstance(q_offset, int) and kv_lens is None:
        if q_offset < 0 or q_offset + t > s:
            raise ValueError(f"q_offset={q_offset}: expected 0 <= q_offset <= S - T = {s - t}")
        if q_offset == 0 and t == s:
            out = F.scaled_dot_product_attention(
                qh, kh, vh, is_causal=True, scale=sm_scale, enable_gqa=gqa
            )
            return out.transpose(1, 2)
    offset = torch.as_tensor(q_offset, device=q.device).to(torch.int64).reshape(-1)
    if offset.numel() not in (1, b):
        raise ValueError(f"q_offset: expected an int or an int tensor [{b}]")
    qpos = offset[:, None] + torch.arange(t, device=q.device)[None]  # [B|1, T]
    key = torch.arange(s, device=q.device)
    mask = key[None, None, :] <= qpos[:, :, None]  # [B|1, T, S]
    if kv_lens is not None:
        mask = mask & (key[None, None, :] < kv_lens.to(q.device, torch.int64)[:, None, None])
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask[:, None], scale=sm_scale, enable_gqa=gqa
    )
    return out.transpose(1, 2)
