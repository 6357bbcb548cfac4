"""CUDA C++ (sm_90) backend for absorbed-MLA tree-verify attention.

``tree_attention_mla_cuda`` has the semantics and argument order of
:func:`kdtree.kernels.tree_attention_mla_triton`: ``q_nope [B, T, H, 512]``, ``q_pe [B, T, H, 64]``,
``kv_cache [num_pages, page_size, 576]``, ``page_table int32 [B, max_pages]``, ``prefix_lens
int32 [B]``, ``tree_mask int64 [B, T, W]``; returns ``[B, T, H, 512]``. bf16 and fp16 only.

The kernel source is ``kernels/mla_tree_sm90.cu`` at the repository root (plain CUDA, no torch
headers). It holds three split kernels, picked by ``kernel=`` (:data:`KERNELS`): ``"wgmma"``
(warp-specialised, a producer warpgroup of cp.async copies, ``wgmma`` from 128-byte-swizzled
shared memory; warpgroup 0 computes every S), ``"seesaw"`` (the same pieces with KV tiles in
pairs, one S of each pair per consumer warpgroup, so one's softmax overlaps the other's MMAs)
and ``"mma"`` (``mma.sync`` + ``ldmatrix``, session 3's); :data:`DEFAULT_KERNEL` is the one
used when none is named. On first use it is built with ``nvcc`` (``CUDA_HOME``/``CUDA_PATH``, then ``PATH``, then
``/usr/local/cuda``) into ``~/.cache/kdtree/cuda/<hash of source, flags, nvcc version>/``
(``KDTREE_CUDA_CACHE`` overrides the root) and loaded with :mod:`ctypes`. The launch goes on
``torch.cuda.current_stream()``; nothing synchronises with the device and the split count is a
function of static shapes only, so a call can be captured in a CUDA graph (pass ``workspace``
to keep allocations out of the call entirely, see :func:`workspace_numel`). Partials of
several splits are merged by the shared CUDA merge of ``kernels/sm90_common.cuh``
(``KDTREE_CUDA_MERGE``, :func:`kdtree.kernels.cuda_common.merge_mode`, picks another).

Importing this module registers backend ``"cuda"`` for kind ``"mla"`` in
:mod:`kdtree.attention`; ``"auto"`` picks it for bf16 / fp16 with dims 512 + 64 on an sm_90 GPU
when nvcc is found (:func:`kdtree.attention.resolve_backend`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading

import torch

from kdtree.kernels._common import launch_merge
from kdtree.kernels.cuda_build import BuildResult, CudaSource, find_nvcc, parse_ptxas
from kdtree.kernels.cuda_common import (
    MERGE_AUTO,
    MERGE_PLAIN,
    aligned16,
    any_sm90,
    is_sm90,
    library_builds,
    merge_for,
    on_sm90,
    split_workspace,
    warn_ablation,
)
from kdtree.kernels.heuristics import MAX_TREE_TOKENS
from kdtree.kernels.tree_attention import _check_lengths, _check_metadata

__all__ = [
    "BuildResult",
    "available",
    "build",
    "choose_splits",
    "compile_only",
    "find_nvcc",
    "parse_ptxas",
    "tree_attention_mla_cuda",
    "workspace_numel",
]

_SRC = CudaSource(
    "mla_tree_sm90.cu", "libkdtree_mla_sm90.so", "CUDA MLA backend", headers=("sm90_common.cuh",)
)
SOURCE = _SRC.path
LIB_NAME = _SRC.lib_name
NVCC_FLAGS = _SRC.flags
RANK = 512
ROPE = 64
BLOCK_M = 64  # query rows per CTA (kernels/mla_tree_sm90.cu)
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1}
# Split kernels of kernels/mla_tree_sm90.cu: "mma" (mma.sync + ldmatrix, 32-key tiles),
# "wgmma" (warpgroup MMA from swizzled shared memory, 64-key tiles, a producer warpgroup) and
# "seesaw" (wgmma over pairs of 64-key tiles, each consumer warpgroup one S of a pair).
KERNELS = {"mma": 0, "wgmma": 1, "seesaw": 2}
#: The split kernel used when none is named ("seesaw": session 10, faster than "wgmma" at every
#: MLA bench point; "wgmma" was 1.7-2.0x "mma" in session 9).
DEFAULT_KERNEL = "seesaw"
_MIN_KEYS_PER_SPLIT = 256
_MAX_WAVES = 2
#: Where the 64-row blocks fill more than half the SMs (batch > 1): the most splits, and a
#: split's fixed cost in keys (Q load, pipeline fill, partials), fitted on session 26's sweep.
_MAX_SPLITS_MANY = 16
_FIXED_KEYS = 512
#: ... from this many keys of page table (below it the one-wave rule stayed faster: session 26,
#: call d, 0.85-0.95x at 1k / 4k at four of the six points whose count it changed)
_MANY_MIN_LEN = 16384

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None


# ----------------------------------------------------------------------------- build


def build() -> BuildResult:
    """The cached shared object, built on first use (keyed by source, flags, nvcc version)."""
    return _SRC.build()


def compile_only(out_dir) -> BuildResult:
    """Build the shared object into ``out_dir`` with the local nvcc (no GPU needed, no cache);
    the result's ``log`` holds the ``--ptxas-options=-v`` report (see :func:`parse_ptxas`)."""
    return _SRC.compile_only(out_dir)


