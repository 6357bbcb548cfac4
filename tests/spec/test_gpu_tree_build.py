"""The device tree builder reproduces the heap reference node for node (order included)."""

from __future__ import annotations

import pytest
import torch

from kdtree.spec.gpu.tree_build import DeviceTree, build_trees_device, score_key
from kdtree.spec.gpu.tree_build_triton import MAX_CAP, build_trees_triton
from kdtree.spec.tree import build_tree_ref, draft_topk, pad_trees


def _sorted_lp(B, D, K, gen, quant=None, zeros=False, neg_inf=False):
    lp = torch.log_softmax(torch.randn(B, D, max(K, 4) * 3, generator=gen) * 2.5, dim=-1)
    lp = lp.topk(K, dim=-1).values
    if quant is not None:  # coarse grid: many exact ties between nodes
        lp = torch.round(lp / quant) * quant
    if zeros:  # log-prob 0: a child ties its parent
        lp[:, :, 0] = 0.0
    if neg_inf:
        lp[:, :, K // 2 :] = float("-inf")
    lp = lp.clamp(max=0.0).sort(dim=-1, descending=True).values.contiguous()
    tok = torch.stack(
        [
            torch.stack([torch.randperm(1000, generator=gen)[:K] for _ in range(D)])
            for _ in range(B)
        ]
    )
    return lp.float(), tok


def _assert_same(dt, lp, tok, budget, bonus):
    trees = [build_tree_ref(lp[b], tok[b], budget, int(bonus[b])) for b in range(lp.shape[0])]
    ref = pad_trees(trees, budget + 1)
    assert dt.n_nodes.tolist() == ref.sizes
    torch.testing.assert_close(dt.tokens, ref.tokens, rtol=0, atol=0)
    torch.testing.assert_close(dt.parents, ref.parents, rtol=0, atol=0)
    torch.testing.assert_close(dt.depths, ref.depths, rtol=0, atol=0)
    torch.testing.assert_close(dt.mask, ref.mask, rtol=0, atol=0)
    for b, tree in enumerate(trees):
        n = tree.size
        assert torch.equal(dt.scores[b, :n], tree.scores)
        assert dt.ranks[b, 1:n].tolist() == [rt[-1] for rt in tree.ranks[1:]]


FIELDS = ("tokens", "parents", "depths", "mask", "scores", "ranks", "n_nodes")
EXACT_ALGOS = ("threshold", "heap")  # "auto" runs one of them (test_auto_picks_...)

CASES = [
    # (B, D, K, budget, quant, zeros, neg_inf)
    (1, 7, 8, 16, None, False, False),
    (3, 15, 16, 64, None, False, False),
    (2, 6, 4, 33, 0.5, False, False),  # K < B, heavy ties
    (2, 9, 3, 97, 1.0, True, False),  # lp = 0 ties parent and child
    (2, 5, 32, 7, 0.25, False, False),  # K > B
    (2, 3, 2, 40, None, False, False),  # heap runs dry: 2 + 4 + 8 = 14 nodes
    (2, 4, 6, 20, None, False, True),  # -inf log-probs
    (4, 1, 8, 5, 0.5, False, False),  # depth 1
    (1, 16, 1, 8, None, False, False),  # K = 1: a chain
    (2, 8, 8, 0, None, False, False),  # budget 0: root only
    (2, 12, 12, 130, 0.75, False, False),  # W = 3 words, bit 63 crosses the sign
]


@pytest.mark.parametrize("B,D,K,budget,quant,zeros,neg_inf", CASES)
def test_device_tree_equals_heap(B, D, K, budget, quant, zeros, neg_inf, gen):
    lp, tok = _sorted_lp(B, D, K, gen, quant, zeros, neg_inf)
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    dt = build_trees_device(lp, tok, budget, bonus, backend="torch")
    _assert_same(dt, lp, tok, budget, bonus)


TRITON_CASES = [
    (2, 6, 4, 20, 0.5, True, False),
    (2, 5, 8, 7, 0.25, False, True),
    (1, 12, 12, 130, 0.75, False, False),
    (2, 3, 2, 40, None, False, False),
    (3, 7, 3, 24, 2.0, True, False),  # K < budget, coarse grid + lp 0: ties everywhere
    (2, 16, 1, 12, None, False, False),  # K = 1: a chain
    (3, 5, 6, 1, 0.5, False, False),  # budget 1
    (2, 1, 5, 9, 0.5, False, False),  # depth 1: the heap runs dry after K pops
    (1, 15, 32, 256, 0.5, False, False),  # the largest budget, D = 15, W = 5 mask words
]


@pytest.mark.parametrize("algo", EXACT_ALGOS)
@pytest.mark.parametrize("B,D,K,budget,quant,zeros,neg_inf", TRITON_CASES)
def test_triton_tree_equals_heap(B, D, K, budget, quant, zeros, neg_inf, algo, gen):
    lp, tok = _sorted_lp(B, D, K, gen, quant, zeros, neg_inf)
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    dt = build_trees_triton(lp, tok, budget, bonus, algo=algo)
    _assert_same(dt, lp, tok, budget, bonus)


@pytest.mark.parametrize("algo", EXACT_ALGOS)
def test_triton_all_ties_follow_rank_tuple_order(algo, gen):
    """Every log-prob equal: all nodes of a depth tie, so the tree is decided by the tie rule
    alone (smaller rank tuple first), across parents and depths (lp 0: children tie parents)."""
    for value in (-1.0, 0.0):
        lp = torch.full((2, 4, 5), value)
        tok = torch.randint(0, 1000, (2, 4, 5), generator=gen)
        bonus = torch.tensor([7, 11])
        for budget in (3, 17, 40):
            dt = build_trees_triton(lp, tok, budget, bonus, algo=algo)
            _assert_same(dt, lp, tok, budget, bonus)


@pytest.mark.parametrize("algo", EXACT_ALGOS)
def test_triton_random_sweep(algo, gen):
    """Small random shapes, many tie patterns, batch > 1 with different root tokens."""
    for trial in range(10):
        B, D, K = 1 + trial % 3, 1 + trial % 7, 1 + (trial * 3) % 10
        budget = [1, 2, 5, 13, 33][trial % 5]
        lp, tok = _sorted_lp(
            B,
            D,
            K,
            gen,
            quant=[None, 0.5, 2.0][trial % 3],
            zeros=trial % 4 == 1,
            neg_inf=trial % 5 == 3,
        )
        bonus = torch.randint(0, 1000, (B,), generator=gen)
        _assert_same(build_trees_triton(lp, tok, budget, bonus, algo=algo), lp, tok, budget, bonus)


@pytest.mark.parametrize("algo", EXACT_ALGOS)
def test_triton_second_pop_ties_the_first_pops_successors(algo):
    """Two pops per reduction: the second pop is the best of the other slots' pending children
    and the first pop's child and sibling, compared at the tie positions the first pop shifts.
    Every pair ties: (0), (1) at -1, then (0,0) (0,0,0) (1,0) (1,0,0) (2) at -2 in rank-tuple
    order, where twice the first pop's child (lp 0) goes ahead of the old second best."""
    lp = torch.tensor([[[-1.0, -1.0, -2.0], [-1.0, -3.0, -3.0], [0.0, -5.0, -5.0]]])
    tok = torch.arange(9).reshape(1, 3, 3)
    bonus = torch.tensor([5])
    for budget in range(1, 12):
        dt = build_trees_triton(lp, tok, budget, bonus, algo=algo)
        _assert_same(dt, lp, tok, budget, bonus)
    tree = build_tree_ref(lp[0], tok[0], 8, 5)
    assert tree.ranks[1:] == [(0,), (1,), (0, 0), (0, 0, 0), (1, 0), (1, 0, 0), (2,), (2, 0)]


@pytest.mark.parametrize("algo", EXACT_ALGOS)
@pytest.mark.parametrize("budget", [2, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33])
def test_triton_budgets_around_powers_of_two(budget, algo, gen):
    """Odd budgets end on a single pop; at budget = next_pow2(budget) the last node has no
    slot; ties everywhere (coarse grid, lp 0: a child ties its parent)."""
    lp, tok = _sorted_lp(2, 6, 5, gen, quant=1.0, zeros=True)
    bonus = torch.randint(0, 1000, (2,), generator=gen)
    dt = build_trees_triton(lp, tok, budget, bonus, algo=algo)
    _assert_same(dt, lp, tok, budget, bonus)


@pytest.mark.parametrize("algo", EXACT_ALGOS)
def test_triton_tie_heavy_sweep(algo, gen):
    """Many small tie-heavy trees (grids, lp 0, -inf tails, K below and above the budget,
    heaps that run dry between the two pops of a reduction)."""
    for trial in range(24):
        D, K = 1 + trial % 5, 1 + (trial * 7) % 6
        budget = 1 + (trial * 5) % 23
        lp, tok = _sorted_lp(
            1,
            D,
            K,
            gen,
            quant=[0.5, 1.0, 2.0][trial % 3],
            zeros=trial % 2 == 0,
            neg_inf=trial % 4 == 3,
        )
        bonus = torch.randint(0, 1000, (1,), generator=gen)
        _assert_same(build_trees_triton(lp, tok, budget, bonus, algo=algo), lp, tok, budget, bonus)


def _draft_like(B, D, K, V, gen, peak=None):
    """Top-K of random logits (the tree-build benchmark's: N(0, 3^2)); ``peak`` adds a spike of
    that height to one token per depth (a confident drafter)."""
    logits = torch.randn(B, D, V, generator=gen) * 3
    if peak is not None:
        logits[:, torch.arange(D), torch.randint(0, V, (D,), generator=gen)] += peak
    return draft_topk(logits, K)


@pytest.mark.parametrize(
    "B,K,budget,peak",
    [(2, 8, 16, None), (2, 32, 64, None), (1, 8, 64, 15.0), (1, 32, 256, None), (1, 8, 256, 20.0)],
)
def test_threshold_path_builds_typical_trees(B, K, budget, peak, gen):
    """On draft-like log-probs the seed lands: the threshold path (not the heap fallback)
    builds the tree, and it is the heap's."""
    lp, tok = _draft_like(B, 15, K, 4096, gen, peak)
    bonus = torch.randint(0, 1000, (B,), generator=gen)
    path = torch.full((B,), -1, dtype=torch.int32)
    dt = build_trees_triton(lp, tok, budget, bonus, path_out=path)
    assert path.tolist() == [1] * B
    _assert_same(dt, lp, tok, budget, bonus)


def test_threshold_falls_back_to_the_heap_when_the_nodes_outgrow_the_cap(gen):
    lp, tok = _sorted_lp(2, 8, 6, gen, quant=0.5, zeros=True)
    bonus = torch.randint(0, 1000, (2,), generator=gen)
    for cap, want in ((4, 0), (None, 1)):  # cap 4 < K: the first level already overflows
        path = torch.full((2,), -1, dtype=torch.int32)
        dt = build_trees_triton(lp, tok, 24, bonus, path_out=path, cap=cap)
        assert path.tolist() == [want, want]
        _assert_same(dt, lp, tok, 24, bonus)


def test_threshold_overflow_at_a_deeper_level_falls_back_exactly(gen):
    """Caps from the budget up: the ones below |U| overflow somewhere in the expansion (path
    0, the heap replay's tree), the larger ones build it themselves (path 1); always exact."""
    lp, tok = _draft_like(1, 15, 8, 4096, gen)
    bonus = torch.tensor([5])
    paths = []
    for cap in range(16, 40, 2):
        path = torch.full((1,), -1, dtype=torch.int32)
        dt = build_trees_triton(lp, tok, 16, bonus, path_out=path, cap=cap)
        _assert_same(dt, lp, tok, 16, bonus)
        paths.append(path.item())
    assert paths[0] == 0 and paths[-1] == 1 and paths == sorted(paths)


def test_threshold_rejects_bad_options(gen):
    lp, tok = _sorted_lp(1, 3, 4, gen)
    bonus = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="algo"):
        build_trees_triton(lp, tok, 4, bonus, algo="bisect")
    with pytest.raises(ValueError, match="cap"):
        build_trees_triton(lp, tok, 4, bonus, cap=0)
    with pytest.raises(ValueError, match="path_out"):
        build_trees_triton(lp, tok, 4, bonus, path_out=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="threshold"):
        build_trees_triton(
            lp, tok, 4, bonus, algo="heap", path_out=torch.zeros(1, dtype=torch.int32)
        )
    lp2, tok2 = _sorted_lp(2, 3, 4, gen)
    strided = torch.zeros(4, dtype=torch.int32)[::2]  # [2], stride 2: the kernel writes b, b + 1
    with pytest.raises(ValueError, match="path_out"):
        build_trees_triton(lp2, tok2, 4, torch.zeros(2, dtype=torch.int64), path_out=strided)
    for bad in (True, MAX_CAP + 1, 2.0):
        with pytest.raises(ValueError, match="cap"):
            build_trees_triton(lp, tok, 4, bonus, cap=bad)
    with pytest.raises(ValueError, match="_stop"):
        build_trees_triton(lp, tok, 4, bonus, _stop=3)
    for kw in (dict(cap=8), dict(_stop=1)):
        with pytest.raises(ValueError, match="threshold"):
            build_trees_triton(lp, tok, 4, bonus, algo="heap", **kw)


