"""Public Triton tree-verify attention: validation, config choice, split-KV launch and merge.

``tree_attention_triton`` (GQA) and ``tree_attention_mla_triton`` (absorbed MLA) follow the
signatures of :func:`kdtree.attention.tree_attention` / ``tree_attention_mla`` and are
registered there as backend ``"triton"``. Extra keywords for engines and benchmarks:

* ``plan``: a :class:`~kdtree.kernels.workspace.TreeAttentionPlan` (preallocated partials;
  without one a cached plan per shape is created on first use);
* ``out``: a preallocated output;
* ``num_splits``: force the split count (tests, tuning);
* ``config``: force a :class:`~kdtree.kernels.heuristics.TileConfig` (tuning; no fallback);
* ``check_values``: check ``prefix_lens + T`` against the page table's capacity on the host
  (``None``: only when ``prefix_lens`` is already on the CPU; the :mod:`kdtree.attention`
  entry point does the check outside CUDA-graph capture). The kernels never read past the
  page table either way.

Nothing here synchronises with the device, and the launch depends only on static shapes, so
a call can be captured in a CUDA graph once it has run (compiled) eagerly.
"""

from __future__ import annotations

import math

import torch

from kdtree.kernels._common import LOG2E, _merge_kernel, merge_launch_args
from kdtree.kernels.gqa import _gqa_split_kernel, gqa_split_args
from kdtree.kernels.heuristics import MAX_TREE_TOKENS, TileConfig, configs_for
from kdtree.kernels.mla import _mla_split_kernel, mla_split_args
from kdtree.kernels.workspace import TreeAttentionPlan, interpreting

