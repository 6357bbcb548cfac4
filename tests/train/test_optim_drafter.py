"""Schedule, deadline, device choice, presets, the KL term and a KL drafter step."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.train.anchors import loss_weights, make_blocks
from kdtree.train.drafter import DraftData, drafter_loss, train_drafter
from kdtree.train.optim import Deadline, cosine_lr, resolve_device
from kdtree.train.presets import get_preset


def test_cosine_lr_warms_up_then_decays_to_the_floor():
    assert cosine_lr(0.0, 1.0) < 0.01
    assert math.isclose(cosine_lr(0.04, 1.0), 1.0)
    assert math.isclose(cosine_lr(1.0, 1.0), 0.1)
    xs = [cosine_lr(f / 100, 1.0) for f in range(5, 101)]
    assert all(a >= b for a, b in zip(xs, xs[1:], strict=False))
    with pytest.raises(ValueError, match="warmup_frac"):
        cosine_lr(0.5, 1.0, warmup_frac=1.0)


def test_deadline_progress_takes_the_further_of_steps_and_time():
    d = Deadline(None)
    assert d.progress(5, 10) == 0.5 and not d.expired()
    d = Deadline(1e-9)
    assert d.progress(0, 10) == 1.0 and d.expired()


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda")


def test_preset_overrides_and_errors():
    p = get_preset("toy", target_steps=7, drafter_kl_weight=0.5)
    assert p.target.steps == 7 and p.drafter.kl_weight == 0.5
    with pytest.raises(ValueError, match="preset="):
        get_preset("huge")
    with pytest.raises(ValueError, match="target_ or drafter_"):
        get_preset("toy", steps=3)
    with pytest.raises(ValueError, match="overrides"):
        get_preset("toy", target_nonsense=3)


def test_kl_term_is_zero_when_drafter_equals_target_and_positive_otherwise(gen):
    x = torch.randint(0, 30, (1, 20), generator=gen)
    lm = torch.ones_like(x, dtype=torch.bool)
    b = make_blocks(x, lm, torch.tensor([[3, 9]]), torch.tensor([[True, True]]), 6, 1)
    logits = torch.randn(1, 2, 6, 30, generator=gen)
    w = loss_weights(6, 4.0)
    ce_only, _ = drafter_loss(logits, b.labels, w)
    same, stats = drafter_loss(logits, b.labels, w, logits.clone(), kl_weight=1.0)
    assert stats["kl"] < 1e-6 and math.isclose(float(same), float(ce_only), rel_tol=1e-5)
    other, stats = drafter_loss(logits, b.labels, w, torch.randn_like(logits), kl_weight=1.0)
    assert stats["kl"] > 0.01 and other > ce_only


def test_one_drafter_step_with_kl_changes_only_drafter_weights(toy_pair, gen):
    target, drafter = toy_pair
    toks = torch.randint(2, 400, (4, 24), generator=gen)
    mask = torch.zeros_like(toks, dtype=torch.bool)
    mask[:, 8:] = True
    data = DraftData(toks, mask, torch.zeros(4))
    before_t = {k: v.clone() for k, v in target.state_dict().items()}
    before_d = {k: v.clone() for k, v in drafter.state_dict().items()}
    p = get_preset("toy", drafter_steps=2, drafter_kl_weight=0.5)
    try:
        res = train_drafter(
            drafter,
            target,
            data,
            p.drafter,
            torch.device("cpu"),
            progress=False,
            log=lambda m: None,
        )
    finally:
        changed = any(not torch.equal(v, drafter.state_dict()[k]) for k, v in before_d.items())
        drafter.load_state_dict(before_d)
        drafter.eval()
    assert res.steps == 2 and math.isfinite(res.train_loss) and changed
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before_t.items())
