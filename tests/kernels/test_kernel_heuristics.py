"""Split-count and tile-config heuristics (pure functions of static shapes)."""

from __future__ import annotations

import pytest

from kdtree.kernels.heuristics import (
    MAX_SPLITS,
    TileConfig,
    choose_num_splits,
    gqa_configs,
    length_bucket,
    mla_configs,
    splits_for,
    tuning_candidates,
)

# GQA d128, one KV head per unit: 512 B and 2*2*64*128 FLOPs per key (64-row tile).
_GQA = dict(token_bytes=512.0, token_flops=32768.0, partial_bytes=64 * 129 * 4)


def test_single_request_long_context_splits_wide():
    s = choose_num_splits(units=8, max_len=131072, block_n=64, slots=264, num_sms=132, **_GQA)
    assert 16 <= s <= MAX_SPLITS
    assert 8 * s <= 264  # one wave
    assert 131072 / s >= 1024  # each split streams >= 1k tokens


def test_large_batch_does_not_split():
    assert (
        choose_num_splits(units=2048, max_len=4096, block_n=64, slots=264, num_sms=132, **_GQA)
        == 1
    )


def test_short_context_bounded_by_tiles():
    s = choose_num_splits(units=1, max_len=100, block_n=64, slots=264, num_sms=132, **_GQA)
    assert s <= 2


def test_avoids_a_nearly_empty_second_wave():
    s = choose_num_splits(units=17, max_len=131072, block_n=64, slots=132, num_sms=132, **_GQA)
    waves = -(-17 * s // 132)
    assert 17 * s / (waves * 132) > 0.85


def test_merge_cost_limits_splits_at_short_context():
    long = choose_num_splits(units=1, max_len=262144, block_n=64, slots=264, num_sms=132, **_GQA)
    short = choose_num_splits(units=1, max_len=4096, block_n=64, slots=264, num_sms=132, **_GQA)
    assert short < long


def test_bad_arguments():
    with pytest.raises(ValueError, match="units"):
        choose_num_splits(units=0, max_len=10, block_n=64, slots=1, num_sms=1, **_GQA)


def test_length_bucket_covers_and_is_coarse():
    for n in (1, 255, 256, 1000, 131072, 131073):
        b = length_bucket(n)
        assert b >= n and (b == 256 or b % 1024 == 0)


@pytest.mark.parametrize("rows", [1, 4, 9, 17, 68, 128, 129, 260, 1028])
@pytest.mark.parametrize("d", [64, 128])
def test_gqa_configs_are_valid(rows, d):
    for cfg in gqa_configs(rows, d):
        assert cfg.block_m in (16, 32, 64, 128) and cfg.block_n in (32, 64, 128)
        assert cfg.num_warps in (4, 8) and cfg.num_stages >= 1
        assert cfg.smem_bytes(d, d) <= 227 * 1024


@pytest.mark.parametrize(
    "cfg, dk, dv, shared",
    [
        (TileConfig(128, 128, 8, 2), 128, 128, False),  # 288 KiB on the H200: refused
        (TileConfig(64, 64, 8, 2), 576, 512, True),  # 248 KiB on the H200: refused
    ],
)
def test_smem_estimate_rejects_configs_the_h200_refused(cfg, dk, dv, shared):
    assert not cfg.fits(dk, dv, shared_kv=shared)


@pytest.mark.parametrize(
    "kind, rows, dk", [("gqa", 68, 128), ("gqa", 260, 128), ("mla", 272, 576)]
)
def test_tuning_candidates_fit(kind, rows, dk):
    shared = kind == "mla"
    for cfg in tuning_candidates(kind, rows, dk):
        assert cfg.fits(dk, 512 if shared else dk, shared_kv=shared)


@pytest.mark.parametrize("rows", [4, 68, 260])
def test_small_latent_tuning_candidates_try_larger_tiles(rows):
    """The shipped target's latent (64 + 16): larger and 4-warp tiles that the 512 latent
    cannot hold, bounded by the packed rows, all fitting shared memory."""
    small = tuning_candidates("mla", rows, 80, 64)
    assert tuning_candidates("mla", rows, 80) == small  # one rule: the key width decides
    big = tuning_candidates("mla", rows, 576)
    assert small[0] == mla_configs(rows, 80)[0]  # the heuristic's own choice comes first
    assert small[0] == TileConfig(16, 128, 4, 2)  # the tuned winners' shape (calls N-P)
    assert mla_configs(rows, 576)[0].block_n <= 64  # the 512 latent keeps its own choice
    assert all(c.fits(80, 64, shared_kv=True) for c in small)
    assert all(c.block_m <= max(16, 1 << (rows - 1).bit_length()) for c in small)
    assert set(small) != set(big)
    if rows > 128:
        assert any(c.block_m == 128 for c in small)
    if rows > 32:  # the shipped 64k, T=17 winner stays findable
        assert TileConfig(64, 128, 4, 2) in small
    assert any(c.num_warps == 4 and c.block_m >= 64 for c in small) == (rows > 16)


@pytest.mark.parametrize("rows", [8, 16, 136, 520, 2176])
def test_mla_configs_fit_shared_memory(rows):
    for cfg in mla_configs(rows):
        assert cfg.smem_bytes(576, 512, shared_kv=True) <= 227 * 1024


def test_splits_for_mla_compute_bound_stays_low():
    cfg = mla_configs(1040)[0]
    s = splits_for(
        "mla",
        cfg,
        batch=1,
        rows=1040,
        num_kv_heads=1,
        head_dim_k=576,
        head_dim_v=512,
        max_len=131072,
        num_sms=132,
    )
    assert 1 <= s <= 16


def test_ctas_per_sm_follows_the_measured_footprint():
    """ncu (session 6): a 64x64 s3 d128 CTA takes 114.9 KiB, so two fit an SM; an 8-warp
    128-row CTA stays one an SM (registers)."""
    assert TileConfig(64, 64, 4, 3, 1).ctas_per_sm(128, 128) == 2
    assert TileConfig(128, 64, 8, 3, 1).ctas_per_sm(128, 128) == 1


def test_split_count_fills_two_ctas_an_sm_when_they_fit():
    """A lone latency-bound CTA per SM is charged as such, so GQA 8q/1kv at 128k, T=17 (3 M
    tiles of 64 rows) takes enough splits for two CTAs an SM (80 on the H200, call b), not one
    (43 before)."""
    from kdtree.kernels.heuristics import splits_for

    s = splits_for("gqa", TileConfig(64, 64, 4, 3, 1), batch=1, rows=136, num_kv_heads=1,
                   head_dim_k=128, head_dim_v=128, max_len=131072, num_sms=132)  # fmt: skip
    assert 132 < 3 * s <= 264


def test_tail_candidates_only_where_a_tail_exists():
    from kdtree.kernels.heuristics import tail_rows, tuning_candidates

    for rows in (136, 68, 520, 128):
        for c in tuning_candidates("gqa", rows, 128):
            assert not c.tail or tail_rows(rows, c) > 0, (rows, c)
    assert any(c.tail for c in tuning_candidates("gqa", 136, 128))
    assert not any(c.tail for c in tuning_candidates("gqa", 128, 128))