def test_auto_picks_the_measured_faster_builder():
    from kdtree.spec.gpu.tree_build_triton import auto_algo

    assert auto_algo(16, 8) == auto_algo(16, 32) == auto_algo(64, 32) == "heap"
    assert auto_algo(64, 8) == auto_algo(256, 8) == auto_algo(256, 32) == "threshold"


def test_assert_same_detects_a_wrong_tree(gen):
    """The comparison itself can fail: swapping two pops, or one token, is caught."""
    lp, tok = _sorted_lp(1, 4, 4, gen, quant=0.5)
    bonus = torch.tensor([3])
    dt = build_trees_device(lp, tok, 9, bonus, backend="triton")
    _assert_same(dt, lp, tok, 9, bonus)
    bad = DeviceTree(**{k: getattr(dt, k).clone() for k in FIELDS})
    bad.tokens[0, 5] += 1
    with pytest.raises(AssertionError):
        _assert_same(bad, lp, tok, 9, bonus)
    perm = torch.arange(10)
    perm[[3, 4]] = perm[[4, 3]]
    bad = DeviceTree(**{k: getattr(dt, k).clone() for k in FIELDS})
    for k in ("tokens", "depths", "scores", "ranks"):
        getattr(bad, k)[0] = getattr(bad, k)[0, perm]
    with pytest.raises(AssertionError):
        _assert_same(bad, lp, tok, 9, bonus)


