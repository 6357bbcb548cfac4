"""The CUDA C++ tree builder (``kernels/tree_build.cu``) reproduces the heap node for node.

On the CPU the same source runs built with g++ over ``kernels/cuda_cpu_emu.h`` (one thread per
CUDA thread, real barriers and shuffles); ``gpu`` cases run the nvcc build on the H200.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from test_gpu_tree_build import CASES, FIELDS, TRITON_CASES, _assert_same, _draft_like, _sorted_lp

from kdtree.spec.gpu import tree_build_cuda as tbc
from kdtree.spec.gpu.tree_build import DeviceTree, build_trees_device

needs_cxx = pytest.mark.skipif(not tbc.cpu_emu_available(), reason="no C++20 compiler")


def _build(lp, tok, budget, bonus, **kw):
    dev = "cuda" if kw.pop("cuda", False) else "cpu"
    path = torch.full((lp.shape[0],), -1, dtype=torch.int32, device=dev)
    dt = tbc.build_trees_cuda(lp.to(dev), tok.to(dev), budget, bonus.to(dev), path_out=path, **kw)
    _assert_same(DeviceTree(**{k: getattr(dt, k).cpu() for k in FIELDS}), lp, tok, budget, bonus)
    return path.tolist()


@needs_cxx
@pytest.mark.parametrize(
    "B,D,K,budget,quant,zeros,neg_inf", [c for c in CASES + TRITON_CASES if c[3] > 0]
)
def test_cuda_source_equals_heap_on_cpu(B, D, K, budget, quant, zeros, neg_inf, gen):
    lp, tok = _sorted_lp(B, D, K, gen, quant, zeros, neg_inf)
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    assert _build(lp, tok, budget, bonus) == [1] * B


@needs_cxx
@pytest.mark.parametrize("B,D,K,budget", [(2, 6, 4, 20), (1, 9, 3, 40), (2, 5, 8, 7)])
def test_forced_thresholds_take_the_slow_paths_exactly(B, D, K, budget, gen):
    """theta 0: too few nodes, so the kernel expands again at -inf (path 0); theta -inf: the
    depths that hold more than the budget keep their best by radix select over the key."""
    lp, tok = _sorted_lp(B, D, K, gen, quant=0.5, zeros=False)
    lp = lp.clamp(max=-0.25)  # no log-prob 0: theta 0 leaves only the root
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    assert _build(lp, tok, budget, bonus, theta=0.0) == [0] * B
    assert _build(lp, tok, budget, bonus, theta=float("-inf")) == [1] * B


@needs_cxx
def test_all_ties_follow_rank_tuple_order_on_cpu(gen):
    for value in (-1.0, 0.0):
        lp = torch.full((2, 4, 5), value)
        tok = torch.randint(0, 1000, (2, 4, 5), generator=gen)
        for budget in (3, 17, 40):
            _build(lp, tok, budget, torch.tensor([7, 11]))


@needs_cxx
def test_tie_heavy_sweep_on_cpu(gen):
    for trial in range(12):
        B, D, K = 1 + trial % 2, 1 + trial % 5, 1 + (trial * 7) % 6
        budget = 1 + (trial * 5) % 23
        lp, tok = _sorted_lp(
            B, D, K, gen, quant=[0.5, 1.0, 2.0][trial % 3], zeros=trial % 2 == 0,
            neg_inf=trial % 4 == 3,
        )  # fmt: skip
        _build(lp, tok, budget, torch.randint(0, 1000, (B,), generator=gen))


@needs_cxx
@pytest.mark.parametrize("K,budget", [(32, 256), (8, 512)])
def test_draft_like_large_budgets_on_cpu(K, budget, gen):
    """Budget 512 takes two parents per thread in the expansion; the seed lands (path 1)."""
    lp, tok = _draft_like(1, 15, K, 2048, gen)
    assert _build(lp.float(), tok, budget, torch.tensor([3])) == [1]


@needs_cxx
@pytest.mark.parametrize("D", [15, 32])
def test_large_union_takes_the_bitonic_sort(D, gen):
    """theta -inf at budget 256 with log-prob-0 ranks (a child ties its parent, so capped depths
    do not prune the deeper ones): every depth keeps 256 nodes, a union of ~3.4k / ~7.8k keys
    whose bitonic sort runs its shared-memory stages up to k = 4096 / 8192; D 32 fills the
    8192-node capacity."""
    lp, tok = _sorted_lp(1, D, 8, gen, quant=0.5, zeros=True)
    assert _build(lp, tok, 256, torch.tensor([1]), theta=float("-inf")) == [1]


@needs_cxx
def test_radix_select_over_more_parents_than_threads(gen):
    """Budget 512 at theta -inf: a depth of 512 parents (two a thread, each walking its ranks
    whole, not the spread path of <= 256 parents) over the budget goes through the radix
    select."""
    lp, tok = _sorted_lp(1, 16, 8, gen, quant=0.5, zeros=False)
    clk = torch.zeros(1, tbc.CLOCK_COLS, dtype=torch.int64)
    tbc.build_trees_cuda(lp, tok, 512, torch.tensor([3]), theta=float("-inf"), clocks=clk)
    assert int(clk[0, 8 + tbc.CLOCK_COUNTERS.index("capped")]) >= 1
    assert _build(lp, tok, 512, torch.tensor([3]), theta=float("-inf")) == [1]


@needs_cxx
@pytest.mark.parametrize("B,D,K,budget", [(1, 40, 3, 64), (2, 90, 2, 90)])
def test_deep_drafts_take_the_serial_seed(B, D, K, budget, gen):
    """More than 32 depths: the seed's chain scalars come from thread 0's loop, not the warp."""
    lp, tok = _sorted_lp(B, D, K, gen)
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    _build(lp, tok, budget, bonus)
    _build(lp, tok, budget, bonus, theta=float("-inf"))


@needs_cxx
def test_smem_layout_matches_the_kernel():
    lib = tbc._load("cpu")
    for budget, ke, dm in ((1, 1, 1), (16, 8, 15), (256, 32, 15), (512, 8, 16), (100, 7, 3)):
        assert lib.kdtree_tree_build_smem_bytes(budget, ke, dm) == tbc.smem_bytes(budget, ke, dm)
    assert lib.kdtree_tree_build_smem_bytes(513, 8, 15) == 0 == tbc.smem_bytes(513, 8, 15)
    assert lib.kdtree_tree_build_smem_bytes(512, 8, 17) == 0 == tbc.smem_bytes(512, 8, 17)
    err = lib.kdtree_tree_build_error_string(ctypes.c_int(-1)).decode()
    assert "budget" in err


def test_auto_backend_policy():
    """auto: torch on the CPU; on CUDA the Triton heap replay at small budgets, the CUDA C++
    builder above them where nvcc and an sm_90 GPU are there, else Triton, else torch."""
    from kdtree.spec.gpu import tree_build as tb

    lp = torch.zeros(1, 15, 8)
    assert tb.auto_backend(lp, 256) == "torch"

    class FakeCuda(torch.Tensor):
        is_cuda = True

    lpc = lp.as_subclass(FakeCuda)
    assert tb.auto_backend(lpc, 16, cuda_ok=True) == "triton"
    assert tb.auto_backend(lpc, tb.CUDA_MIN_BUDGET, cuda_ok=True) == "cuda"
    assert tb.auto_backend(lpc, 256, cuda_ok=True) == "cuda"
    assert tb.auto_backend(lpc, 256, cuda_ok=False) == "triton"
    assert tb.auto_backend(lpc, 512, cuda_ok=True) == "cuda"  # past Triton's 256
    assert tb.auto_backend(lpc, 512, cuda_ok=False) == "torch"
    wide = torch.zeros(1, 17, 8).as_subclass(FakeCuda)  # 17 * 512 nodes: outside both kernels
    assert tb.auto_backend(wide, 512, cuda_ok=True) == "torch"


def test_root_only_shapes_match_the_other_builders():
    lp = torch.zeros(2, 3, 4)
    tok = torch.zeros(2, 3, 4, dtype=torch.int64)
    bonus = torch.tensor([5, 6])
    for args in ((lp, tok, 0), (lp[:, :0], tok[:, :0], 4), (lp[:, :, :0], tok[:, :, :0], 4)):
        dt = tbc.build_trees_cuda(*args, bonus)
        assert dt.n_nodes.tolist() == [1, 1] and dt.tokens[:, 0].tolist() == [5, 6]


def test_supports_and_bad_inputs():
    lp = torch.zeros(1, 15, 8)
    tok = torch.zeros(1, 15, 8, dtype=torch.int64)
    assert tbc.supports(lp, 256) and tbc.supports(lp, 512) and not tbc.supports(lp, 513)
    assert not tbc.supports(torch.zeros(1, 17, 8), 512)  # 17 * 512 nodes > 8192
    assert tbc.supports(torch.zeros(1, 17, 8), 256)
    assert not tbc.supports(lp, 0) and not tbc.supports(torch.zeros(1, 0, 8), 8)
    with pytest.raises(ValueError, match="backend='torch'"):
        tbc.build_trees_cuda(lp, tok, 513, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="path_out"):
        tbc.build_trees_cuda(
            lp, tok, 8, torch.zeros(1, dtype=torch.int64), path_out=torch.zeros(1)
        )
    with pytest.raises(ValueError, match="lp"):
        tbc.build_trees_cuda(lp.double(), tok, 8, torch.zeros(1, dtype=torch.int64))


@pytest.mark.skipif(not tbc.find_nvcc(), reason="no nvcc")
def test_cuda_tree_builder_compiles_for_sm90_without_spills(tmp_path):
    from kdtree.kernels.cuda_build import parse_ptxas

    res = tbc.compile_only(tmp_path)
    assert res.path.is_file()
    kernels = parse_ptxas(res.log)
    (name,) = [k for k in kernels if "tree_build_kernel" in k and k.endswith("@sm_90a")]
    assert kernels[name]["spill_stores"] == 0 and kernels[name]["spill_loads"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    "B,D,K,budget,quant,zeros,neg_inf", [c for c in CASES + TRITON_CASES if c[3] > 0]
)
def test_cuda_builder_equals_heap_on_gpu(B, D, K, budget, quant, zeros, neg_inf, gen):
    lp, tok = _sorted_lp(B, D, K, gen, quant, zeros, neg_inf)
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    _build(lp, tok, budget, bonus, cuda=True)
    _build(lp, tok, budget, bonus, cuda=True, theta=float("-inf"))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "batch,budget,K", [(1, 16, 8), (8, 64, 32), (32, 256, 32), (4, 256, 8), (2, 512, 8)]
)
def test_cuda_builder_draft_like_on_gpu(batch, budget, K, gen):
    lp, tok = _draft_like(batch, 15, K, 8192, gen)
    bonus = torch.randint(0, 1000, (batch,), generator=gen)
    assert _build(lp, tok, budget, bonus, cuda=True) == [1] * batch
    assert _build(lp, tok, budget, bonus, cuda=True, theta=0.0) == [0] * batch


@pytest.mark.gpu
def test_cuda_builder_in_a_cuda_graph(gen):
    """Captured once, replayed on new log-probs written in place: the tree follows them."""
    lp, tok = _draft_like(4, 15, 8, 8192, gen)
    lp, tok = lp.cuda(), tok.cuda()
    bonus = torch.randint(0, 1000, (4,), device="cuda")
    build_trees_device(lp, tok, 64, bonus, backend="cuda")  # build and warm up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dt = build_trees_device(lp, tok, 64, bonus, backend="cuda")
    for _ in range(3):
        lp2, tok2 = _draft_like(4, 15, 8, 8192, gen)
        lp.copy_(lp2)
        tok.copy_(tok2)
        g.replay()
        torch.cuda.synchronize()
        _assert_same(
            DeviceTree(**{k: getattr(dt, k).cpu() for k in FIELDS}), lp2, tok2, 64, bonus.cpu()
        )


def _warp_inclusive_scan(x: np.ndarray) -> np.ndarray:
    """``__shfl_up_sync`` Hillis-Steele scan over 32 float32 lanes, in the kernel's order."""
    x = x.astype(np.float32).copy()
    for o in (1, 2, 4, 8, 16):
        y = x.copy()
        y[o:] = x[o:] + x[:-o]
        x = y
    return x


