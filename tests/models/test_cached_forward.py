"""The cached forward (prefill chunks, T=1 decode, tree verify) equals the dense forward."""

from __future__ import annotations

import pytest
import torch

from kdtree.attention import AttnMetadata
from kdtree.cache import PagedKVCache
from kdtree.spec.bitmask import pack_bits

ATOL = 1e-4


def run(model, cache, reqs, ids, starts, mode="prefill", tree=None, backend="ref", depths=None):
    """One cached forward of ``ids [B, T]`` for request slots ``reqs`` at ``starts``."""
    b, t = ids.shape
    cache.reserve(reqs, t)
    slots = cache.slot_mapping(reqs, starts, t)
    offs = torch.tensor(starts)[:, None]
    pos = offs + (torch.arange(t)[None] if depths is None else depths)
    attn = AttnMetadata(
        mode=mode,
        slot_mapping=slots,
        page_table=cache.batch_page_table(reqs),
        prefix_lens=torch.tensor(starts, dtype=torch.int32),
        tree_mask=tree,
        backend=backend,
    )
    return model(ids, pos, cache, attn, return_taps=True)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_prefill_chunks_and_decode_equal_dense(target_name, page_size, gen, random_model):
    model = random_model(target_name, gen)
    cfg = model.config
    seqs = torch.randint(0, cfg.vocab_size, (2, 20), generator=gen)
    with torch.no_grad():
        dense = model.forward_dense(seqs, return_taps=True)
        cache = PagedKVCache.for_model(cfg, max_batch=3, max_len=64, page_size=page_size)
        reqs = [2, 0]  # request slots need not be 0..B-1
        got = {r: [] for r in range(2)}
        taps = {r: [] for r in range(2)}
        for row, (r, n) in enumerate(zip(reqs, (9, 4), strict=True)):  # first chunks, B=1 each
            out = run(model, cache, [r], seqs[row : row + 1, :n], [0])
            got[row].append(out.logits[0])
            taps[row].append(out.taps[0])
            cache.advance(r, n)
        # second chunk, batched, different prefix lengths (9 and 4)
        ids = torch.stack([seqs[0, 9:14], seqs[1, 4:9]])
        out = run(model, cache, reqs, ids, [9, 4])
        for row, r in enumerate(reqs):
            got[row].append(out.logits[row])
            taps[row].append(out.taps[row])
            cache.advance(r, 5)
        # T = 1 decode steps through tree mode (a one-node tree)
        for step in range(3):
            starts = [14 + step, 9 + step]
            ids = torch.stack(
                [seqs[0, starts[0] : starts[0] + 1], seqs[1, starts[1] : starts[1] + 1]]
            )
            one = pack_bits(torch.ones(2, 1, 1, dtype=torch.bool))
            out = run(model, cache, reqs, ids, starts, mode="tree", tree=one)
            for row, r in enumerate(reqs):
                got[row].append(out.logits[row])
                taps[row].append(out.taps[row])
                cache.advance(r, 1)
    for row, n in enumerate((17, 12)):
        torch.testing.assert_close(torch.cat(got[row]), dense.logits[row, :n], atol=ATOL, rtol=0)
        torch.testing.assert_close(torch.cat(taps[row]), dense.taps[row, :n], atol=ATOL, rtol=0)


def random_tree_parents(t: int, gen: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]


@pytest.mark.parametrize("backend", ["ref", "dense_mask"])
def test_tree_logits_equal_causal_forward_over_ancestor_path(
    target_name, backend, gen, random_model
):
    model = random_model(target_name, gen)
    cfg = model.config
    t, prefix = 8, [11, 6]
    prompt = torch.randint(0, cfg.vocab_size, (2, max(prefix)), generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (2, t), generator=gen)
    parents = [random_tree_parents(t, gen) for _ in range(2)]
    vis = torch.zeros(2, t, t, dtype=torch.bool)
    depths = torch.zeros(2, t, dtype=torch.int64)
    for b in range(2):
        for i in range(t):
            p = parents[b][i]
            vis[b, i, i] = True
            if p >= 0:
                vis[b, i] |= vis[b, p]
                depths[b, i] = depths[b, p] + 1
    with torch.no_grad():
        cache = PagedKVCache.for_model(cfg, max_batch=2, max_len=32, page_size=4)
        for b in range(2):
            run(model, cache, [b], prompt[b : b + 1, : prefix[b]], [0])
            cache.advance(b, prefix[b])
        out = run(model, cache, [0, 1], tokens, prefix, "tree", pack_bits(vis), backend, depths)
        for b in range(2):
            for i in range(t):
                path = [j for j in range(t) if vis[b, i, j]]  # ancestors in pop order
                seq = torch.cat([prompt[b, : prefix[b]], tokens[b, path]])[None]
                want = model.forward_dense(seq).logits[0, -1]
                torch.testing.assert_close(out.logits[b, i], want, atol=ATOL, rtol=0)


def test_model_input_validation(gen, random_model):
    model = random_model("tiny-llama", gen)
    with pytest.raises(ValueError, match="input_ids"):
        model.forward_dense(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="positions"):
        model.forward_dense(
            torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int64)
        )
    cache = PagedKVCache.for_model(model.config, max_batch=1, max_len=16, page_size=16)
    cache.reserve(0, 3)
    ids = torch.zeros(1, 3, dtype=torch.int64)
    attn = AttnMetadata(
        "prefill", cache.slot_mapping([0], [0], 2), cache.page_table[:1], cache.lengths[:1]
    )
    with pytest.raises(ValueError, match="slot_mapping"):
        model(ids, torch.arange(3)[None], cache, attn)
    with pytest.raises(ValueError, match="tree_mask"):
        AttnMetadata(
            "tree", cache.slot_mapping([0], [0], 3), cache.page_table[:1], cache.lengths[:1]
        )


def test_tree_beyond_the_page_table_raises(gen, random_model):
    model = random_model("tiny-mla", gen)
    cache = PagedKVCache.for_model(model.config, max_batch=1, max_len=16, page_size=16)
    cache.reserve(0, 4)
    attn = AttnMetadata(
        "tree",
        cache.slot_mapping([0], [0], 4),
        cache.page_table[:1],
        torch.tensor([14], dtype=torch.int32),  # 14 + 4 > 16
        pack_bits(torch.eye(4, dtype=torch.bool)[None]),
    )
    with pytest.raises(ValueError, match="capacity"):
        model(torch.zeros(1, 4, dtype=torch.int64), torch.arange(4)[None] + 14, cache, attn)
