"""The long-context extension phase: tail loss measures depth into a window, the extension
runs the preset's lengths in turn, and refuses what it cannot do."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import build_model
from kdtree.train.presets import get_preset, target_config
from kdtree.train.target import extend_context, tail_loss, tail_windows


def _model(vocab: int = 64):
    p = get_preset("toy").target
    model = build_model(target_config(p, vocab, 0))
    model.init_weights(torch.Generator().manual_seed(0))
    return model, p


def test_tail_loss_reads_only_the_tail():
    """Changing tokens before the tail's context changes nothing a causal model could not
    see; changing a tail label changes the loss."""
    model, _ = _model()
    gen = torch.Generator().manual_seed(1)
    stream = torch.randint(2, 64, (400,), generator=gen, dtype=torch.int32)
    wins = tail_windows(stream, 48, 2)
    assert [tuple(w.shape) for w in wins] == [(1, 49), (1, 49)]
    base = tail_loss(model, wins, 8, torch.device("cpu"))
    changed = [w.clone() for w in wins]
    changed[0][0, -1] = (changed[0][0, -1] + 1) % 64
    assert tail_loss(model, changed, 8, torch.device("cpu")) != pytest.approx(base, abs=1e-7)


def test_extension_visits_each_length_in_turn():
    model, p = _model()
    p = p.__class__(**{**p.__dict__, "extend_seq_lens": (32, 64), "extend_steps": 5})
    gen = torch.Generator().manual_seed(2)
    train = torch.randint(2, 64, (2000,), generator=gen, dtype=torch.int32)
    val = torch.randint(2, 64, (600,), generator=gen, dtype=torch.int32)
    res = extend_context(
        model, train, val, p, torch.device("cpu"), progress=False, log=lambda m: None
    )
    assert res.steps == 5 and res.steps_per_len == {32: 3, 64: 2}
    assert res.tokens_seen == 3 * 32 * (128 // 32) + 2 * 64 * (128 // 64)
    assert set(res.tail_loss_before) == set(res.tail_loss_after) == {32, 64}
    assert all(torch.isfinite(torch.tensor(v)) for v in res.tail_loss_after.values())


def test_extension_refuses_windows_longer_than_the_data():
    model, p = _model()
    p = p.__class__(**{**p.__dict__, "extend_seq_lens": (4096,), "extend_steps": 1})
    stream = torch.randint(2, 64, (500,), dtype=torch.int32)
    with pytest.raises(ValueError, match="longer than"):
        extend_context(model, stream, stream, p, torch.device("cpu"), progress=False)
    p = p.__class__(**{**p.__dict__, "extend_seq_lens": ()})
    with pytest.raises(ValueError, match="no extension"):
        extend_context(model, stream, stream, p, torch.device("cpu"), progress=False)
