"""Benchmark suite ``verify_attention``: tree-verify attention, ours against the peers.

For every point (head layout, batch, prefix length ``L``, tree size ``T``) each provider runs
on the same paged cache; KV buffers rotate through ``n_rot`` disjoint page sets so the working
set exceeds L2. Providers:

* ``ours`` / ``ours_graph``: the Triton kernels (eager, and replayed from a CUDA graph);
  ``ours_cuda_graph``: the sm_90 CUDA C++ MLA kernel (``kernels/mla_tree_sm90.cu``) with its
  mma.sync split kernel (``kernel="mma"``), replayed; ``ours_wgmma_graph``: the same with the
  warp-specialised wgmma split kernel (``kernel="wgmma"``), replayed; ``ours_seesaw_graph``: the
  same with the seesaw split kernel (``kernel="seesaw"``, the backend's default), replayed;
  ``ours_gqa_graph``: the sm_90 CUDA C++ GQA kernel (``kernels/gqa_tree_sm90.cu``), replayed;
* ``ref``: the torch reference backend (correctness anchor, small points only);
* ``sdpa_dense``: SDPA over contiguous K/V with a prebuilt dense additive mask;
* ``flex``: FlexAttention (compiled) with a tree ``mask_mod`` and a BlockMask built directly
  from KV blocks (full prefix blocks, partial tree blocks);
* ``fi_mask``: FlashInfer one-shot paged prefill with the custom mask (packed by ``plan``);
* ``fi_cascade``: FlashInfer paged prefill without mask (``backend="fa3"``, LSE) + the tree
  part per request through ``single_prefill_with_kv_cache`` + ``merge_state``;
* ``fi_mla``: FlashInfer ``BatchMLAPagedAttentionWrapper`` (``fa3``, non-causal, LSE) over
  the prefix + the tree part in torch + ``merge_state`` (FlashInfer's LSE is base 2);
* ``eager_mla``: the eager absorbed form (einsum, dense mask, softmax, einsum).

Every failure or skip becomes a row (``metric="error"``, reason in ``config_json``) and
never stops the run. FlashInfer's host-side ``plan()`` and Flex's BlockMask build are timed
separately (``mode="plan"``).
"""

from __future__ import annotations

import math
import re
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from kdtree.bench.roofline import Ceilings, floor_ms, gqa_cost, mla_cost
from kdtree.bench.schema import BenchRow

SUITE = "verify_attention"
L2_BYTES = 60 << 20

FULL_L = (1024, 4096, 16384, 65536, 131072, 262144)
FULL_T = (1, 9, 17, 65, 257)
FULL_B = (1, 8, 32)
#: The most page sets (rotations) a workload keeps.
MAX_ROTATIONS = 32


def rotations(kv_bytes: int, min_rotations: int = 1) -> int:
    """How many disjoint page sets a workload of ``kv_bytes`` rotates through: enough for 2 x L2
    of KV, at least ``min_rotations``, at most :data:`MAX_ROTATIONS`."""
    return min(MAX_ROTATIONS, max(min_rotations, math.ceil(2 * L2_BYTES / max(kv_bytes, 1))))


def kv_token_bytes(layout: HeadLayout, dtype: torch.dtype) -> int:
    """The paged cache's bytes a token: K and V of every KV head (GQA) or the latent + rope (MLA)."""
    elem = torch.finfo(dtype).bits // 8
    if layout.kind == "gqa":
        return layout.hkv * layout.d * 2 * elem
    return (layout.d + layout.rope) * elem


#: How the bench lays each request's pages out in the pool (:class:`Options.page_order`).
PAGE_ORDERS = ("random", "sequential")
# Run order of the default grid (what a short budget must measure first): batch 1 at long
# context and the main tree sizes, then short context, then larger batches, then T 9 / 257.
CORE_L = (16384, 131072, 65536, 262144)  # in this order
CORE_T = (1, 17, 65)
QUICK_L = (16384, 131072)
QUICK_T = (17, 65)
#: ``--tune`` also tries one split (no merge) up to this prefix length; beyond it a single CTA
#: column costs milliseconds (0.9-2.4 ms at 64k in session-4 call N) and eats the time box.
ONE_SPLIT_MAX_L = 16384
#: Lengths the ``--tune`` sweep visits (batch 1, T in QUICK_T).
TUNE_L = (16384, 65536, 131072)
QUICK_B = (1,)
SMOKE_L = (40, 97)
SMOKE_T = (1, 5)
SMOKE_B = (1, 2)

ALL_PROVIDERS = (
    "ours",
    "ours_graph",
    "ours_cuda_graph",
    "ours_wgmma_graph",
    "ours_seesaw_graph",
    "ours_gqa_graph",
    "ref",
    "sdpa_dense",
    "flex",
    "fi_mask",
    "fi_cascade",
    "fi_mla",
    "eager_mla",
)


@dataclass(frozen=True)
class HeadLayout:
    name: str
    kind: str  # "gqa" | "mla"
    hq: int
    hkv: int
    d: int  # head dim (gqa) or kv_lora_rank (mla)
    rope: int = 0


LAYOUTS = {
    "gqa_32q8kv_d128": HeadLayout("gqa_32q8kv_d128", "gqa", 32, 8, 128),
    "gqa_8q1kv_d128": HeadLayout("gqa_8q1kv_d128", "gqa", 8, 1, 128),
    "mla_h8": HeadLayout("mla_h8", "mla", 8, 1, 512, 64),
    "mla_h16": HeadLayout("mla_h16", "mla", 16, 1, 512, 64),
}
#: Layouts outside the default grid, run when named: the shipped target's own attention
#: (4 heads, latent 64 + rope 16), so ``--tune`` can fit the decode engine's launches.
ENGINE_LAYOUTS = {
    "mla_h4_r64": HeadLayout("mla_h4_r64", "mla", 4, 1, 64, 16),
}
SMOKE_LAYOUTS = {
    "gqa_4q2kv_d32": HeadLayout("gqa_4q2kv_d32", "gqa", 4, 2, 32),
    "mla_h2_r64": HeadLayout("mla_h2_r64", "mla", 2, 1, 64, 16),
}


def known_layouts(smoke: bool) -> tuple[dict[str, HeadLayout], dict[str, HeadLayout]]:
    """(every layout that may be named, the default grid's layouts)."""
    if smoke:
        return SMOKE_LAYOUTS, SMOKE_LAYOUTS
    return {**LAYOUTS, **ENGINE_LAYOUTS}, LAYOUTS


class Skip(Exception):
    """A provider does not apply at this point (the reason becomes a row)."""