def _load() -> ctypes.CDLL:
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        lib = ctypes.CDLL(str(build().path))
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        lib.kdtree_mla_tree_launch.restype = i32
        lib.kdtree_mla_tree_launch.argtypes = (
            [i32]  # dtype
            + [ptr] * 9  # q_nope q_pe kv page_table prefix_lens tree_mask out part lse
            + [i64] * 13  # strides: q_nope 3, q_pe 3, kv slot, page table row, mask 2, out 3
            + [i32] * 8  # B T H rank rope page_size max_pages num_splits
            + [
                ctypes.c_float,
                i32,
                i64,
                i32,
                ctypes.c_size_t,
            ]  # sm_scale kernel num_slots merge stream
        )
        lib.kdtree_mla_wgmma_clocks.restype = i32
        lib.kdtree_mla_wgmma_clocks.argtypes = [ptr]
        lib.kdtree_mla_wgmma_probe.restype = i32
        lib.kdtree_mla_wgmma_probe.argtypes = [i32] + [ptr] * 5 + [i32, i32, ctypes.c_size_t]
        lib.kdtree_mla_error_string.restype = ctypes.c_char_p
        lib.kdtree_mla_error_string.argtypes = [i32]
        lib.kdtree_mla_smem_bytes.restype = i32
        _LIB = lib
        return lib


# ----------------------------------------------------------------------------- availability


@functools.cache
def _library_ok() -> bool:
    """nvcc is found and the library builds and loads (once a process; the build is cached on
    disk). A failure warns once and makes ``"auto"`` fall back to Triton."""
    return library_builds(find_nvcc, _load, "MLA")


def available_on(device: torch.device) -> bool:
    """``device`` is a CUDA sm_90 (Hopper) GPU and the library builds with the local nvcc (what
    ``"auto"`` checks before it picks this backend; the first call builds, later ones are
    cheap)."""
    return on_sm90(device, _library_ok)


def available() -> bool:
    """nvcc is found and a CUDA sm_90 (Hopper) device is present."""
    return any_sm90(find_nvcc)


# ----------------------------------------------------------------------------- launch planning


