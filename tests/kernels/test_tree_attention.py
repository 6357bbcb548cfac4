"""Triton tree-verify attention (GQA and absorbed MLA) against an fp64 reference."""

from __future__ import annotations

import pytest
import torch
from _kernel_inputs import gqa_inputs, mla_inputs
from _kernel_reference import assert_close_to_truth, gqa_dense, mla_dense

from kdtree.kernels import TreeAttentionPlan, tree_attention_mla_triton, tree_attention_triton

ATOL = {torch.float32: 1e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3}

# (prefix lengths, T, Hq, Hkv, D, page size, forced splits or None)
GQA_CASES = [
    ([97], 7, 4, 2, 64, 16, None),
    ([1], 1, 4, 4, 64, 1, None),
    ([257], 17, 4, 1, 64, 64, 4),
    ([1, 257, 97], 7, 2, 1, 64, 16, 3),
    ([97, 1], 17, 8, 2, 32, 1, 5),
    ([257], 1, 8, 1, 128, 16, 2),
    ([5, 97], 65, 2, 2, 32, 64, None),
    # more splits than the merge reads at once (128 -> two chunks of 64), most of them empty
    ([257, 40], 3, 4, 1, 128, 16, 100),
]


def _run_gqa(case, dtype, gen, pad_from=None):
    lens, t, hq, hkv, d, ps, splits = case
    q, k, v, pt, pl, m = gqa_inputs(lens, t, hq, hkv, d, ps, dtype, gen, pad_from)
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    got = tree_attention_triton(q, k, v, pt, pl, m, sm_scale=d**-0.5, out=out, num_splits=splits)
    assert got is out
    truth = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.float64)
    base = gqa_dense(q, k, v, pt, pl, m, d**-0.5, dtype)
    assert_close_to_truth(got, truth, base, ATOL[dtype], f"gqa {case} {dtype}")


