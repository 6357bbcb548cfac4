"""CUDA C++ (sm_90) GQA tree-verify kernel: compile check and host-side checks on CPU, fp64
comparisons on a GPU."""

from __future__ import annotations

import contextlib
import math
import re
from pathlib import Path

import pytest
import torch
from _kernel_inputs import gqa_inputs, paged, ramp_pages
from _kernel_reference import assert_close_to_truth, gqa_dense

from kdtree.kernels import cuda_gqa
from kdtree.kernels.cuda_build import find_nvcc, parse_ptxas

ATOL = {torch.float16: 2e-4, torch.bfloat16: 2e-3}
SCALE = 128**-0.5

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit absent)")


# ----------------------------------------------------------------------------- CPU / CI


@needs_nvcc
def test_compiles_for_sm90a_without_spills_or_serialised_wgmma(tmp_path):
    res = cuda_gqa.compile_only(tmp_path)
    kernels = parse_ptxas(res.log)
    split = [k for k in kernels if "gqa_split_kernel" in k]
    # (Wide, WideTail, Tall) x bf16 / fp16 x K / V order
    assert len(split) == 12, f"expected three shapes x bf16 / fp16 x K / V order, got {kernels}"
    merge = [k for k in kernels if "merge_splits_kernel" in k]  # sm90_common.cuh, Dv 128
    assert len(merge) == 2, f"expected the bf16 / fp16 merge, got {kernels}"
    by_warp = [k for k in kernels if "merge_splits_warp_kernel" in k]  # a row a warp
    assert len(by_warp) == 2, f"expected the bf16 / fp16 merge by warp, got {kernels}"
    wide = [k for k in kernels if "merge_splits_wide_kernel" in k]  # 16-byte loads (session 38)
    assert len(wide) == 2, f"expected the bf16 / fp16 wide merge, got {kernels}"
    cols = [k for k in kernels if "merge_splits_cols_kernel" in k]  # a row over CS CTAs (s39)
    assert len(cols) == 8, f"expected bf16 / fp16 x CS 2 / 4 / 8 / 16, got {kernels}"
    # a serialised wgmma (ptxas C7510-C7520) would be a silent several-fold slowdown
    assert "serialized" not in res.log and "C75" not in res.log, res.log
    for name, info in kernels.items():
        assert name.endswith("@sm_90a"), name
        if "ELb1ELi40E" in name:  # WideTail (Cfg<..., KEY_TAIL, 40>): its producer at 24 registers
            # spills its tile counter and a barrier address (~5 local accesses a tile, measured
            # in session 21 with the tail warpgroup 6-15 % less time than the split tail), and
            # since session 24 its consumers, holding the scores through the max-free path,
            # reload two MMA descriptors a tile (two 8-byte local loads; measured 1.3-4.7 % less
            # time at T=65 with them, call f); no more
            assert info["spill_stores"] <= 52 and info["spill_loads"] <= 84, (name, info)
            assert info["stack"] <= 24, (name, info)
            continue
        if "CfgILi3ELi64E" in name:  # Tall: the max-free path reloads one MMA descriptor a tile
            # (one 8-byte local load; 1.5-3.0 % less time at 8q/1kv, T=17, session 24 call f)
            assert info["spill_stores"] <= 8 and info["spill_loads"] <= 16, (name, info)
            assert info["stack"] <= 8, (name, info)
            continue
        if "ELi232ELb0E" in name:  # Wide without its register clocks (session 25): the max-free
            # path parks one value a tile (one 4-byte store and load), no MMA descriptor
            assert info["spill_stores"] <= 4 and info["spill_loads"] <= 4, (name, info)
            assert info["stack"] <= 8, (name, info)
            continue
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (name, info)
        assert info["stack"] == 0, (name, info)  # a local array would be a per-tile round trip


@needs_nvcc
def test_build_probe_builds_the_device_tools(tmp_path, monkeypatch):
    """cuda_build.build_probe: the device tools' standalone probes build with the kernels' nvcc
    and flags and export what their drivers call; without nvcc, a clear error."""
    import ctypes

    from kdtree.kernels import cuda_build

    tools = Path(__file__).resolve().parents[2] / "tools" / "gpu"
    for name, symbols in (("read_floor", ("read_floor_launch", "paged_read_launch")),
                          ("atomic_merge_probe", ("probe_run", "probe_check"))):  # fmt: skip
        lib = cuda_build.build_probe(tools / f"{name}.cu", tmp_path / name)
        assert lib == tmp_path / name / f"lib{name}.so" and lib.exists()
        loaded = ctypes.CDLL(str(lib))
        assert all(hasattr(loaded, s) for s in symbols)
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: None)
    with pytest.raises(RuntimeError, match="no nvcc"):
        cuda_build.build_probe(tools / "read_floor.cu")


@needs_nvcc
def test_timeline_build_compiles_without_spills(tmp_path):
    """The CTA timeline's measurement build (KDTREE_TIMELINE) stays buildable: every kernel of
    the default build plus the stamps. Since session 22's 16-bit partials (the split kernels'
    whole-sector stores, the row-a-CTA merge's loads) the stamps' registers push one value of
    the split kernels and of the row-a-CTA merge to the stack there (4-8 bytes; WideTail 4 more
    than its producer's 24; since session 24's max-free path WideTail 48 and Tall 12, the
    default build's descriptor reloads among them; since session 37, when WideTail's record
    moved into its dynamic shared memory so that it launches in this build, its stack 32 bytes,
    the record's address among them): bounded here, so a timeline that starts to spill more is
    caught. The default build's bounds are the test above's."""
    kernels = parse_ptxas(cuda_gqa.compile_only(tmp_path, ("KDTREE_TIMELINE",)).log)
    assert sum("gqa_split_kernel" in k for k in kernels) == 12
    # row a CTA, a warp, wide (session 38), a row over CS CTAs (session 39: four CS)
    assert sum("merge_splits" in k for k in kernels) == 14
    for name, info in kernels.items():
        if "merge_splits_warp_kernel" in name:
            assert info["spill_stores"] == 0 and info["stack"] == 0, (name, info)
        elif "ELb1ELi40E" in name:  # WideTail: its producer's spills (the default build's test)
            assert info["spill_stores"] <= 48 and info["stack"] <= 32, (name, info)
        elif "CfgILi3ELi64E" in name:  # Tall: a descriptor reload (the default build's test)
            assert info["spill_stores"] <= 12 and info["stack"] <= 16, (name, info)
        else:
            assert info["spill_stores"] <= 8 and info["stack"] <= 8, (name, info)


@needs_nvcc
def test_ctypes_call_matches_the_c_signature(gen):
    """The ctypes prototype, the C signature and the wrapper's argument tuple agree; the
    launcher rejects an invalid dtype code (-1) and a head dim other than 128 (-2) before it
    touches a GPU."""
    src = cuda_gqa.SOURCE.read_text()
    sig = re.search(r"int kdtree_gqa_tree_launch\(([^)]*)\)", src).group(1)
    n_c = len([a for a in sig.split(",") if a.strip()])
    lib = cuda_gqa._load()
    assert len(lib.kdtree_gqa_tree_launch.argtypes) == n_c
    q, k, v, pt, pl, m = gqa_inputs([10], 3, 8, 2, 128, 16, torch.float32, gen)
    out = torch.empty_like(q)
    args = cuda_gqa.launch_args(q, k, v, pt, pl, m, out, None, None, 1, SCALE, 0)
    assert len(args) == n_c and args[0] == -1
    assert lib.kdtree_gqa_tree_launch(*args) == -1
    assert b"bfloat16" in lib.kdtree_gqa_error_string(-1)
    args = (0, *args[1:])
    d_at = args.index(128, 23)  # B T Hq Hkv head_dim ...
    assert lib.kdtree_gqa_tree_launch(*args[:d_at], 64, *args[d_at + 1 :]) == -2
    assert b"128" in lib.kdtree_gqa_error_string(-2)
    for wgs, (block_m, block_n) in cuda_gqa.SHAPES.items():
        assert lib.kdtree_gqa_block_m(wgs) == block_m
        assert lib.kdtree_gqa_block_n(wgs) == block_n
        assert 0 < lib.kdtree_gqa_smem_bytes(wgs) <= 227 * 1024
    assert lib.kdtree_gqa_block_m(4) == -1
    assert args[-2] == 1  # merge: the CUDA merge in stream order
    assert args[-3] == 1  # q_groups: one launch head a KV head
    assert args[-4] == 0  # split_tail: off
    assert args[-5] == 0  # tail_blocks: no tail warpgroup
    assert lib.kdtree_gqa_tree_launch(*args[:-6], 4, *args[-5:]) == -10
    assert b"warpgroups" in lib.kdtree_gqa_error_string(-10)
    # the tail warpgroup: at most `wgs` blocks a CTA (12 rows here: a tail alone is valid)
    assert lib.kdtree_gqa_tree_launch(*args[:-5], 3, *args[-4:]) == -13
    assert b"tail" in lib.kdtree_gqa_error_string(-13)
    # the split tail: only two-block CTAs of an even count >= 4 of blocks, with splits
    assert lib.kdtree_gqa_tree_launch(*args[:-4], 1, *args[-3:]) == -14
    assert b"split_tail" in lib.kdtree_gqa_error_string(-14)
    # q_groups: >= 1 and dividing the 4 query heads of a KV head here
    for bad in (0, 3):
        assert lib.kdtree_gqa_tree_launch(*args[:-3], bad, *args[-2:]) == -17
    assert b"q_groups" in lib.kdtree_gqa_error_string(-17)
    # merge modes 0-2 only, and at most 2048 splits for the CUDA merge, before the GPU
    assert lib.kdtree_gqa_tree_launch(*args[:-2], 3, args[-1]) == -11
    big = cuda_gqa.launch_args(q, k, v, pt, pl, m, out, None, None, 4096, SCALE, 0)
    assert lib.kdtree_gqa_tree_launch(0, *big[1:]) == -11
    assert b"2048" in lib.kdtree_gqa_error_string(-11)


def test_measurement_defines(monkeypatch, tmp_path):
    """KDTREE_CUDA_DEFINES: macro names or NAME=VALUE, checked, and part of the build cache's
    key (a measurement build never reuses the default library)."""
    from kdtree.kernels import cuda_build

    monkeypatch.setenv("KDTREE_CUDA_DEFINES", " KDTREE_GQA_TALL_CLOCKS, KDTREE_SOME_VALUE=4 ")
    assert cuda_build.measurement_defines() == ("KDTREE_GQA_TALL_CLOCKS", "KDTREE_SOME_VALUE=4")
    for bad in ("1X", "A B", "A=-1", "A=(1)", "A;rm"):
        monkeypatch.setenv("KDTREE_CUDA_DEFINES", bad)
        with pytest.raises(ValueError, match="KDTREE_CUDA_DEFINES"):
            cuda_build.measurement_defines()
    monkeypatch.delenv("KDTREE_CUDA_DEFINES")
    assert cuda_build.measurement_defines() == ()
    seen = []
    monkeypatch.setattr(cuda_build, "_cache_root", lambda: tmp_path)
    monkeypatch.setattr(cuda_build.CudaSource, "_require_nvcc", lambda self: "nvcc-stub")
    monkeypatch.setattr(
        cuda_build.CudaSource, "_key", lambda self, compiler, flags: str(len(seen))
    )
    monkeypatch.setattr(
        cuda_build.CudaSource,
        "_compile",
        lambda self, cmd, out_dir, lib: seen.append(cmd) or (out_dir / lib, ""),
    )
    cuda_gqa._SRC.build()
    monkeypatch.setenv("KDTREE_CUDA_DEFINES", "KDTREE_GQA_TALL_CLOCKS")
    cuda_gqa._SRC.build()
    assert "-DKDTREE_GQA_TALL_CLOCKS" in seen[1] and not any(a.startswith("-D") for a in seen[0])