@dataclass
class Options:
    providers: tuple[str, ...] = ALL_PROVIDERS
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    lengths: tuple[int, ...] = FULL_L
    trees: tuple[int, ...] = FULL_T
    batches: tuple[int, ...] = FULL_B
    page_size: int = 16
    # "random": each request's pages a random permutation of the pool (a fragmented cache, the
    # default); "sequential": its pages consecutive in the pool (a cache allocated in order)
    page_order: str = "random"
    # at least this many disjoint page sets (rotations) whatever the KV size: the default rule
    # keeps 2 x L2 of KV in rotation, so a KV above 120 MB is read again from one set each call
    min_rotations: int = 1
    dtype: torch.dtype = torch.bfloat16
    max_seconds: float = 360.0
    all_points: bool = False  # run slow peers everywhere, not only on their default domain
    seed: int = 0
    smoke: bool = False
    tune: bool = False  # also time our kernels under candidate tile configs and split counts
    tune_lengths: tuple[int, ...] = TUNE_L  # where --tune runs (batch 1)
    tune_trees: tuple[int, ...] = QUICK_T
    point_seconds: float = 30.0  # time box per (layout, batch, L, trees) item, JIT excluded


@dataclass
class Result:
    rows: list[BenchRow] = field(default_factory=list)
    errors: int = 0
    summary: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    t = torch.tensor(xs, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def time_calls(
    fn: Callable[[int], object],
    n_rot: int,
    device: torch.device,
    *,
    per_call: int = 1,
    target_s: float = 0.04,
    min_reps: int = 5,
    max_reps: int = 40,
) -> tuple[float, float, float]:
    """p50/p20/p80 milliseconds of ``fn(r)`` (``r`` cycles through the rotations), each call
    bracketed by CUDA events; ``per_call`` divides (a graph replay holding several calls)."""
    if device.type != "cuda":  # the CPU interpreter (plumbing checks): two timed calls
        times = []
        for i in range(2):
            t0 = time.perf_counter()
            fn(i % n_rot)
            times.append((time.perf_counter() - t0) * 1e3 / per_call)
        return _quantiles(times)
    for i in range(2):
        fn(i % n_rot)
    _sync(device)
    t0 = time.perf_counter()
    fn(0)
    _sync(device)
    est = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max_reps, max(min_reps, target_s / est)))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(i % n_rot)
        end.record()
    torch.cuda.synchronize(device)
    return _quantiles([s.elapsed_time(e) / per_call for s, e in events])


def _host_ms(fn: Callable[[], object], device: torch.device, reps: int = 3) -> float:
    """Median wall time of ``fn`` including a device sync (host-side work such as plan())."""
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


# ----------------------------------------------------------------------------- workloads


