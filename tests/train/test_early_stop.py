"""Overfitting guards: best-weights keeping, early stopping, epoch caps, small-corpus warning."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.train.corpus import small_corpus_warnings
from kdtree.train.early_stop import BestKeeper
from kdtree.train.presets import eval_interval, get_preset, planned_steps


def _linear_with(value: float) -> torch.nn.Linear:
    lin = torch.nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.fill_(value)
        lin.bias.fill_(value)
    return lin


def test_keeper_on_a_synthetic_overfitting_curve_stops_and_restores_the_best():
    curve = [5.0, 4.0, 3.0, 3.5, 3.6, 3.7, 2.0]  # the last point must never be reached
    model = _linear_with(0.0)
    keeper = BestKeeper(patience=3)
    stopped_at = None
    for i, v in enumerate(curve):
        with torch.no_grad():
            model.weight.fill_(float(i))  # weights "of step i"
        if keeper.update(v, i, model):
            stopped_at = i
            break
    assert stopped_at == 5
    assert keeper.best_step == 2 and keeper.best == 3.0
    assert torch.all(model.weight == 5.0)  # the snapshot is a copy, not a view
    assert keeper.restore(model) and torch.all(model.weight == 2.0)
    assert keeper.summary()["best_val"] == 3.0 and keeper.summary()["evals_since_best"] == 3


def test_keeper_modes_nan_patience_zero_and_errors():
    m = _linear_with(1.0)
    up = BestKeeper(patience=2, mode="max")
    assert not up.update(1.0, 1, m) and not up.update(2.0, 2, m)
    assert not up.update(math.nan, 3, m) and up.update(1.5, 4, m)
    assert up.best_step == 2
    never = BestKeeper(patience=0)
    assert not any(never.update(float(v), v, m) for v in range(10))
    assert not BestKeeper().restore(m) and not BestKeeper().has_best
    with pytest.raises(ValueError, match="mode="):
        BestKeeper(mode="lowest")
    with pytest.raises(ValueError, match="patience="):
        BestKeeper(patience=-1)


def test_steps_are_capped_by_epochs_over_the_corpus_found():
    # the H200 run that overfit: 2.64 M training tokens; the h200 preset now caps its steps
    t = get_preset("h200").target
    steps, epochs = planned_steps(t.steps, t.batch_size * t.seq_len, 2_635_175, t.max_epochs)
    assert steps < t.steps and epochs <= t.max_epochs + 0.01
    assert planned_steps(100, 10, 1000, None) == (100, 1.0)
    assert planned_steps(100, 10, 1000, 0.5) == (50, 0.5)
    assert planned_steps(100, 10_000, 10, 1.0)[0] == 1
    with pytest.raises(ValueError, match="max_epochs"):
        planned_steps(100, 10, 1000, 0.0)
    assert eval_interval(483, 100, 16) == 30 and eval_interval(10_000, 100, 16) == 100
    assert eval_interval(3, 250, 16) == 1


def test_small_corpus_is_warned_about_with_the_interpreter_and_path():
    src = {
        "root": "/usr/lib/python3.12",
        "python_version": "3.12.3",
        "python_executable": "/usr/bin/python3",
        "train_files": 600,
        "test_package_files": 0,
    }
    (w,) = small_corpus_warnings(2_635_175, 7_000_000, src)
    assert "/usr/lib/python3.12" in w and "3.12.3" in w and "/usr/bin/python3" in w
    assert "test" in w and "2,635,175" in w
    assert small_corpus_warnings(7_760_000, 7_000_000, src) == []
    assert small_corpus_warnings(10, 0, src) == []


def _markov(n: int, seed: int, vocab: int = 32) -> torch.Tensor:
    """A stream from a fixed sparse bigram chain (3 successors per token)."""
    nxt = torch.randint(2, vocab, (vocab, 3), generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, 3, (n,), generator=g)
    out = [2]
    for i in range(n - 1):
        out.append(int(nxt[out[-1], picks[i]]))
    return torch.tensor(out, dtype=torch.int32)


def test_target_memorising_a_tiny_corpus_stops_early_with_the_best_weights():
    from kdtree.models import build_model
    from kdtree.train.presets import target_config
    from kdtree.train.target import train_target

    p = get_preset(
        "toy",
        target_num_layers=2,
        target_seq_len=16,
        target_batch_size=8,
        target_lr=1e-2,
        target_steps=600,
        target_eval_every=10,
        target_patience=3,
        target_eval_batches=2,
        target_weight_decay=0.0,
    ).target
    model = build_model(target_config(p, 32, 0))
    model.init_weights(torch.Generator().manual_seed(0))
    # 120 training tokens (memorised within tens of steps), 1000 held-out ones
    res = train_target(
        model,
        _markov(120, 1),
        _markov(1000, 2),
        p,
        torch.device("cpu"),
        progress=False,
        log=lambda m: None,
    )
    vals = [h["val_loss"] for h in res.history]
    assert res.stopped_by == "early_stop" and res.steps < p.steps
    assert res.steps == res.best_step + p.patience * res.eval_every
    assert res.best_val == min(vals) and res.last_val_loss > res.best_val + 0.1
    # val_loss is re-measured after the restore: the best weights are back in the model
    assert res.restored_best and math.isclose(res.val_loss, res.best_val, rel_tol=1e-5)


def test_drafter_keeps_the_weights_of_its_best_held_out_loss(toy_pair, gen):
    from kdtree.train.anchors import default_gamma, loss_weights
    from kdtree.train.drafter import DraftData, DraftVal, train_drafter, validate_drafter

    target, drafter = toy_pair
    toks = torch.randint(2, 400, (4, 24), generator=gen)
    mask = torch.zeros_like(toks, dtype=torch.bool)
    mask[:, 8:] = True
    val = DraftVal.build(torch.randint(2, 400, (3, 24), generator=gen), 8, 8, 4, seed=0)
    p = get_preset("toy", drafter_steps=6, drafter_lr=5e-2, drafter_patience=0).drafter
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    try:
        res = train_drafter(
            drafter,
            target,
            DraftData(toks, mask, torch.zeros(4)),
            p,
            torch.device("cpu"),
            progress=False,
            log=lambda m: None,
            val=val,
            eval_every=1,
        )
        again = validate_drafter(drafter, target, val, loss_weights(8, default_gamma(8)))
    finally:
        drafter.load_state_dict(before)
        drafter.eval()
    vals = [h["val_loss"] for h in res.history]
    assert len(vals) == 6 and res.steps == 6 and res.stopped_by == "steps"
    assert res.best_val_loss == min(vals) and res.best_step == 1 + vals.index(min(vals))
    assert math.isclose(again["loss"], res.best_val_loss, rel_tol=1e-5)
    assert 1.0 <= again["tau"] <= 8.0
    assert res.restored_best == (res.best_step != 6)
