"""Paged KV cache: allocation, slots, writes, exhaustion, release."""

from __future__ import annotations

import pytest
import torch

from kdtree.attention import gather_prefix
from kdtree.cache import CacheExhaustedError, PagedKVCache
from kdtree.models import get_config


def gqa_cache(page_size: int, num_pages: int = 12, max_batch: int = 3) -> PagedKVCache:
    return PagedKVCache(
        num_layers=2,
        num_pages=num_pages,
        page_size=page_size,
        max_batch=max_batch,
        kind="gqa",
        n_kv_heads=2,
        head_dim=8,
    )


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_write_then_gather_round_trips(page_size, gen):
    cache = gqa_cache(page_size, num_pages=-(-200 // page_size) * 3)
    lens = [5, 130, 0]
    data = {}
    for r, n in enumerate(lens):
        cache.reserve(r, n + 3)
        k = torch.randn(n + 3, 2, 8, generator=gen)
        v = torch.randn(n + 3, 2, 8, generator=gen)
        cache.write(1, cache.slots(r, 0, n + 3), k, v)
        data[r] = (k, v)
    # pages of different requests never overlap
    pages = [set(cache.pages(r)) for r in range(3)]
    assert not (pages[0] & pages[1]) and not (pages[0] & pages[2]) and not (pages[1] & pages[2])
    for r, n in enumerate(lens):
        assert cache.capacity(r) >= n + 3
        k = gather_prefix(cache.k[1], cache.page_table[r], n + 3)
        v = gather_prefix(cache.v[1], cache.page_table[r], n + 3)
        assert torch.equal(k, data[r][0]) and torch.equal(v, data[r][1])
    assert not cache.k[0].any()  # other layer untouched


def test_slots_follow_page_table(gen):
    cache = gqa_cache(16)
    cache.reserve(0, 20)
    cache.reserve(1, 40)
    cache.reserve(0, 50)  # grows request 0 after request 1 took pages
    s = cache.slots(0, 0, 50)
    pos = torch.arange(50)
    table = cache.page_table[0].long()
    assert torch.equal(s, table[pos // 16] * 16 + pos % 16)
    sm = cache.slot_mapping([0, 1], [3, 7], 4)
    assert sm.shape == (2, 4) and torch.equal(sm[1], cache.slots(1, 7, 4))
    with pytest.raises(ValueError, match="reserved"):
        cache.slots(1, 40, 9)


def test_exhaustion_raises_and_leaves_state_intact(gen):
    cache = gqa_cache(16, num_pages=4)
    cache.reserve([0, 1], [20, 10])  # 2 + 1 pages
    k = torch.randn(20, 2, 8, generator=gen)
    cache.write(0, cache.slots(0, 0, 20), k, k)
    cache.set_length(0, 20)
    before = (cache.free_pages, cache.page_table.clone(), cache.k[0].clone(), cache.pages(0))
    with pytest.raises(CacheExhaustedError, match="exhausted"):
        cache.reserve([1, 0], [10, 30])  # needs 0 + 2 more, only 1 free: all or nothing
    assert cache.free_pages == before[0]
    assert torch.equal(cache.page_table, before[1])
    assert torch.equal(cache.k[0], before[2])
    assert cache.pages(0) == before[3] and cache.length(0) == 20
    with pytest.raises(CacheExhaustedError, match="page table"):
        PagedKVCache.for_model(
            get_config("tiny-llama"), max_batch=1, max_len=16, page_size=16
        ).reserve(0, 17)


def test_release_returns_pages_and_lengths():
    cache = gqa_cache(16, num_pages=4)
    cache.reserve(0, 64)
    cache.set_length(0, 50)
    assert cache.free_pages == 0 and int(cache.lengths[0]) == 50
    cache.release(0)
    assert cache.free_pages == 4 and cache.length(0) == 0 and int(cache.lengths[0]) == 0
    cache.reserve(1, 64)
    assert sorted(cache.pages(1)) == [0, 1, 2, 3]
    cache.advance(1, 10)
    assert cache.length(1) == 10
    with pytest.raises(ValueError, match="capacity"):
        cache.set_length(1, 65)


def test_padding_slots_are_not_written(gen):
    cache = gqa_cache(1)
    cache.reserve(0, 3)
    sm = cache.slots(0, 0, 3).clone()
    sm[1] = -1
    k = torch.randn(3, 2, 8, generator=gen)
    cache.write(0, sm[None], k[None], k[None])
    flat = cache.k[0].view(-1, 2, 8)
    assert torch.equal(flat[sm[0]], k[0]) and torch.equal(flat[sm[2]], k[2])
    assert not flat[cache.slots(0, 1, 1)].any()


def test_mla_latent_layout(gen):
    cfg = get_config("tiny-mla")
    cache = PagedKVCache.for_model(cfg, max_batch=2, max_len=40, page_size=16)
    assert cache.kind == "mla" and len(cache.kv) == cfg.num_hidden_layers
    assert cache.kv[0].shape[-1] == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    cache.reserve(1, 5)
    c = torch.randn(5, cfg.kv_lora_rank, generator=gen)
    pe = torch.randn(5, cfg.qk_rope_head_dim, generator=gen)
    cache.write_latent(2, cache.slots(1, 0, 5), c, pe)
    got = gather_prefix(cache.kv[2], cache.page_table[1], 5)
    assert torch.equal(got[:, : cfg.kv_lora_rank], c) and torch.equal(
        got[:, cfg.kv_lora_rank :], pe
    )
    with pytest.raises(TypeError, match="write_latent"):
        cache.write(0, cache.slots(1, 0, 5), c, c)


def test_bad_arguments():
    cache = gqa_cache(16)
    with pytest.raises(ValueError, match="req"):
        cache.reserve(3, 1)
    with pytest.raises(ValueError, match="duplicate"):
        cache.reserve([0, 0], 1)
    cache.reserve(0, 4)
    with pytest.raises(TypeError, match="int64"):
        cache.write(0, cache.slots(0, 0, 4).int(), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8))
    with pytest.raises(ValueError, match="k, v"):
        cache.write(0, cache.slots(0, 0, 4), torch.zeros(4, 3, 8), torch.zeros(4, 3, 8))
    with pytest.raises(ValueError, match="slots"):
        cache.write(0, cache.slots(0, 0, 3), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8))
    with pytest.raises(ValueError, match="page_size"):
        gqa_cache(0)


def test_remap_tail_moves_pages_without_copy(gen):
    cache = gqa_cache(1, num_pages=16)
    cache.reserve(0, 4)
    cache.set_length(0, 4)
    cache.reserve(0, 5)  # a 5-node tree at positions 4..8
    k = torch.randn(9, 2, 8, generator=gen)
    cache.write(0, cache.slots(0, 0, 9), k, k)
    cache.remap_tail(0, 4, [0, 2, 4])  # accepted path: nodes 0, 2, 4
    assert cache.capacity(0) == 7 and cache.free_pages == 16 - 7
    got = gather_prefix(cache.k[0], cache.page_table[0], 7)
    assert torch.equal(got, k[[0, 1, 2, 3, 4, 6, 8]])
    cache.set_length(0, 7)
    cache.reserve(0, 3)
    cache.set_length(0, 8)
    cache.trim(0)
    assert cache.capacity(0) == 8 and cache.free_pages == 8
    with pytest.raises(ValueError, match="page_size 1"):
        gqa_cache(16).remap_tail(0, 0, [])
    with pytest.raises(ValueError, match="path"):
        cache.remap_tail(0, 4, [0, 0])


def test_check_slots_rejects_out_of_range():
    cache = gqa_cache(16, num_pages=2)
    with pytest.raises(ValueError, match="beyond"):
        cache.check_slots(torch.tensor([[0, 32]]))
    with pytest.raises(ValueError, match="-1 for padding"):
        cache.check_slots(torch.tensor([[0, -2]]))
    assert cache.check_slots(torch.tensor([[0, 31]])) is None
    assert cache.check_slots(torch.tensor([[0, -1]])).tolist() == [True, False]
