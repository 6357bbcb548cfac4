"""The DFlash alignment traps (``research/ddtree_spec.md`` §5, §7.1), each written so that it
fails when the trap is present: tap offset, anchor context strictly earlier, same-position
labels, the mask id, and training forward == inference forward."""

from __future__ import annotations

import torch

from kdtree.models import target_layer_ids
from kdtree.train.anchors import IGNORE, loss_weights, make_blocks
from kdtree.train.drafter import drafter_loss


def _ids(gen: torch.Generator, s: int, vocab: int = 400) -> torch.Tensor:
    return torch.randint(2, vocab, (1, s), generator=gen)


def test_taps_are_layer_outputs_hf_index_plus_one(toy_pair, gen):
    target, _ = toy_pair
    assert target.tap_layer_ids == target_layer_ids(6, 3) == [1, 2, 3]
    outs = []
    hooks = [
        layer.register_forward_hook(lambda m, i, o: outs.append(o))
        for layer in target.model.layers
    ]
    try:
        ids = _ids(gen, 12)
        with torch.no_grad():
            taps = target.forward_dense(ids, return_taps=True).taps
            emb = target.embed_tokens(ids)
    finally:
        for h in hooks:
            h.remove()
    hidden_states = [emb, *outs]  # HF indexing: 0 = embeddings, l + 1 = output of layer l
    want = torch.cat([hidden_states[lid + 1] for lid in target.tap_layer_ids], dim=-1)
    off_by_one = torch.cat([hidden_states[lid] for lid in target.tap_layer_ids], dim=-1)
    torch.testing.assert_close(taps, want)
    assert not torch.allclose(taps, off_by_one)


def test_anchor_sees_only_strictly_earlier_context(toy_pair, gen):
    target, drafter = toy_pair
    s, a = 24, 10
    ids = _ids(gen, s)
    with torch.no_grad():
        taps = target.forward_dense(ids, return_taps=True).taps
        anchors = torch.tensor([[a]])
        base = drafter.forward_train(taps, ids, anchors).logits
        later = taps.clone()
        later[:, a:] += torch.randn(later[:, a:].shape, generator=gen)  # the anchor and after
        same = drafter.forward_train(later, ids, anchors).logits
        earlier = taps.clone()
        earlier[:, a - 1] += torch.randn(earlier[:, a - 1].shape, generator=gen)
        moved = drafter.forward_train(earlier, ids, anchors).logits
    torch.testing.assert_close(same, base, rtol=0, atol=0)
    assert (moved - base).abs().max() > 1e-4


def test_training_forward_equals_inference_draft(toy_pair, gen):
    """Block row j of the packed forward at anchor a == draft row j-1 with context taps[:a]."""
    target, drafter = toy_pair
    s, bs = 30, drafter.config.block_size
    ids = _ids(gen, s)
    anchors = torch.tensor([[3, 11, 19]])
    with torch.no_grad():
        taps = target.forward_dense(ids, return_taps=True).taps
        packed = drafter.forward_train(taps, ids, anchors).logits  # [1, 3, bs, V]
        for n, a in enumerate(anchors[0].tolist()):
            ctx = drafter.new_context(1, s, device="cpu")
            drafter.append_context(ctx, taps[:, :a], torch.arange(a)[None])
            live = drafter.draft(ctx, ids[:, a], torch.tensor([a]))  # [1, bs-1, V]
            torch.testing.assert_close(packed[0, n, 1:], live[0], rtol=1e-4, atol=1e-4)
            assert packed.shape[2] == bs


def test_same_position_labels():
    """Block (n, j) is labelled with x[a_n + j] (j >= 1); j = 0 and out-of-range are ignored."""
    x = torch.arange(100, 120)[None]  # token value = 100 + position
    lm = torch.ones_like(x, dtype=torch.bool)
    lm[:, :4] = False  # prompt
    anchors, valid = torch.tensor([[5, 15]]), torch.tensor([[True, True]])
    b = make_blocks(x, lm, anchors, valid, block_size=8, mask_token_id=1)
    assert b.labels[0, 0, 0] == IGNORE
    assert b.labels[0, 0, 1:].tolist() == [106 + j for j in range(7)]
    assert b.positions[0, 0].tolist() == list(range(5, 13))
    # anchor 15: positions 16..19 exist, 20..22 are past the end
    assert b.labels[0, 1, 1:5].tolist() == [116, 117, 118, 119]
    assert (b.labels[0, 1, 5:] == IGNORE).all()
    assert b.input_ids[0, 0].tolist() == [105] + [1] * 7


def test_loss_pairs_block_row_j_with_label_j():
    """A drafter that is right at every position has ~0 loss; one that predicts the token one
    position earlier (the classic shifted-label bug) has a large one."""
    v, bs = 50, 8
    x = torch.arange(20)[None] + 10
    lm = torch.ones_like(x, dtype=torch.bool)
    blocks = make_blocks(x, lm, torch.tensor([[2, 9]]), torch.tensor([[True, True]]), bs, 1)
    right = torch.full((1, 2, bs, v), -30.0)
    shifted = torch.full((1, 2, bs, v), -30.0)
    for n, a in enumerate([2, 9]):
        for j in range(bs):
            right[0, n, j, x[0, a + j]] = 30.0
            shifted[0, n, j, x[0, a + j - 1] if j else x[0, a]] = 30.0
    w = loss_weights(bs, 7.0)
    good, stats = drafter_loss(right, blocks.labels, w)
    bad, _ = drafter_loss(shifted, blocks.labels, w)
    assert good < 1e-6 and stats["acc1"] == 1.0
    assert bad > 10.0


def test_mask_token_is_the_one_in_the_block(toy_pair, gen):
    """The block is [bonus, MASK...] with the configured mask id: its embedding row matters,
    another unused row does not."""
    target, drafter = toy_pair
    mask = drafter.config.mask_token_id
    assert mask == 1
    ids = _ids(gen, 20, vocab=300)  # ids < 300, so row 350 is never looked up
    anchors = torch.tensor([[8]])
    emb = target.embed_tokens.weight
    with torch.no_grad():
        taps = target.forward_dense(ids, return_taps=True).taps
        base = drafter.forward_train(taps, ids, anchors).logits
        saved = emb[[mask, 350]].clone()
        try:
            emb[350] += 5.0
            unused = drafter.forward_train(taps, ids, anchors).logits
            emb[mask] += 5.0
            changed = drafter.forward_train(taps, ids, anchors).logits
        finally:
            emb[[mask, 350]] = saved
    # (the head is tied to the embedding: columns of the touched rows move by construction)
    cols = torch.ones(base.shape[-1], dtype=torch.bool)
    cols[[mask, 350]] = False
    torch.testing.assert_close(unused[..., cols], base[..., cols], rtol=0, atol=0)
    assert (changed[..., cols] - base[..., cols]).abs().max() > 1e-4


def test_pipeline_uses_the_tokenizer_mask_id(tiny_tok):
    from kdtree.models import dflash_config_for
    from kdtree.train.presets import get_preset, target_config
    from kdtree.train.tokenizer import MASK_TOKEN, eos_id, mask_id

    cfg = target_config(get_preset("toy").target, tiny_tok.get_vocab_size(), eos_id(tiny_tok))
    dcfg = dflash_config_for(cfg, mask_token_id=mask_id(tiny_tok))
    assert dcfg.mask_token_id == tiny_tok.token_to_id(MASK_TOKEN) == 1
    assert dcfg.mask_token_id != cfg.eos_token_id
