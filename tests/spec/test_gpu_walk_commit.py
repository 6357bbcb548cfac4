"""Device walk, sampling, verify buffers and the one-launch KV commit vs the references."""

from __future__ import annotations

import pytest
import torch

from kdtree.cache import PagedKVCache
from kdtree.spec.accept import walk_tree
from kdtree.spec.gpu.commit import (
    CommitPlan,
    commit_kv,
    commit_path,
    commit_slots,
    make_commit_plan,
)
from kdtree.spec.gpu.tree_build import build_trees_device
from kdtree.spec.gpu.verify_inputs import DeviceVerifyBuffers
from kdtree.spec.gpu.walk import sample_tokens_device, walk_trees_device
from kdtree.spec.tree import build_tree_ref, draft_topk


def _trees(B, D, K, budget, gen, V=50):
    lp, tok = draft_topk(torch.randn(B, D, V, generator=gen) * 3, K)
    bonus = torch.randint(0, V, (B,), generator=gen)
    return lp, tok, bonus, build_trees_device(lp, tok, budget, bonus, backend="torch")


def _post_following(tree_ref, T, gen, V=50, p_follow=0.8):
    """Target tokens that mostly follow some child, so paths get long."""
    post = torch.randint(0, V, (T,), generator=gen)
    for i, kids in enumerate(tree_ref.children):
        if kids and torch.rand(1, generator=gen).item() < p_follow:
            toks = list(kids)
            post[i] = toks[int(torch.randint(0, len(toks), (1,), generator=gen))]
    return post


@pytest.mark.parametrize(
    "B,D,K,budget", [(3, 6, 4, 20), (2, 15, 8, 64), (2, 3, 2, 30), (1, 4, 3, 0)]
)
def test_walk_equals_reference(B, D, K, budget, gen):
    lp, tok, bonus, dt = _trees(B, D, K, budget, gen)
    T = budget + 1
    for _ in range(5):
        posts, refs = [], []
        for b in range(B):
            ref_tree = build_tree_ref(lp[b], tok[b], budget, int(bonus[b]))
            post = _post_following(ref_tree, T, gen)
            posts.append(post)
            refs.append(walk_tree(ref_tree, post.tolist()))
        acc = walk_trees_device(dt, torch.stack(posts), max_path=min(D, budget) + 1)
        for b, ref in enumerate(refs):
            n = ref.accepted_len
            assert int(acc.count[b]) == n
            assert acc.path[b, :n].tolist() == list(ref.path)
            assert (acc.path[b, n:] == -1).all()
            assert int(acc.bonus[b]) == ref.bonus
            assert acc.accepted[b].nonzero().flatten().tolist() == list(ref.path)


def test_sampling_matches_distribution(gen):
    V = 5
    logits = torch.randn(1, 1, V, generator=gen)
    n = 40000
    u = torch.rand(n, 1, generator=gen)
    toks = sample_tokens_device(logits.expand(n, 1, V), 0.7, uniforms=u).flatten()
    freq = torch.bincount(toks, minlength=V).float() / n
    probs = torch.softmax(logits.flatten() / 0.7, dim=0)
    assert (freq - probs).abs().max() < 0.015  # ~4 sigma at n = 40k
    assert torch.equal(sample_tokens_device(logits, 0.0), logits.argmax(-1))


def _cache(kind, gen, dtype=torch.float32, device="cpu"):
    common = dict(num_layers=3, num_pages=12, page_size=4, max_batch=3, dtype=dtype, device=device)
    if kind == "gqa":
        cache = PagedKVCache(kind="gqa", n_kv_heads=2, head_dim=8, v_head_dim=6, **common)
        bufs = cache.k + cache.v
    else:
        cache = PagedKVCache(kind="mla", kv_lora_rank=16, rope_dim=4, **common)
        bufs = cache.kv
    for buf in bufs:
        buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype).to(device))
    return cache, bufs