def _random_tree_vis(batch: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """``bool [B, T, T]``: a random tree per request (parents before children)."""
    vis = torch.zeros(batch, t, t, dtype=torch.bool)
    idx = torch.arange(t)
    vis[:, idx, idx] = True
    for j in range(1, t):
        parents = torch.randint(0, j, (batch,), generator=gen)
        vis[:, j] |= vis[torch.arange(batch), parents]
    return vis


class Workload:
    """A paged cache for one (layout, batch, L) holding ``L + t_max`` tokens per request, in
    ``n_rot`` disjoint page sets (rotations) so that the working set exceeds L2."""

    def __init__(
        self,
        layout: HeadLayout,
        batch: int,
        length: int,
        t_max: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
        page_order: str = "random",
        min_rotations: int = 1,
    ):
        if page_order not in PAGE_ORDERS:
            raise ValueError(f"page_order={page_order!r}: expected one of {PAGE_ORDERS}")
        if not 1 <= min_rotations <= MAX_ROTATIONS:
            raise ValueError(f"min_rotations={min_rotations}: expected 1..{MAX_ROTATIONS}")
        self.page_order = page_order
        self.layout, self.batch, self.length, self.t_max = layout, batch, length, t_max
        self.page_size, self.dtype, self.device = page_size, dtype, device
        self.pages_per_req = math.ceil((length + t_max) / page_size)
        self.kv_bytes = batch * (length + t_max) * self.token_bytes
        self.n_rot = rotations(self.kv_bytes, min_rotations)
        if device.type != "cuda":
            self.n_rot = min(self.n_rot, max(2, min_rotations))  # (small KV: two unless asked)
        total_pages = self.n_rot * batch * self.pages_per_req
        gen = torch.Generator(device=device).manual_seed(seed)
        shape = (total_pages, page_size)
        if layout.kind == "gqa":
            self.k = torch.empty(*shape, layout.hkv, layout.d, dtype=dtype, device=device)
            self.v = torch.empty_like(self.k)
            self.k.normal_(generator=gen)
            self.v.normal_(generator=gen)
        else:
            self.kv = torch.empty(*shape, layout.d + layout.rope, dtype=dtype, device=device)
            self.kv.normal_(generator=gen)
        if page_order == "random":
            perm = torch.randperm(total_pages, generator=gen, device=device).to(torch.int32)
        else:
            perm = torch.arange(total_pages, device=device, dtype=torch.int32)
        per_rot = batch * self.pages_per_req
        self.tables = [
            perm[r * per_rot : (r + 1) * per_rot].view(batch, self.pages_per_req).contiguous()
            for r in range(self.n_rot)
        ]
        self.prefix_lens = torch.full((batch,), length, dtype=torch.int32, device=device)
        self._contig: dict[int, tuple] = {}

    @property
    def token_bytes(self) -> int:
        return kv_token_bytes(self.layout, self.dtype)

    @staticmethod
    def bytes_needed(
        layout: HeadLayout,
        batch: int,
        length: int,
        t_max: int,
        dtype: torch.dtype,
        min_rotations: int = 1,
    ) -> int:
        kv = batch * (length + t_max) * kv_token_bytes(layout, dtype)
        return rotations(kv, min_rotations) * kv

    def gather(self, cache: torch.Tensor, r: int, n: int) -> torch.Tensor:
        """Logical positions ``0..n-1`` of every request of rotation ``r``: ``[B, n, ...]``."""
        pos = torch.arange(n, device=self.device)
        pages = self.tables[r].to(torch.int64)[:, pos // self.page_size]
        slots = pages * self.page_size + pos % self.page_size
        flat = cache.reshape(-1, *cache.shape[2:])
        return flat.index_select(0, slots.reshape(-1)).reshape(self.batch, n, *cache.shape[2:])

    def contiguous_rotations(self, max_bytes: int) -> int:
        """How many contiguous copies (one per rotation) the dense providers use."""
        n = max(1, math.ceil(2 * L2_BYTES / max(self.kv_bytes, 1)))
        if self.kv_bytes * n > max_bytes:
            raise Skip(f"contiguous K/V copies need {self.kv_bytes * n / 2**30:.1f} GiB")
        return min(n, self.n_rot)

    def contiguous(self, r: int):
        """Rotation ``r`` gathered into contiguous ``[B, H, L + t_max, D]`` (GQA: K, V) or
        ``[B, L + t_max, rank + rope]`` (MLA), cached."""
        if r not in self._contig:
            n = self.length + self.t_max
            if self.layout.kind == "gqa":
                k = self.gather(self.k, r, n).transpose(1, 2).contiguous()
                v = self.gather(self.v, r, n).transpose(1, 2).contiguous()
                self._contig[r] = (k, v)
            else:
                self._contig[r] = (self.gather(self.kv, r, n).contiguous(),)
        return self._contig[r]


@dataclass
class TreeInputs:
    t: int
    q: torch.Tensor | None  # gqa [B, T, Hq, D]
    q_nope: torch.Tensor | None
    q_pe: torch.Tensor | None
    vis: torch.Tensor  # bool [B, T, T] on device
    tree_mask: torch.Tensor  # int64 [B, T, W]
    scale: float


def make_tree_inputs(wl: Workload, t: int, seed: int) -> TreeInputs:
    from kdtree.spec.bitmask import pack_bits

    gen = torch.Generator().manual_seed(seed + 7919 * t)
    vis = _random_tree_vis(wl.batch, t, gen)
    lay, dev, dt = wl.layout, wl.device, wl.dtype
    dgen = torch.Generator(device=dev).manual_seed(seed + t)
    if lay.kind == "gqa":
        q = torch.randn(wl.batch, t, lay.hq, lay.d, generator=dgen, device=dev, dtype=dt)
        qn = qp = None
        scale = lay.d**-0.5
    else:
        q = None
        qn = torch.randn(wl.batch, t, lay.hq, lay.d, generator=dgen, device=dev, dtype=dt)
        qp = torch.randn(wl.batch, t, lay.hq, lay.rope, generator=dgen, device=dev, dtype=dt)
        scale = (lay.d + lay.rope) ** -0.5
    return TreeInputs(t, q, qn, qp, vis.to(dev), pack_bits(vis).to(dev), scale)


# ----------------------------------------------------------------------------- providers
# Each setup returns (fn(r) -> output, calls per fn, extra rows-info dict); raises Skip.


def _head_tensors(wl: Workload, ti: TreeInputs) -> tuple[torch.Tensor, ...]:
    """The layout's leading attention arguments: ``(q, k, v)`` or ``(q_nope, q_pe, kv)``."""
    if wl.layout.kind == "gqa":
        return ti.q, wl.k, wl.v
    return ti.q_nope, ti.q_pe, wl.kv


def _ours_fn(wl: Workload, ti: TreeInputs):
    from kdtree.kernels import TreeAttentionPlan, tree_attention_mla_triton, tree_attention_triton

    lay = wl.layout
    sizes = dict(
        max_batch=wl.batch,
        max_tree=ti.t,
        max_prefix_len=wl.pages_per_req * wl.page_size,
        device=wl.device,
    )
    if lay.kind == "gqa":
        plan = TreeAttentionPlan.for_gqa(
            num_q_heads=lay.hq, num_kv_heads=lay.hkv, head_dim=lay.d, **sizes
        )
        attend = tree_attention_triton
    else:
        plan = TreeAttentionPlan.for_mla(
            num_heads=lay.hq, kv_lora_rank=lay.d, rope_dim=lay.rope, **sizes
        )
        attend = tree_attention_mla_triton
    head = _head_tensors(wl, ti)
    out = torch.empty_like(head[0])

    def fn(r):
        return attend(
            *head,
            wl.tables[r],
            wl.prefix_lens,
            ti.tree_mask,
            sm_scale=ti.scale,
            plan=plan,
            out=out,
            check_values=False,
        )

    return fn, plan


def setup_ours(wl, ti, opts):
    fn, plan = _ours_fn(wl, ti)
    return fn, 1, {"workspace_MiB": round(plan.nbytes / 2**20, 1)}


def _cuda_mla_fn(wl: Workload, ti: TreeInputs, kernel: str, num_splits: int | None = None):
    """The sm_90 CUDA C++ MLA kernel (``kernels/mla_tree_sm90.cu``; ``kernel`` picks its split
    kernel) with its workspace and split count (``num_splits``, default
    :func:`~kdtree.kernels.cuda_mla.choose_splits`) fixed up front, as the engine would hold
    them."""
    if wl.layout.kind != "mla":
        raise Skip("the CUDA C++ kernel is MLA only")
    from kdtree.kernels import cuda_mla

    if not cuda_mla.available():
        raise Skip("CUDA MLA kernel unavailable (needs sm_90 and nvcc)")
    from kdtree.kernels.workspace import device_sm_count

    t, h = ti.t, wl.layout.hq
    splits = num_splits or cuda_mla.choose_splits(
        wl.batch, h * t, wl.pages_per_req * wl.page_size, device_sm_count(wl.device)
    )
    ws = torch.empty(
        max(cuda_mla.workspace_numel(wl.batch, t, h, splits), 4),
        dtype=torch.float32,
        device=wl.device,
    )
    head = _head_tensors(wl, ti)
    out = torch.empty_like(head[0])

    def fn(r):
        return cuda_mla.tree_attention_mla_cuda(
            *head, wl.tables[r], wl.prefix_lens, ti.tree_mask, sm_scale=ti.scale,
            out=out, num_splits=splits, workspace=ws, kernel=kernel,
        )  # fmt: skip

    return fn, splits


def setup_ours_cuda_graph(wl, ti, opts):
    if wl.device.type != "cuda":
        raise Skip("CUDA graphs need a GPU")
    fn, splits = _cuda_mla_fn(wl, ti, kernel="mma")
    return (*_graphed(fn, wl.n_rot, wl.device), {"splits": splits, "kernel": "mma"})


def setup_ours_wgmma_graph(wl, ti, opts):
    if wl.device.type != "cuda":
        raise Skip("CUDA graphs need a GPU")
    fn, splits = _cuda_mla_fn(wl, ti, kernel="wgmma")
    return (*_graphed(fn, wl.n_rot, wl.device), {"splits": splits, "kernel": "wgmma"})


def setup_ours_seesaw_graph(wl, ti, opts):
    if wl.device.type != "cuda":
        raise Skip("CUDA graphs need a GPU")
    from kdtree.kernels.cuda_common import split_pdl

    fn, splits = _cuda_mla_fn(wl, ti, kernel="seesaw")
    cfg = {"splits": splits, "kernel": "seesaw", "split_pdl": split_pdl()}
    return (*_graphed(fn, wl.n_rot, wl.device), cfg)


def _cuda_gqa_fn(wl: Workload, ti: TreeInputs, num_splits: int | None = None):
    """The sm_90 CUDA C++ GQA kernel (``kernels/gqa_tree_sm90.cu``) with its workspace and
    split count (default :func:`~kdtree.kernels.cuda_gqa.plan_launch`'s) fixed up front."""
    lay = wl.layout
    if lay.kind != "gqa" or lay.d != 128:
        raise Skip("the CUDA C++ GQA kernel is GQA with head dim 128")
    from kdtree.kernels import cuda_gqa

    if not cuda_gqa.available():
        raise Skip("CUDA GQA kernel unavailable (needs sm_90 and nvcc)")
    plan = _gqa_plan(wl, ti, num_splits)
    splits = plan.num_splits
    ws = torch.empty(max(plan.workspace_numel, 4), dtype=torch.float32, device=wl.device)
    head = _head_tensors(wl, ti)
    out = torch.empty_like(head[0])

    def fn(r):
        return cuda_gqa.tree_attention_gqa_cuda(
            *head, wl.tables[r], wl.prefix_lens, ti.tree_mask, sm_scale=ti.scale,
            out=out, num_splits=splits, workspace=ws,
        )  # fmt: skip

    return fn, splits


def _gqa_plan(wl: Workload, ti: TreeInputs, num_splits: int | None = None):
    """The CUDA GQA kernel's launch for this workload (:func:`~kdtree.kernels.cuda_gqa.plan_launch`)."""
    from kdtree.kernels import cuda_gqa
    from kdtree.kernels.workspace import device_sm_count

    lay = wl.layout
    return cuda_gqa.plan_launch(
        wl.batch, ti.t, lay.hq, lay.hkv, wl.pages_per_req * wl.page_size,
        device_sm_count(wl.device), num_splits,
    )  # fmt: skip


#: The GQA launch's merge (``GqaLaunch.merge``) as recorded in a row's config.
MERGE_NAMES = {0: "triton", 1: "plain", 2: "pdl"}


def setup_ours_gqa_graph(wl, ti, opts):
    if wl.device.type != "cuda":
        raise Skip("CUDA graphs need a GPU")
    fn, splits = _cuda_gqa_fn(wl, ti)
    plan = _gqa_plan(wl, ti, splits)
    from kdtree.kernels.cuda_common import split_pdl

    return (
        *_graphed(fn, wl.n_rot, wl.device),
        {"splits": plan.num_splits, "kernel": "gqa_sm90", "warpgroups": plan.wgs,
         "tail_blocks": plan.tail_blocks, "split_tail": plan.split, "q_groups": plan.q_groups,
         "split_pdl": split_pdl(), "merge": MERGE_NAMES.get(plan.merge, str(plan.merge)),
         "trigger": plan.trigger},
    )  # fmt: skip


def setup_ours_graph(wl, ti, opts):
    if wl.device.type != "cuda":
        raise Skip("CUDA graphs need a GPU")
    fn, _ = _ours_fn(wl, ti)
    return (*_graphed(fn, wl.n_rot, wl.device), {})


def _graphed(fn: Callable[[int], object], n_rot: int, device: torch.device):
    """``(replay, per_call)``: ``fn`` over all ``n_rot`` rotations captured in one CUDA graph
    (after a warm call on a side stream); on the CPU, ``fn`` itself with ``per_call = 1``.
    Rotation 0 is captured last, so what ``replay`` returns (the output buffer every call
    writes) is rotation 0's result, comparable with an eager ``fn(0)``."""
    if device.type != "cuda":
        return fn, 1
    fn(0)
    torch.cuda.synchronize(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(0)  # warm on the side stream, as torch's capture recipe asks
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in [*range(1, n_rot), 0]:
            out = fn(r)
    return (lambda _r: (graph.replay(), out)[1]), n_rot


def setup_ref(wl, ti, opts):
    from kdtree.attention import tree_attention, tree_attention_mla

    if not opts.all_points and (wl.batch > 1 or wl.length > 16384) and wl.device.type == "cuda":
        raise Skip("ref runs at batch 1, L <= 16k (use --all-points)")
    attend = tree_attention if wl.layout.kind == "gqa" else tree_attention_mla
    head = _head_tensors(wl, ti)

    def fn(r):
        return attend(
            *head, wl.tables[r], wl.prefix_lens, ti.tree_mask, sm_scale=ti.scale, backend="ref"
        )

    return fn, 1, {}


def _dense_additive(wl: Workload, ti: TreeInputs) -> torch.Tensor:
    """``[B, 1, T, L + T]`` additive mask (0 visible, -inf hidden) in the workload dtype."""
    b, t, n = wl.batch, ti.t, wl.length + ti.t
    allowed = torch.ones(b, t, n, dtype=torch.bool, device=wl.device)
    allowed[:, :, wl.length :] = ti.vis
    zero = torch.zeros((), dtype=wl.dtype, device=wl.device)
    return torch.where(allowed, zero, float("-inf")).to(wl.dtype)[:, None]


def _free_bytes(device) -> int:
    if device.type != "cuda":
        return 8 << 30
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def setup_sdpa_dense(wl, ti, opts):
    import torch.nn.functional as F

    if wl.layout.kind != "gqa":
        raise Skip("GQA only (MLA's dense-mask peer is eager_mla)")
    if not opts.all_points and (wl.batch > 8 or wl.length > 131072):
        raise Skip("sdpa_dense runs at batch <= 8, L <= 128k (use --all-points)")
    mask_bytes = wl.batch * ti.t * (wl.length + ti.t) * 2
    n = wl.contiguous_rotations(max(0, _free_bytes(wl.device) // 2 - mask_bytes))
    mask = _dense_additive(wl, ti)
    qh = ti.q.transpose(1, 2)
    n_keys = wl.length + ti.t

    def fn(r):
        k, v = wl.contiguous(r % n)
        return F.scaled_dot_product_attention(
            qh, k[:, :, :n_keys], v[:, :, :n_keys], attn_mask=mask, scale=ti.scale, enable_gqa=True
        ).transpose(1, 2)

    return fn, 1, {"rotations": n}


_FLEX: dict[str, Callable] = {}


def _flex_compiled():
    if "fn" not in _FLEX:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        for name in (
            "cache_size_limit",
            "recompile_limit",
            "accumulated_cache_size_limit",
            "accumulated_recompile_limit",
        ):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 512)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def build_tree_block_mask(
    prefix_lens: torch.Tensor, vis: torch.Tensor, length: int, block: int = 128
):
    """A FlexAttention BlockMask for the tree: KV blocks wholly inside the prefix are *full*
    (``mask_mod`` skipped), only the blocks holding tree keys are partial. O(L / block)
    metadata, no Q x KV evaluation."""
    from torch.nn.attention.flex_attention import BlockMask

    b, t, _ = vis.shape
    dev = vis.device
    n_keys = length + t
    n_kv_blocks = math.ceil(n_keys / block)
    n_q_blocks = math.ceil(t / block)
    n_full = length // block
    kv_idx = torch.arange(n_kv_blocks, dtype=torch.int32, device=dev)
    full_num = torch.full((b, 1, n_q_blocks), n_full, dtype=torch.int32, device=dev)
    full_idx = kv_idx.expand(b, 1, n_q_blocks, n_kv_blocks).contiguous()
    part_num = torch.full((b, 1, n_q_blocks), n_kv_blocks - n_full, dtype=torch.int32, device=dev)
    part_idx = torch.roll(kv_idx, -n_full).expand(b, 1, n_q_blocks, n_kv_blocks).contiguous()
    lens = prefix_lens.to(torch.int64)

    def mask_mod(bi, hi, qi, ki):
        rel = ki - lens[bi]
        in_tree = (rel >= 0) & (rel < t)
        return (rel < 0) | (in_tree & vis[bi, qi, rel.clamp(0, t - 1)])

    return BlockMask.from_kv_blocks(
        part_num,
        part_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=(t, n_keys),
    )


def setup_flex(wl, ti, opts):
    if wl.layout.kind != "gqa":
        raise Skip("GQA only (FlexAttention has no absorbed-MLA kernel)")
    if wl.device.type != "cuda":
        raise Skip("FlexAttention needs a GPU here")
    if not opts.all_points and (
        wl.batch > 1 or wl.length not in (16384, 131072) or ti.t not in (17, 65)
    ):
        raise Skip(
            "flex runs at batch 1, L in {16k, 128k}, T in {17, 65} (each shape "
            "compiles; use --all-points)"
        )
    n = wl.contiguous_rotations(_free_bytes(wl.device) // 2)
    flex = _flex_compiled()
    t0 = time.perf_counter()
    bm = build_tree_block_mask(wl.prefix_lens, ti.vis, wl.length)
    _sync(wl.device)
    build_ms = (time.perf_counter() - t0) * 1e3
    qh = ti.q.transpose(1, 2).contiguous()
    n_keys = wl.length + ti.t

    def fn(r):
        k, v = wl.contiguous(r % n)
        return flex(
            qh, k[:, :, :n_keys], v[:, :, :n_keys], block_mask=bm, scale=ti.scale, enable_gqa=True
        ).transpose(1, 2)

    try:
        fn(0)
    except Exception as exc:
        raise Skip(f"compile failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
    return fn, 1, {"rotations": n, "plan_ms": build_ms, "plan_what": "blockmask_build"}


def _flashinfer():
    import flashinfer

    return flashinfer


def _fi_indices(wl: Workload, r: int, n_tokens: int):
    """kv_indptr, kv_indices, last_page_len for ``n_tokens`` per request of rotation ``r``."""
    ps = wl.page_size
    n_pages = math.ceil(n_tokens / ps)
    indices = wl.tables[r][:, :n_pages].reshape(-1).contiguous()
    indptr = torch.arange(wl.batch + 1, dtype=torch.int32, device=wl.device) * n_pages
    last = torch.full(
        (wl.batch,), n_tokens - (n_pages - 1) * ps, dtype=torch.int32, device=wl.device
    )
    return indptr, indices, last


_FI_WS: list[torch.Tensor] = []


def _fi_workspaces(n: int, device) -> list[torch.Tensor]:
    while len(_FI_WS) < n:
        # 256 MiB: at 8q/1kv, L=16k, T=17 the custom-mask prefill asked for 129 MiB of split
        # partials (a 128 MiB buffer overflowed on the H200)
        _FI_WS.append(torch.empty(256 << 20, dtype=torch.uint8, device=device))
    return _FI_WS[:n]


def _fi_prefill_wrappers(fi, wl, ti, n, n_keys, wrapper_kwargs, plan_kwargs):
    """``(wrappers, plan_ms)``: one GQA paged-prefill wrapper per rotation ``0..n-1``, planned
    over ``n_keys`` keys per request (``plan_kwargs``: the mask), and the first plan's host ms."""
    lay, b, t = wl.layout, wl.batch, ti.t
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=wl.device) * t
    wrappers = []
    plan_ms = 0.0
    for r, ws in zip(range(n), _fi_workspaces(n, wl.device), strict=True):
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", **wrapper_kwargs)
        indptr, indices, last = _fi_indices(wl, r, n_keys)

        def plan(w=w, indptr=indptr, indices=indices, last=last):
            w.plan(
                qo_indptr,
                indptr,
                indices,
                last,
                lay.hq,
                lay.hkv,
                lay.d,
                wl.page_size,
                **plan_kwargs,
                q_data_type=wl.dtype,
                kv_data_type=wl.dtype,
                sm_scale=ti.scale,
            )

        plan_ms = _host_ms(plan, wl.device) if r == 0 else plan_ms
        if r:
            plan()
        wrappers.append(w)
    return wrappers, plan_ms


def setup_fi_mask(wl, ti, opts):
    if wl.layout.kind != "gqa":
        raise Skip("GQA only")
    if wl.device.type != "cuda":
        raise Skip("FlashInfer needs a GPU")
    fi = _flashinfer()
    lay, b, t = wl.layout, wl.batch, ti.t
    n_keys = wl.length + t
    n = min(wl.n_rot, 8)
    allowed = torch.ones(b, t, n_keys, dtype=torch.bool, device=wl.device)
    allowed[:, :, wl.length :] = ti.vis
    flat_mask = allowed.reshape(-1)
    wrappers, plan_ms = _fi_prefill_wrappers(fi, wl, ti, n, n_keys, {}, {"custom_mask": flat_mask})
    q = ti.q.reshape(b * t, lay.hq, lay.d)

    def fn(r):
        return wrappers[r % n].run(q, (wl.k, wl.v)).view(b, t, lay.hq, lay.d)

    return fn, 1, {"rotations": n, "plan_ms": plan_ms, "plan_what": "plan_with_mask_packing"}


def _tree_kv(wl: Workload, cache: torch.Tensor, t: int) -> torch.Tensor:
    """The tree tokens' entries (logical ``L .. L+T-1``) of rotation 0, ``[B, T, ...]``."""
    return wl.gather(cache, 0, wl.length + t)[:, wl.length :].contiguous()


def setup_fi_cascade(wl, ti, opts):
    if wl.layout.kind != "gqa":
        raise Skip("GQA only (MLA: fi_mla)")
    if wl.device.type != "cuda":
        raise Skip("FlashInfer needs a GPU")
    fi = _flashinfer()
    lay, b, t = wl.layout, wl.batch, ti.t
    n = min(wl.n_rot, 8)
    wrappers, plan_ms = _fi_prefill_wrappers(
        fi, wl, ti, n, wl.length, {"backend": "fa3"}, {"causal": False}
    )
    q = ti.q.reshape(b * t, lay.hq, lay.d)
    k_tree = _tree_kv(wl, wl.k, t)  # [B, T, Hkv, D]: contiguous, as right after projection
    v_tree = _tree_kv(wl, wl.v, t)
    vis = ti.vis

    def fn(r):
        o1, s1 = wrappers[r % n].run(q, (wl.k, wl.v), return_lse=True)
        parts = [
            fi.single_prefill_with_kv_cache(
                ti.q[i],
                k_tree[i],
                v_tree[i],
                custom_mask=vis[i],
                sm_scale=ti.scale,
                return_lse=True,
            )
            for i in range(b)
        ]
        o2 = torch.cat([p[0] for p in parts])
        s2 = torch.cat([p[1] for p in parts])
        out, _ = fi.merge_state(o1, s1, o2, s2)
        return out.view(b, t, lay.hq, lay.d)

    def prefix_only(r):
        return wrappers[r % n].run(q, (wl.k, wl.v), return_lse=True)[0]

    return (
        fn,
        1,
        {
            "rotations": n,
            "plan_ms": plan_ms,
            "plan_what": "plan",
            "component": ("fi_cascade_prefix", prefix_only),
        },
    )


def _tree_part_mla(ti: TreeInputs, lat_tree: torch.Tensor, rank: int):
    """Eager absorbed attention of the tree queries to the tree keys; LSE in base 2."""
    c, kp = lat_tree[..., :rank], lat_tree[..., rank:]
    s = torch.einsum("bthr,bsr->bths", ti.q_nope, c).float()
    s = (s + torch.einsum("bthp,bsp->bths", ti.q_pe, kp).float()) * ti.scale
    s = s.masked_fill(~ti.vis[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).to(lat_tree.dtype)
    o = torch.einsum("bths,bsr->bthr", p, c)
    return o, lse / math.log(2.0)


def setup_fi_mla(wl, ti, opts):
    if wl.layout.kind != "mla":
        raise Skip("MLA only")
    if wl.device.type != "cuda":
        raise Skip("FlashInfer needs a GPU")
    fi = _flashinfer()
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    lay, b, t = wl.layout, wl.batch, ti.t
    if wl.kv.numel() * wl.kv.element_size() > _free_bytes(wl.device) // 2:
        raise Skip("no memory for the split ckv / kpe caches")
    ckv = wl.kv[..., : lay.d].contiguous()
    kpe = wl.kv[..., lay.d :].contiguous()
    n = min(wl.n_rot, 8)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=wl.device) * t
    kv_len = torch.full((b,), wl.length, dtype=torch.int32, device=wl.device)
    wrappers = []
    plan_ms = 0.0
    for r, ws in zip(range(n), _fi_workspaces(n, wl.device), strict=True):
        w = BatchMLAPagedAttentionWrapper(ws, backend="fa3")
        indptr, indices, _ = _fi_indices(wl, r, wl.length)

        def plan(w=w, indptr=indptr, indices=indices):
            w.plan(
                qo_indptr,
                indptr,
                indices,
                kv_len,
                lay.hq,
                lay.d,
                lay.rope,
                wl.page_size,
                False,
                ti.scale,
                wl.dtype,
                wl.dtype,
            )

        plan_ms = _host_ms(plan, wl.device) if r == 0 else plan_ms
        if r:
            plan()
        wrappers.append(w)
    qn = ti.q_nope.reshape(b * t, lay.hq, lay.d)
    qp = ti.q_pe.reshape(b * t, lay.hq, lay.rope)
    lat_tree = _tree_kv(wl, wl.kv, t)  # [B, T, rank + rope]

    def fn(r):
        o1, s1 = wrappers[r % n].run(qn, qp, ckv, kpe, return_lse=True)
        o2, s2 = _tree_part_mla(ti, lat_tree, lay.d)
        out, _ = fi.merge_state(
            o1, s1, o2.reshape(b * t, lay.hq, lay.d), s2.reshape(b * t, lay.hq).contiguous()
        )
        return out.view(b, t, lay.hq, lay.d)

    def prefix_only(r):
        return wrappers[r % n].run(qn, qp, ckv, kpe, return_lse=True)[0]

    return (
        fn,
        1,
        {
            "rotations": n,
            "plan_ms": plan_ms,
            "plan_what": "plan",
            "component": ("fi_mla_prefix", prefix_only),
        },
    )


def setup_eager_mla(wl, ti, opts):
    if wl.layout.kind != "mla":
        raise Skip("MLA only")
    lay, b, t = wl.layout, wl.batch, ti.t
    n_keys = wl.length + t
    score_bytes = b * lay.hq * t * n_keys * 4 * 3
    if not opts.all_points and wl.device.type == "cuda" and b > 1:
        raise Skip("eager_mla runs at batch 1 (use --all-points)")
    if score_bytes > _free_bytes(wl.device) // 2:
        raise Skip(f"scores need {score_bytes / 2**30:.1f} GiB")
    n = wl.contiguous_rotations(_free_bytes(wl.device) // 4)
    mask = _dense_additive(wl, ti)  # [B, 1, T, N]

    def fn(r):
        (lat,) = wl.contiguous(r % n)
        lat = lat[:, :n_keys]
        c, kp = lat[..., : lay.d], lat[..., lay.d :]
        s = torch.einsum("bthr,bnr->bhtn", ti.q_nope, c).float()
        s = (s + torch.einsum("bthp,bnp->bhtn", ti.q_pe, kp).float()) * ti.scale + mask
        p = s.softmax(-1).to(lat.dtype)
        return torch.einsum("bhtn,bnr->bthr", p, c)

    return fn, 1, {"rotations": n}


SETUPS: dict[str, Callable] = {
    "ours": setup_ours,
    "ours_graph": setup_ours_graph,
    "ours_cuda_graph": setup_ours_cuda_graph,
    "ours_wgmma_graph": setup_ours_wgmma_graph,
    "ours_seesaw_graph": setup_ours_seesaw_graph,
    "ours_gqa_graph": setup_ours_gqa_graph,
    "ref": setup_ref,
    "sdpa_dense": setup_sdpa_dense,
    "flex": setup_flex,
    "fi_mask": setup_fi_mask,
    "fi_cascade": setup_fi_cascade,
    "fi_mla": setup_fi_mla,
    "eager_mla": setup_eager_mla,
}


# ----------------------------------------------------------------------------- the run


def _points(opts: Options) -> Iterator[tuple[HeadLayout, int, int, tuple[int, ...]]]:
    """(layout, batch, L, trees) in priority order: batch 1 x ``CORE_L`` x ``CORE_T`` first
    (every layout and provider), then batch 1 at the other lengths, then larger batches, and
    the other tree sizes last; each (layout, batch, L) appears once per tree group. Lengths
    named on the command line (``--lengths``, anything but the default grid) run in the order
    given: session 6's ``--lengths 128k,64k,16k`` spent its whole time box at 16k, run first."""
    layouts, default = known_layouts(opts.smoke)
    chosen = [layouts[n] for n in opts.layouts if n in layouts] or list(default.values())
    core_t = tuple(t for t in opts.trees if t in CORE_T) or tuple(opts.trees)
    other_t = tuple(t for t in opts.trees if t not in core_t)

    explicit = tuple(opts.lengths) not in (FULL_L, SMOKE_L)

    def phase(b: int, n: int, trees: tuple[int, ...]) -> int:
        if trees is other_t:
            return 3
        if b != min(opts.batches):
            return 2
        return 0 if explicit or n in CORE_L else 1

    def rank(n: int) -> tuple[int, int]:
        return (0, list(opts.lengths).index(n)) if explicit else _length_rank(n)

    items = []
    for trees in (core_t, other_t):
        if not trees:
            continue
        for b in opts.batches:
            for n in opts.lengths:
                for lay in chosen:
                    items.append((phase(b, n, trees), b, rank(n), n, lay, trees))
    items.sort(key=lambda it: (it[0], it[1], it[2], it[4].name))
    for _, b, _, n, lay, trees in items:
        yield lay, b, n, trees


def _length_rank(n: int) -> tuple[int, int]:
    """``CORE_L`` in its listed order, then the others longest first (4k before 1k)."""
    return (0, CORE_L.index(n)) if n in CORE_L else (1, -n)


class _Runner:
    def __init__(
        self,
        opts: Options,
        ceilings: Ceilings | None,
        device: torch.device,
        log: Callable[[str], None],
    ):
        self.opts, self.ceilings, self.device, self.log = opts, ceilings, device, log
        self.result = Result()
        self.t_start = time.time()
        self.disabled: dict[str, str] = {}
        self.warmed: set[str] = set()
        self.point_deadline = math.inf

    def _cfg(self, wl: Workload, t: int, **extra) -> dict:
        lay = wl.layout
        if lay.kind == "gqa":
            nbytes, flops = gqa_cost(wl.batch, wl.length, t, lay.hq, lay.hkv, lay.d)
        else:
            nbytes, flops = mla_cost(wl.batch, wl.length, t, lay.hq, lay.d, lay.rope)
        cfg = {
            "layout": lay.name,
            "kind": lay.kind,
            "hq": lay.hq,
            "hkv": lay.hkv,
            "d": lay.d,
            "rope": lay.rope,
            "batch": wl.batch,
            "L": wl.length,
            "T": t,
            "page_size": wl.page_size,
            "page_order": wl.page_order,
            "dtype": str(wl.dtype),
            "n_rot": wl.n_rot,
            "bytes": nbytes,
            "flops": flops,
        }
        if self.ceilings is not None:
            cfg["floor_ms"] = floor_ms(nbytes, flops, self.ceilings)
            cfg.update(self.ceilings.as_dict())
        cfg.update(extra)
        return cfg

    def _name(self, lay: HeadLayout, b: int, n: int, t: int) -> str:
        return f"{lay.name}/B{b}/L{n}/T{t}"

    def error_row(self, provider: str, name: str, cfg: dict, reason: str, mode: str = "") -> None:
        cfg = dict(cfg, reason=reason)
        self.result.rows.append(
            BenchRow(
                SUITE,
                name,
                provider,
                "error",
                "",
                float("nan"),
                mode=mode,
                x_name="L",
                x_value=cfg.get("L", ""),
                config=cfg,
            )
        )
        self.result.errors += 1

    def time_rows(
        self, provider: str, name: str, cfg: dict, q: tuple[float, float, float], mode: str
    ) -> None:
        p50, p20, p80 = q
        rows = [
            BenchRow(SUITE, name, provider, "time", "ms", p50, p20, p80, mode, "L", cfg["L"], cfg)
        ]
        if p50 > 0:
            # rates = amount / time: the slow quantile (p80 time) gives the low rate (p20 slot)
            rates = [("bandwidth", "GB/s", cfg["bytes"] / 1e9),
                     ("throughput", "TFLOP/s", cfg["flops"] / 1e12)]  # fmt: skip
            if "floor_ms" in cfg:
                rates.append(("frac_of_floor", "fraction", cfg["floor_ms"] * 1e-3))
            seconds = (p50 * 1e-3, p80 * 1e-3, p20 * 1e-3)
            for metric, unit, amount in rates:
                vals = (amount / x for x in seconds)
                rows.append(
                    BenchRow(SUITE, name, provider, metric, unit, *vals, mode, "L", cfg["L"], cfg)
                )
        self.result.rows.extend(rows)

    def over_budget(self) -> bool:
        return time.time() - self.t_start > self.opts.max_seconds

    def run_point(self, lay: HeadLayout, b: int, n: int, trees: tuple[int, ...]) -> None:
        opts = self.opts
        trees = list(trees)
        t_max = max(opts.trees)  # one cache layout per (layout, batch, L) whatever the group
        need = Workload.bytes_needed(lay, b, n, t_max, opts.dtype, opts.min_rotations)
        free = _free_bytes(self.device)
        if self.over_budget() or need > 0.6 * free:
            reason = (
                "time budget spent"
                if self.over_budget()
                else f"KV needs {need / 2**30:.1f} GiB of {free / 2**30:.1f} free"
            )
            for t in trees:
                cfg = {"layout": lay.name, "batch": b, "L": n, "T": t}
                for p in opts.providers:
                    self.error_row(p, self._name(lay, b, n, t), cfg, f"skipped: {reason}")
            return
        wl = Workload(
            lay, b, n, t_max, opts.page_size, opts.dtype, self.device, opts.seed, opts.page_order,
            opts.min_rotations,
        )  # fmt: skip
        self.point_deadline = time.time() + opts.point_seconds
        try:
            for t in trees:
                ti = make_tree_inputs(wl, t, opts.seed)
                self.run_tree(wl, ti)
        finally:
            del wl
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def run_tune(self, wl: Workload, ti: TreeInputs, name: str, cfg: dict) -> None:
        """Time our kernels under each tuning candidate config and split counts 0.5x-4x the
        heuristic's, each replayed from a CUDA graph holding one call per rotation (eager
        timing would measure the host launch path, not the kernel); one row set per
        (config, splits), provider ``ours_tune[...]``, mode ``graph``."""
        from kdtree.kernels import (
            TreeAttentionPlan,
            tree_attention_mla_triton,
            tree_attention_triton,
        )
        from kdtree.kernels.heuristics import MAX_SPLITS

        lay, b, t = wl.layout, wl.batch, ti.t
        kernel = tree_attention_triton if lay.kind == "gqa" else tree_attention_mla_triton
        head = _head_tensors(wl, ti)
        tune_l, tune_t = self.opts.tune_lengths, self.opts.tune_trees
        if not self.opts.all_points and (b != 1 or wl.length not in tune_l or t not in tune_t):
            return
        rows = t * lay.hq // lay.hkv
        cap = wl.pages_per_req * wl.page_size
        dk = lay.d if lay.kind == "gqa" else lay.d + lay.rope
        plan = TreeAttentionPlan(
            lay.kind,
            max_batch=b,
            max_tree=t,
            num_kv_heads=lay.hkv,
            group=lay.hq // lay.hkv,
            head_dim_k=dk,
            head_dim_v=lay.d,
            max_prefix_len=cap,
            device=wl.device,
            min_capacity_rows=b * lay.hkv * MAX_SPLITS * (-(-rows // 16) * 16),
        )
        from kdtree import env as kenv

        saved, kenv.KERNEL_TUNING = kenv.KERNEL_TUNING, "off"  # heuristics only, explicit choices
        try:
            self._tune_candidates(wl, ti, name, cfg, kernel, head, plan, rows, dk)
        finally:
            kenv.KERNEL_TUNING = saved

    def _tune_candidates(self, wl, ti, name, cfg, kernel, head, plan, rows, dk) -> None:
        from kdtree.kernels.heuristics import MAX_SPLITS, tuning_candidates

        lay, b, t = wl.layout, wl.batch, ti.t
        for tc in tuning_candidates(lay.kind, rows, dk, lay.d):
            base = plan.num_splits(tc, b, t)
            splits = {max(1, base // 2), base, 2 * base, 4 * base}
            if wl.length <= ONE_SPLIT_MAX_L:  # no merge launch: at short context it can win
                splits.add(1)
            for s in sorted(x for x in splits if x <= MAX_SPLITS):
                pf = ("p" if tc.pt_prefetch else "") + ("t" if tc.tail else "")
                label = (
                    f"ours_tune[{tc.block_m}x{tc.block_n}w{tc.num_warps}s{tc.num_stages}{pf}/S{s}]"
                )
                if self.over_budget():
                    return
                try:

                    def fn(r, tc=tc, s=s):
                        return kernel(
                            *head,
                            wl.tables[r],
                            wl.prefix_lens,
                            ti.tree_mask,
                            sm_scale=ti.scale,
                            plan=plan,
                            num_splits=s,
                            config=tc,
                            check_values=False,
                        )

                    replay, per_call = _graphed(fn, wl.n_rot, self.device)
                    q = time_calls(replay, 1, self.device, per_call=per_call)
                    self.time_rows(
                        label,
                        name,
                        dict(
                            cfg,
                            tile=str(tc),
                            splits=s,
                            heuristic_splits=base,
                            static_L=plan.max_prefix_len,
                            group=lay.hq // lay.hkv,
                            dk=dk,
                        ),
                        q,
                        "graph" if self.device.type == "cuda" else "eager",
                    )
                    self.log(f"{name:34} {label:40} {q[0]:9.4f} ms")
                except Exception as exc:
                    self.error_row(
                        label, name, cfg, f"failed: {type(exc).__name__}: {str(exc)[:200]}"
                    )
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)

    def run_tree(self, wl: Workload, ti: TreeInputs) -> None:
        name = self._name(wl.layout, wl.batch, wl.length, ti.t)
        cfg = self._cfg(wl, ti.t)
        if self.opts.tune:
            self.run_tune(wl, ti, name, cfg)
        reference = None
        for provider in self.opts.providers:
            if provider in self.disabled:
                self.error_row(provider, name, cfg, f"skipped: {self.disabled[provider]}")
                continue
            if self.over_budget():
                self.error_row(provider, name, cfg, "skipped: time budget spent")
                continue
            if time.time() > self.point_deadline:
                self.error_row(
                    provider,
                    name,
                    cfg,
                    f"skipped: point time box ({self.opts.point_seconds:.0f} s) spent",
                )
                continue
            try:
                t_setup = time.time()
                fn, per_call, info = SETUPS[provider](wl, ti, self.opts)
                out = fn(0)
                _sync(self.device)
                if provider not in self.warmed:  # first use compiles (JIT): not charged
                    self.warmed.add(provider)
                    self.point_deadline += time.time() - t_setup
                extra = {k: v for k, v in info.items() if k not in ("component",)}
                if reference is None and provider in ("ours", "ref"):
                    reference = out.detach().clone()
                elif reference is not None:
                    extra["max_abs_diff_vs_ours"] = float(
                        (out.float() - reference.float()).abs().max()
                    )
                pcfg = dict(cfg, **extra)
                q = time_calls(fn, wl.n_rot, self.device, per_call=per_call)
                mode = "graph" if provider.endswith("_graph") else "eager"
                self.time_rows(provider, name, pcfg, q, mode)
                if "plan_ms" in info:
                    self.result.rows.append(
                        BenchRow(
                            SUITE,
                            name,
                            provider,
                            info.get("plan_what", "plan"),
                            "ms",
                            info["plan_ms"],
                            mode="plan",
                            x_name="L",
                            x_value=wl.length,
                            config=pcfg,
                        )
                    )
                if "component" in info:
                    comp_name, comp_fn = info["component"]
                    qc = time_calls(comp_fn, wl.n_rot, self.device)
                    self.time_rows(comp_name, name, pcfg, qc, "eager")
                self.log(
                    f"{name:34} {provider:11} {q[0]:9.4f} ms"
                    + (f"  {cfg['floor_ms'] / q[0]:6.1%} of floor" if "floor_ms" in cfg else "")
                )
            except Skip as exc:
                self.error_row(provider, name, cfg, f"skipped: {exc}")
            except ModuleNotFoundError as exc:
                self.disabled[provider] = f"import failed: {exc}"
                self.error_row(provider, name, cfg, f"failed: {exc!r}")
                self.log(f"{name:34} {provider:11} disabled: {exc!r}")
            except Exception as exc:
                msg = f"failed: {type(exc).__name__}: {str(exc)[:400]}"
                self.error_row(provider, name, cfg, msg)
                self.log(f"{name:34} {provider:11} {msg[:160]}")
                self.log(traceback.format_exc(limit=3)[-600:])
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                    torch.cuda.empty_cache()


def run_suite(
    opts: Options,
    device: torch.device,
    log: Callable[[str], None] = print,
    ceilings: Ceilings | None = None,
    on_rows: Callable[[list[BenchRow]], None] | None = None,
) -> Result:
    """Run the grid; returns every row (timings, physical units, errors). ``on_rows`` gets
    each point's new rows as soon as the point is done (write them: a killed run keeps
    what it measured)."""
    runner = _Runner(opts, ceilings, device, log)
    for lay, b, n, trees in _points(opts):
        done = len(runner.result.rows)
        try:
            runner.run_point(lay, b, n, trees)
        except Exception as exc:  # allocation or setup failure of a whole point
            cfg = {"layout": lay.name, "batch": b, "L": n}
            runner.error_row(
                "*",
                f"{lay.name}/B{b}/L{n}",
                cfg,
                f"failed: {type(exc).__name__}: {str(exc)[:400]}",
            )
            log(f"{lay.name}/B{b}/L{n}: point failed: {exc!r}"[:300])
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if on_rows is not None and len(runner.result.rows) > done:
            on_rows(runner.result.rows[done:])
    runner.result.summary = {
        "seconds": round(time.time() - runner.t_start, 1),
        "rows": len(runner.result.rows),
        "errors": runner.result.errors,
        "disabled": runner.disabled,
    }
    return runner.result


_TILE_RE = re.compile(
    r"block_m=(?P<block_m>\d+), block_n=(?P<block_n>\d+), num_warps=(?P<num_warps>\d+), "
    r"num_stages=(?P<num_stages>\d+)(?:, pt_prefetch=(?P<pt_prefetch>\d+))?"
    r"(?:, tail=(?P<tail>\d+))?"
)


def tuned_table(rows: Iterable[BenchRow], device_name: str, min_gain: float = 0.03) -> dict:
    """The ``--tune`` rows (``ours_tune[...]`` time rows) as a kernel tuning table
    (:mod:`kdtree.kernels.tuned`): per shape, the winner when it beats the heuristic's own
    config and split count by more than ``min_gain``."""
    from kdtree.kernels.heuristics import TileConfig, configs_for
    from kdtree.kernels.tuned import best_entries

    cands = []
    for r in rows:
        c = r.config
        if not r.provider.startswith("ours_tune[") or r.metric != "time" or "tile" not in c:
            continue
        m = _TILE_RE.search(str(c["tile"]))
        if m is None:
            raise ValueError(f"tune row {r.name} {r.provider}: unreadable tile {c['tile']!r}")
        tc = TileConfig(**{k: int(v) for k, v in m.groupdict().items() if v is not None})
        group = int(c.get("group", c["hq"] // c["hkv"]))
        dk = int(c.get("dk", c["d"] + c.get("rope", 0)))
        first = configs_for(c["kind"], group * int(c["T"]), dk, False)[0]
        cands.append(
            dict(
                kind=c["kind"],
                group=group,
                T=int(c["T"]),
                dk=dk,
                batch=int(c["batch"]),
                L=int(c.get("static_L", c["L"])),
                tile=tc,
                splits=int(c["splits"]),
                p50=float(r.p50),
                heuristic=tc == first and int(c["splits"]) == int(c["heuristic_splits"]),
            )
        )
    return {
        "device": device_name,
        "note": "CUDA-graph p50 of every tuning candidate; winners that beat the heuristic",
        "entries": best_entries(cands, min_gain),
    }
