"""Reference tree builder: equals brute-force top-B, structure invariants, edge cases."""

from __future__ import annotations

import pytest
import torch

from kdtree.spec.bitmask import ancestor_mask, unpack_bits
from kdtree.spec.tree import (
    brute_force_tree,
    build_tree_ref,
    build_trees,
    chain_tree,
    draft_topk,
)


def _random_lp_tok(gen, D, K, V=11, B=1, scale=2.0):
    logits = torch.randn(B, D, V, generator=gen) * scale
    return draft_topk(logits, K)


@pytest.mark.parametrize(("D", "K", "budget"), [(1, 3, 2), (3, 2, 5), (3, 3, 13), (4, 3, 20)])
def test_heap_equals_brute_force(gen, D, K, budget):
    for _ in range(20):
        lp, tok = _random_lp_tok(gen, D, K)
        heap = build_tree_ref(lp[0], tok[0], budget, bonus=7)
        brute = brute_force_tree(lp[0], tok[0], budget, bonus=7)
        assert heap.ranks == brute.ranks
        assert torch.equal(heap.tokens, brute.tokens)
        assert torch.equal(heap.parents, brute.parents)
        assert torch.equal(heap.scores, brute.scores)
        assert torch.equal(heap.mask, brute.mask)


def test_ties_follow_rank_tuple_order():
    # Every log-prob equal: all scores at one depth tie; pops go by (score, rank tuple).
    lp = torch.full((3, 3), -1.0)
    tok = torch.arange(9).reshape(3, 3)
    tree = build_tree_ref(lp, tok, 8, bonus=0)
    assert tree.ranks[1:] == [(0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert tree.ranks == brute_force_tree(lp, tok, 8, bonus=0).ranks


def test_scores_are_float32_running_sums(gen):
    lp, tok = _random_lp_tok(gen, 4, 3)
    tree = build_tree_ref(lp[0], tok[0], 15, bonus=1)
    assert tree.scores.dtype == torch.float32
    for i in range(1, tree.size):
        p, d, r = int(tree.parents[i]), int(tree.depths[i]), tree.ranks[i][-1]
        assert tree.scores[i] == tree.scores[p] + lp[0, d - 1, r]  # float32 add, same order


def test_structure_invariants(gen):
    lp, tok = _random_lp_tok(gen, 6, 4, V=50)
    tree = build_tree_ref(lp[0], tok[0], 40, bonus=3)
    assert tree.size == 41 and int(tree.tokens[0]) == 3 and int(tree.parents[0]) == -1
    ranks = set(tree.ranks)
    for i in range(1, tree.size):
        p = int(tree.parents[i])
        assert 0 <= p < i
        assert int(tree.depths[i]) == int(tree.depths[p]) + 1
        assert tree.ranks[i][:-1] == tree.ranks[p]  # prefix-closed
        assert tree.ranks[i][:-1] in ranks
        assert tree.children[p][int(tree.tokens[i])] == i
        assert int(tree.tokens[i]) == int(tok[0, tree.depths[i] - 1, tree.ranks[i][-1]])
    assert (tree.scores[1:] <= tree.scores[:-1]).all()  # pops in non-increasing score
    assert torch.equal(unpack_bits(tree.mask, tree.size), ancestor_mask(tree.parents))


def test_budget_zero_gives_root_only(gen):
    lp, tok = _random_lp_tok(gen, 3, 2)
    tree = build_tree_ref(lp[0], tok[0], 0, bonus=9)
    assert tree.size == 1 and tree.tokens.tolist() == [9] and tree.children == [{}]
    assert unpack_bits(tree.mask, 1).tolist() == [[True]]


def test_heap_runs_dry_below_budget(gen):
    lp, tok = _random_lp_tok(gen, 2, 2)
    tree = build_tree_ref(lp[0], tok[0], 100, bonus=0)
    assert tree.size == 1 + 2 + 4


def test_top1_reproduces_the_chain(gen):
    D = 7
    logits = torch.randn(1, D, 30, generator=gen)
    lp, tok = draft_topk(logits, 1)
    tree = build_tree_ref(lp[0], tok[0], D, bonus=5)
    chain = chain_tree(logits[0].argmax(-1), 5)
    assert torch.equal(tree.tokens, chain.tokens)
    assert torch.equal(tree.parents, chain.parents)
    assert torch.equal(tree.depths, chain.depths)
    assert torch.equal(tree.mask, chain.mask)
    assert tree.ranks == chain.ranks


def test_build_trees_pads_to_budget_plus_one(gen):
    lp, tok = _random_lp_tok(gen, 2, 2, B=3)
    batch = build_trees(lp, tok, 10, bonus=torch.tensor([1, 2, 3]))
    assert batch.tokens.shape == (3, 11) and batch.mask.shape == (3, 11, 1)
    assert batch.sizes == [7, 7, 7]
    bits = unpack_bits(batch.mask, 11)
    for b in range(3):
        assert batch.tokens[b, 0] == b + 1
        for i in range(7, 11):  # padded rows see only themselves
            assert bits[b, i].nonzero().flatten().tolist() == [i]
            assert batch.parents[b, i] == -1


def test_draft_topk_is_log_softmax_topk(gen):
    logits = torch.randn(2, 3, 40, generator=gen, dtype=torch.float64)
    lp, tok = draft_topk(logits.to(torch.float16), 5)
    assert lp.dtype == torch.float32 and tok.dtype == torch.int64 and lp.shape == (2, 3, 5)
    ref = torch.log_softmax(logits.to(torch.float16).float(), -1)
    assert torch.equal(lp, ref.topk(5, -1).values)
    assert (lp[..., 1:] <= lp[..., :-1]).all()


def test_bad_inputs(gen):
    lp, tok = _random_lp_tok(gen, 3, 2)
    with pytest.raises(ValueError, match="budget=-1"):
        build_tree_ref(lp[0], tok[0], -1, bonus=0)
    with pytest.raises(TypeError, match="lp: expected float32"):
        build_tree_ref(lp[0].double(), tok[0], 3, bonus=0)
    with pytest.raises(TypeError, match="tok: expected int64"):
        build_tree_ref(lp[0], tok[0].int(), 3, bonus=0)
    with pytest.raises(ValueError, match="lp, tok"):
        build_tree_ref(lp[0], tok[0, :2], 3, bonus=0)
    with pytest.raises(ValueError, match="descending"):
        build_tree_ref(lp[0].flip(-1), tok[0], 3, bonus=0)
    with pytest.raises(ValueError, match="K=0"):
        draft_topk(torch.randn(1, 2, 5), 0)
    with pytest.raises(ValueError, match="draft_logits"):
        draft_topk(torch.randn(2, 5), 1)
    with pytest.raises(ValueError, match="bonus"):
        build_trees(lp, tok, 3, bonus=[1, 2])


@pytest.mark.parametrize("V", [37, 4096, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_draft_topk_selects_what_log_softmax_topk_selects(V, dtype):
    from kdtree.spec.gpu.topk_triton import draft_topk_triton

    g = torch.Generator().manual_seed(V)
    # distinct values (a permutation), so the order of the top-K is unique in fp32
    x = (torch.randperm(2 * 3 * V, generator=g).reshape(2, 3, V).float() / 256).to(dtype)
    for K in (1, 8, 33):
        lp, tok = draft_topk_triton(x, K)
        logp = torch.log_softmax(x, dim=-1, dtype=torch.float32)
        ref_lp, ref_tok = torch.topk(logp, K, dim=-1)
        if dtype == torch.float32:
            assert torch.equal(tok, ref_tok)
        else:  # bf16 rounds the permutation into ties: the same values, lowest id first
            assert torch.equal(x.gather(-1, tok), x.gather(-1, ref_tok))
            same = lp[..., 1:] == lp[..., :-1]
            assert (tok[..., 1:][same] > tok[..., :-1][same]).all()
        torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-4)
        assert lp.dtype == torch.float32 and tok.dtype == torch.int64
        assert (lp[..., :-1] >= lp[..., 1:]).all()


def test_fused_draft_topk_with_minus_inf_logits_and_k_equal_to_v():
    """Fewer finite logits than K: distinct ids below V and -inf values, as torch.topk; K = V
    lists the whole row; no rows, no launch."""
    from kdtree.spec.gpu.topk_triton import draft_topk_triton

    inf = float("inf")
    x = torch.tensor([[[0.0, -inf, -inf, -inf, 1.0], [-inf, 2.0, -inf, 0.5, -inf]]])
    lp, tok = draft_topk_triton(x, 5)
    ref_lp, _ = torch.topk(torch.log_softmax(x, dim=-1), 5, dim=-1)
    torch.testing.assert_close(lp, ref_lp)
    assert tok[0, 0, :2].tolist() == [4, 0] and tok[0, 1, :2].tolist() == [1, 3]
    for row in tok.reshape(-1, 5):
        assert sorted(row.tolist()) == [0, 1, 2, 3, 4]  # every id once, none beyond V
    lp0, tok0 = draft_topk_triton(torch.zeros(0, 16, 50), 4)
    assert lp0.shape == tok0.shape == (0, 16, 4)


def test_fused_draft_topk_rejects_what_it_cannot_do():
    from kdtree.spec.gpu.topk_triton import MAX_VOCAB, draft_topk_triton

    with pytest.raises(ValueError, match="at most"):
        draft_topk_triton(torch.zeros(1, 1, MAX_VOCAB + 1), 4)
    with pytest.raises(ValueError, match="K=6"):
        draft_topk_triton(torch.zeros(1, 1, 5), 6)


@pytest.mark.gpu
def test_draft_topk_on_the_gpu_is_fused_and_selects_the_same_values(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import kdtree.spec.gpu.topk_triton as tt
    from kdtree.spec.tree import draft_topk

    calls = []

    def spy(*args):
        calls.append(args[0].shape)
        return fused(*args)

    fused = tt.draft_topk_triton
    monkeypatch.setattr(tt, "draft_topk_triton", spy)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 16385, generator=g).to(torch.bfloat16)
    lp_c, tok_c = draft_topk(x, 8)
    lp_g, tok_g = draft_topk(x.cuda(), 8)
    assert calls == [x.shape]  # the GPU call took the fused kernel, the CPU call did not
    torch.testing.assert_close(lp_g.cpu(), lp_c, rtol=0, atol=1e-4)
    assert torch.equal(x.gather(-1, tok_g.cpu()), x.gather(-1, tok_c))
    # beyond the registers' vocabulary the GPU falls back to log_softmax + topk
    big = torch.randn(1, 2, tt.MAX_VOCAB + 7, generator=g)
    lp_b, tok_b = draft_topk(big.cuda(), 4)
    assert len(calls) == 1
    assert torch.equal(tok_b.cpu(), draft_topk(big, 4)[1])