def choose_splits(batch: int, rows: int, max_len: int, num_sms: int) -> int:
    """KV splits for ``batch`` requests of ``rows = H * T`` query rows and a prefix bound
    ``max_len`` (static shapes only: no host sync). One CTA per SM fits (~200 KB of shared
    memory). Where the 64-row blocks fill at most half the SMs (``2 * ctas <= num_sms``: every
    batch-1 shape of the bench) or the page table holds fewer than ``_MANY_MIN_LEN`` keys, the
    split count that minimises the per-SM serial work
    ``ceil(ctas * s / num_sms) / s`` within ``_MAX_WAVES`` waves, the smallest one within 3 % of
    the best, with at least ``_MIN_KEYS_PER_SPLIT`` keys per split (measured at batch 1: session
    10's sweep); where that takes two waves of CTAs, the most splits of one wave if they are
    within 3 % of it under the many-block model below (session 29). With more blocks that rule
    allowed one split only (136-160 CTAs ran as two
    waves, the second nearly empty: 44-45 % of the floor at h=16, batch 8, T=65 and batch 32,
    T=17), so there the model is waves times (keys a split + ``_FIXED_KEYS``) for up to
    ``_MAX_SPLITS_MANY`` splits, again the smallest within 3 %: fitted on session 26's sweep
    (call c, batch 8 / 32, T 9-257, 16k / 64k, ``tools/fit_mla_splits.py``: within 4 % of the
    best measured count wherever the sweep measured the pick, up to 1.54x faster than one split; call d, the whole batch-8 / 32 grid from 16k:
    1.03-1.71x)."""
    ctas = batch * math.ceil(rows / BLOCK_M)
    if 2 * ctas <= num_sms or max_len < _MANY_MIN_LEN:
        cap = max(1, min(max_len // _MIN_KEYS_PER_SPLIT, (_MAX_WAVES * num_sms) // ctas))
        costs = {s: math.ceil(ctas * s / num_sms) / s for s in range(1, cap + 1)}
        best = min(costs.values())
        pick = min(s for s, c in costs.items() if c <= best * 1.03)
        one = min(num_sms // ctas, cap)  # the most splits in one wave of CTAs
        if max_len >= _MANY_MIN_LEN and one >= 1 and math.ceil(ctas * pick / num_sms) > 1:
            # A second wave pays the fixed cost again: costed as the many-block model does
            # (waves x (keys a split + _FIXED_KEYS)), one wave within 3 % of the pick is taken.
            # (Session 29, call f: h=8, T=65 (9 row blocks) 14 splits against 29: 0.82 / 0.94 /
            # 0.98x the time at 16k / 64k / 256k; h=16, T=65 (17) 7 against 15: 0.90 / 1.00x at
            # 16k / 64k, and 15 kept at 256k, where 7 took 1.008x.)
            def waves_cost(s: int) -> float:
                return math.ceil(ctas * s / num_sms) * (math.ceil(max_len / s) + _FIXED_KEYS)

            if waves_cost(one) <= waves_cost(pick) * 1.03:
                return one
        return pick
    else:
        cap = max(1, min(max_len // _MIN_KEYS_PER_SPLIT, _MAX_SPLITS_MANY))
        costs = {
            s: math.ceil(ctas * s / num_sms) * (math.ceil(max_len / s) + _FIXED_KEYS)
            for s in range(1, cap + 1)
        }
    best = min(costs.values())
    return min(s for s, c in costs.items() if c <= best * 1.03)


def workspace_numel(batch: int, tree: int, heads: int, num_splits: int) -> int:
    """fp32 elements of the split workspace (partials ``[B, S, H*T, 512]`` + LSE
    ``[B, S, H*T]``); 0 with one split."""
    if num_splits <= 1:
        return 0
    n = batch * num_splits * tree * heads
    return n * RANK + n


# ----------------------------------------------------------------------------- entry point


_ABLATE_WARNED = False


def _warn_if_ablating() -> None:
    """``KDTREE_MLA_ABLATE`` makes the wgmma / seesaw MLA kernels skip work: say so once a process."""
    global _ABLATE_WARNED
    _ABLATE_WARNED = warn_ablation(
        "KDTREE_MLA_ABLATE",
        _ABLATE_WARNED,
        "wgmma / seesaw MLA kernels",
        "tools/gpu/mla_phases.py",
    )


def _check(q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, out) -> None:
    if q_nope.dim() != 4 or q_pe.dim() != 4 or q_pe.shape[:3] != q_nope.shape[:3]:
        raise ValueError(
            f"q_nope, q_pe: expected [B, T, H, {RANK}] and [B, T, H, {ROPE}], got "
            f"{tuple(q_nope.shape)} and {tuple(q_pe.shape)}"
        )
    b, t, h, rank = q_nope.shape
    if q_nope.dtype not in _DTYPE_CODES:
        raise TypeError(
            f"q_nope: dtype {q_nope.dtype}; the CUDA backend supports {list(_DTYPE_CODES)}"
        )
    for name, x in (("q_pe", q_pe), ("kv_cache", kv_cache)):
        if x.dtype != q_nope.dtype:
            raise TypeError(f"{name}: dtype {x.dtype} differs from q_nope's {q_nope.dtype}")
    if rank != RANK or q_pe.shape[3] != ROPE:
        raise ValueError(
            f"q_nope, q_pe: rank {rank} and rope dim {q_pe.shape[3]}; the CUDA kernel is "
            f"compiled for kv_lora_rank {RANK} and rope {ROPE}"
        )
    if b < 1 or t < 1 or h < 1:
        raise ValueError(f"q_nope: expected B, T, H >= 1, got {tuple(q_nope.shape)}")
    if t > MAX_TREE_TOKENS:
        raise ValueError(f"q_nope: T={t} tree tokens is above the maximum {MAX_TREE_TOKENS}")
    if q_nope.device.type != "cuda":
        raise RuntimeError(f"q_nope: on {q_nope.device}; the CUDA backend needs CUDA tensors")
    if not is_sm90(q_nope.device):
        cap = torch.cuda.get_device_capability(q_nope.device)
        raise RuntimeError(
            f"{q_nope.device} has compute capability {cap}; the CUDA MLA kernel is built for "
            "sm_90a (H100/H200) only"
        )
    if q_nope.stride(-1) != 1 or q_pe.stride(-1) != 1:
        raise ValueError("q_nope, q_pe: expected a contiguous last dim")
    if kv_cache.dim() != 3 or kv_cache.shape[2] != RANK + ROPE:
        raise ValueError(
            f"kv_cache: expected [num_pages, page_size, {RANK + ROPE}], got "
            f"{tuple(kv_cache.shape)}"
        )
    page_size = kv_cache.shape[1]
    if kv_cache.stride(-1) != 1 or kv_cache.stride(0) != page_size * kv_cache.stride(1):
        raise ValueError(
            "kv_cache: expected pages laid out contiguously (slot = page * page_size + offset) "
            f"with a contiguous last dim; strides {tuple(kv_cache.stride())}"
        )
    if kv_cache.data_ptr() % 16 or kv_cache.stride(1) % 8:
        raise ValueError("kv_cache: expected a 16-byte aligned base and slot stride")
    _check_metadata(b, t, page_size, page_table, prefix_lens, tree_mask, q_nope.device)
    if page_table.shape[1] < 1:
        raise ValueError("page_table: expected >= 1 page")
    for name, x in (("q_pe", q_pe), ("kv_cache", kv_cache)):
        if x.device != q_nope.device:
            raise ValueError(f"{name}: on {x.device}, expected q_nope's device {q_nope.device}")
    if out is not None:
        if tuple(out.shape) != (b, t, h, RANK) or out.dtype != q_nope.dtype:
            raise ValueError(
                f"out: expected {q_nope.dtype} {(b, t, h, RANK)}, got {out.dtype} "
                f"{tuple(out.shape)}"
            )
        if out.device != q_nope.device:
            raise ValueError(f"out: on {out.device}, expected {q_nope.device}")
        if out.stride(-1) != 1 or out.data_ptr() % 4 or any(s % 2 for s in out.stride()[:-1]):
            raise ValueError("out: expected a contiguous last dim, 4-byte aligned, even strides")


def launch_args(
    q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, out, part_ptr, lse_ptr,
    num_splits: int, sm_scale: float, stream: int, kernel: str = DEFAULT_KERNEL, merge: int = 1,
) -> tuple:  # fmt: skip
    """The argument tuple of ``kdtree_mla_tree_launch`` (one entry per C parameter, in the
    order of the signature in ``kernels/mla_tree_sm90.cu``)."""
    b, t, h, _ = q_nope.shape
    return (
        _DTYPE_CODES.get(q_nope.dtype, -1),
        q_nope.data_ptr(),
        q_pe.data_ptr(),
        kv_cache.data_ptr(),
        page_table.data_ptr(),
        prefix_lens.data_ptr(),
        tree_mask.data_ptr(),
        out.data_ptr(),
        part_ptr,
        lse_ptr,
        *q_nope.stride()[:3],
        *q_pe.stride()[:3],
        kv_cache.stride(1),
        page_table.stride(0),
        tree_mask.stride(0),
        tree_mask.stride(1),
        *out.stride()[:3],
        b,
        t,
        h,
        RANK,
        ROPE,
        kv_cache.shape[1],
        page_table.shape[1],
        int(num_splits),
        float(sm_scale),
        KERNELS.get(kernel, -1),
        kv_cache.shape[0] * kv_cache.shape[1],  # num_slots (the seesaw kernel's TMA map)
        int(merge),
        stream,
    )


def tree_attention_mla_cuda(
    q_nope,
    q_pe,
    kv_cache,
    page_table,
    prefix_lens,
    tree_mask,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    workspace: torch.Tensor | None = None,
    check_values: bool = False,
    dense_mask=None,
    kernel: str = DEFAULT_KERNEL,
) -> torch.Tensor:
    """Absorbed-MLA tree-verify attention on sm_90 (see
    :func:`kdtree.attention.tree_attention_mla`); returns ``[B, T, H, 512]`` in ``q_nope``'s
    dtype. ``num_splits`` forces the KV split count (default: :func:`choose_splits` from the
    page table's capacity). ``workspace``: a float32 CUDA tensor of at least
    :func:`workspace_numel` elements (else one is allocated per call when splitting).
    ``check_values`` checks ``prefix_lens + T`` against the page table on the host (a sync);
    the kernel never reads past the page table either way. ``dense_mask`` is ignored.
    ``kernel`` picks the split kernel (:data:`KERNELS`, default :data:`DEFAULT_KERNEL`)."""
    del dense_mask
    _warn_if_ablating()
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: expected one of {sorted(KERNELS)}")
    _check(q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, out)
    b, t, h, _ = q_nope.shape
    page_size = kv_cache.shape[1]
    max_pages = page_table.shape[1]
    if check_values:
        _check_lengths(prefix_lens, t, page_table, page_size)
    device = q_nope.device
    if num_splits is None:
        from kdtree.kernels.workspace import device_sm_count

        num_splits = choose_splits(b, h * t, max_pages * page_size, device_sm_count(device))
    num_splits = int(num_splits)
    if num_splits < 1:
        raise ValueError(f"num_splits={num_splits}: expected >= 1")
    if not aligned16(q_nope):
        q_nope = q_nope.clone(memory_format=torch.contiguous_format)
    if not aligned16(q_pe):
        q_pe = q_pe.clone(memory_format=torch.contiguous_format)
    if out is None:
        out = q_nope.new_empty(b, t, h, RANK)
    part_ptr = lse_ptr = None
    need = workspace_numel(b, t, h, num_splits)
    if need:
        workspace = split_workspace(workspace, need, device)
        n_part = b * num_splits * t * h * RANK
        part_ptr = workspace.data_ptr()
        lse_ptr = part_ptr + 4 * n_part
    lib = _load()
    merge = merge_for(num_splits)
    if merge == MERGE_AUTO:  # (the MLA merge's launch mode was not measured: stream order)
        merge = MERGE_PLAIN
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        args = launch_args(
            q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, out, part_ptr, lse_ptr,
            num_splits, sm_scale, stream, kernel, merge,
        )  # fmt: skip
        rc = lib.kdtree_mla_tree_launch(*args)
        if rc != 0:
            msg = lib.kdtree_mla_error_string(rc).decode()
            raise RuntimeError(f"CUDA MLA tree attention launch failed ({rc}): {msg}")
        if num_splits > 1 and merge == 0:  # the Triton merge over the same workspace
            n_part = b * num_splits * t * h * RANK
            part = workspace[:n_part].view(b, 1, num_splits, t * h, RANK)
            lse = workspace[n_part : n_part + b * num_splits * t * h].view(b, 1, num_splits, t * h)
            launch_merge(part, lse, out, 1, h, t * h, num_splits)
    return out


def wgmma_probe(a, bk, v, *, v_offsets: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the wgmma operand-layout probe: ``a [64, 64] @ bk[32, 64].T`` and ``a @ v [64, 256]``
    through the swizzled shared-memory layouts and descriptors of the wgmma split kernel, with
    ``v_offsets`` = (leading, stride) byte offsets of the V descriptor. Returns the two fp32
    products; compare them with ``torch`` to check the layouts on the device."""
    if a.dtype not in _DTYPE_CODES or bk.dtype != a.dtype or v.dtype != a.dtype:
        raise TypeError(f"a, bk, v: expected one of {list(_DTYPE_CODES)}, got {a.dtype}")
    shapes = (tuple(a.shape), tuple(bk.shape), tuple(v.shape))
    if shapes != ((64, 64), (32, 64), (64, 256)):
        raise ValueError(f"a, bk, v: expected [64, 64], [32, 64], [64, 256], got {shapes}")
    a, bk, v = (x.contiguous() for x in (a, bk, v))
    d1 = torch.empty(64, 32, dtype=torch.float32, device=a.device)
    d2 = torch.empty(64, 256, dtype=torch.float32, device=a.device)
    lib = _load()
    with torch.cuda.device(a.device):
        stream = torch.cuda.current_stream(a.device).cuda_stream
        rc = lib.kdtree_mla_wgmma_probe(
            _DTYPE_CODES[a.dtype], a.data_ptr(), bk.data_ptr(), v.data_ptr(), d1.data_ptr(),
            d2.data_ptr(), int(v_offsets[0]), int(v_offsets[1]), stream,
        )  # fmt: skip
    if rc != 0:
        raise RuntimeError(
            f"wgmma probe failed ({rc}): {lib.kdtree_mla_error_string(rc).decode()}"
        )
    return d1, d2


#: Phases of the wgmma kernel's clocks (``kernels/mla_tree_sm90.cu``, ``g_wg_clocks``), the
#: same slots for both consumer warpgroups; the first three are warpgroup 0's alone (S and the
#: softmax), during which warpgroup 1 waits at P_FREE by the protocol. Its stamps put that wait
#: at P_READY instead (session 9, call i): a stamp taken right after a barrier is not
#: necessarily taken after the warp resumed, so read the phases after a barrier as a sum.
WGMMA_PHASES = (
    "wait_tile", "s_mma", "softmax", "p_free", "p_ready", "rescale", "pv_mma", "release",
)  # fmt: skip
#: Phases of the seesaw kernel's clocks, per consumer warpgroup (each loops over tile pairs;
#: the sums are divided by the CTA's tiles, so a warpgroup's phases add up to its time a tile;
#: the last tile of an odd count is stamped only in part).
#: Warpgroup 0: wait for tile a, S_a, softmax + P_a out, rescale +
#: issue P_a V_a, wait for P_b, the rest (P_a V_a's wait, rescale, P_b V_b, releases).
#: Warpgroup 1: wait for tile b, S_b, wait for P_a, rescale + issue P_a V_a, softmax
#: + P_b out, the rest (P_a V_a's wait, rescale, P_b V_b, releases).
SEESAW_PHASES = {
    0: ("wait_tile", "s_mma", "softmax", "pv_a_issue", "wait_p_b", "pv_b"),
    1: ("wait_tile", "s_mma", "wait_p_a", "pv_a_issue", "softmax", "pv_b"),
}


def wgmma_clocks(kernel: str = "wgmma") -> dict[str, float]:
    """Phase clocks of the wgmma or seesaw split kernel accumulated since the last read
    (launches made with ``KDTREE_MLA_CLOCKS=1`` in the environment), then reset: mean cycles
    per KV tile of each phase of thread 0 of each consumer warpgroup (keys ``wg0.<phase>``,
    ``wg1.<phase>`` from :data:`WGMMA_PHASES` or :data:`SEESAW_PHASES`), ``tiles`` and
    ``ctas``."""
    if kernel not in ("wgmma", "seesaw"):
        raise ValueError(f"kernel={kernel!r}: only the wgmma and seesaw kernels keep clocks")
    buf = (ctypes.c_ulonglong * 20)()
    rc = _load().kdtree_mla_wgmma_clocks(ctypes.cast(buf, ctypes.c_void_p))
    if rc != 0:
        raise RuntimeError(f"reading the wgmma clocks failed ({rc})")
    tiles = max(int(buf[8]), 1)
    out: dict[str, float] = {}
    for w in range(2):
        names = WGMMA_PHASES if kernel == "wgmma" else SEESAW_PHASES[w]
        for i, name in enumerate(names):
            out[f"wg{w}.{name}"] = buf[10 * w + i] / tiles
    out.update(tiles=int(buf[8]), ctas=int(buf[9]))
    return out


def _register() -> None:
    from kdtree.attention import register_backend

    register_backend("mla", "cuda", tree_attention_mla_cuda)


_register()