def test_choose_splits_is_static_and_bounded():
    assert cuda_gqa.choose_splits(1, 8, 4 * 65, 256, 132) == 1  # one tile's worth: no split
    for b, hkv, rows, max_len in [
        (1, 1, 8 * 65, 131072),
        (1, 8, 4 * 17, 131072),
        (1, 1, 8 * 17, 16384),
        (8, 8, 4 * 65, 262144),
    ]:
        s = cuda_gqa.choose_splits(b, hkv, rows, max_len, 132)
        ctas = b * hkv * cuda_gqa.row_ctas(rows, *cuda_gqa.launch_plan(rows)) * s
        assert s >= 1 and ctas <= cuda_gqa._MAX_WAVES * 132
        assert max_len // s >= 256
    # one CTA a split per request and KV head fills the GPU with many splits
    assert cuda_gqa.choose_splits(1, 1, 8 * 17, 131072, 132) >= 60
    assert cuda_gqa.workspace_numel(2, 8, 68, 1) == 0
    assert cuda_gqa.workspace_numel(2, 8, 68, 3) == 2 * 8 * 3 * 68 * 65  # 16-bit partials


def test_split_min_keys_one_tile_where_a_split_is_one_two_warpgroup_cta(monkeypatch):
    """Session 35: a split as short as one 128-key tile where its rows fit one two-warpgroup CTA
    (8q/1kv at T 1 / 9 / 16), 256 keys elsewhere; KDTREE_GQA_SPLIT_MIN_KEYS forces either."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_TAIL", "KDTREE_GQA_SPLIT_MIN_KEYS"):
        monkeypatch.delenv(name, raising=False)
    assert [cuda_gqa.split_min_keys(8 * t) for t in (1, 9, 16, 17, 65)] == [
        128,
        128,
        128,
        256,
        256,
    ]
    max_len = 16384 + 80
    for t in (1, 9, 16):  # 129 tiles of 128 keys: one a split, 129 CTAs in one wave
        assert cuda_gqa.plan_launch(1, t, 8, 1, max_len, 132).num_splits == 129
    # the three-warpgroup shape keeps its bound (8q/1kv, T=17: 52 splits of >= 256 keys)
    assert cuda_gqa.plan_launch(1, 17, 8, 1, max_len, 132).num_splits == 52
    assert cuda_gqa.split_min_keys(8 * 16) == 128
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", "3")  # (forced three warpgroups: 256 keys)
    assert cuda_gqa.split_min_keys(8) == 256
    monkeypatch.delenv("KDTREE_GQA_WARPGROUPS")
    monkeypatch.setenv("KDTREE_GQA_SPLIT_MIN_KEYS", "256")  # the bound before session 35
    assert cuda_gqa.plan_launch(1, 1, 8, 1, max_len, 132).num_splits == 43
    s = cuda_gqa.choose_splits(1, 1, 8, max_len, 132)
    assert max_len // s >= 256
    monkeypatch.setenv("KDTREE_GQA_SPLIT_MIN_KEYS", "64")
    with pytest.raises(ValueError):
        cuda_gqa.split_min_keys(8)


def test_choose_splits_costs_the_layout_each_count_gets(monkeypatch):
    """One split of 260 rows runs three-block CTAs (the two-CTA tail layout needs a merge), and
    the split count is costed in that layout since session 26: 32q/8kv, T=65 at batch 8 and 32
    takes two splits of WideTail (call c: 1.16-1.28x faster than one split at 16k / 64k)."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_KEY_TAIL", "KDTREE_GQA_QGROUPS"):
        monkeypatch.delenv(name, raising=False)
    assert cuda_gqa.launch_layout(260, 1) == (3, 3, 0) and cuda_gqa.launch_layout(260, 2) == (
        2,
        2,
        2,
    )
    for b in (8, 16, 32):
        for length in (16384, 65536):
            plan = cuda_gqa.plan_launch(b, 65, 32, 8, length + 272, 132)
            assert (plan.num_splits, plan.wgs, plan.split) == (2, 2, 2), (b, length)
    # host cost: one launch_layout a range of counts, not one a count (the first form read the
    # layout knobs up to 528 times a call at 8q/1kv, T=17, 256k: ~6 ms of host time)
    calls = []
    real = cuda_gqa.launch_layout
    monkeypatch.setattr(cuda_gqa, "launch_layout", lambda *a: calls.append(a) or real(*a))
    assert cuda_gqa.choose_splits(1, 1, 136, 262144 + 272, 132) > 100
    assert 1 <= len(calls) <= 3
    # copy-bound shapes keep whole waves of one layout: 32q/8kv, T=17 at batch 32, one split
    assert cuda_gqa.choose_splits(32, 8, 68, 65536 + 272, 132) == 1
    # and batch 1 its measured counts
    assert cuda_gqa.plan_launch(1, 65, 32, 8, 131072 + 272, 132).num_splits == 8
    assert cuda_gqa.plan_launch(1, 65, 8, 1, 65536 + 272, 132).num_splits == 33


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows, splits", [(68, 3), (260, 8), (520, 43), (1028, 2)])
def test_workspace_views(rows, splits, dtype, monkeypatch):
    """The partials (16-bit, the input's dtype) and the fp32 LSE tile the workspace without
    overlap, the LSE 16-byte aligned after them, both within workspace_numel; with the split
    tail's or tail warpgroup's shadow rows too (260 rows)."""
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "plain")
    b, hkv = 2, 3
    need = cuda_gqa.workspace_numel(b, hkv, rows, splits)
    ws = torch.zeros(need, dtype=torch.float32)
    part, lse = cuda_gqa.workspace_views(ws, b, hkv, rows, splits, dtype)
    r = cuda_gqa.workspace_rows(rows, splits)
    assert part.dtype == dtype and part.shape == (b, hkv, splits, r, 128) and part.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (b, hkv, splits, r)
    assert part.data_ptr() == ws.data_ptr()
    assert lse.data_ptr() == ws.data_ptr() + part.numel() * 2  # right after the partials
    assert lse.data_ptr() % 16 == 0 and part.numel() * 2 + lse.numel() * 4 == need * 4
    part.fill_(1.0)  # the partials never reach the LSE
    assert (lse == 0).all()


def test_consumer_warpgroups(monkeypatch):
    monkeypatch.delenv("KDTREE_GQA_WARPGROUPS", raising=False)
    # whole 128-row CTAs but not whole 192-row ones: the two-warpgroup shape
    rows = (17, 68, 128, 129, 136, 256, 260, 384, 512, 520, 768, 1024)
    wgs = (2, 2, 2, 3, 3, 2, 3, 3, 2, 3, 3, 2)
    assert tuple(cuda_gqa.consumer_warpgroups(r) for r in rows) == wgs
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", "2")
    assert cuda_gqa.consumer_warpgroups(520) == 2
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", "5")
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        cuda_gqa.consumer_warpgroups(520)


def test_launch_plan_and_row_ctas(monkeypatch):
    """Rows past the last whole 64-row block (1..16) go to the tail warpgroup; the CTA count
    along the rows is what the C launcher computes (a CTA of its own for a tail with no free
    warpgroup in the last CTA)."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_TAIL", "KDTREE_GQA_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    plan = {r: cuda_gqa.launch_plan(r) for r in (17, 68, 100, 136, 256, 260, 272, 273, 520, 1028)}
    assert plan == {
        17: (2, 0),  # no whole block
        68: (2, 0),  # 32q/8kv T=17: [64 | 4 padded] (the tail measured no faster)
        100: (2, 0),  # 36 rows left: a padded block
        136: (3, 0),  # 8q/1kv T=17
        256: (2, 0),  # 32q/8kv T=64: [128] [128] (measured 26 % faster than [192] [64])
        260: (3, 3),  # 32q/8kv T=65: [64 x 3] [64 | 4 in the tail]
        272: (3, 3),  # 16 rows left: the most the tail takes
        273: (3, 0),  # 17 left: padded
        520: (3, 0),  # 8q/1kv T=65: [64 x 3] [64 x 3] [64, 64, 8 padded]
        1028: (3, 3),  # 16 whole blocks: [64 x 3] x 5 [64 | 4]
    }
    ctas = {r: cuda_gqa.row_ctas(r, *plan[r]) for r in plan}
    assert ctas == {17: 1, 68: 1, 100: 1, 136: 1, 256: 2, 260: 2, 272: 2, 273: 2, 520: 3, 1028: 6}
    assert cuda_gqa.launch_plan(1024) == (2, 0) and cuda_gqa.row_ctas(1024, 2, 0) == 8
    assert cuda_gqa.row_ctas(200, 3, 3) == 2  # three whole blocks fill the CTA: the tail alone
    assert cuda_gqa.row_ctas(8, 2, 1) == 1  # no whole block: the tail alone
    # two whole blocks and 1-8 rows in one three-warpgroup CTA: the tail where splits are long
    tiles = cuda_gqa.TAIL_MIN_TILES
    assert cuda_gqa.launch_plan(136, tiles) == (3, 3) and cuda_gqa.row_ctas(136, 3, 3) == 1
    assert cuda_gqa.launch_plan(132, tiles) == (3, 3)  # 32q/8kv, T=33: 4 rows
    assert cuda_gqa.launch_plan(144, 4 * tiles) == (3, 0)  # 16 rows (m64n16): measured slower
    assert cuda_gqa.launch_plan(136, tiles - 1) == (3, 0)  # short splits: padded
    assert cuda_gqa.launch_plan(145, 4 * tiles) == (3, 0)  # 17 rows: padded
    assert cuda_gqa.launch_plan(68, 4 * tiles) == (2, 0)  # two warpgroups: measured slower
    assert cuda_gqa.launch_plan(392, 4 * tiles) == (3, 0)  # six whole blocks and 8 rows: padded
    # launch_layout counts the Tall tiles a split streams of the static prefix bound
    assert cuda_gqa.launch_layout(136, 16, max_len=32 * 1024) == (3, 3, 0)  # 32 tiles a split
    assert cuda_gqa.launch_layout(136, 16, max_len=16 * 1024) == (3, 0, 0)  # 16
    assert cuda_gqa.launch_layout(136, 16) == (3, 0, 0)  # not known
    monkeypatch.setenv("KDTREE_GQA_TAIL", "0")
    assert cuda_gqa.launch_plan(260) == (3, 0)
    assert cuda_gqa.launch_plan(136, 4 * tiles) == (3, 0)
    monkeypatch.setenv("KDTREE_GQA_TAIL", "1")
    assert cuda_gqa.launch_plan(520) == (3, 3) and cuda_gqa.launch_plan(68) == (2, 2)
    assert cuda_gqa.launch_plan(256) == (2, 0)  # nothing left past the blocks
    monkeypatch.delenv("KDTREE_GQA_TAIL")
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", "3")
    assert cuda_gqa.launch_plan(68) == (3, 0)  # one whole block: the tail was not measured there
    monkeypatch.delenv("KDTREE_GQA_WARPGROUPS")
    monkeypatch.setenv("KDTREE_GQA_TAIL", "1")
    monkeypatch.setenv("KDTREE_GQA_BLOCKS", "2")
    assert cuda_gqa.launch_plan(260) == (3, 2)
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", "2")
    assert cuda_gqa.launch_plan(260) == (2, 2) and cuda_gqa.row_ctas(260, 2, 2) == 3
    monkeypatch.setenv("KDTREE_GQA_BLOCKS", "4")
    with pytest.raises(ValueError, match="KDTREE_GQA_BLOCKS"):
        cuda_gqa.launch_plan(260)


def test_plan_launch_takes_the_tail_on_long_splits(monkeypatch):
    """8q/1kv, T=17 (136 rows) takes [2 blocks + the tail warpgroup] where each split streams
    at least TAIL_MIN_TILES tiles (session 33, call b): batch 8 from 32k, batch 32 from 16k,
    batch 1 at 256k; padded elsewhere. The split count is the padded layout's (both cost three
    blocks a CTA), so only the layout changes."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_TAIL", "KDTREE_GQA_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    got = {
        (b, n): cuda_gqa.plan_launch(b, 17, 8, 1, n * 1024, 132)
        for b, n in ((1, 16), (1, 128), (1, 256), (8, 16), (8, 32), (8, 256), (32, 16))
    }
    tails = {key: (p.wgs, p.tail_blocks) for key, p in got.items()}
    assert tails == {
        (1, 16): (3, 0), (1, 128): (3, 0), (1, 256): (3, 3),
        (8, 16): (3, 0), (8, 32): (3, 3), (8, 256): (3, 3), (32, 16): (3, 3),
    }  # fmt: skip
    monkeypatch.setenv("KDTREE_GQA_TAIL", "0")
    for (b, n), p in got.items():
        q = cuda_gqa.plan_launch(b, 17, 8, 1, n * 1024, 132)
        assert q.tail_blocks == 0
        assert (q.num_splits, q.workspace_numel) == (p.num_splits, p.workspace_numel)