def _warp_butterfly(x: np.ndarray, op) -> np.float32:
    """``__shfl_xor_sync`` reduction over 32 float32 lanes; every lane ends with lane 0's."""
    x = x.astype(np.float32).copy()
    for o in (16, 8, 4, 2, 1):
        x = op(x, x[np.arange(32) ^ o]).astype(np.float32)
    return x[0]


def _seed_tstar(lp: np.ndarray, N: int) -> tuple[int, int]:
    """The kernel's seed in float32 numpy, its DP run over every depth (no early exit): the
    grid threshold index t* (256: none) and the number of DP passes."""
    NB, f32 = 256, np.float32
    DM, KE = min(lp.shape[0], N), min(lp.shape[1], N)
    lp = lp[:DM, :KE].astype(f32)
    fin = (lp > -np.inf).sum(1).astype(f32)
    last = np.array([lp[d, int(fin[d]) - 1] if fin[d] > 0 else np.inf for d in range(DM)], f32)
    l0 = lp[:, 0]
    assert DM <= 32, "the serial path (DM > 32) sums in depth order; not mirrored here"
    pad = 32 - DM
    inn = np.r_[np.ones(DM, bool), np.zeros(pad, bool)]
    l0p = np.r_[l0, np.zeros(pad, f32)]
    lastp = np.r_[last, np.full(pad, np.inf, f32)]
    finp = np.r_[fin, np.zeros(pad, f32)]
    chain = inn & (np.cumsum(~(l0p > -np.inf) & inn) == 0)
    zin = _warp_inclusive_scan(np.where(chain, l0p, f32(0)))
    zprev = (zin - np.where(chain, l0p, f32(0))).astype(f32)
    fin_next = np.r_[finp[1:], finp[31:]]
    last_next = np.r_[lastp[1:], lastp[31:]]
    two = chain & (np.arange(32) + 1 < DM) & (finp > 1) & (fin_next > 0)
    with np.errstate(invalid="ignore", over="ignore"):
        low_chain = _warp_butterfly(np.where(chain, zprev + lastp, np.inf), np.minimum)
        n_sib = _warp_butterfly(np.where(chain, finp, 0), np.add)
        low_two = _warp_butterfly(np.where(two, (zprev + lastp) + last_next, np.inf), np.minimum)
        n_two = _warp_butterfly(np.where(two, (finp - 1) * fin_next, 0), np.add)
        low_all = _warp_butterfly(np.where(inn & (lastp < np.inf), lastp, 0), np.add)
    low = low_chain if n_sib >= N else min(low_chain, low_two) if n_sib + n_two >= N else low_all
    rng = f32(-low)
    finite = bool(rng < f32(3.0e38))
    w = f32((max(rng, f32(1e-30)) if finite else f32(1)) / f32(NB - 1))
    zc = np.zeros(DM, f32)
    z = f32(0)
    for d in range(DM):
        z = f32(z + l0[d])
        zc[d] = f32(z / w)
    with np.errstate(invalid="ignore"):
        x = ((lp[:, :1] - lp) / w).astype(f32)
        u = np.where(x < NB, np.maximum(np.ceil(x), 0), NB).astype(np.int64)
    for npass, nbins in ((1, NB // 2), (2, NB)):
        prev, cnt = np.ones(nbins, f32), np.zeros(nbins, f32)
        c = np.arange(nbins)
        for d in range(DM):
            zt = f32(zc[d] + f32(nbins - 1))
            if not zt >= 0:
                break
            src = c[:, None] - u[d][None, :]
            cur = np.where(src >= 0, prev[np.clip(src, 0, None)], 0).sum(1).astype(f32)
            cur[c > int(zt)] = 0
            f = (zc[d] + c.astype(f32)).astype(f32)
            ok = f >= 0
            cnt[ok] += cur[np.minimum(f[ok].astype(np.int64), nbins - 1)]
            prev = cur
        hit = np.nonzero(cnt >= N)[0]
        if hit.size:  # the kernel's counter holds the DP's t*; only theta checks ``finite``
            return int(hit[0]), npass
    return NB, 2


@needs_cxx
@pytest.mark.parametrize("K,budget", [(8, 16), (8, 256), (32, 64), (32, 256), (4, 128)])
def test_seed_threshold_matches_the_full_dp(K, budget, gen):
    """The seed's grid index t* (clocks column ``tstar``) equals the same float32 DP run over
    every depth: the kernel's early exit (a depth whose chain score lies below the lowest bin
    that reached N adds nothing at or below it) and its bound for K * D < N change no t*."""
    lp, tok = _draft_like(4, 15, K, 4096, gen, peak=8.0 if K == 4 else None)
    clk = torch.zeros(4, tbc.CLOCK_COLS, dtype=torch.int64)
    tbc.build_trees_cuda(lp, tok, budget, torch.zeros(4, dtype=torch.int64), clocks=clk)
    col = {n: 8 + i for i, n in enumerate(tbc.CLOCK_COUNTERS)}
    for b in range(4):
        assert _seed_tstar(
            lp[b].numpy(), budget
        ) == (  # (clocks: the DP's t*, range finite or not)
            int(clk[b, col["tstar"]]),
            int(clk[b, col["seed_passes"]]),
        )