@pytest.mark.parametrize(
    "case", GQA_CASES, ids=lambda c: f"L{c[0]}-T{c[1]}-g{c[2]}x{c[3]}-d{c[4]}-ps{c[5]}"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gqa_matches_fp64(case, dtype, gen):
    _run_gqa(case, dtype, gen)


def test_merge_tiles():
    from kdtree.kernels._common import MERGE_TILE_ELEMS, merge_tiles

    # every split in one load where it fits, one row a program while programs are scarce
    assert merge_tiles(136, 128, 43) == (128, 64, 1)
    assert merge_tiles(136, 128, 128) == (128, 64, 1)  # 128 x 128 > the tile: two chunks
    # many rows: wider programs, never above the tile
    bd, bs, br = merge_tiles(2080, 128, 13, programs_per_row=8)
    assert (bd, bs) == (128, 16) and br > 1 and bs * br * bd <= MERGE_TILE_ELEMS
    assert merge_tiles(1040, 512, 15)[0] == 128


def test_merge_with_wide_programs(gen, monkeypatch):
    """Several rows per merge program (the layout large grids get) stay exact."""
    import kdtree.kernels._common as common

    monkeypatch.setattr(common, "MERGE_TARGET_PROGRAMS", 1)
    assert common.merge_tiles(4 * 9, 64, 6)[2] > 1
    _run_gqa(([150, 61], 9, 4, 1, 64, 16, 6), torch.float32, gen)


def test_gqa_padded_rows(gen):
    _run_gqa(([97, 20], 17, 4, 2, 64, 16, 2), torch.float32, gen, pad_from=[9, 17])


# (prefix lengths, T, H, rank, rope, page size, forced splits or None)
MLA_CASES = [
    ([97], 7, 2, 64, 16, 16, None),
    ([1, 257], 1, 4, 64, 16, 1, 3),
    ([257, 1], 17, 1, 64, 16, 64, 2),
    ([33], 3, 2, 512, 64, 64, None),
    ([300], 2, 2, 512, 64, 16, 9),  # the merge over four 128-wide slices of the latent
]


@pytest.mark.parametrize(
    "case", MLA_CASES, ids=lambda c: f"L{c[0]}-T{c[1]}-h{c[2]}-r{c[3]}-ps{c[5]}"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_mla_matches_fp64(case, dtype, gen):
    lens, t, h, rank, rope, ps, splits = case
    qn, qp, kv, pt, pl, m = mla_inputs(lens, t, h, rank, rope, ps, dtype, gen)
    out = torch.full((len(lens), t, h, rank), float("nan"), dtype=dtype)
    got = tree_attention_mla_triton(
        qn, qp, kv, pt, pl, m, sm_scale=0.1, out=out, num_splits=splits
    )
    truth = mla_dense(qn, qp, kv, pt, pl, m, 0.1, torch.float64)
    base = mla_dense(qn, qp, kv, pt, pl, m, 0.1, dtype)
    assert_close_to_truth(got, truth, base, ATOL[dtype], f"mla {case} {dtype}")


def test_plan_workspace_is_reused_and_poison_proof(gen):
    lens, t, hq, hkv, d = [200, 3], 9, 4, 2, 32
    q, k, v, pt, pl, m = gqa_inputs(lens, t, hq, hkv, d, 16, torch.float32, gen)
    plan = TreeAttentionPlan(
        "gqa",
        max_batch=4,
        max_tree=16,
        num_kv_heads=hkv,
        group=hq // hkv,
        head_dim_k=d,
        head_dim_v=d,
        max_prefix_len=256,
        device="cpu",
        min_capacity_rows=4 * hkv * 3 * 64,  # room for the forced 3 splits
    )
    plan.part.fill_(float("nan"))
    plan.lse.fill_(float("nan"))
    ptr = plan.part.data_ptr()
    first = tree_attention_triton(q, k, v, pt, pl, m, sm_scale=0.2, plan=plan, num_splits=3)
    second = tree_attention_triton(q, k, v, pt, pl, m, sm_scale=0.2, plan=plan, num_splits=3)
    assert plan.part.data_ptr() == ptr
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    truth = gqa_dense(q, k, v, pt, pl, m, 0.2, torch.float64)
    assert (first.double() - truth).abs().max() < 1e-5


def test_entry_point_dispatches_to_triton(gen):
    from kdtree.attention import tree_attention, tree_attention_mla

    q, k, v, pt, pl, m = gqa_inputs([40, 7], 5, 4, 2, 32, 16, torch.float32, gen)
    got = tree_attention(q, k, v, pt, pl, m, sm_scale=0.3, backend="triton")
    ref = tree_attention(q, k, v, pt, pl, m, sm_scale=0.3, backend="ref")
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    qn, qp, kv, pt, pl, m = mla_inputs([40], 5, 2, 64, 16, 16, torch.float32, gen)
    got = tree_attention_mla(qn, qp, kv, pt, pl, m, sm_scale=0.1, backend="triton")
    ref = tree_attention_mla(qn, qp, kv, pt, pl, m, sm_scale=0.1, backend="ref")
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 17, 65])
@pytest.mark.parametrize("shape", [(32, 8, 128), (8, 1, 128), (16, 2, 64)], ids=str)
def test_gqa_bf16_gpu(t, shape, gen):
    hq, hkv, d = shape
    q, k, v, pt, pl, m = gqa_inputs([3000, 1, 517], t, hq, hkv, d, 16, torch.bfloat16, gen)
    dev = [x.cuda() for x in (q, k, v, pt, pl, m)]
    got = tree_attention_triton(*dev, sm_scale=d**-0.5).cpu()
    truth = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.float64)
    base = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.bfloat16)
    assert_close_to_truth(got, truth, base, ATOL[torch.bfloat16], f"gqa bf16 {shape} T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("t", [17, 65])
@pytest.mark.parametrize("shape", [(32, 8), (8, 1)], ids=str)
@pytest.mark.parametrize(
    "cfg", [(64, 64, 4, 3, 1, 1), (128, 64, 8, 3, 1, 1), (64, 64, 8, 3, 1, 1)], ids=str
)
def test_gqa_tail_tile_bf16_gpu(t, shape, cfg, gen):
    """The small-tail tiles as compiled for the GPU (the tuning candidates), several splits."""
    from kdtree.kernels.heuristics import TileConfig

    hq, hkv = shape
    q, k, v, pt, pl, m = gqa_inputs([3000, 1, 517], t, hq, hkv, 128, 16, torch.bfloat16, gen)
    dev = [x.cuda() for x in (q, k, v, pt, pl, m)]
    got = tree_attention_triton(
        *dev, sm_scale=128**-0.5, config=TileConfig(*cfg), num_splits=5
    ).cpu()
    truth = gqa_dense(q, k, v, pt, pl, m, 128**-0.5, torch.float64)
    base = gqa_dense(q, k, v, pt, pl, m, 128**-0.5, torch.bfloat16)
    assert_close_to_truth(got, truth, base, ATOL[torch.bfloat16], f"tail {shape} T={t} {cfg}")


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 17, 65])
@pytest.mark.parametrize("h", [8, 16, 128])
def test_mla_bf16_gpu(t, h, gen):
    if h * t > 4096:
        pytest.skip("keeps the fp64 reference small")
    qn, qp, kv, pt, pl, m = mla_inputs([2000, 9], t, h, 512, 64, 64, torch.bfloat16, gen)
    dev = [x.cuda() for x in (qn, qp, kv, pt, pl, m)]
    got = tree_attention_mla_triton(*dev, sm_scale=576**-0.5).cpu()
    truth = mla_dense(qn, qp, kv, pt, pl, m, 576**-0.5, torch.float64)
    base = mla_dense(qn, qp, kv, pt, pl, m, 576**-0.5, torch.bfloat16)
    assert_close_to_truth(got, truth, base, ATOL[torch.bfloat16], f"mla bf16 h={h} T={t}")


