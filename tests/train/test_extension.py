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


def test_tail_loss_is_the_loss_on_the_last_tail_positions():
    """``tail_loss`` equals cross-entropy computed directly on the window's last ``tail``
    positions, differs from the whole-window loss, and equals it when ``tail`` is the length."""
    import torch.nn.functional as F

    model, _ = _model()
    model.eval()
    gen = torch.Generator().manual_seed(1)
    stream = torch.randint(2, 64, (400,), generator=gen, dtype=torch.int32)
    wins = tail_windows(stream, 48, 2)
    assert [tuple(w.shape) for w in wins] == [(1, 49), (1, 49)]

    def direct(tail):
        with torch.no_grad():
            per = [
                F.cross_entropy(
                    model.forward_dense(w[:, :-1].long()).logits[0, -tail:].float(),
                    w[0, -tail:].long(),
                )
                for w in wins
            ]
        return float(sum(per) / len(per))

    cpu = torch.device("cpu")
    assert tail_loss(model, wins, 8, cpu) == pytest.approx(direct(8), rel=1e-5)
    assert tail_loss(model, wins, 48, cpu) == pytest.approx(direct(48), rel=1e-5)
    assert tail_loss(model, wins, 8, cpu) != pytest.approx(direct(48), rel=1e-3)


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