def test_q_groups_and_plan_launch(monkeypatch):
    """8q/1kv at T=65 (520 rows) runs as two launch heads of 260 rows in WideTail's layout
    (q_groups 2); rows that take that layout themselves, or that no head group brings to it,
    stay one launch head; so do the forced layouts and KDTREE_GQA_QGROUPS=1. plan_launch sizes
    the workspace for the launch heads and falls back to one where the head groups' layout does
    not run (one split)."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_KEY_TAIL", "KDTREE_GQA_QGROUPS"):
        monkeypatch.delenv(name, raising=False)
    assert cuda_gqa.q_groups(8, 65) == 2 and cuda_gqa.q_groups(16, 65) == 4
    assert cuda_gqa.q_groups(4, 65) == 1  # 260 rows: WideTail already
    assert cuda_gqa.q_groups(8, 17) == 1 and cuda_gqa.q_groups(8, 64) == 1  # no group reaches it
    assert cuda_gqa.q_groups(6, 65) == 1  # 390 rows; 195 and 130 are not 257-260
    assert cuda_gqa.q_groups(4, 257) == 4  # 32q/8kv, T=257: four launch heads of 257 rows
    assert cuda_gqa.q_groups(8, 257) == 1  # eight would be needed: measured slower
    plan = cuda_gqa.plan_launch(1, 65, 8, 1, 32768, 132)
    assert (plan.q_groups, plan.heads, plan.rows) == (2, 2, 260)
    assert (plan.wgs, plan.tail_blocks, plan.split) == (2, 2, 2)
    assert plan.num_splits == cuda_gqa.choose_splits(1, 2, 260, 32768, 132)
    assert plan.workspace_numel == cuda_gqa.workspace_numel(1, 2, 260, plan.num_splits)
    assert 2 * 2 * plan.num_splits <= 132  # one wave of two CTAs a launch head
    one = cuda_gqa.plan_launch(1, 65, 8, 1, 32768, 132, num_splits=1)  # no merge: no WideTail
    assert (one.q_groups, one.heads, one.rows, one.workspace_numel) == (1, 1, 520, 0)
    forced = cuda_gqa.plan_launch(2, 65, 32, 4, 32768, 132, num_splits=7)  # G = 8 too
    assert (forced.q_groups, forced.heads, forced.num_splits) == (2, 8, 7)
    same = cuda_gqa.plan_launch(1, 65, 32, 8, 32768, 132)  # 32q/8kv: unchanged
    assert (same.q_groups, same.heads, same.rows, same.split) == (1, 8, 260, 2)
    monkeypatch.setenv("KDTREE_GQA_QGROUPS", "1")
    assert cuda_gqa.q_groups(8, 65) == 1
    assert cuda_gqa.plan_launch(1, 65, 8, 1, 32768, 132).rows == 520
    monkeypatch.setenv("KDTREE_GQA_QGROUPS", "2")
    with pytest.raises(ValueError, match="KDTREE_GQA_QGROUPS"):
        cuda_gqa.q_groups(8, 65)
    monkeypatch.delenv("KDTREE_GQA_QGROUPS")
    for name, value in (("KDTREE_GQA_KEY_TAIL", "0"), ("KDTREE_GQA_WARPGROUPS", "3")):
        monkeypatch.setenv(name, value)
        assert cuda_gqa.q_groups(8, 65) == 1, name
        monkeypatch.delenv(name)


def test_plan_launch_given_its_own_split_count(monkeypatch):
    """A call given the split count of its own plan gets that plan, workspace included: the
    bench and the engine size the workspace from ``plan_launch(...)`` and then pass its
    ``num_splits``. Before session 26 the head groups were tried at the forced count, so
    8q/1kv at batch 32, T=65 (one launch head at the chosen 4 splits: two heads' layout needs
    more) planned two launch heads when given those 4 and asked for 4592640 elements of a 4326400 workspace."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_KEY_TAIL", "KDTREE_GQA_QGROUPS"):
        monkeypatch.delenv(name, raising=False)
    shapes = [(32, 8), (8, 1), (16, 2), (16, 1), (64, 8), (12, 4)]
    for b in (1, 2, 8, 32, 64):
        for t in (1, 9, 17, 64, 65, 129, 257):
            for hq, hkv in shapes:
                for length in (1024, 16384, 262144):
                    plan = cuda_gqa.plan_launch(b, t, hq, hkv, length + 272, 132)
                    again = cuda_gqa.plan_launch(b, t, hq, hkv, length + 272, 132, plan.num_splits)
                    assert again == plan, (b, t, hq, hkv, length)
    # and that call itself: two launch heads of 260 rows at two splits since session 26's
    # layout-aware split count (four splits of one 520-row head before)
    plan = cuda_gqa.plan_launch(32, 65, 8, 1, 16384 + 272, 132)
    assert (plan.q_groups, plan.num_splits, plan.split) == (2, 2, 2)


def test_split_tail(monkeypatch):
    """The tail split by tile parity between two two-block CTAs only where the layout would be
    [3 blocks] [1 block + tail] (four whole blocks), with splits and the CUDA merge, and the tail
    warpgroup (key_tail) off; its workspace holds TAIL_ROWS shadow rows a split."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_TAIL", "KDTREE_GQA_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("KDTREE_GQA_SPLIT_TAIL", raising=False)
    monkeypatch.setenv("KDTREE_GQA_KEY_TAIL", "0")
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "plain")
    assert cuda_gqa.split_tail(260, 8) and cuda_gqa.split_tail(272, 2)
    # what a launch runs: the split tail's layout, else launch_plan's
    assert cuda_gqa.launch_layout(260, 8) == (3, 2, 1)
    assert cuda_gqa.launch_layout(260, 1) == (3, 3, 0)
    assert cuda_gqa.launch_layout(256, 8) == (2, 0, 0)
    assert not cuda_gqa.split_tail(260, 1)  # one split: no merge to add the halves
    assert not cuda_gqa.split_tail(260, 8, merge=0)  # the Triton merge knows no shadow rows
    assert not cuda_gqa.split_tail(260, 1025)  # 2 S weights in the merge's 2048
    for rows in (256, 273, 520, 1028, 68, 136):  # no tail, padded, or not four blocks
        assert not cuda_gqa.split_tail(rows, 8), rows
    assert cuda_gqa.workspace_rows(260, 8) == 276 and cuda_gqa.workspace_rows(520, 8) == 520
    assert cuda_gqa.workspace_numel(1, 8, 260, 8) == 8 * 8 * 276 * 65  # 16-bit partials
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "triton")
    assert not cuda_gqa.split_tail(260, 8) and cuda_gqa.workspace_rows(260, 8) == 260
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "plain")
    monkeypatch.setenv("KDTREE_GQA_SPLIT_TAIL", "0")
    assert not cuda_gqa.split_tail(260, 8) and cuda_gqa.workspace_rows(260, 8) == 260
    monkeypatch.setenv("KDTREE_GQA_SPLIT_TAIL", "1")  # any even number >= 4 of whole blocks
    assert cuda_gqa.split_tail(520, 8) and cuda_gqa.split_tail(1028, 2)
    assert not cuda_gqa.split_tail(136, 8) and not cuda_gqa.split_tail(456, 8)  # 2 / 7 blocks
    # its two-block CTAs in choose_splits' model: 8q/1kv T=65 (520 rows), four CTAs a split
    assert cuda_gqa.choose_splits(1, 1, 520, 131072, 132) * 4 <= 132
    monkeypatch.delenv("KDTREE_GQA_SPLIT_TAIL")
    monkeypatch.setenv("KDTREE_GQA_TAIL", "0")
    assert not cuda_gqa.split_tail(260, 8)  # the padded layout


def test_key_tail(monkeypatch):
    """The tail warpgroup (WideTail, the default; KDTREE_GQA_KEY_TAIL=0 turns it off) takes 1-4
    rows past four whole blocks beside two two-block CTAs: the second's partials in shadow rows,
    so splits and the CUDA merge; it comes before the split tail, and never with the
    three-warpgroup shape or another row layout forced."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_TAIL", "KDTREE_GQA_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("KDTREE_GQA_SPLIT_TAIL", raising=False)
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "plain")
    monkeypatch.delenv("KDTREE_GQA_KEY_TAIL", raising=False)
    assert cuda_gqa.key_tail(260, 8) and cuda_gqa.launch_layout(260, 8) == (2, 2, 2)
    monkeypatch.setenv("KDTREE_GQA_TAIL", "0")  # another layout forced: not by default
    assert not cuda_gqa.key_tail(260, 8)
    monkeypatch.setenv("KDTREE_GQA_KEY_TAIL", "1")
    assert cuda_gqa.key_tail(260, 8)
    monkeypatch.delenv("KDTREE_GQA_TAIL")
    assert cuda_gqa.workspace_rows(260, 8) == 260 + cuda_gqa.TAIL_ROWS
    assert not cuda_gqa.key_tail(260, 1)  # two CTAs share it: no merge to add the halves
    assert cuda_gqa.launch_layout(260, 1) == (3, 3, 0)
    assert not cuda_gqa.key_tail(260, 8, merge=0) and not cuda_gqa.key_tail(260, 1025)
    assert cuda_gqa.key_tail(257, 8)
    # nothing past the blocks, more than 4 rows, other block counts (516: 32q/8kv T=129, 1028:
    # T=257), fewer than 4 blocks
    for rows in (256, 264, 520, 516, 1028, 324, 132, 68, 66, 17):
        assert not cuda_gqa.key_tail(rows, 8), rows
    # choose_splits counts two-block CTAs: 32q/8kv T=65 at 128k, 2 CTAs a head -> 8 splits
    assert cuda_gqa.choose_splits(1, 8, 260, 131072, 132) * 16 <= 132
    monkeypatch.setenv("KDTREE_CUDA_DEFINES", "KDTREE_TIMELINE")  # (its record fits, session 37)
    assert cuda_gqa.key_tail(260, 8) and cuda_gqa.launch_layout(260, 8) == (2, 2, 2)
    monkeypatch.delenv("KDTREE_CUDA_DEFINES")
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", "3")
    assert not cuda_gqa.key_tail(260, 8)
    monkeypatch.setenv("KDTREE_GQA_KEY_TAIL", "0")
    monkeypatch.delenv("KDTREE_GQA_WARPGROUPS")
    assert not cuda_gqa.key_tail(260, 8) and cuda_gqa.launch_layout(260, 8) == (3, 2, 1)