# the page-table prefetch variant of the prefix loop (TileConfig.pt_prefetch): same results
# with several full tiles per split, a ragged tail and requests of different lengths
@pytest.mark.parametrize("ps", [1, 16])
def test_gqa_pt_prefetch_matches_fp64(ps, gen):
    from kdtree.kernels.heuristics import TileConfig

    lens, t, hq, hkv, d = [131, 40, 1], 9, 4, 2, 32
    q, k, v, pt, pl, m = gqa_inputs(lens, t, hq, hkv, d, ps, torch.float32, gen)
    truth = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.float64)
    base = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.float32)
    for splits in (1, 3):
        got = tree_attention_triton(
            q, k, v, pt, pl, m, sm_scale=d**-0.5, num_splits=splits,
            config=TileConfig(32, 16, 4, 1, pt_prefetch=1),
        )  # fmt: skip
        assert_close_to_truth(got, truth, base, ATOL[torch.float32], f"prefetch S{splits}")


# the small-tail variant (TileConfig.tail): G * (2^k + 1) rows = full tiles and a 16- or
# 32-row last tile, with one and several splits, the prefetch on and off, a padded tree row;
# the workspace is poisoned between runs so a partial the tail misses cannot come from before
@pytest.mark.parametrize("hq,t,bm,tail", [(4, 17, 64, 16), (8, 17, 64, 16), (2, 65, 64, 16),
                                          (32, 17, 128, 32)])  # fmt: skip
def test_gqa_tail_tile_matches_fp64(hq, t, bm, tail, gen):
    from kdtree.kernels import TreeAttentionPlan
    from kdtree.kernels.gqa import gqa_split_args
    from kdtree.kernels.heuristics import TileConfig, tail_rows

    lens, hkv, d, ps = [131, 40], 1, 32, 16
    cfgs = [TileConfig(bm, 16, 4, 1, 0, 1), TileConfig(bm, 16, 4, 1, 1, 1)]
    assert all(tail_rows(hq * t, c) == tail for c in cfgs)
    q, k, v, pt, pl, m = gqa_inputs(lens, t, hq, hkv, d, ps, torch.float32, gen, [t, t - 2])
    truth = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.float64)
    base = gqa_dense(q, k, v, pt, pl, m, d**-0.5, torch.float32)
    plan = TreeAttentionPlan("gqa", max_batch=2, max_tree=t, num_kv_heads=hkv, group=hq,
                             head_dim_k=d, head_dim_v=d, max_prefix_len=256, device="cpu",
                             min_capacity_rows=2 * hkv * 3 * (-(-hq * t // 16) * 16))  # fmt: skip
    for cfg in cfgs:
        for splits in (1, 3):
            out = torch.full_like(q, float("nan"))
            part, lse = plan.views(2, t, splits) if splits > 1 else (out, out)
            _, _, kw = gqa_split_args(q, k, v, pt, pl, m, out, part, lse, qk_scale=1.0,
                                      num_splits=splits, cfg=cfg, dot_precision="ieee")  # fmt: skip
            assert kw["TAIL_M"] == tail  # the launch really takes the small tile
            if splits > 1:
                part.fill_(float("nan"))
                lse.fill_(float("nan"))
            got = tree_attention_triton(
                q, k, v, pt, pl, m, sm_scale=d**-0.5, num_splits=splits, config=cfg, out=out,
                plan=plan,
            )  # fmt: skip
            assert_close_to_truth(got, truth, base, ATOL[torch.float32], f"tail {cfg} S{splits}")


def test_tail_rows_rule():
    from kdtree.kernels.heuristics import TileConfig, tail_rows

    tail = TileConfig(64, 64, 4, 3, 1, 1)
    assert tail_rows(136, tail) == 16  # 8 heads x 17 tokens: 2 tiles + 8 rows
    assert tail_rows(260, TileConfig(128, 64, 8, 3, 1, 1)) == 16  # 4 x 65
    assert tail_rows(128, tail) == 0  # no remainder
    assert tail_rows(40, tail) == 0  # a single partial tile stays one tile
    assert tail_rows(64 + 20, tail) == 0  # 32 rows would be half the tile
    assert tail_rows(136, TileConfig(64, 64, 4, 3, 1)) == 0  # the flag off


def test_mla_pt_prefetch_matches_fp64(gen):
    from kdtree.kernels.heuristics import TileConfig

    lens, t, h, rank, rope, ps = [131, 17], 5, 2, 64, 16, 16
    qn, qp, kv, pt, pl, m = mla_inputs(lens, t, h, rank, rope, ps, torch.float32, gen)
    truth = mla_dense(qn, qp, kv, pt, pl, m, 0.1, torch.float64)
    base = mla_dense(qn, qp, kv, pt, pl, m, 0.1, torch.float32)
    got = tree_attention_mla_triton(
        qn, qp, kv, pt, pl, m, sm_scale=0.1, num_splits=2,
        config=TileConfig(16, 16, 4, 1, pt_prefetch=1),
    )  # fmt: skip
    assert_close_to_truth(got, truth, base, ATOL[torch.float32], "mla prefetch")