def test_triton_rejects_unsupported_shapes():
    from kdtree.spec.gpu.tree_build_triton import MAX_BUDGET, supports

    lp = torch.zeros(1, 3, 4)
    tok = torch.zeros(1, 3, 4, dtype=torch.int64)
    assert not supports(lp, MAX_BUDGET + 1) and not supports(lp, 0) and supports(lp, 8)
    assert supports(lp, MAX_BUDGET) and supports(torch.zeros(1, 40, 300), MAX_BUDGET)
    assert not supports(torch.zeros(1, 3, 0), 8) and not supports(torch.zeros(1, 0, 4), 8)
    with pytest.raises(ValueError, match="backend='torch'"):
        build_trees_device(
            lp, tok, MAX_BUDGET + 1, torch.zeros(1, dtype=torch.int64), backend="triton"
        )


@pytest.mark.gpu
@pytest.mark.parametrize("batch,budget,K", [(1, 16, 16), (8, 64, 32), (32, 256, 32), (3, 255, 7)])
def test_triton_and_torch_match_heap_on_gpu(batch, budget, K, gen):
    lp, tok = _sorted_lp(batch, 15, K, gen, quant=0.5)
    bonus = torch.randint(0, 1000, (batch,), generator=gen)
    for backend in ("triton", "heap", "torch"):
        args = (lp.cuda(), tok.cuda(), budget, bonus.cuda())
        if backend == "heap":
            dt = build_trees_triton(*args, algo="heap")
        else:
            dt = build_trees_device(*args, backend=backend)
        _assert_same(
            DeviceTree(**{k: getattr(dt, k).cpu() for k in FIELDS}), lp, tok, budget, bonus
        )