def test_registered_as_gqa_backend():
    from kdtree.attention import available_backends, resolve_backend

    assert "cuda" in available_backends("gqa")
    assert resolve_backend("gqa", "auto", torch.device("cpu"), (128,)) != "cuda"


def test_auto_picks_the_cuda_kernel_where_it_was_measured_faster(monkeypatch):
    """The CUDA kernel from 64 packed rows, and below where requests x KV heads < 128."""
    from kdtree.attention import resolve_backend

    cuda = torch.device("cuda")
    bf = torch.bfloat16
    monkeypatch.setattr(cuda_gqa, "available_on", lambda device: True)
    for rows in (64, 68, 128, 260, 520):  # 32q/8kv T=17, 65; 8q/1kv T=65
        assert resolve_backend("gqa", "auto", cuda, (128,), bf, rows) == "cuda"
    assert resolve_backend("gqa", "auto", cuda, (128,), torch.float16, 260) == "cuda"
    # 8q/1kv T=17 (136 rows): the CUDA kernel at every length since session 26 (call a: 1.29-2.24x
    # the Triton one at 1k / 4k, where the Triton kernel used to be picked)
    for length in (None, 1024, 8192, 16384, 131072):
        assert resolve_backend("gqa", "auto", cuda, (128,), bf, 136, length) == "cuda"
    assert resolve_backend("gqa", "auto", cuda, (128,), bf, 260, 16384) == "cuda"
    # fewer than 64 rows (T=1, 32q/8kv's T=9): by the requests x KV heads
    assert resolve_backend("gqa", "auto", cuda, (128,), bf, 17) == "triton"  # pairs unknown
    for rows, pairs in ((4, 8), (4, 64), (8, 32), (36, 8), (36, 127)):
        assert resolve_backend("gqa", "auto", cuda, (128,), bf, rows, 65536, pairs) == "cuda"
    assert resolve_backend("gqa", "auto", cuda, (128,), bf, 4, 65536, 256) == "triton"  # B32
    assert resolve_backend("gqa", "auto", cuda, (128,), bf, 64, 65536, 256) == "cuda"
    assert resolve_backend("gqa", "auto", cuda, (64,), bf, 260) == "triton"  # head dim 64
    assert resolve_backend("gqa", "auto", cuda, (128,), torch.float32, 260) == "triton"
    assert resolve_backend("gqa", "auto", cuda, (128,), bf) == "triton"  # rows unknown
    assert resolve_backend("gqa", "auto", torch.device("cpu"), (128,), bf, 260) == "ref"
    monkeypatch.setattr(cuda_gqa, "available_on", lambda device: False)
    assert resolve_backend("gqa", "auto", cuda, (128,), bf, 260) == "triton"


def test_a_library_that_does_not_build_leaves_auto_on_triton(monkeypatch):
    def broken():
        raise RuntimeError("nvcc: unsupported gpu architecture 'sm_90a'")

    monkeypatch.setattr(cuda_gqa, "find_nvcc", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(cuda_gqa, "_load", broken)
    cuda_gqa._library_ok.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="uses Triton"):
            assert cuda_gqa._library_ok() is False
    finally:
        cuda_gqa._library_ok.cache_clear()


def test_rejects_bad_inputs(gen):
    q, k, v, pt, pl, m = gqa_inputs([10], 3, 8, 2, 128, 16, torch.float32, gen)
    with pytest.raises(TypeError, match="dtype"):
        cuda_gqa.tree_attention_gqa_cuda(q, k, v, pt, pl, m, sm_scale=SCALE)
    bf = [x.to(torch.bfloat16) if x.is_floating_point() else x for x in (q, k, v)]
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        cuda_gqa.tree_attention_gqa_cuda(*bf, pt, pl, m, sm_scale=SCALE)
    with pytest.raises(ValueError, match="head dim 64"):
        cuda_gqa.tree_attention_gqa_cuda(*(x[..., :64] for x in bf), pt, pl, m, sm_scale=SCALE)
    with pytest.raises(TypeError, match="k_cache: dtype"):
        cuda_gqa.tree_attention_gqa_cuda(bf[0], k.half(), bf[2], pt, pl, m, sm_scale=SCALE)


# ----------------------------------------------------------------------------- GPU

needs_sm90 = pytest.mark.skipif(
    not (torch.cuda.is_available() and cuda_gqa.available()),
    reason="needs nvcc and an sm_90 GPU",
)

# (prefix lengths, T, Hq, Hkv, page size, forced splits or None)
GPU_CASES = [
    ([1], 1, 8, 1, 1, None),
    ([97], 17, 32, 8, 16, None),
    ([257, 1, 40], 17, 8, 1, 64, 3),
    ([5000], 65, 8, 1, 16, None),  # 520 rows: two launch heads of 260 (q_groups, WideTail)
    ([5000], 65, 32, 8, 16, 1),
    ([2000, 9], 17, 32, 8, 64, None),
    ([1234, 4000], 65, 8, 8, 1, 7),  # MHA (G = 1)
    ([300], 1, 16, 2, 16, 2),
    ([33, 700, 64], 65, 32, 8, 64, 5),
    ([0, 100], 17, 8, 1, 16, 4),  # an empty prefix: the tree alone, splits with no keys
    ([64], 257, 8, 2, 16, 3),  # T above 256: five mask words, three tree tiles
    ([4096], 9, 12, 4, 16, 40),  # more splits than tiles: empty partials
    ([3000, 17], 64, 32, 8, 16, None),  # 256 rows: two two-warpgroup CTAs (the default there)
    ([777], 32, 8, 1, 64, 5),  # 256 rows, one KV head
]


def _run(case, dtype, gen, graph=False, key_scale=None, key_ramp=None):
    lens, t, hq, hkv, ps, splits = case
    cpu = gqa_inputs(lens, t, hq, hkv, 128, ps, dtype, gen)
    if key_ramp is not None:  # keys scaled up along each request's prefix (ramp_pages)
        q, k, v, table, *rest = cpu
        cpu = [q, ramp_pages(k, table, *key_ramp), v, table, *rest]
    if key_scale is not None:  # a factor a page: scores that jump up and down across tiles
        q, k, *rest = cpu
        pick = torch.randint(0, len(key_scale), (k.shape[0],), generator=gen)
        f = torch.tensor(key_scale)[pick].view(-1, 1, 1, 1)
        cpu = [q, (k.double() * f).to(dtype), *rest]
    dev = [x.cuda() for x in cpu]
    out = torch.full((len(lens), t, hq, 128), float("nan"), dtype=dtype, device="cuda")
    if graph:
        cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=SCALE, out=out, num_splits=splits)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        plan = cuda_gqa.plan_launch(len(lens), t, hq, hkv, dev[3].shape[1] * ps, sms, splits)
        ws = torch.empty(max(plan.workspace_numel, 1), dtype=torch.float32, device="cuda")
        out.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            cuda_gqa.tree_attention_gqa_cuda(
                *dev, sm_scale=SCALE, out=out, num_splits=splits, workspace=ws
            )
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        got = out
    else:
        got = cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=SCALE, out=out, num_splits=splits)
        assert got is out
    truth = gqa_dense(*dev, SCALE, torch.float64)
    base = gqa_dense(*dev, SCALE, dtype)
    assert_close_to_truth(got.cpu(), truth, base, ATOL[dtype], f"cuda gqa {case} {dtype}")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "case", GPU_CASES, ids=lambda c: f"L{c[0]}-T{c[1]}-h{c[2]}x{c[3]}-ps{c[4]}-s{c[5]}"
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_matches_fp64(case, dtype, gen):
    _run(case, dtype, gen)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("wgs", ["2", "3"])
@pytest.mark.parametrize("case", [GPU_CASES[i] for i in (1, 2, 3, 4, 6, 8, 9, 10, 11)], ids=str)
def test_both_kernel_shapes_match_fp64(wgs, case, gen, monkeypatch):
    """Both split kernel shapes (2 consumer warpgroups and 128-key tiles, 3 and 64-key tiles),
    forced through KDTREE_GQA_WARPGROUPS, match fp64 on any row count."""
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
    _run(case, torch.bfloat16, gen)


