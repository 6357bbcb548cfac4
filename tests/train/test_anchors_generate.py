"""Anchor sampling, loss weights, packed visibility, batched generation and offline τ."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.train.anchors import (
    default_gamma,
    eligible_anchors,
    loss_weights,
    packed_visibility,
    sample_anchors,
    target_soft_labels,
)
from kdtree.train.evaluate import accepted_lengths, full_block_anchors
from kdtree.train.generate import generate_batch, sample_next, temperature_mix


def test_eligible_anchors_need_two_generated_tokens():
    lm = torch.tensor([[0, 0, 1, 1, 1, 0, 1]], dtype=torch.bool)
    assert eligible_anchors(lm).int().tolist() == [[0, 0, 1, 1, 0, 0, 0]]


def test_sample_anchors_sorted_distinct_eligible_and_padded(gen):
    lm = torch.zeros(3, 40, dtype=torch.bool)
    lm[0, 10:] = True
    lm[1, 30:33] = True  # only two candidates: 30, 31
    anchors, valid = sample_anchors(lm, 6, generator=gen)
    elig = eligible_anchors(lm)
    for r in range(3):
        a = anchors[r][valid[r]]
        assert torch.equal(a, a.sort().values) and a.unique().numel() == a.numel()
        assert elig[r, a].all()
    assert valid[0].all() and valid[1].sum() == 2 and not valid[2].any()
    with pytest.raises(ValueError, match="n_anchors"):
        sample_anchors(lm, 0)


def test_loss_weights_decay():
    w = loss_weights(16, 7.0)
    assert w[0] == 0 and w[1] == 1
    assert math.isclose(float(w[8]), math.exp(-1.0), rel_tol=1e-6)
    assert default_gamma(16) == 7.0 and default_gamma(8) == 4.0
    assert loss_weights(4, None).tolist() == [0, 1, 1, 1]


def test_packed_visibility_matches_the_rule():
    anchors, valid = torch.tensor([[2, 5]]), torch.tensor([[True, False]])
    vis = packed_visibility(anchors, valid, seq_len=8, block_size=3)[0]
    assert vis.shape == (6, 8 + 6)
    assert vis[0, :8].tolist() == [True, True] + [False] * 6  # context i < 2 only
    assert not vis[3:, :8].any()  # invalid block sees no context
    assert vis[0, 8:].tolist() == [True] * 3 + [False] * 3  # own block, both directions
    assert vis[4, 8:].tolist() == [False] * 3 + [True] * 3


def test_target_soft_labels_use_the_previous_row():
    logits = torch.arange(10, dtype=torch.float32).view(1, 10, 1).expand(1, 10, 3)
    pos = torch.tensor([[[4, 5, 6]]])
    labels = torch.tensor([[[-100, 7, 7]]])
    rows = target_soft_labels(logits, pos, labels)
    assert rows[0, 0, :, 0].tolist() == [0.0, 4.0, 5.0]  # row p-1 predicts token p


def test_sample_next_greedy_and_sampled(gen):
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    assert sample_next(logits, torch.tensor([0.0, 0.0])).tolist() == [1, 1]
    draws = torch.stack([sample_next(logits[:1], torch.tensor([1.0]), gen) for _ in range(400)])
    freq = torch.bincount(draws.flatten(), minlength=3).float() / 400
    p = torch.softmax(logits[0], -1)
    assert (freq - p).abs().max() < 0.08
    assert temperature_mix(5, (0.0, 1.0)).tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_cached_generation_equals_dense_greedy(toy_pair, gen):
    target, _ = toy_pair
    prompts = torch.randint(2, 400, (3, 7), generator=gen)
    out = generate_batch(target, prompts, 9, torch.zeros(3))
    x = prompts.clone()
    with torch.no_grad():
        for _ in range(9):
            nxt = target.forward_dense(x).logits[:, -1].argmax(-1, keepdim=True)
            x = torch.cat([x, nxt], dim=1)
    assert torch.equal(out, x)


def test_accepted_lengths_and_anchor_range(gen):
    pred = torch.tensor([[1, 2, 3, 4], [1, 9, 3, 4], [0, 2, 3, 4]])
    truth = torch.tensor([1, 2, 3, 4]).expand(3, 4)
    assert accepted_lengths(pred, truth).tolist() == [4, 1, 0]
    a = full_block_anchors(10, 40, 16, 100, gen)
    assert a.min() >= 10 and a.max() <= 24 and a.numel() == 15
    with pytest.raises(ValueError, match="no anchor fits"):
        full_block_anchors(30, 40, 16, 4, gen)