@pytest.mark.gpu
@pytest.mark.parametrize("batch,budget,K", [(1, 16, 8), (8, 64, 32), (32, 256, 32), (4, 256, 8)])
def test_threshold_path_on_gpu(batch, budget, K, gen):
    """Draft-like top-K on the GPU: the threshold path builds every tree, and it is the heap's."""
    lp, tok = _draft_like(batch, 15, K, 8192, gen)
    bonus = torch.randint(0, 1000, (batch,), generator=gen)
    path = torch.full((batch,), -1, dtype=torch.int32, device="cuda")
    dt = build_trees_triton(lp.cuda(), tok.cuda(), budget, bonus.cuda(), path_out=path)
    assert path.tolist() == [1] * batch
    _assert_same(DeviceTree(**{k: getattr(dt, k).cpu() for k in FIELDS}), lp, tok, budget, bonus)


def test_many_random_tie_heavy(gen):
    for trial in range(12):
        B, D, K = 2, 1 + trial % 6, 1 + (trial * 5) % 9
        budget = [1, 3, 10, 25, 64][trial % 5]
        lp, tok = _sorted_lp(B, D, K, gen, quant=[None, 0.5, 2.0][trial % 3], zeros=trial % 4 == 0)
        bonus = torch.randint(0, 1000, (B,), generator=gen)
        _assert_same(
            build_trees_device(lp, tok, budget, bonus, backend="torch"), lp, tok, budget, bonus
        )