TAIL_CASES = [  # rows = G * T with 1..16 past the whole 64-row blocks
    ([977, 1900], 65, 32, 8, 16, 3),  # 260 rows: [64 x 3] [64 | 4]
    ([0, 100], 17, 8, 1, 16, 4),  # 136: an empty prefix, splits with no keys
    ([4096], 9, 8, 1, 16, 40),  # 72: more splits than tiles (empty partials)
    ([1234, 4000], 65, 8, 1, 64, 1),  # 520: one split, the output written directly
    ([300], 257, 4, 1, 16, 2),  # 1028: five mask words, tree tiles over several tiles
    ([500, 77], 17, 16, 1, 16, None),  # 272: 16 rows past the blocks, the most the tail takes
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("tail", ["0", "1"])
@pytest.mark.parametrize("case", TAIL_CASES, ids=lambda c: f"T{c[1]}-h{c[2]}x{c[3]}-s{c[5]}")
def test_tail_warpgroup_matches_fp64(tail, case, gen, monkeypatch):
    """The rows past the last whole 64-row block through the tail warpgroup (swapped-operand
    m64n16 MMAs, KDTREE_GQA_TAIL=1) and padded to a block (=0) both match fp64."""
    monkeypatch.setenv("KDTREE_GQA_TAIL", tail)
    _run(case, torch.bfloat16, gen)


@pytest.mark.gpu
@needs_sm90
# 8 and 4 rows past two whole blocks (8q/1kv, T=17; 32q/8kv, T=33): t, hq, hkv
@pytest.mark.parametrize("shape", [(17, 8, 1), (33, 32, 8)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_long_splits_take_the_tail_by_default(shape, dtype, gen, monkeypatch):
    """Two requests whose two splits stream over TAIL_MIN_TILES tiles each take the tail
    warpgroup by default (no knob) and match fp64, eagerly and graph-captured."""
    for name in ("KDTREE_GQA_WARPGROUPS", "KDTREE_GQA_TAIL", "KDTREE_GQA_BLOCKS"):
        monkeypatch.delenv(name, raising=False)
    t, hq, hkv = shape
    case = ([4200, 1900], t, hq, hkv, 16, 2)
    table, _ = paged(case[0], t, 16, torch.Generator().manual_seed(0))  # gqa_inputs' page table
    max_len = table.shape[1] * 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert cuda_gqa.plan_launch(2, t, hq, hkv, max_len, sms, 2).tail_blocks == 3
    _run(case, dtype, gen)
    _run(case, dtype, gen, graph=True)


SPLIT_TAIL_CASES = [  # four whole blocks and a tail: [2 + even tail tiles] [2 + odd ones]
    ([977, 1900], 65, 32, 8, 16, 3),  # 260 rows
    ([448, 513], 65, 8, 2, 16, 2),  # 7 and 9 prefix tiles a request: odd and even tile counts
    ([0, 100], 65, 4, 1, 16, 4),  # an empty prefix: splits with no keys
    ([2000], 65, 4, 1, 16, 40),  # one-tile splits (the odd half has none) and empty ones
    ([500, 77], 17, 16, 1, 16, 5),  # 272 rows: 16 in the tail
    ([3000, 70], 65, 4, 1, 1, 6),  # page size 1: every tile on cp.async
    ([5000], 65, 32, 8, 64, 8),  # page size 64
    ([1234, 4000], 65, 8, 1, 16, 6),  # 520 rows: [2] [2] [2 + even] [2 + odd] (only forced)
    ([300], 257, 4, 1, 16, 2),  # 1028 rows: sixteen blocks, the tail in the last two CTAs
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("on", ["0", "1"])
@pytest.mark.parametrize("case", SPLIT_TAIL_CASES, ids=lambda c: f"T{c[1]}-h{c[2]}x{c[3]}-s{c[5]}")
def test_split_tail_matches_fp64(on, case, gen, monkeypatch):
    """The tail rows split by tile parity between the last two row CTAs (KDTREE_GQA_SPLIT_TAIL=1,
    the odd half's partials in shadow rows added by the CUDA merge) and not split (=0) both
    match fp64, eager and graph-captured, in both dtypes, with and without turns."""
    lens, t, hq, hkv, ps, splits = case
    monkeypatch.setenv("KDTREE_GQA_KEY_TAIL", "0")  # (the tail warpgroup comes first)
    monkeypatch.setenv("KDTREE_GQA_SPLIT_TAIL", on)
    assert cuda_gqa.split_tail(t * hq // hkv, splits) == (on == "1")
    _run(case, torch.bfloat16, gen)
    _run(case, torch.float16, gen, graph=True)
    monkeypatch.setenv("KDTREE_GQA_PINGPONG", "2")
    _run(case, torch.bfloat16, gen)


KEY_TAIL_CASES = [  # 1-4 rows past four whole blocks, in the two CTAs of a KV head
    ([977, 1900], 65, 32, 8, 16, 3),  # 260 rows: [2] [2], the tail's tiles by parity
    ([2000, 5], 65, 4, 1, 16, 8),  # a 5-key prefix: splits with no keys, partial tiles
    ([0, 100], 65, 4, 1, 16, 2),  # an empty prefix
    ([3000, 70], 65, 4, 1, 1, 6),  # page size 1: every tile on cp.async
    ([5000], 65, 32, 8, 64, 8),  # page size 64
    ([1234, 4000], 257, 1, 1, 16, 6),  # 257 rows (MHA, T=257): one row past the blocks
    ([9000, 2500], 65, 4, 1, 16, 4),  # long splits: many tail tiles a CTA
    ([700, 1500], 65, 4, 1, 16, 37),  # 1-2 tiles a split: CTA 1 with no tile of its parity
    ([4100], 65, 8, 2, 16, 2),  # two KV heads, each with its tail
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "case", KEY_TAIL_CASES, ids=lambda c: f"T{c[1]}-h{c[2]}x{c[3]}-ps{c[4]}-s{c[5]}"
)
def test_key_tail_matches_fp64(case, gen, monkeypatch):
    """The rows past the last whole blocks in the last two CTAs' consumer warpgroups
    (KDTREE_GQA_KEY_TAIL=1) match fp64, eager and graph-captured, in both dtypes, with and
    without turns."""
    lens, t, hq, hkv, ps, splits = case
    monkeypatch.setenv("KDTREE_GQA_KEY_TAIL", "1")
    assert cuda_gqa.key_tail(t * hq // hkv, splits)
    _run(case, torch.bfloat16, gen)
    _run(case, torch.float16, gen, graph=True)
    monkeypatch.setenv("KDTREE_GQA_PINGPONG", "0")
    _run(case, torch.bfloat16, gen)


WIDE_MERGE_CASES = [  # >= 3 merge CTAs an SM and 17-72 entries a row: the wide merge's rows
    ([16000], 65, 8, 1, 16, 33),  # 8q/1kv, T=65 as in the bench: the tail rows' 66 entries
    ([5000], 65, 8, 1, 16, None),  # the split count's own rule
    ([200], 65, 8, 1, 16, 30),  # two tiles, 30 splits: splits with no keys (-inf LSEs)
    ([3000, 700], 65, 8, 1, 64, 20),  # two requests, page size 64
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("wide", ["0", "1"])
@pytest.mark.parametrize(
    "case", WIDE_MERGE_CASES, ids=lambda c: f"L{c[0]}-T{c[1]}-h{c[2]}x{c[3]}-ps{c[4]}-s{c[5]}"
)
def test_wide_merge_matches_fp64(case, wide, gen, monkeypatch):
    """The merge with 16-byte loads (merge_splits_wide_kernel, session 38) where the launcher
    takes it, and merge_splits_kernel there under KDTREE_CUDA_MERGE_WIDE=0, match fp64: eager,
    graph-captured (where the T=65 merge is a programmatic dependent), both dtypes."""
    monkeypatch.setenv("KDTREE_CUDA_MERGE_WIDE", wide)
    _run(case, torch.bfloat16, gen)
    _run(case, torch.float16, gen, graph=True)


COLS_MERGE_CASES = [  # rows the row-a-warp and the wide merge leave to merge_splits_kernel
    ([16000], 17, 8, 1, 16, 129),  # 8q/1kv, T=17 as in the bench at 128k: 129 entries a row
    ([9000], 1, 8, 1, 16, 128),  # T=1: 8 rows of 128 entries
    ([200], 17, 8, 1, 16, 30),  # two tiles, 30 splits: splits with no keys (-inf LSEs)
    ([3000, 700], 17, 8, 1, 64, 20),  # two requests, page size 64
    ([16000], 65, 8, 1, 16, 33),  # (with the wide merge off) the tail rows' 66 entries
    ([16000], 9, 8, 1, 16, 129),  # T=9: 72 rows, a dependent merge at 4 CTAs a row (session 40)
    ([9000, 3000], 5, 8, 1, 16, 100),  # two requests of T=5: 80 rows, as T=9
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cs", ["2", "4", "8", "16", ""])
@pytest.mark.parametrize(
    "case", COLS_MERGE_CASES, ids=lambda c: f"L{c[0]}-T{c[1]}-h{c[2]}x{c[3]}-ps{c[4]}-s{c[5]}"
)
def test_cols_merge_matches_fp64(case, cs, gen, monkeypatch):
    """The merge of a row over several CTAs of a column slice each (merge_splits_cols_kernel,
    session 39) matches fp64 at every count (KDTREE_CUDA_MERGE_COLS=cs; "": the launcher's
    rule, 8 CTAs a row at T=1's 8 rows, 4 a row as a programmatic dependent at T=5 / 9's 80 /
    72, none at T=17's 136): eager and graph-captured, both dtypes, with the wide merge off."""
    monkeypatch.setenv("KDTREE_CUDA_MERGE_COLS", cs)
    monkeypatch.setenv("KDTREE_CUDA_MERGE_WIDE", "0")
    _run(case, torch.bfloat16, gen)
    _run(case, torch.float16, gen, graph=True)


Q_GROUP_CASES = [  # query heads of a KV head as several launch heads (cuda_gqa.q_groups)
    ([5000], 65, 8, 1, 16, None),  # 8q/1kv, T=65: two launch heads of 260 rows
    ([1234, 4000], 65, 8, 1, 64, 6),  # page size 64, two requests
    ([0, 100], 65, 8, 1, 16, 4),  # an empty prefix: splits with no keys
    ([3000, 70], 65, 8, 1, 1, 6),  # page size 1: every tile on cp.async
    ([4100, 900], 65, 16, 2, 16, 3),  # four launch heads a KV head, two KV heads
    ([700, 1500], 65, 8, 1, 16, 37),  # 1-2 tiles a split
    ([900, 40], 257, 8, 2, 16, 2),  # G = 4 at T=257: four launch heads of 257 rows
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize(
    "case", Q_GROUP_CASES, ids=lambda c: f"T{c[1]}-h{c[2]}x{c[3]}-ps{c[4]}-s{c[5]}"
)
def test_q_groups_match_fp64(case, gen, monkeypatch):
    """A KV head's query heads launched as several heads of WideTail's layout, each reading the
    same cache head, match fp64: eager and graph-captured, both dtypes, and as one launch head
    (KDTREE_GQA_QGROUPS=1)."""
    lens, t, hq, hkv, ps, splits = case
    monkeypatch.delenv("KDTREE_GQA_QGROUPS", raising=False)
    assert cuda_gqa.q_groups(hq // hkv, t) > 1 and splits != 1
    _run(case, torch.bfloat16, gen)
    _run(case, torch.float16, gen, graph=True)
    monkeypatch.setenv("KDTREE_GQA_QGROUPS", "1")
    _run(case, torch.bfloat16, gen)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_key_tail_rescales_match_fp64(dtype, gen, monkeypatch):
    """Keys scaled by 1/4 .. 8 a page make scores jump up and down across the tiles and 64-key
    halves of every split, so the tail warpgroup's running max moves (and its O^T and sums
    rescale) mid-split, not only at its first half; the result still matches fp64."""
    monkeypatch.setenv("KDTREE_GQA_KEY_TAIL", "1")
    case = ([7000, 3100], 65, 4, 1, 16, 3)
    assert cuda_gqa.key_tail(260, 3)
    _run(case, dtype, gen, key_scale=[0.25, 1.0, 4.0, 8.0])
    _run(case, dtype, gen, graph=True, key_scale=[8.0, 0.25, 0.5, 1.0])


# The three split-kernel shapes: WideTail through head groups, Tall, Wide (checked below).
LAZY_CASES = [
    ([9000], 65, 8, 1, 16, None),
    ([20000, 700], 17, 8, 1, 64, None),
    ([6000, 17], 64, 32, 8, 16, None),
]


def test_lazy_cases_cover_the_three_shapes():
    """The lazy-rescale GPU cases run WideTail (two launch heads of 260 rows, the tail warpgroup),
    Tall (three consumer warpgroups) and Wide (two, no tail), all three on the max-free path on
    whole tiles (Cfg::MAX_FREE; Wide's since session 25, without its register clocks)."""
    shapes = []
    for lens, t, hq, hkv, ps, splits in LAZY_CASES:
        pages = -(-(max(lens) + t) // ps) + 1  # as gqa_inputs' page table: one spare page
        plan = cuda_gqa.plan_launch(len(lens), t, hq, hkv, pages * ps, 132, splits)
        shapes.append((plan.q_groups, plan.wgs, plan.split))
    assert shapes == [(2, 2, 2), (1, 3, 0), (1, 2, 0)], shapes


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", LAZY_CASES, ids=lambda c: f"L{c[0]}-T{c[1]}-h{c[2]}x{c[3]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_lazy_rescale_matches_fp64(case, dtype, gen):
    """Keys scaled up along the prefix (x0.25 at its start to x6 at its end) make every row's
    max creep up tile after tile: the block warpgroups keep their offset while a row's scores
    stay within KDTREE_RESCALE_SLACK of it (P up to 2^8 in the 16-bit P V operand; the max-free
    path on whole tiles) and move it when they rise past (the exact path over the kept scores);
    a quarter of the pages scaled x40 make scores jump far past the offset (P overflows to inf
    on the max-free path, which the exact one replaces). The result matches fp64, eager and
    graph-captured."""
    _run(case, dtype, gen, key_ramp=(0.25, 6.0))
    _run(case, dtype, gen, graph=True, key_ramp=(6.0, 0.25))
    _run(case, dtype, gen, key_scale=[1.0, 1.0, 1.0, 40.0])


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("by_warp", ["0", "1"])
@pytest.mark.parametrize("merge", ["plain", "pdl"])
def test_merge_by_warp_and_by_cta(by_warp, merge, gen, monkeypatch):
    """The CUDA merge's two kernels (a row a warp for at most 16 entries a row, else a row a
    CTA; KDTREE_CUDA_MERGE_WARP=0 takes the CTA one everywhere) match fp64 on both sides of the
    bound: 16 and 17 splits, and 8 and 9 with the split tail's shadow rows (16 and 18 entries in
    the shared rows), in stream order and as a programmatic dependent, graph-captured."""
    monkeypatch.setenv("KDTREE_CUDA_MERGE_WARP", by_warp)
    monkeypatch.setenv("KDTREE_CUDA_MERGE", merge)
    for case in (
        ([5000], 17, 8, 1, 16, 16),
        ([5000, 300], 17, 8, 1, 16, 17),
        ([977, 1900], 65, 32, 8, 16, 8),
        ([977, 1900], 65, 32, 8, 16, 9),
        # the one-pass merge's batches (8 entries a thread a batch, 8 groups): 65 entries give
        # group 0 a second batch; at 200 most of the second request's splits have no keys (its
        # prefix is empty: only the last split, 199, has the tree's keys, in group 7's fourth
        # batch after three with none)
        ([5000, 300], 17, 8, 1, 16, 65),
        ([3000, 0], 17, 8, 1, 16, 200),
    ):
        _run(case, torch.bfloat16, gen, graph=True)
    assert cuda_gqa.split_tail(260, 8) and cuda_gqa.split_tail(260, 9)


@pytest.mark.gpu
@needs_sm90
# (whole blocks a CTA are capped at the warpgroups: 2 warpgroups x 3 blocks is 2 x 2)
@pytest.mark.parametrize(
    "wgs,blocks", [("2", "1"), ("2", "2"), ("3", "1"), ("3", "2"), ("3", "3")]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_tail_warpgroup_in_every_layout(wgs, blocks, dtype, gen, monkeypatch):
    """Every (shape, whole blocks a CTA) layout of 260 rows: the tail in the last CTA's first
    free warpgroup or in a CTA of its own, with and without turns; graph-captured with splits."""
    monkeypatch.setenv("KDTREE_GQA_TAIL", "1")
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
    monkeypatch.setenv("KDTREE_GQA_BLOCKS", blocks)
    monkeypatch.setenv("KDTREE_GQA_PINGPONG", "2")
    _run(([977, 1900], 65, 32, 8, 16, 3), dtype, gen, graph=True)
    monkeypatch.setenv("KDTREE_GQA_PINGPONG", "0")
    _run(([3000], 65, 32, 8, 64, None), dtype, gen)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("order", ["k_first", "v_first", "padded_heads", "padded_heads_1kv"])
@pytest.mark.parametrize("wgs", ["2", "3"])
def test_kv_pools_in_either_order(order, wgs, gen, monkeypatch):
    """One TMA map spans both pools (K and V of a page run in one box), based at the lower one:
    V below K swaps their places in the stage (the kernel's SWAP layout). Pools whose heads are
    not 128 contiguous dims (a padded head stride) cannot be mapped and keep the cp.async path;
    KDTREE_GQA_TMA=1 makes that an error. With one KV head the head stride does not matter."""
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
    lens, t, hq, hkv, ps = [977, 1900], 65, 32, 8, 16
    if order == "padded_heads_1kv":
        hq, hkv = 8, 1
    q, k, v, pt, pl, m = (
        x.cuda() for x in gqa_inputs(lens, t, hq, hkv, 128, ps, torch.bfloat16, gen)
    )
    if order.startswith("padded_heads"):
        pool = torch.zeros(2, *k.shape[:3], 256, dtype=k.dtype, device="cuda")
        kk, vv = pool[0, ..., :128], pool[1, ..., :128]
    else:
        pool = torch.zeros(2, *k.shape, dtype=k.dtype, device="cuda")
        kk, vv = (pool[0], pool[1]) if order == "k_first" else (pool[1], pool[0])
    kk.copy_(k)
    vv.copy_(v)
    truth = gqa_dense(q, kk, vv, pt, pl, m, SCALE, torch.float64)
    base = gqa_dense(q, kk, vv, pt, pl, m, SCALE, torch.bfloat16)
    for splits in (1, 3):
        got = cuda_gqa.tree_attention_gqa_cuda(
            q, kk, vv, pt, pl, m, sm_scale=SCALE, num_splits=splits
        )
        assert_close_to_truth(got.cpu(), truth, base, ATOL[torch.bfloat16], f"{order} {splits}")
    monkeypatch.setenv("KDTREE_GQA_TMA", "1")
    if order == "padded_heads":
        with pytest.raises(RuntimeError, match="-12"):
            cuda_gqa.tree_attention_gqa_cuda(q, kk, vv, pt, pl, m, sm_scale=SCALE)
    else:
        got = cuda_gqa.tree_attention_gqa_cuda(q, kk, vv, pt, pl, m, sm_scale=SCALE)
        assert_close_to_truth(got.cpu(), truth, base, ATOL[torch.bfloat16], f"{order} tma")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("wgs", ["2", "3"])
@pytest.mark.parametrize("ps", [8, 16, 64, 256])
def test_both_shapes_tma_paths(wgs, ps, gen, monkeypatch):
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
    _run(([977, 1900], 65, 8, 1, ps, 3), torch.bfloat16, gen)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("splits", [1, 6])
def test_cuda_graph_replay(splits, gen):
    _run(([3000, 17], 17, 32, 8, 16, splits), torch.bfloat16, gen, graph=True)


@pytest.mark.gpu
@needs_sm90
def test_auto_backend_runs_the_cuda_kernel(gen):
    """kdtree.attention.tree_attention with backend="auto" (what the GQA model calls) runs this
    kernel for head dim 128 in bf16 on sm_90 at 32q/8kv, T=65: bitwise the explicit call."""
    from kdtree.attention import tree_attention

    dev = [x.cuda() for x in gqa_inputs([700, 33], 65, 32, 8, 128, 16, torch.bfloat16, gen)]
    got = tree_attention(*dev, sm_scale=SCALE)
    want = cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=SCALE)
    assert torch.equal(got, want)


@pytest.mark.gpu
@needs_sm90
def test_matches_triton(gen):
    from kdtree.kernels import tree_attention_triton

    dev = [x.cuda() for x in gqa_inputs([9000, 3000], 65, 32, 8, 128, 16, torch.bfloat16, gen)]
    got = cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=SCALE)
    ref = tree_attention_triton(*dev, sm_scale=SCALE)
    torch.testing.assert_close(got.float(), ref.float(), rtol=0, atol=2e-2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [GPU_CASES[3], GPU_CASES[8], GPU_CASES[10]], ids=str)
@pytest.mark.parametrize("wgs", ["2", "3"])
@pytest.mark.parametrize("turns", ["0", "1", "2"])
def test_with_and_without_turns_match_fp64(case, wgs, turns, gen, monkeypatch):
    """KDTREE_GQA_PINGPONG=0 (the consumer warpgroups issue their MMAs without taking turns),
    =1 (turns in the two-warpgroup shape, the default) and =2 (a ring of the warpgroups with
    rows in both shapes: two or three, none with one) all give the attention."""
    monkeypatch.setenv("KDTREE_GQA_PINGPONG", turns)
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
    _run(case, torch.bfloat16, gen)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("merge", ["pdl", "plain", "triton"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("wgs", ["2", "3"])
def test_merge_modes_match_fp64(merge, graph, wgs, gen, monkeypatch):
    """KDTREE_CUDA_MERGE: the shared CUDA merge in stream order (default), as a programmatic
    dependent launch, or the Triton merge; each matches fp64 with both kernel shapes, eager and
    in a CUDA graph, with more splits than the short request has tiles (empty partials)."""
    monkeypatch.setenv("KDTREE_CUDA_MERGE", merge)
    monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
    _run(([9000, 40, 1500], 65, 8, 1, 16, 37), torch.bfloat16, gen, graph=graph)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("split_pdl", ["1", "0"])
@pytest.mark.parametrize("merge", ["plain", "pdl"])
@pytest.mark.parametrize("splits", [1, 50])
@pytest.mark.parametrize("t", [17, 65])
def test_split_kernel_as_programmatic_dependent(split_pdl, merge, splits, t, gen, monkeypatch):
    """The split kernel as a programmatic dependent (the default; KDTREE_CUDA_SPLIT_PDL=0: a plain
    launch) starts while the kernel before it runs (the prefix read early; Q, the tree part, the
    workspace and the output after that kernel is done). One graph: two calls back to back (the
    second starts under the first's merge, which still reads the workspace the second writes), Q
    overwritten by a copy kernel, a third call; eager calls too. Each output matches the fp64
    result of its own Q. T=65 at 50 splits runs WideTail (two launch heads of 260 rows; a cluster
    of its two row CTAs in the multicast build)."""
    monkeypatch.setenv("KDTREE_CUDA_SPLIT_PDL", split_pdl)
    assert cuda_gqa.split_pdl() == (split_pdl == "1")
    monkeypatch.setenv("KDTREE_CUDA_MERGE", merge)
    _pdl_chain(t, splits, gen)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("trigger", ["0", "2", "3"])
@pytest.mark.parametrize("cols", ["0", "2"])
@pytest.mark.parametrize("t", [17, 65])
def test_late_trigger_keeps_the_dependent_merge_exact(trigger, cols, t, gen, monkeypatch):
    """KDTREE_GQA_TRIGGER (a measurement knob, session 41): a split CTA that lets the dependent
    merge be scheduled late (once its producer has issued its last copy, once a consumer
    warpgroup has stored its rows, or at its exit) changes when the merge's CTAs land, never
    what they read (the merge waits for the split grid to complete): the back-to-back graph of
    :func:`test_split_kernel_as_programmatic_dependent` under the dependent merge, a row a CTA
    or sliced two CTAs a row, at T=17 (one CTA a split) and T=65 (WideTail)."""
    monkeypatch.setenv("KDTREE_GQA_TRIGGER", trigger)
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "pdl")
    monkeypatch.setenv("KDTREE_CUDA_MERGE_COLS", cols)
    _pdl_chain(t, 50, gen)


def _pdl_chain(t: int, splits: int, gen) -> None:
    lens, hq, hkv = [20000, 3000], 8, 1
    dev = [x.cuda() for x in gqa_inputs(lens, t, hq, hkv, 128, 16, torch.bfloat16, gen)]
    q1, rest = dev[0], dev[1:]
    q2 = torch.randn(q1.shape, generator=gen).to(q1)
    qbuf = q1.clone()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = cuda_gqa.plan_launch(2, t, hq, hkv, rest[2].shape[1] * 16, sms, splits)
    assert plan.split == (2 if t == 65 and splits > 1 else 0), plan
    ws = torch.empty(max(plan.workspace_numel, 1), dtype=torch.float32, device="cuda")
    outs = [torch.empty_like(q1) for _ in range(3)]

    def call(o):
        cuda_gqa.tree_attention_gqa_cuda(qbuf, *rest, sm_scale=SCALE, out=o, num_splits=splits,
                                         workspace=ws)  # fmt: skip

    call(outs[0])  # (warm: build and load)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call(outs[0])
        call(outs[1])
        qbuf.copy_(q2)
        call(outs[2])
    for replay in (True, False):
        qbuf.copy_(q1)
        for o in outs:
            o.fill_(float("nan"))
        if replay:
            g.replay()
        else:
            call(outs[0])
            call(outs[1])
            qbuf.copy_(q2)
            call(outs[2])
        torch.cuda.synchronize()
        for o, q in zip(outs, (q1, q1, q2), strict=True):
            truth = gqa_dense(q, *rest, SCALE, torch.float64)
            base = gqa_dense(q, *rest, SCALE, torch.bfloat16)
            assert_close_to_truth(o.cpu(), truth, base, ATOL[torch.bfloat16], f"pdl {replay}")


def _in_measurement_build(script: str, defines: str, *args: str) -> dict:
    """Run ``script`` (argv[1]: this folder, then ``args``) in a process of its own whose CUDA
    libraries are the measurement build ``KDTREE_CUDA_DEFINES=defines`` (a process loads one
    build); the JSON of its last output line."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", script, os.path.dirname(__file__), *args],
        env=dict(os.environ, KDTREE_CUDA_DEFINES=defines),
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_CLOCKS_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from _kernel_inputs import gqa_inputs
from _kernel_reference import assert_close_to_truth, gqa_dense
from kdtree.kernels import cuda_gqa
gen = torch.Generator().manual_seed(0)
dev = [x.cuda() for x in gqa_inputs([3000], 65, 8, 1, 128, 16, torch.bfloat16, gen)]
out = cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=128 ** -0.5, num_splits=4)
torch.cuda.synchronize()
assert_close_to_truth(out.cpu(), gqa_dense(*dev, 128 ** -0.5, torch.float64),
                      gqa_dense(*dev, 128 ** -0.5, torch.bfloat16), %r, "clocked launch")
print(json.dumps(cuda_gqa.phase_clocks()))
"""


def _check_clocks(ck: dict, n_wg: int, length: int = 3000, t: int = 65, splits: int = 4) -> None:
    for w in range(n_wg):
        assert all(ck[f"wg{w}.{ph}"] >= 0 for ph in cuda_gqa.CONSUMER_PHASES)
        assert sum(ck[f"wg{w}.{ph}"] for ph in cuda_gqa.CONSUMER_PHASES) > 0
    assert ("prod.copies" in ck) == (n_wg == 2) and f"wg{n_wg}.issue" not in ck
    bn = cuda_gqa.SHAPES[n_wg][1]
    chunk = math.ceil(math.ceil(length / splits) / bn) * bn  # split_tiles: whole tiles a split
    tiles = sum(
        -(-(min(s * chunk + chunk, length) - min(s * chunk, length)) // bn) for s in range(splits)
    ) + -(-t // bn)  # the last split's tree tiles
    row_ctas = -(-520 // (64 * n_wg))
    assert ck["ctas"] == row_ctas * splits and ck["tiles"] == row_ctas * tiles


@pytest.mark.gpu
@needs_sm90
def test_phase_clocks_in_both_shapes(gen, monkeypatch):
    """KDTREE_GQA_CLOCKS=1: the default build keeps no clocks in either shape (it says so);
    the two-warpgroup shape keeps its clocks in registers in its measurement build
    (KDTREE_CUDA_DEFINES=KDTREE_GQA_WIDE_CLOCKS, since session 25), the three-warpgroup one
    sums its consumers' clocks in shared memory in its own (KDTREE_GQA_TALL_CLOCKS); each in a
    process of its own (a process loads one build), where the clocked launch's result still
    matches fp64. Tiles and CTAs are the launch's (520 rows: no idle warpgroup)."""
    monkeypatch.setenv("KDTREE_GQA_TAIL", "0")
    with contextlib.suppress(RuntimeError):
        cuda_gqa.phase_clocks()  # (drop any earlier sums)
    monkeypatch.setenv("KDTREE_GQA_CLOCKS", "1")
    for wgs, define in (("2", "KDTREE_GQA_WIDE_CLOCKS"), ("3", "KDTREE_GQA_TALL_CLOCKS")):
        monkeypatch.setenv("KDTREE_GQA_WARPGROUPS", wgs)
        _run(([3000], 65, 8, 1, 16, 4), torch.bfloat16, gen)
        with pytest.raises(RuntimeError, match=define):
            cuda_gqa.phase_clocks()  # the default build's shapes keep none
        script = _CLOCKS_SCRIPT % ATOL[torch.bfloat16]
        _check_clocks(_in_measurement_build(script, define), int(wgs))


@needs_nvcc
def test_default_build_has_no_timeline():
    """The CTA timeline is a measurement build's: the default library says so, not zeros."""
    assert cuda_gqa._load().kdtree_gqa_timeline(None, 0) == -1
    with pytest.raises(RuntimeError, match="KDTREE_TIMELINE"):
        cuda_gqa.timeline_records()
    src = (cuda_gqa.SOURCE.parent / "sm90_common.cuh").read_text()
    assert 1 << int(re.search(r"TL_CAP = 1 << (\d+);", src).group(1)) == cuda_gqa.TIMELINE_CAP


_TIMELINE_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from _kernel_inputs import gqa_inputs
from kdtree.kernels import cuda_gqa
from kdtree.profiling import cta_timeline as ctl
t = int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
dev = [x.cuda() for x in gqa_inputs([3000, 100], t, 8, 1, 128, 16, torch.bfloat16, gen)]
sms = torch.cuda.get_device_properties(0).multi_processor_count
plan = cuda_gqa.plan_launch(2, t, 8, 1, dev[3].shape[1] * 16, sms, 5)
cuda_gqa.timeline_records(discard=True)
out = cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=128 ** -0.5, num_splits=5)
torch.cuda.synchronize()
df = ctl.decode(cuda_gqa.timeline_records())
from kdtree.kernels.cuda_common import merge_ctas
x = 2 if plan.split == 2 else 1
entries = 5 * (2 if plan.split else 1)
df = ctl.assign_calls(df, split_ctas=x * 5 * 2 * plan.heads,
                      merge_ctas=merge_ctas(plan.rows, 2 * plan.heads, entries))
ph = ctl.call_phases(df)
split = df[df.kind == "split"]
print(json.dumps({"ok": bool(((split.first_tile >= split.entry) & (split.mma_end >= split.first_tile)
                              & (split.exit >= split.mma_end))[split.tiles > 0].all()),
                  "split": plan.split, "heads": plan.heads,
                  "blocks": sorted(zip(split.bx.tolist(), split.by.tolist(), split.bz.tolist())),
                  "empty": int((split.tiles == 0).sum()), "gap": float(ph.gap_merge[0]),
                  "out": out.float().cpu().tolist()}))
"""


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t", [17, 65])
def test_cta_timeline_build(t, gen):
    """KDTREE_CUDA_DEFINES=KDTREE_TIMELINE (a process of its own): every CTA of the split grid
    and the merge appends one record, stamps in order, the merge after the split; the result
    is the default build's. T=65 runs WideTail (two launch heads of 260 rows, two row CTAs a
    split; its record in the tail warpgroup's unused Q^T rows since session 37)."""
    got = _in_measurement_build(_TIMELINE_SCRIPT, "KDTREE_TIMELINE", str(t))
    assert got["ok"] and got["gap"] >= 0
    if t == 17:  # one CTA a split; request 1's 100 keys: splits 0-1, its tree tile on split 4
        assert got["split"] == 0 and got["heads"] == 1
        assert got["blocks"] == [[0, s, b] for s in range(5) for b in range(2)]  # (JSON lists)
        assert got["empty"] == 2
    else:  # two CTAs a split of each launch head; request 1: split 0's tile, split 4's tree tile
        assert got["split"] == 2 and got["heads"] == 2
        assert got["blocks"] == [[x, s, z] for x in range(2) for s in range(5) for z in range(4)]
        assert got["empty"] == 2 * 2 * 3  # (its splits 1-3, both CTAs of both launch heads)
    dev = [x.cuda() for x in gqa_inputs([3000, 100], t, 8, 1, 128, 16, torch.bfloat16,
                                        torch.Generator().manual_seed(0))]  # fmt: skip
    ref = cuda_gqa.tree_attention_gqa_cuda(*dev, sm_scale=SCALE, num_splits=5)
    assert torch.equal(torch.tensor(got["out"]), ref.float().cpu())


def test_merge_mode_setting(monkeypatch):
    from kdtree.kernels.cuda_common import merge_mode

    monkeypatch.delenv("KDTREE_CUDA_MERGE", raising=False)
    assert merge_mode() == 3  # auto
    for value, code in (("pdl", 2), ("plain", 1), ("triton", 0), ("auto", 3), ("", 3)):
        monkeypatch.setenv("KDTREE_CUDA_MERGE", value)
        assert merge_mode() == code
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "nccl")
    with pytest.raises(ValueError, match="KDTREE_CUDA_MERGE"):
        merge_mode()
    # above the CUDA merge's split bound the backends fall back to the Triton merge
    from kdtree.kernels.cuda_common import MERGE_MAX_SPLITS, merge_for

    monkeypatch.setenv("KDTREE_CUDA_MERGE", "pdl")
    assert merge_for(MERGE_MAX_SPLITS) == 2 and merge_for(MERGE_MAX_SPLITS + 1) == 0
    src = (cuda_gqa.SOURCE.parent / "sm90_common.cuh").read_text()
    assert f"constexpr int MERGE_MAX_SPLITS = {MERGE_MAX_SPLITS};" in src
    # the merge's CTAs (the timeline counts them): a row a warp up to 16 entries, else a CTA
    from kdtree.kernels.cuda_common import MERGE_WARP_ENTRIES, merge_ctas

    assert f"constexpr int MERGE_WARP_ENTRIES = {MERGE_WARP_ENTRIES};" in src
    assert merge_ctas(136, 2, 16) == 17 * 2 and merge_ctas(136, 2, 17) == 136 * 2
    assert merge_ctas(8, 1, 4, head_dim=512) == 8  # (MLA: a row a CTA)
    # the column-sliced merge (session 39): 8 CTAs a row at <= 16 row CTAs of > 64 entries
    from kdtree.kernels.cuda_common import (
        MERGE_COLS_DEFAULT,
        MERGE_COLS_ENTRIES,
        MERGE_COLS_MAX_ROW_CTAS,
        MERGE_COLS_MIN_ENTRIES,
        MERGE_WIDE_ENTRIES,
    )

    assert (
        f"constexpr int MERGE_COLS_MAX_ROW_CTAS = {MERGE_COLS_MAX_ROW_CTAS}, MERGE_COLS_DEFAULT = "
        f"{MERGE_COLS_DEFAULT}, MERGE_COLS_MIN_ENTRIES = {MERGE_COLS_MIN_ENTRIES};" in src
    )
    assert f"MERGE_WIDE_ENTRIES = {MERGE_WIDE_ENTRIES};" in src
    for cs, most in MERGE_COLS_ENTRIES.items():  # merge_cols_entries: 8 cs groups of K
        assert most % (8 * cs) == 0 and f"cs == {cs} ? {most // (8 * cs)}" in src, cs
    assert merge_ctas(8, 1, 129) == 8 * 8 and merge_ctas(8, 1, 32) == 8  # (T=1: 16k / 4k)
    # as a programmatic dependent, 4 a row up to a row CTA an SM (session 40: T 5-13)
    from kdtree.kernels.cuda_common import MERGE_COLS_PDL

    assert f"constexpr int MERGE_COLS_PDL = {MERGE_COLS_PDL};" in src
    assert merge_ctas(72, 1, 129, num_sms=132, pdl=True) == 72 * 4
    assert merge_ctas(8, 1, 129, num_sms=132, pdl=True) == 8 * 8  # (T=1's count)
    assert merge_ctas(136, 1, 129, num_sms=132, pdl=True) == 136  # (T=17: past an SM each)
    assert merge_ctas(132, 1, 129, num_sms=132, pdl=True) == 132 * 4
    assert merge_ctas(72, 1, 129, num_sms=132) == 72  # (in stream order: none)
    assert merge_ctas(72, 1, 129, pdl=True) == 72  # (no SM count: none)
    assert merge_ctas(72, 1, 64, num_sms=132, pdl=True) == 72  # (64 entries: one batch)
    assert merge_ctas(72, 1, 161, num_sms=132, pdl=True) == 72  # (past what 4 a row hold)
    assert merge_ctas(136, 1, 129) == 136 and merge_ctas(8, 1, 300) == 8  # (past 192 entries)
    monkeypatch.setenv("KDTREE_CUDA_MERGE_COLS", "2")
    assert merge_ctas(136, 1, 129) == 272 and merge_ctas(136, 1, 145) == 136
    assert merge_ctas(528, 1, 33, num_sms=132) == 528  # (the wide merge's rows)
    assert merge_ctas(528, 1, 33) == 1056 and merge_ctas(8, 1, 4, head_dim=512) == 8
    monkeypatch.setenv("KDTREE_CUDA_MERGE_COLS", "0")
    assert merge_ctas(8, 1, 129) == 8
    monkeypatch.setenv("KDTREE_CUDA_MERGE_WARP", "0")
    assert merge_ctas(136, 2, 16) == 136 * 2


def test_auto_merge_launch(monkeypatch):
    """KDTREE_CUDA_MERGE=auto (the default) launches the merge as a programmatic dependent where
    every wave of the split grid fills the SMs (no SM free once its last CTA has started), else
    in stream order; forced modes are left as they are.
    At the bench's points (page tables of L + T keys in 16-slot pages, 132 SMs) that is where
    sessions 23 and 25 measured the dependent launch faster (8q/1kv, T=65, 16k-64k)."""
    from kdtree.kernels.cuda_common import resolve_merge

    assert resolve_merge(3, 132, 132) == 2 and resolve_merge(3, 264, 132) == 2
    assert resolve_merge(3, 131, 132) == 1 and resolve_merge(3, 64, 132) == 1
    assert resolve_merge(3, 200, 132) == 1  # a second wave of 68: 64 SMs free at its start
    assert resolve_merge(3, 0, 132) == 1
    # one CTA a split: a dependent launch whatever the grid (session 40: the sliced merge;
    # session 41: any other form, scheduled at the split CTAs' exit, split_trigger)
    assert resolve_merge(3, 132, 132, one_cta_a_split=True) == 2
    assert resolve_merge(3, 64, 132, one_cta_a_split=True) == 2
    assert resolve_merge(1, 129, 132, one_cta_a_split=True) == 1  # (forced stays forced)
    for forced in (0, 1, 2):
        assert resolve_merge(forced, 132, 132) == forced
        assert resolve_merge(forced, 64, 132) == forced
    monkeypatch.delenv("KDTREE_CUDA_MERGE", raising=False)

    def merge_at(hq, hkv, t, length):
        pages = -(-(length + t) // 16)
        return cuda_gqa.plan_launch(1, t, hq, hkv, pages * 16, 132).merge

    for length in (16384, 32768, 65536):  # 8q/1kv, T=65: 33 splits, 132 CTAs
        assert merge_at(8, 1, 65, length) == 2
    assert merge_at(8, 1, 65, 131072) == 1  # 32 splits: 4 SMs free
    for length in (16384, 32768, 65536, 131072):  # 8q/1kv, T=17: 52-129 split CTAs, one a split
        assert merge_at(8, 1, 17, length) == 2
    # 8q/1kv, T 5 / 9 / 13 from 8k (65-129 entries): 40 / 72 / 104 rows sliced as a dependent;
    # at 4k (33 entries, a row a CTA) a dependent too, scheduled at the split CTAs' exit
    for t in (5, 9, 13):
        assert merge_at(8, 1, t, 4096) == 2
        assert cuda_gqa.plan_launch(1, t, 8, 1, 4096 + 16 * -(-t // 16), 132).trigger == 0
        for length in (8192, 16384, 262144):
            assert merge_at(8, 1, t, length) == 2, (t, length)
    # 8q/1kv, T=1 at 16768 keys: the split rule's 132 splits of one tile, one CTA each: a
    # dependent launch since its merge is sliced (session 40; the row-a-CTA merge took 12.56 us
    # so against 9.46 in stream order in session 35's call e)
    plan = cuda_gqa.plan_launch(1, 1, 8, 1, 16784, 132)
    assert (plan.num_splits, plan.merge) == (132, 2)
    for length in (16384, 65536, 131072):
        assert merge_at(32, 8, 17, length) == 2  # (68 rows: one CTA a split)
        assert merge_at(32, 8, 65, length) == 1  # (two CTAs a split, 4 SMs free or more)
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "plain")
    assert merge_at(8, 1, 65, 65536) == 1
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "pdl")
    assert merge_at(32, 8, 65, 65536) == 2


def test_split_trigger(monkeypatch):
    """When a split CTA lets the dependent merge be scheduled (split_trigger, mirroring
    split_trigger_of in gqa_tree_sm90.cu): at its exit where the merge is a dependent of a grid
    of one CTA a split that takes a row a CTA or a warp; at its start elsewhere (the sliced and
    the wide merge, four CTAs an SM; grids of several CTAs a split; stream order). Session 41,
    call a: the row-a-CTA merge at 8q/1kv, T=17 0.975-0.989x stream order at the exit trigger."""
    from kdtree.kernels.cuda_common import MERGE_PDL, MERGE_PLAIN, merge_form

    monkeypatch.delenv("KDTREE_GQA_TRIGGER", raising=False)
    monkeypatch.delenv("KDTREE_CUDA_MERGE", raising=False)
    src = (Path(__file__).parents[2] / "kernels" / "gqa_tree_sm90.cu").read_text()
    assert "if (merge != MERGE_PDL || row_ctas != 1 || p.num_splits == 1) return 1;" in src
    assert "return form == MERGE_FORM_CTA || form == MERGE_FORM_WARP ? 0 : 1;" in src
    assert cuda_gqa.split_trigger(MERGE_PDL, 1, 129, "cta") == 0
    assert cuda_gqa.split_trigger(MERGE_PDL, 1, 16, "warp") == 0
    for form in ("cols", "wide"):
        assert cuda_gqa.split_trigger(MERGE_PDL, 1, 129, form) == 1
    assert cuda_gqa.split_trigger(MERGE_PDL, 2, 33, "cta") == 1  # (several CTAs a split)
    assert cuda_gqa.split_trigger(MERGE_PLAIN, 1, 129, "cta") == 1
    assert cuda_gqa.split_trigger(MERGE_PDL, 1, 1, "cta") == 1  # (one split: no merge)
    assert merge_form(136, 1, 129, num_sms=132, pdl=True) == "cta"
    assert merge_form(72, 1, 129, num_sms=132, pdl=True) == "cols"
    assert merge_form(528, 1, 33, num_sms=132, pdl=True) == "wide"
    assert merge_form(68, 8, 16, num_sms=132, pdl=True) == "warp"
    assert merge_form(8, 1, 4, head_dim=512) == "cta"

    def plan(hq, hkv, t, length, batch=1):
        pages = -(-(length + t) // 16)
        return cuda_gqa.plan_launch(batch, t, hq, hkv, pages * 16, 132)

    for length in (16384, 131072, 262144):
        assert plan(8, 1, 17, length).trigger == 0  # (the row-a-CTA merge, dependent)
        assert plan(32, 8, 17, length).trigger == 0  # (a row a warp, dependent)
        for t in (5, 9, 13):  # (sliced, dependent)
            assert plan(8, 1, t, length).trigger == 1
        assert plan(8, 1, 65, length).trigger == 1  # (two CTAs a split)
    assert plan(8, 1, 1, 16384).trigger == 1  # (T=1: sliced 8 a row)
    monkeypatch.setenv("KDTREE_CUDA_MERGE", "plain")
    assert plan(8, 1, 17, 131072).trigger == 1
    monkeypatch.setenv("KDTREE_GQA_TRIGGER", "2")
    assert plan(8, 1, 17, 131072).trigger == 2


def test_ablation_setting_warns(monkeypatch):
    monkeypatch.setattr(cuda_gqa, "_ABLATE_WARNED", False)
    monkeypatch.setenv("KDTREE_GQA_ABLATE", "8")
    with pytest.warns(RuntimeWarning, match="wrong"):
        cuda_gqa._warn_if_ablating()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("tma", ["0", "1"])
@pytest.mark.parametrize("ps", [8, 16, 64, 256])
@pytest.mark.parametrize("t", [17, 65])
def test_tma_and_cp_async_paths(tma, ps, t, gen, monkeypatch):
    """Whole prefix tiles go through TMA (page size >= 8) unless KDTREE_GQA_TMA=0; both paths
    match fp64. KDTREE_GQA_TMA=1 makes a tensor map the driver rejects an error (-12) instead of
    a silent cp.async fallback, so the TMA cases do run TMA. Three splits of 977 and 1900 keys: whole, partial and tree tiles, in both
    requests."""
    monkeypatch.setenv("KDTREE_GQA_TMA", tma)
    _run(([977, 1900], t, 32, 8, ps, 3), torch.bfloat16, gen)


def test_split_pdl_setting(monkeypatch):
    """The split kernel is a programmatic dependent unless KDTREE_CUDA_SPLIT_PDL=0 (the Python
    mirror of the launcher's reading, which the bench rows record)."""
    monkeypatch.delenv("KDTREE_CUDA_SPLIT_PDL", raising=False)
    assert cuda_gqa.split_pdl()
    for value, on in (("0", False), ("1", True), ("", True)):
        monkeypatch.setenv("KDTREE_CUDA_SPLIT_PDL", value)
        assert cuda_gqa.split_pdl() is on
    src = (cuda_gqa.SOURCE.parent / "sm90_common.cuh").read_text()  # (both split launchers')
    assert 'getenv("KDTREE_CUDA_SPLIT_PDL")' in src and "env[0] != '0'" in src


def _busiest_split_tiles(prefix_len: int, t: int, num_splits: int, tile: int) -> int:
    """The most tiles one split streams, dealt as ``split_tiles<BN, P, true>`` in
    ``kernels/sm90_common.cuh`` deals them: a chunk of whole tiles, the S-th of the prefix's and
    the tree's tiles together; the prefix in chunks, the tree's tiles on the last split."""
    pre, tree = math.ceil(prefix_len / tile), math.ceil(t / tile)
    chunk = math.ceil(math.ceil((pre + tree) * tile / num_splits) / tile)
    counts = [min(chunk, max(0, pre - s * chunk)) for s in range(num_splits)]
    counts[-1] += tree
    return max(counts)


def test_split_count_model_counts_the_tree_tiles_the_kernel_streams():
    """choose_splits costs a count by ceil(page-table tiles / s); the kernel balances the prefix
    and the tree tiles over the splits, so the busiest split can stream one tile more than the
    prefix alone would give (8q/1kv, T=65, 16k at 32 splits: 5 tiles, not 4). The page table a
    caller sizes covers the tree tokens (the bench: L + the run's largest T, whole pages), so
    the model's count is what the busiest split streams at every point of the issue's grid."""
    assert _busiest_split_tiles(16384, 65, 32, 128) == 5  # the case the model must not hit
    assert _busiest_split_tiles(16384, 65, 33, 128) == 4
    for hq, hkv in ((8, 1), (32, 8)):
        for batch in (1, 8, 32):
            for t in (1, 9, 17, 65, 257):
                for length in (1024, 4096, 16384, 32768, 65536, 131072, 262144):
                    for t_max in (t, 257):
                        max_len = math.ceil((length + t_max) / 16) * 16
                        plan = cuda_gqa.plan_launch(batch, t, hq, hkv, max_len, 132)
                        tile = cuda_gqa.SHAPES[plan.wgs][1]
                        modelled = math.ceil(math.ceil(max_len / tile) / plan.num_splits)
                        got = _busiest_split_tiles(length, t, plan.num_splits, tile)
                        assert got <= modelled, (hq, batch, t, length, t_max, plan)
    assert cuda_gqa.plan_launch(1, 65, 8, 1, 16384 + 80, 132).num_splits == 33
    # where a count one tile short of the fewest remains, it is the rule's 3 % tolerance: at
    # 128k 32 splits of 33 tiles, where 33 splits would stream 32
    assert cuda_gqa.plan_launch(1, 65, 8, 1, 131072 + 80, 132).num_splits == 32
    assert _busiest_split_tiles(131072, 65, 33, 128) == 32
