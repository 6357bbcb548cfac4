"""CUDA C++ tree builder (``kernels/tree_build.cu``): the heap's tree, one CTA per request,
every phase in shared memory.

The Triton builders (:mod:`kdtree.spec.gpu.tree_build_triton`) pass data between their phases
through global scratch rows and a barrier: ~0.7–1 µs a dependent step, and the threshold
build has ~4 × depth of them. Here the same exact threshold algorithm (seed a threshold, expand
level by level, preorder, order, emit; see the source's header for why it is exact) runs with
``__syncthreads`` between steps, and a depth whose children above the threshold outnumber the
budget keeps its best ``budget`` by a radix select over the 64-bit key instead of falling back to
a heap replay. Semantics and outputs are those of ``build_trees_torch``.

On first use the source is built with ``nvcc`` (:mod:`kdtree.kernels.cuda_build`) and loaded
with :mod:`ctypes`; the launch goes on ``torch.cuda.current_stream()`` and reads no device
value on the host, so it can be captured in a CUDA graph. The same source also builds with g++
over ``kernels/cuda_cpu_emu.h`` (one std::thread per CUDA thread): ``build_trees_cuda`` on CPU
tensors runs that build, which is how the CPU test suite checks the kernel node for node
against the heap reference.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from kdtree.kernels.cuda_build import (
    SHARED_FLAGS,
    SM90_FLAGS,
    BuildResult,
    CudaSource,
    find_cxx,
    find_nvcc,
)
from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu.tree_build import DeviceTree, check_out_buffer, check_tree_inputs

__all__ = [
    "MAX_BUDGET",
    "available",
    "build",
    "build_trees_cuda",
    "compile_only",
    "cpu_emu_available",
    "smem_bytes",
    "supports",
]

MAX_BUDGET = 512
# ``clocks`` columns: 0-7 thread 0's clock64() at these boundaries (the phases are the deltas),
CLOCK_STAMPS = ("start", "loaded", "prologue", "threshold", "expanded", "ordered", "rowmap", "end")
# 8-15 what the build did: the seed's grid threshold index (256: none), its DP passes (1 or 2),
# kept union size, depths expanded, depths capped by the radix select, radix passes in all,
# path (1 seeded, 0 re-expanded at -inf), keys sorted (the union padded to a power of two)
CLOCK_COUNTERS = ("tstar", "seed_passes", "n_union", "depths", "capped", "radix_passes", "path",
                  "sort_size")  # fmt: skip
# 16-21 finer splits: thread 0's clock64() once the preorder keys are written and once the runs
# of 32 are sorted; cycles the expansion spent in the radix select, in the one-warp depths and
# in the block depths (select included); and the seed DP's depth steps (both passes)
CLOCK_SPLITS = ("keys_done", "runs_sorted", "select_cycles", "warp_depth_cycles",
                "block_depth_cycles", "dp_steps")  # fmt: skip
CLOCK_COLS = len(CLOCK_STAMPS) + len(CLOCK_COUNTERS) + len(CLOCK_SPLITS)  # the kernel's too
_SRC = CudaSource(
    "tree_build.cu",
    "libkdtree_tree_build.so",
    "CUDA tree builder",
    # no --use_fast_math: the scores are float32 sums that must round like the reference's
    flags=SM90_FLAGS + SHARED_FLAGS,
    headers=("cuda_cpu_emu.h",),
)
SOURCE = _SRC.path

_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL] = {}


def build() -> BuildResult:
    """The cached device library (nvcc), built on first use."""
    return _SRC.build()


def compile_only(out_dir) -> BuildResult:
    """Build the device library into ``out_dir`` with the local nvcc (no GPU, no cache)."""
    return _SRC.compile_only(out_dir)


def _load(kind: str) -> ctypes.CDLL:
    with _LOCK:
        if kind in _LIBS:
            return _LIBS[kind]
        res = _SRC.build() if kind == "cuda" else _SRC.build_cpu_emu()
        lib = ctypes.CDLL(str(res.path))
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        lib.kdtree_tree_build_launch.restype = i32
        lib.kdtree_tree_build_launch.argtypes = (
            [ptr] * 3  # lp tok bonus
            + [i64] * 4  # strides: lp batch, lp depth, tok batch, tok depth
            + [ptr] * 9  # tokens parents depths ranks scores mask n_nodes path clocks
            + [i32] * 5  # B N KE DM W
            + [ctypes.c_float]  # theta override (NaN: seeded)
            + [ctypes.c_size_t]  # stream
        )
        lib.kdtree_tree_build_error_string.restype = ctypes.c_char_p
        lib.kdtree_tree_build_error_string.argtypes = [i32]
        lib.kdtree_tree_build_smem_bytes.restype = ctypes.c_size_t
        lib.kdtree_tree_build_smem_bytes.argtypes = [i32, i32, i32]
        _LIBS[kind] = lib
        return lib


def _dims(lp: torch.Tensor, budget: int) -> tuple[int, int]:
    return min(int(lp.shape[2]), budget), min(int(lp.shape[1]), budget)


def smem_bytes(budget: int, ke: int, dm: int) -> int:
    """Dynamic shared memory of one CTA (mirrors the kernel's ``Layout``); 0 = unsupported."""
    if not (1 <= budget <= MAX_BUDGET and 1 <= ke <= budget and 1 <= dm <= min(budget, 255)):
        return 0
    ucap = dm * budget
    if ucap > 8192:
        return 0
    pcap = max(32, 1 << (ucap - 1).bit_length())

    def up(x: int) -> int:
        return (x + 15) // 16 * 16

    total = 0
    for nbytes in (
        8 * pcap,  # sort keys
        4 * dm * ke,  # log-probs
        2 * dm * ((ke + 7) // 8 * 8),  # rounded deviations, rows padded to 8 ranks
        4 * max(4 * 256 + 3 * dm + 4, 3 * 256 + 4 * 8),  # seed rows and scalars; radix histograms
        4 * ucap,  # scores
        2 * ucap,  # parents
        2 * ucap,  # ranks
        2 * ucap,  # first child
        2 * ucap,  # rows
        1 * ucap,  # depths
        4 * (2 * 8 + 16 + dm + 2),  # scan scratch, hand-offs and level starts
    ):
        total = up(total + nbytes)
    return total


_SMEM_LIMIT = 227 * 1024  # sm_90 opt-in maximum per block


def supports(lp: torch.Tensor, budget: int) -> bool:
    """Whether the kernel handles this shape (budget ``1..512``, ``min(D, budget) * budget <=
    8192``, shared memory within the sm_90 limit)."""
    if lp.dim() != 3 or lp.shape[1] == 0 or lp.shape[2] == 0 or budget < 1:
        return False
    ke, dm = _dims(lp, budget)
    n = smem_bytes(budget, ke, dm)
    return 0 < n <= _SMEM_LIMIT


def available() -> bool:
    """nvcc is found and a CUDA sm_90 (Hopper) device is present."""
    if find_nvcc() is None or not torch.cuda.is_available():
        return False
    return any(
        torch.cuda.get_device_capability(i) == (9, 0) for i in range(torch.cuda.device_count())
    )


def cpu_emu_available() -> bool:
    """The CPU stand-in builds here (a C++20 compiler with ``<barrier>``: GCC 11 or newer);
    builds it on first call (cached)."""
    if find_cxx() is None:
        return False
    try:
        _SRC.build_cpu_emu()
    except RuntimeError:
        return False
    return True


def build_trees_cuda(
    lp: torch.Tensor,
    tok: torch.Tensor,
    budget: int,
    bonus: torch.Tensor,
    *,
    path_out: torch.Tensor | None = None,
    theta: float | None = None,
    clocks: torch.Tensor | None = None,
) -> DeviceTree:
    """One CTA per request; shapes and outputs as ``build_trees_torch``.

    CUDA tensors run the nvcc build on the current stream; CPU tensors run the g++ stand-in
    (slow: for tests). ``path_out`` (``int32 [B]``) receives 1 where the seeded threshold held
    and 0 where the kernel expanded again at threshold ``-inf``. ``theta`` replaces the seeded
    threshold (tests force the slow paths with it: ``0.0`` usually leaves too few nodes, so the
    kernel expands again at ``-inf``; ``-inf`` makes every depth with more than ``budget``
    children keep its best ``budget`` by radix select); the tree is the same whatever it is.
    ``clocks`` (``int64 [B, CLOCK_COLS]``, profiling) receives in columns 0–7 thread 0's
    ``clock64()`` at the phase boundaries (``CLOCK_STAMPS``; zeros on the CPU stand-in), in
    columns 8–15 what the build did (``CLOCK_COUNTERS``) and in 16–21 finer splits
    (``CLOCK_SPLITS``).
    """
    check_tree_inputs(lp, tok, budget, bonus)
    Bsz, D, K = lp.shape
    if budget == 0 or D == 0 or K == 0:  # the root alone, as every builder returns it
        from kdtree.spec.gpu.tree_build import build_trees_torch

        return build_trees_torch(lp, tok, budget, bonus)
    if not supports(lp, budget):
        raise ValueError(
            f"budget={budget}, lp {tuple(lp.shape)}: outside the CUDA builder's range (budget in "
            f"[1, {MAX_BUDGET}], min(D, budget) * budget <= 8192); use backend='torch'"
        )
    dev = lp.device
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev) != (9, 0):
        raise ValueError(f"the CUDA tree builder is built for sm_90; {dev} is not")
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"lp on {dev}: expected a CUDA or CPU tensor")
    N = budget
    ke, dm = _dims(lp, N)
    T, W = N + 1, num_words(N + 1)
    lp = lp if lp.stride(-1) == 1 else lp.contiguous()
    tok = tok if tok.stride(-1) == 1 else tok.contiguous()
    bonus = bonus.to(torch.int64).contiguous()
    out = DeviceTree.empty(Bsz, T, W, dev)
    check_out_buffer("path_out", path_out, (Bsz,), torch.int32, dev)
    check_out_buffer("clocks", clocks, (Bsz, CLOCK_COLS), torch.int64, dev)
    if Bsz == 0:
        return out
    lib = _load("cuda" if dev.type == "cuda" else "cpu")
    if dev.type == "cuda":
        with torch.cuda.device(dev):  # the C side sizes and launches on the current device
            rc = _launch(lib, lp, tok, bonus, out, path_out, clocks, Bsz, N, ke, dm, W, theta,
                         torch.cuda.current_stream(dev).cuda_stream)  # fmt: skip
    else:
        rc = _launch(lib, lp, tok, bonus, out, path_out, clocks, Bsz, N, ke, dm, W, theta, 0)
    if rc != 0:
        raise RuntimeError(
            f"kdtree_tree_build_launch failed ({rc}): "
            f"{lib.kdtree_tree_build_error_string(rc).decode()}"
        )
    return out


def _launch(lib, lp, tok, bonus, out, path_out, clocks, Bsz, N, ke, dm, W, theta, stream) -> int:
    return lib.kdtree_tree_build_launch(
        lp.data_ptr(), tok.data_ptr(), bonus.data_ptr(),
        lp.stride(0), lp.stride(1), tok.stride(0), tok.stride(1),
        out.tokens.data_ptr(), out.parents.data_ptr(), out.depths.data_ptr(),
        out.ranks.data_ptr(), out.scores.data_ptr(), out.mask.data_ptr(),
        out.n_nodes.data_ptr(), 0 if path_out is None else path_out.data_ptr(),
        0 if clocks is None else clocks.data_ptr(),
        Bsz, N, ke, dm, W, float("nan") if theta is None else float(theta), stream,
    )  # fmt: skip