def test_empty_batch():
    lp = torch.zeros(0, 4, 4)
    tok = torch.zeros(0, 4, 4, dtype=torch.int64)
    dt = build_trees_device(lp, tok, 8, torch.zeros(0, dtype=torch.int64), backend="torch")
    assert dt.tokens.shape == (0, 9) and dt.mask.shape == (0, 9, 1)


def test_score_key_orders_like_floats(gen):
    s = torch.cat(
        [
            torch.randn(200, generator=gen) * 10,
            torch.tensor([0.0, -0.0, float("-inf"), -1e-30, 1e-30]),
        ]
    )
    k = score_key(s, torch.zeros_like(s, dtype=torch.int64))
    i, j = torch.meshgrid(torch.arange(len(s)), torch.arange(len(s)), indexing="ij")
    assert torch.equal(s[i] < s[j], k[i] < k[j])
    # equal scores: the smaller tiebreak wins
    assert (
        score_key(torch.tensor([1.5]), torch.tensor([3]))[0]
        > score_key(torch.tensor([1.5]), torch.tensor([4]))[0]
    )


def test_bad_inputs():
    lp = torch.zeros(1, 2, 2)
    tok = torch.zeros(1, 2, 2, dtype=torch.int64)
    bonus = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="budget"):
        build_trees_device(lp, tok, -1, bonus, backend="torch")
    with pytest.raises(ValueError, match="lp"):
        build_trees_device(lp.double(), tok, 4, bonus, backend="torch")
    with pytest.raises(ValueError, match="tok"):
        build_trees_device(lp, tok[:, :1], 4, bonus, backend="torch")
    with pytest.raises(ValueError, match="bonus"):
        build_trees_device(lp, tok, 4, torch.zeros(2, dtype=torch.int64), backend="torch")
    with pytest.raises(ValueError, match="backend"):
        build_trees_device(lp, tok, 4, bonus, backend="heap")
    with pytest.raises(ValueError, match="lp"):
        build_trees_device(lp.double(), tok, 4, bonus, backend="triton")