__all__ = ["clear_caches", "tree_attention_mla_triton", "tree_attention_triton"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PLANS: dict[tuple, TreeAttentionPlan] = {}
# Plans replaced by a larger one stay alive: a CUDA graph captured earlier may point at them.
_RETIRED: list[TreeAttentionPlan] = []
_CONFIGS: dict[tuple, TileConfig] = {}
# Per call signature (shapes, strides, dtypes, devices, plan, options): a ready launch.
_LAUNCHES: dict[tuple, _Launch] = {}
_MAX_LAUNCHES = 512


def clear_caches() -> None:
    """Forget the cached workspaces, launches and the configs that compiled."""
    _PLANS.clear()
    _RETIRED.clear()
    _CONFIGS.clear()
    _LAUNCHES.clear()


def _sig(x: torch.Tensor) -> tuple:
    return (x.shape, x.stride(), x.dtype, x.device)


# ----------------------------------------------------------------------------- validation


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def _check_device(q: torch.Tensor) -> None:
    if q.device.type == "cuda":
        return
    if q.device.type == "cpu" and interpreting():
        return
    raise RuntimeError(
        f"q: on {q.device}; the Triton backend needs a CUDA tensor (or TRITON_INTERPRET=1 "
        "for CPU tensors)"
    )


def _check_metadata(b, t, page_size, page_table, prefix_lens, tree_mask, device) -> None:
    """The paged-tree metadata of a call with ``b`` requests of ``T = t`` tree tokens (shared
    by the Triton entry points and the CUDA MLA kernel, :mod:`kdtree.kernels.cuda_mla`)."""
    if not _is_pow2(page_size):
        raise ValueError(f"page_size={page_size}: expected a power of two")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != b:
        raise ValueError(
            f"page_table: expected int32 [{b}, max_pages], got {page_table.dtype} "
            f"{tuple(page_table.shape)}"
        )
    if page_table.stride(1) != 1:
        raise ValueError("page_table: expected a contiguous last dim")
    if prefix_lens.dtype != torch.int32 or tuple(prefix_lens.shape) != (b,):
        raise ValueError(
            f"prefix_lens: expected int32 [{b}], got {prefix_lens.dtype} "
            f"{tuple(prefix_lens.shape)}"
        )
    w = (t + 63) // 64
    if tree_mask.dtype != torch.int64 or tuple(tree_mask.shape) != (b, t, w):
        raise ValueError(
            f"tree_mask: expected int64 [{b}, {t}, {w}], got {tree_mask.dtype} "
            f"{tuple(tree_mask.shape)}"
        )
    if tree_mask.stride(2) != 1:
        raise ValueError("tree_mask: expected a contiguous last dim")
    for name, x in (
        ("page_table", page_table),
        ("prefix_lens", prefix_lens),
        ("tree_mask", tree_mask),
    ):
        if x.device != device:
            raise ValueError(f"{name}: on {x.device}, expected the query's device {device}")


def _check_common(q, caches, page_table, prefix_lens, tree_mask, page_size, plan) -> None:
    b, t = q.shape[:2]
    if q.dtype not in _DTYPES:
        raise TypeError(f"q: dtype {q.dtype}; expected one of {_DTYPES}")
    if b < 1 or t < 1:
        raise ValueError(f"q: expected B >= 1 and T >= 1, got B={b}, T={t}")
    if t > MAX_TREE_TOKENS:
        raise ValueError(f"q: T={t} tree tokens is above the compiled maximum {MAX_TREE_TOKENS}")
    _check_device(q)
    for name, c in caches:
        if c.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {c.dtype} differs from the query's {q.dtype}")
        if c.device != q.device:
            raise ValueError(f"{name}: on {c.device}, expected the query's device {q.device}")
        if c.stride(-1) != 1 or c.stride(0) != c.shape[1] * c.stride(1):
            raise ValueError(
                f"{name}: expected pages laid out contiguously (slot = page * "
                f"page_size + offset) with a contiguous last dim; strides "
                f"{tuple(c.stride())}"
            )
    _check_metadata(b, t, page_size, page_table, prefix_lens, tree_mask, q.device)
    if plan is not None:
        if plan.device != q.device and not (
            plan.device.type == q.device.type == "cuda"
            and plan.device.index in (None, q.device.index)
        ):
            raise ValueError(f"plan: workspace on {plan.device}, expected {q.device}")
        if b > plan.max_batch or t > plan.max_tree:
            raise ValueError(
                f"plan: sized for batch <= {plan.max_batch}, T <= {plan.max_tree};"
                f" the call has B={b}, T={t}"
            )


def _check_lengths(prefix_lens, t: int, page_table, page_size: int) -> None:
    """``0 <= prefix_lens`` and ``prefix_lens + T`` within the page table (host sync)."""
    capacity = page_table.shape[1] * page_size
    lo, hi = (int(x) for x in torch.stack([prefix_lens.min(), prefix_lens.max()]).tolist())
    if lo < 0:
        raise ValueError(f"prefix_lens: expected non-negative lengths, got min {lo}")
    if hi + t > capacity:
        raise ValueError(
            f"prefix_lens + T = {hi + t} tokens exceed the page table's "
            f"capacity ({page_table.shape[1]} pages x {page_size} = {capacity})"
        )


def _check_out(out, shape, q) -> None:
    if out is None:
        return
    if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(
            f"out: expected {q.dtype} {shape} on {q.device}, got {out.dtype} "
            f"{tuple(out.shape)} on {out.device}"
        )
    if out.stride(-1) != 1:
        raise ValueError("out: expected a contiguous last dim")


# ----------------------------------------------------------------------------- launch


def _plan_for(kind, q, page_table, page_size, num_kv_heads, group, dk, dv, plan, forced):
    if plan is not None:
        if (plan.kind, plan.num_kv_heads, plan.group, plan.head_dim_k, plan.head_dim_v) != (
            kind,
            num_kv_heads,
            group,
            dk,
            dv,
        ):
            raise ValueError(
                f"plan: built for {plan.kind} kv_heads={plan.num_kv_heads} group={plan.group} "
                f"dims=({plan.head_dim_k}, {plan.head_dim_v}); the call is {kind} "
                f"kv_heads={num_kv_heads} group={group} dims=({dk}, {dv})"
            )
        return plan
    b, t = q.shape[:2]
    max_len = page_table.shape[1] * page_size
    key = (kind, q.device, num_kv_heads, group, dk, dv, max_len)
    cached = _PLANS.get(key)
    need = b * num_kv_heads * (forced or 1) * (-(-t * group // 16) * 16)
    if (
        cached is None
        or cached.max_batch < b
        or cached.max_tree < t
        or cached.capacity_rows < need
    ):
        mb = max(b, cached.max_batch if cached else 0)
        mt = max(t, cached.max_tree if cached else 0)
        cached = TreeAttentionPlan(
            kind,
            max_batch=mb,
            max_tree=mt,
            num_kv_heads=num_kv_heads,
            group=group,
            head_dim_k=dk,
            head_dim_v=dv,
            max_prefix_len=max_len,
            device=q.device,
            min_capacity_rows=need,
        )
        if key in _PLANS:
            _RETIRED.append(_PLANS[key])
        _PLANS[key] = cached
    return cached


class _Launch:
    """Everything one call signature needs, computed once: the config (walking the ladder on
    the first call), the split count, workspace views, grids and the scalar launch arguments.
    A call then costs two Triton launches (one with a single split) and nothing else."""

    def __init__(self, kind, ws, configs, cfg_key, forced_cfg, forced_splits, fixed, rows, group):
        self.kind, self.ws, self.configs, self.cfg_key = kind, ws, configs, cfg_key
        self.forced_cfg, self.forced_splits = forced_cfg, forced_splits
        self.fixed = fixed  # kwargs of the args builder that never change (scale, precision)
        self.rows, self.group = rows, group
        self.ready = False

    def _prepare(self, cfg, tensors, out) -> None:
        b, t = tensors[0].shape[:2]
        ws = self.ws
        s = self.forced_splits if self.forced_splits is not None else ws.num_splits(cfg, b, t)
        part, lse = ws.views(b, t, s) if s > 1 else (out, out)
        builder = gqa_split_args if self.kind == "gqa" else mla_split_args
        self.kernel = _gqa_split_kernel if self.kind == "gqa" else _mla_split_kernel
        self.grid, self.args, self.kwargs = builder(
            *tensors, out, part, lse, num_splits=s, cfg=cfg, **self.fixed
        )
        self.num_splits, self.cfg = s, cfg
        self.part, self.lse = (part, lse) if s > 1 else (None, None)
        if s > 1:
            self.mgrid, self.margs, self.mkwargs = merge_launch_args(
                part, lse, out, ws.num_kv_heads, self.group, self.rows, s
            )

    def _launch(self, tensors, out) -> None:
        if self.part is None:
            self.kernel[self.grid](*tensors, out, out, out, *self.args, **self.kwargs)
            return
        self.kernel[self.grid](*tensors, out, self.part, self.lse, *self.args, **self.kwargs)
        _merge_kernel[self.mgrid](self.part, self.lse, out, *self.margs, **self.mkwargs)

    def __call__(self, tensors, out):
        if self.ready:
            self._launch(tensors, out)
            return out
        if self.forced_cfg is not None:
            self._prepare(self.forced_cfg, tensors, out)
            self._launch(tensors, out)
            self.ready = True
            return out
        cached = _CONFIGS.get(self.cfg_key)
        ladder = [cached] if cached is not None else self.configs
        first_error: Exception | None = None
        for cfg in ladder:
            self._prepare(cfg, tensors, out)
            try:
                self._launch(tensors, out)
            except (ValueError, TypeError):
                raise  # bad arguments, not an unfit config
            except Exception as exc:  # an unfit config: shared memory, registers, lowering
                if first_error is None:
                    first_error = exc
                continue
            _CONFIGS[self.cfg_key] = cfg
            self.ready = True
            return out
        raise RuntimeError(
            f"{self.kind} tree attention: no kernel config compiled for this shape "
            f"(tried {ladder})"
        ) from first_error


def _remember(key, launch: _Launch) -> _Launch:
    if len(_LAUNCHES) >= _MAX_LAUNCHES:
        _LAUNCHES.pop(next(iter(_LAUNCHES)))
    _LAUNCHES[key] = launch
    return launch


def _wants_check(check_values, prefix_lens) -> bool:
    return prefix_lens.device.type == "cpu" if check_values is None else bool(check_values)


def _launch_for(kind, tensors, out, plan, num_splits, config, sm_scale, build) -> _Launch:
    """The cached launch of this call signature; ``build(*tensors, sm_scale, plan, out,
    num_splits, config)`` validates a new signature and makes its launch."""
    key = (
        kind,
        *map(_sig, tensors),
        None if out is None else _sig(out),
        None if plan is None else id(plan),
        num_splits,
        config,
        sm_scale,
        False if tensors[0].is_cuda else interpreting(),  # CPU tensors need the interpreter
    )
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _remember(key, build(*tensors, sm_scale, plan, out, num_splits, config))
    return launch


def _new_launch(
    kind,
    q,
    caches,
    page_table,
    prefix_lens,
    tree_mask,
    out_shape,
    sm_scale,
    plan,
    out,
    num_splits,
    config,
    *,
    num_kv_heads: int,
    group: int,
    dk: int,
    dv: int,
    cfg_dims: tuple[int, ...],
) -> _Launch:
    """Shared tail of :func:`_gqa_launch` / :func:`_mla_launch`: the common checks, then the
    workspace plan, config ladder and fixed launch keywords of a ``kind`` launch."""
    page_size = caches[0][1].shape[1]
    _check_common(q, caches, page_table, prefix_lens, tree_mask, page_size, plan)
    _check_out(out, out_shape, q)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits={num_splits}: expected >= 1")
    rows = group * q.shape[1]
    ws = _plan_for(kind, q, page_table, page_size, num_kv_heads, group, dk, dv, plan, num_splits)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    configs = [config] if config is not None else configs_for(kind, rows, dk, interpreting())
    if config is None:
        tuned = ws.tuned(q.shape[0], q.shape[1])  # a measured winner goes first
        if tuned is not None:
            configs = [tuned.config, *(c for c in configs if c != tuned.config)]
    cfg_key = (kind, q.device.type, q.dtype, *cfg_dims, page_size, configs[0])
    fixed = {"qk_scale": sm_scale * LOG2E, "dot_precision": precision}
    return _Launch(kind, ws, configs, cfg_key, config, num_splits, fixed, rows, group)


def tree_attention_triton(
    q,
    k_cache,
    v_cache,
    page_table,
    prefix_lens,
    tree_mask,
    *,
    sm_scale: float,
    plan: TreeAttentionPlan | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: TileConfig | None = None,
    check_values: bool | None = None,
    dense_mask=None,
) -> torch.Tensor:
    """GQA tree-verify attention (see :func:`kdtree.attention.tree_attention`); returns
    ``[B, T, Hq, D]`` in ``q``'s dtype. ``dense_mask`` is accepted and ignored. Shapes are
    validated once per call signature; later calls with the same signature go straight to
    the cached launch."""
    tensors = (q, k_cache, v_cache, page_table, prefix_lens, tree_mask)
    launch = _launch_for("gqa", tensors, out, plan, num_splits, config, sm_scale, _gqa_launch)
    if _wants_check(check_values, prefix_lens):
        _check_lengths(prefix_lens, q.shape[1], page_table, k_cache.shape[1])
    if out is None:
        out = torch.empty_like(q)
    return launch(tensors, out)


def _gqa_launch(
    q,
    k_cache,
    v_cache,
    page_table,
    prefix_lens,
    tree_mask,
    sm_scale,
    plan,
    out,
    num_splits,
    config,
) -> _Launch:
    """Validate a new GQA call signature and build its launch."""
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, Hq, D], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache, v_cache: expected equal [num_pages, page_size, Hkv, D], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    b, t, hq, d = q.shape
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} differs from the query's {d}")
    if not _is_pow2(d) or not 16 <= d <= 256:
        raise ValueError(f"q: head dim {d}; expected a power of two in [16, 256] (64, 128)")
    if hq % hkv:
        raise ValueError(f"q: {hq} query heads are not a multiple of {hkv} kv heads")
    if q.stride(-1) != 1:
        raise ValueError("q: expected a contiguous last dim")
    return _new_launch(
        "gqa",
        q,
        [("k_cache", k_cache), ("v_cache", v_cache)],
        page_table,
        prefix_lens,
        tree_mask,
        (b, t, hq, d),
        sm_scale,
        plan,
        out,
        num_splits,
        config,
        num_kv_heads=hkv,
        group=hq // hkv,
        dk=d,
        dv=d,
        cfg_dims=(d,),
    )


def tree_attention_mla_triton(
    q_nope,
    q_pe,
    kv_cache,
    page_table,
    prefix_lens,
    tree_mask,
    *,
    sm_scale: float,
    plan: TreeAttentionPlan | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: TileConfig | None = None,
    check_values: bool | None = None,
    dense_mask=None,
) -> torch.Tensor:
    """Absorbed-MLA tree-verify attention (see :func:`kdtree.attention.tree_attention_mla`);
    returns ``[B, T, H, kv_lora_rank]`` in ``q_nope``'s dtype. Validated once per call
    signature, like :func:`tree_attention_triton`."""
    tensors = (q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask)
    launch = _launch_for("mla", tensors, out, plan, num_splits, config, sm_scale, _mla_launch)
    if _wants_check(check_values, prefix_lens):
        _check_lengths(prefix_lens, q_nope.shape[1], page_table, kv_cache.shape[1])
    if out is None:
        b, t, h, rank = q_nope.shape
        out = q_nope.new_empty(b, t, h, rank)
    return launch(tensors, out)


def _mla_launch(
    q_nope,
    q_pe,
    kv_cache,
    page_table,
    prefix_lens,
    tree_mask,
    sm_scale,
    plan,
    out,
    num_splits,
    config,
) -> _Launch:
    """Validate a new MLA call signature and build its launch."""
    if q_nope.dim() != 4 or q_pe.dim() != 4 or q_pe.shape[:3] != q_nope.shape[:3]:
        raise ValueError(
            f"q_nope, q_pe: expected [B, T, H, rank] and [B, T, H, rope], got "
            f"{tuple(q_nope.shape)} and {tuple(q_pe.shape)}"
        )
    if q_pe.dtype != q_nope.dtype or q_pe.device != q_nope.device:
        raise TypeError(
            f"q_pe: expected {q_nope.dtype} on {q_nope.device}, got {q_pe.dtype} on {q_pe.device}"
        )
    b, t, h, rank = q_nope.shape
    rope = q_pe.shape[3]
    if not (_is_pow2(rank) and _is_pow2(rope) and rank >= 16 and rope >= 16):
        raise ValueError(
            f"q_nope, q_pe: rank {rank} and rope dim {rope}; expected powers of two "
            ">= 16 (512 and 64)"
        )
    if kv_cache.dim() != 3 or kv_cache.shape[2] != rank + rope:
        raise ValueError(
            f"kv_cache: expected [num_pages, page_size, {rank + rope}], got "
            f"{tuple(kv_cache.shape)}"
        )
    if q_nope.stride(-1) != 1 or q_pe.stride(-1) != 1:
        raise ValueError("q_nope, q_pe: expected a contiguous last dim")
    return _new_launch(
        "mla",
        q_nope,
        [("kv_cache", kv_cache)],
        page_table,
        prefix_lens,
        tree_mask,
        (b, t, h, rank),
        sm_scale,
        plan,
        out,
        num_splits,
        config,
        num_kv_heads=1,
        group=h,
        dk=rank + rope,
        dv=rank,
        cfg_dims=(rank, rope),
    )


def default_sm_scale(head_dim: int) -> float:
    """``1 / sqrt(head_dim)``."""
    return 1.0 / math.sqrt(head_dim)
