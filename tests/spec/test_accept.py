"""Acceptance walk: greedy path following and losslessness of the sampled walk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtree.spec.accept import target_tokens, walk_tree, walk_trees
from kdtree.spec.tree import build_tree_ref, draft_topk


def chisquare_pvalue(obs, exp) -> float:
    """Pearson chi-square p-value (``df = cells - 1``) via the regularised upper gamma."""
    obs, exp = np.asarray(obs, np.float64), np.asarray(exp, np.float64)
    x = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(x / 2.0)))


def _chisquare_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value of ``counts`` against ``probs`` (cells with expectation <= 5 pooled)."""
    expect = probs / probs.sum() * counts.sum()
    small = expect <= 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expect[~small], expect[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare_pvalue(obs, exp)


def _tree(gen, V=6, D=3, K=2, budget=6):
    lp, tok = draft_topk(torch.randn(1, D, V, generator=gen) * 2, K)
    return build_tree_ref(lp[0], tok[0], budget, bonus=0)


def test_greedy_walk_follows_matching_children(gen):
    tree = _tree(gen)
    # Target agrees with the tree down the deepest path, then disagrees.
    leaf = int(tree.depths.argmax())
    path = [leaf]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    path = path[::-1]
    post = [0] * tree.size
    for a, b in zip(path, path[1:], strict=False):
        post[a] = int(tree.tokens[b])
    post[leaf] = 99  # no child carries 99: the bonus
    acc = walk_tree(tree, post)
    assert acc.path == tuple(path) and acc.bonus == 99 and acc.accepted_len == len(path)


def test_rejected_root_gives_tau_one(gen):
    tree = _tree(gen)
    acc = walk_tree(tree, [77] * tree.size)
    assert acc.path == (0,) and acc.bonus == 77


def test_argmax_at_zero_temperature(gen):
    logits = torch.randn(2, 4, 9, generator=gen)
    assert torch.equal(target_tokens(logits, 0.0), logits.argmax(-1))


def test_sampled_walk_is_lossless(gen):
    """First emitted token ~ p(root); given it is child c, the second ~ p(c) — exactly the
    autoregressive law, whatever the tree proposes."""
    V, N = 6, 20000
    tree = _tree(gen, V=V)
    node_logits = torch.randn(tree.size, V, generator=gen)
    probs = torch.softmax(node_logits / 0.8, -1).double().numpy()
    post = target_tokens(node_logits.expand(N, -1, -1), 0.8, gen)
    walks = walk_trees([tree] * N, post)
    first = np.array([tree.tokens[w.path[1]] if len(w.path) > 1 else w.bonus for w in walks])
    counts = np.bincount(first, minlength=V)
    assert _chisquare_p(counts, probs[0]) > 1e-3, (counts, probs[0] * N)
    for tok, child in tree.children[0].items():
        second = [
            (int(tree.tokens[w.path[2]]) if len(w.path) > 2 else w.bonus)
            for w in walks
            if len(w.path) > 1 and w.path[1] == child
        ]
        assert len(second) == counts[tok]
        if len(second) < 500:
            continue
        c2 = np.bincount(second, minlength=V)
        assert _chisquare_p(c2, probs[child]) > 1e-3, (c2, probs[child] * len(second))


def test_bad_inputs(gen):
    tree = _tree(gen)
    with pytest.raises(ValueError, match="post"):
        walk_tree(tree, [0])
    with pytest.raises(ValueError, match="temperature"):
        target_tokens(torch.randn(1, 2, 3), -1.0)
    with pytest.raises(ValueError, match="logits"):
        target_tokens(torch.randn(2, 3), 0.0)
    with pytest.raises(ValueError, match="post"):
        walk_trees([tree], torch.zeros(2, tree.size, dtype=torch.int64))
