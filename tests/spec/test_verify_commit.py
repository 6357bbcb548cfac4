"""Verify inputs and KV commit against from-scratch causal forwards."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import build_model, get_config
from kdtree.spec.accept import Acceptance, target_tokens, walk_trees
from kdtree.spec.bitmask import unpack_bits
from kdtree.spec.commit import commit_kv
from kdtree.spec.engine import SpecEngine
from kdtree.spec.testing import OracleDrafter, RandomDrafter
from kdtree.spec.tree import build_trees, draft_topk
from kdtree.spec.verify import build_dense_mask_host, prepare_for_verify

PROMPTS = [[1, 5, 7, 9, 11, 13], [3, 4, 100, 200]]


def chisquare_pvalue(obs, exp) -> float:
    """Pearson chi-square p-value (``df = cells - 1``) via the regularised upper gamma."""
    obs, exp = torch.as_tensor(obs, dtype=torch.float64), torch.as_tensor(exp, dtype=torch.float64)
    x = float(((obs - exp) ** 2 / exp).sum())
    return float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2.0), torch.tensor(x / 2)))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread is several times faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_target(name: str):
    model = build_model(get_config(name).replace(initializer_range=0.2)).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    return model


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-mla"])
def target(request):
    return make_target(request.param)


def _ancestors(tree, i: int) -> list[int]:
    path = [i]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


def _random_trees(gen, state, V, budget=10, D=4, K=3):
    lp, tok = draft_topk(torch.randn(state.batch, D, V, generator=gen) * 2, K)
    return build_trees(lp, tok, budget, state.bonus)


@torch.no_grad()
@pytest.mark.parametrize("page_size", [1, 16])
def test_tree_logits_equal_causal_forward_on_ancestor_path(target, gen, page_size):
    eng = SpecEngine(target, None, mode="ar", page_size=page_size)
    state = eng.prefill(PROMPTS, max_new_tokens=32)
    trees = _random_trees(gen, state, target.config.vocab_size)
    vin = prepare_for_verify(state.cache, state.reqs, trees)
    assert vin.positions.tolist() == [
        [len(p) + int(d) for d in trees.depths[b]] for b, p in enumerate(PROMPTS)
    ]
    out = target(vin.input_ids, vin.positions, state.cache, vin.attn)
    for b, tree in enumerate(trees.trees):
        for i in range(tree.size):
            path_tokens = [int(tree.tokens[j]) for j in _ancestors(tree, i)]
            seq = torch.tensor([PROMPTS[b] + path_tokens])
            ref = target.forward_dense(seq).logits[0, -1]
            torch.testing.assert_close(out.logits[b, i], ref, rtol=1e-4, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize(
    ("page_size", "method"), [(1, "remap"), (1, "copy"), (16, "copy"), (64, "copy")]
)
def test_next_step_after_commit_equals_recompute(target, gen, page_size, method):
    eng = SpecEngine(target, None, mode="ar", page_size=page_size)
    state = eng.prefill(PROMPTS, max_new_tokens=64)
    committed = [list(p) for p in PROMPTS]
    for _ in range(3):
        trees = _random_trees(gen, state, target.config.vocab_size)
        prefix = state.context_lens
        vin = prepare_for_verify(state.cache, state.reqs, trees)
        out = target(vin.input_ids, vin.positions, state.cache, vin.attn)
        # Force a deep, non-contiguous accepted path: the deepest node of each tree.
        accepts = []
        for b, tree in enumerate(trees.trees):
            path = _ancestors(tree, int(tree.depths.argmax()))
            accepts.append(Acceptance(tuple(path), int(out.logits[b, path[-1]].argmax())))
            committed[b] += [int(tree.tokens[j]) for j in path]
        used = commit_kv(state.cache, state.reqs, prefix, vin.slot_mapping, accepts, method=method)
        assert used == method
        assert state.context_lens == [len(c) for c in committed]
        state.bonus = [a.bonus for a in accepts]
    # Next step: the root's logits must equal a from-scratch forward over everything committed.
    trees = _random_trees(gen, state, target.config.vocab_size, budget=3)
    vin = prepare_for_verify(state.cache, state.reqs, trees)
    out = target(vin.input_ids, vin.positions, state.cache, vin.attn)
    for b in range(state.batch):
        seq = torch.tensor([committed[b] + [state.bonus[b]]])
        ref = target.forward_dense(seq).logits[0, -1]
        torch.testing.assert_close(out.logits[b, 0], ref, rtol=1e-4, atol=1e-4)


def test_remap_frees_rejected_pages(gen):
    target = make_target("tiny-llama")
    eng = SpecEngine(target, None, mode="ar", page_size=1)
    state = eng.prefill(PROMPTS[:1], max_new_tokens=16)
    cache = state.cache
    trees = _random_trees(gen, state, target.config.vocab_size, budget=8)
    free_before = cache.free_pages
    vin = prepare_for_verify(cache, state.reqs, trees)
    assert cache.free_pages == free_before - 9
    commit_kv(cache, state.reqs, [6], vin.slot_mapping, [Acceptance((0, 1), 5)], method="remap")
    assert cache.length(0) == 8 and cache.capacity(0) == 8
    assert cache.free_pages == free_before - 2


def test_copy_skips_rows_in_place_and_reads_before_writing():
    """Path (0, 2, 3): row 2 → 1 and row 3 → 2; the second source is the first's destination
    only if writes happened before reads."""
    target = make_target("tiny-llama")
    eng = SpecEngine(target, None, mode="ar", page_size=16)
    state = eng.prefill([[1, 2, 3]], max_new_tokens=16)
    cache = state.cache
    cache.reserve([0], 4)
    slots = cache.slot_mapping([0], [3], 4)
    k0 = cache.k[0].view(-1, *cache.k[0].shape[2:])
    marks = torch.arange(4, dtype=k0.dtype)[:, None, None] + 10
    k0[slots[0]] = marks.expand(4, *k0.shape[1:])
    commit_kv(cache, [0], [3], slots, [Acceptance((0, 2, 3), 1)], method="copy")
    got = k0[slots[0, :3], 0, 0].tolist()
    assert got == [10.0, 12.0, 13.0]
    assert cache.length(0) == 6


def test_dense_mask_matches_bitmask(gen):
    tree_mask = torch.randint(-(2**62), 2**62, (2, 5, 1), generator=gen)
    dense = build_dense_mask_host([3, 7], tree_mask, torch.device("cpu"))
    assert dense.shape == (2, 5, 12)
    bits = unpack_bits(tree_mask, 5)
    assert dense[0, :, :3].all() and not dense[0, :, 8:].any()
    assert torch.equal(dense[0, :, 3:8], bits[0])
    assert dense[1, :, :7].all() and torch.equal(dense[1, :, 7:12], bits[1])


def test_commit_bad_inputs():
    target = make_target("tiny-llama")
    eng = SpecEngine(target, None, mode="ar", page_size=16)
    state = eng.prefill([[1, 2, 3]], max_new_tokens=8)
    slots = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="remap"):
        commit_kv(state.cache, [0], [3], slots, [Acceptance((0,), 1)], method="remap")
    with pytest.raises(ValueError, match="method="):
        commit_kv(state.cache, [0], [3], slots, [Acceptance((0,), 1)], method="move")
    with pytest.raises(ValueError, match="increasing"):
        commit_kv(state.cache, [0], [3], slots, [Acceptance((0, 2, 1), 1)])
    with pytest.raises(ValueError, match="beyond the tree"):
        commit_kv(state.cache, [0], [3], slots, [Acceptance((0, 4), 1)])


def test_sampling_first_token_matches_target_distribution():
    """Tree mode at T = 1 on a 12-token vocabulary: the first token a speculative step emits
    follows the target's distribution after ``prompt + bonus`` (chi-square over 1500 draws)."""
    V, N, temp = 12, 1500, 1.0
    target = build_model(get_config("tiny-llama").replace(vocab_size=V, initializer_range=0.3))
    target.init_weights(torch.Generator().manual_seed(5))
    target.eval()
    drafter = RandomDrafter(V, 4, scale=1.0, generator=torch.Generator().manual_seed(9))
    gen = torch.Generator().manual_seed(11)
    # The batched dense-mask backend: the ref backend loops over 1500 requests one by one.
    eng = SpecEngine(target, drafter, mode="tree", budget=6, top_k=3, temperature=temp,
                     generator=gen, dense_mask=True)  # fmt: skip
    prompt = [1, 3, 5]
    state = eng.prefill([prompt] * N, max_new_tokens=8)
    bonus = list(state.bonus)
    rec = eng.step(state)
    assert max(rec.accepted_len) > 1  # the tree did get accepted sometimes
    first = [state.tokens[b][1] for b in range(N)]
    with torch.no_grad():
        seqs = torch.tensor([[*prompt, b] for b in range(V)])
        p_next = torch.softmax(target.forward_dense(seqs).logits[:, -1] / temp, -1).double()
    # Exact law of the first emitted token: sum over the bonus the prefill drew.
    counts_b = torch.bincount(torch.tensor(bonus), minlength=V).double()
    expect = (counts_b[:, None] * p_next).sum(0)
    obs = torch.bincount(torch.tensor(first), minlength=V).double()
    keep = expect > 5
    pooled_o = torch.cat([obs[keep], obs[~keep].sum()[None]])
    pooled_e = torch.cat([expect[keep], expect[~keep].sum()[None]])
    if pooled_e[-1] == 0:
        pooled_o, pooled_e = pooled_o[:-1], pooled_e[:-1]
    scale = pooled_o.sum().item() / pooled_e.sum().item()
    p = chisquare_pvalue(pooled_o, pooled_e * scale)
    assert p > 1e-3


def test_oracle_proposals_are_target_greedy():
    target = make_target("tiny-llama")
    oracle = OracleDrafter(target, block_size=4)
    ctx = oracle.new_context(1, 64, "cpu")
    oracle.append_tokens(ctx, torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    logits = oracle.draft(ctx, torch.tensor([7]), torch.tensor([3]))
    seq = [1, 2, 3, 7]
    for j in range(3):
        nxt = int(target.forward_dense(torch.tensor([seq])).logits[0, -1].argmax())
        assert int(logits[0, j].argmax()) == nxt
        seq.append(nxt)
    post = target_tokens(logits[:, :1], 0.0)
    assert post.shape == (1, 1)
    assert walk_trees([], torch.zeros(0, 1, dtype=torch.int64)) == []
