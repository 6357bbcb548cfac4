"""DFlash drafter: tap rule, sharing with the target, context cache, inference == training form."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import DFlashDrafter, dflash_config_for, get_config, target_layer_ids


def test_tap_rule_matches_the_spec():
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert target_layer_ids(8, 3) == [1, 3, 5]
    assert target_layer_ids(6, 3) == [1, 2, 3]
    assert target_layer_ids(10, 1) == [5]
    with pytest.raises(ValueError):
        target_layer_ids(0, 3)


def make_pair(target_name, gen, random_model, randomize, block_size=8):
    target = random_model(target_name, gen)
    cfg = dflash_config_for(target.config, num_layers=2, n_taps=3, block_size=block_size)
    drafter = DFlashDrafter(cfg, target).eval()
    randomize(drafter, gen)
    return target, drafter


def test_shares_target_embedding_and_head(gen, random_model, randomize):
    target, drafter = make_pair("tiny-llama", gen, random_model, randomize)
    assert drafter.embed_tokens is target.model.embed_tokens
    assert drafter.lm_head is target.lm_head
    own = {id(p) for p in drafter.parameters()}
    assert id(target.lm_head.weight) not in own and id(target.embed_tokens.weight) not in own
    assert not any(k.startswith(("model.", "lm_head", "embed")) for k in drafter.state_dict())
    assert target.tap_layer_ids == drafter.config.target_layer_ids
    tiny = get_config("tiny-dflash")
    assert tiny.block_size == 16 and tiny.num_hidden_layers == 1 and tiny.n_taps == 3
    assert tiny.mask_token_id == tiny.vocab_size - 1


@pytest.mark.parametrize("target_name", ["tiny-qwen3", "tiny-mla"])
def test_draft_equals_training_forward(target_name, gen, random_model, randomize):
    target, drafter = make_pair(target_name, gen, random_model, randomize)
    s, bs = 24, drafter.block_size
    seqs = torch.randint(0, target.config.vocab_size, (2, s), generator=gen)
    starts = [13, 7]
    with torch.no_grad():
        taps = target.forward_dense(seqs, return_taps=True).taps  # [2, S, 3d]
        ctx = drafter.new_context(2, max_len=32)
        # append in two uneven chunks with padding rows
        first = torch.tensor([5, 3])
        drafter.append_context(ctx, taps[:, :5], torch.arange(5).expand(2, 5), first)
        rest = torch.tensor(starts) - first
        idx = (first[:, None] + torch.arange(int(rest.max()))).clamp_max(s - 1)
        chunk = torch.stack([taps[b, idx[b]] for b in range(2)])
        drafter.append_context(ctx, chunk, idx, rest)
        assert ctx.lengths.tolist() == starts
        bonus = seqs[torch.arange(2), torch.tensor(starts)]
        logits = drafter.draft(ctx, bonus, torch.tensor(starts))
        assert logits.shape == (2, bs - 1, target.config.vocab_size)
        assert logits.dtype == torch.float32
        # the packed training form with the same anchors (plus an invalid one) agrees
        anchors = torch.tensor([[starts[0], 2], [starts[1], 20]])
        valid = torch.tensor([[True, True], [True, False]])
        train = drafter.forward_train(taps, seqs, anchors, valid)
    assert train.logits.shape == (2, 2, bs, target.config.vocab_size)
    for b in range(2):
        torch.testing.assert_close(train.logits[b, 0, 1:], logits[b], atol=1e-4, rtol=0)
    assert torch.isfinite(train.logits).all()


def test_training_blocks_do_not_see_each_other_or_the_anchor_feature(gen, random_model, randomize):
    target, drafter = make_pair("tiny-llama", gen, random_model, randomize)
    s = 20
    seqs = torch.randint(0, target.config.vocab_size, (1, s), generator=gen)
    taps = torch.randn(1, s, drafter.fc.in_features, generator=gen)
    anchors = torch.tensor([[4, 11]])
    f = lambda t, x: drafter.forward_train(t, x, anchors).logits[0]  # noqa: E731
    with torch.no_grad():
        base = f(taps, seqs)
        late = taps.clone()
        late[:, 11:] += 5.0  # features at and after the second anchor: nobody sees them
        mid = taps.clone()
        mid[:, 4:11] += 5.0  # seen by the second block only (the first anchor is 4)
        tok = seqs.clone()
        tok[0, 4] = (seqs[0, 4] + 1) % target.config.vocab_size  # the first block's anchor token
        out_late, out_mid, out_tok = f(late, seqs), f(mid, seqs), f(taps, tok)
    torch.testing.assert_close(out_late, base, atol=1e-6, rtol=0)
    torch.testing.assert_close(out_mid[0], base[0], atol=1e-6, rtol=0)
    assert not torch.allclose(out_mid[1], base[1], atol=1e-3)
    torch.testing.assert_close(out_tok[1], base[1], atol=1e-6, rtol=0)
    assert not torch.allclose(out_tok[0], base[0], atol=1e-3)


def test_drafter_bad_inputs(gen, random_model, randomize):
    target, drafter = make_pair("tiny-llama", gen, random_model, randomize)
    ctx = drafter.new_context(1, max_len=4)
    taps = torch.randn(1, 5, drafter.fc.in_features, generator=gen)
    with pytest.raises(ValueError, match="overflow"):
        drafter.append_context(ctx, taps, torch.arange(5)[None])
    with pytest.raises(ValueError, match="taps"):
        drafter.append_context(ctx, taps[:, :3, :-1], torch.arange(3)[None])
    with pytest.raises(ValueError, match="layers"):
        DFlashDrafter(get_config("tiny-dflash").replace(num_target_layers=4), target)
    with pytest.raises(ValueError, match="hidden"):
        DFlashDrafter(get_config("tiny-dflash").replace(hidden_size=32), target)
    with pytest.raises(ValueError, match="mask_token_id"):
        get_config("tiny-dflash").replace(mask_token_id=10**6)


def test_context_window_equals_a_context_holding_only_the_last_rows(gen, random_model, randomize):
    """With ``context_window = w`` the draft equals a draft over a context that holds only
    the last ``w`` rows (same absolute positions), and differs from the full-context draft."""
    target, drafter = make_pair("tiny-llama", gen, random_model, randomize)
    s, w = 20, 6
    seqs = torch.randint(0, target.config.vocab_size, (1, s), generator=gen)
    with torch.no_grad():
        taps = target.forward_dense(seqs, return_taps=True).taps
        pos = torch.arange(s).unsqueeze(0)
        full = drafter.new_context(1, max_len=32)
        drafter.append_context(full, taps, pos)
        last = drafter.new_context(1, max_len=32)
        drafter.append_context(last, taps[:, s - w :], pos[:, s - w :])
        bonus, start = seqs[:, -1], torch.tensor([s])
        everything = drafter.draft(full, bonus, start)
        drafter.config.context_window = w
        try:
            windowed = drafter.draft(full, bonus, start)
            only_last = drafter.draft(last, bonus, start)
        finally:
            drafter.config.context_window = None
    torch.testing.assert_close(windowed, only_last, atol=1e-5, rtol=0)
    assert (windowed - everything).abs().max() > 1e-3


def test_context_window_in_a_batch_of_short_and_long_contexts(gen, random_model, randomize):
    """A batch mixing a context shorter than the window (the gathered rows before its first
    token must stay invisible) with a longer one: each row equals its own unbatched draft."""
    target, drafter = make_pair("tiny-llama", gen, random_model, randomize)
    w, lens = 6, (3, 20)
    seqs = torch.randint(0, target.config.vocab_size, (2, max(lens)), generator=gen)
    with torch.no_grad():
        taps = target.forward_dense(seqs, return_taps=True).taps
        pos = torch.arange(max(lens)).expand(2, -1)
        drafter.config.context_window = w
        try:
            both = drafter.new_context(2, max_len=32)
            drafter.append_context(both, taps, pos, torch.tensor(lens))
            bonus = torch.stack([seqs[i, n - 1] for i, n in enumerate(lens)])
            start = torch.tensor(lens)
            batched = drafter.draft(both, bonus, start)
            for i, n in enumerate(lens):
                one = drafter.new_context(1, max_len=32)
                drafter.append_context(one, taps[i : i + 1, :n], pos[i : i + 1, :n])
                alone = drafter.draft(one, bonus[i : i + 1], start[i : i + 1])
                torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=0)
            drafter.config.context_window = None
            short = drafter.new_context(1, max_len=32)
            drafter.append_context(short, taps[:1, :3], pos[:1, :3])
            unwindowed = drafter.draft(short, bonus[:1], start[:1])
        finally:
            drafter.config.context_window = None
    # a context shorter than the window sees everything, as without a window
    torch.testing.assert_close(batched[:1], unwindowed, atol=1e-5, rtol=0)