@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("backend", ["torch", "triton", "triton_path", "torch_path"])
def test_commit_moves_accepted_rows(kind, backend, gen):
    dtype = torch.float16 if backend.startswith("triton") else torch.float32
    _check_commit(kind, backend, gen, dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("backend", ["triton", "triton_path", "torch_path"])
def test_commit_moves_accepted_rows_on_gpu(kind, backend, gen):
    _check_commit(kind, backend, gen, torch.bfloat16, "cuda")


def _check_commit(kind, backend, gen, dtype, device):
    triton_kernel = backend.startswith("triton")
    cache, bufs = _cache(kind, gen, dtype, device)
    reqs, prefix = [0, 1, 2], [5, 0, 9]
    for r, L in zip(reqs, prefix, strict=True):
        cache.reserve(r, L + 9)
        cache.set_length(r, L)
    pt = cache.batch_page_table(reqs)
    # path [0, 2, 3]: overlapping moves; [0, 1, 5, 8]: first two in place; [0]: nothing
    path = torch.tensor([[0, 2, 3, -1, -1], [0, 1, 5, 8, -1], [0, -1, -1, -1, -1]], device=device)
    count = torch.tensor([3, 4, 1], device=device)
    L = torch.tensor(prefix, dtype=torch.int32, device=device)
    src, dst = commit_slots(pt, L, path, count, cache.page_size)
    assert (src[:, 0] == -1).all() and (src[1, :2] == -1).all() and (src[2] == -1).all()
    assert (src[0, 1:3] >= 0).all() and (src[1, 2:4] >= 0).all()
    before = [b.clone() for b in bufs]
    plan = make_commit_plan(cache) if triton_kernel else bufs
    if backend.endswith("_path"):
        commit_path(plan, pt, L, path, count, cache.page_size, backend=backend[:-5])
    else:
        commit_kv(plan, src, dst, backend=backend)
    for buf, old in zip(bufs, before, strict=True):
        rows_new, rows_old = buf.view(-1, *buf.shape[2:]), old.view(-1, *old.shape[2:])
        expect = rows_old.clone()
        for b, r in enumerate(reqs):
            for k in range(int(count[b])):
                s = cache.slots(r, prefix[b] + int(path[b, k]), 1)
                d = cache.slots(r, prefix[b] + k, 1)
                expect[d] = rows_old[s]
        assert torch.equal(rows_new, expect)
        assert not torch.equal(rows_new, rows_old)  # something really moved


def test_commit_plan_rejects_mixed_buffers():
    with pytest.raises(ValueError, match="buffers\\[1\\]"):
        CommitPlan([torch.zeros(2, 2, 4), torch.zeros(2, 2, 4, dtype=torch.float16)])
    with pytest.raises(ValueError, match="backend"):
        commit_kv(
            [torch.zeros(2, 2, 4)],
            torch.zeros(1, 1, dtype=torch.int64),
            torch.zeros(1, 1, dtype=torch.int64),
            backend="cuda",
        )


def test_verify_buffers_in_place(gen):
    cache, _ = _cache("gqa", gen)
    reqs, prefix = [0, 1], [3, 6]
    for r, L in zip(reqs, prefix, strict=True):
        cache.reserve(r, L + 8)
        cache.set_length(r, L)
    _, _, _, dt = _trees(2, 4, 3, 7, gen)
    buf = DeviceVerifyBuffers(2, 7, "cpu")
    ptrs = [t.data_ptr() for t in (buf.input_ids, buf.positions, buf.tree_mask, buf.slot_mapping)]
    L = torch.tensor(prefix, dtype=torch.int32)
    buf.fill(dt, L, cache.batch_page_table(reqs), cache.page_size)
    assert ptrs == [
        t.data_ptr() for t in (buf.input_ids, buf.positions, buf.tree_mask, buf.slot_mapping)
    ]
    assert torch.equal(buf.positions, L[:, None] + dt.depths)
    assert torch.equal(buf.input_ids, dt.tokens) and torch.equal(buf.tree_mask, dt.mask)
    assert torch.equal(buf.slot_mapping, cache.slot_mapping(reqs, prefix, 8))
    with pytest.raises(ValueError, match="tree"):
        DeviceVerifyBuffers(3, 7, "cpu").fill(dt, L, cache.batch_page_table(reqs), 4)
    with pytest.raises(ValueError, match="backend"):
        buf.fill(dt, L, cache.batch_page_table(reqs), 4, backend="cuda")
    # the fused kernel writes exactly what the torch ops write (poisoned buffers first)
    fused = DeviceVerifyBuffers(2, 7, "cpu")
    for t in (fused.input_ids, fused.positions, fused.tree_mask, fused.slot_mapping):
        t.fill_(-7)
    fused.fill(dt, L, cache.batch_page_table(reqs), cache.page_size, backend="triton")
    for a, b in (
        (fused.input_ids, buf.input_ids),
        (fused.positions, buf.positions),
        (fused.tree_mask, buf.tree_mask),
        (fused.slot_mapping, buf.slot_mapping),
    ):
        assert torch.equal(a, b)
