"""SpecEngine's decision hooks: ``_draft_logits``, ``_topk``, ``_argmax``, ``_target_tokens``,
``_verify_kwargs`` and ``budget_policy`` (with ``fixed_tree_size``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtree.models import build_model, get_config
from kdtree.spec import generate
from kdtree.spec.engine import SpecEngine
from kdtree.spec.testing import OracleDrafter, RandomDrafter

PROMPTS = [[1, 5, 7, 9, 11], [3, 4, 100, 200, 300, 11]]
MAX_NEW = 10
BS = 5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def target():
    cfg = get_config("tiny-llama").replace(initializer_range=0.2)
    model = build_model(cfg).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    return model


@pytest.fixture(scope="module")
def ar_tokens(target):
    return generate(target, None, PROMPTS, mode="ar", max_new_tokens=MAX_NEW).tokens


def _run(eng: SpecEngine):
    state = eng.prefill(PROMPTS, max_new_tokens=MAX_NEW)
    recs = []
    while state.active:
        recs.append(eng.step(state))
    return state.tokens, recs


class CountingEngine(SpecEngine):
    """Every decision through the hooks, counted; the vocabulary is padded with ``-inf``
    columns by ``_draft_logits`` (as a padded TP shard) and cut again by ``_topk``/``_argmax``."""

    PAD = 3

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = {"draft": 0, "topk": 0, "argmax": 0, "target": 0}

    def _draft_logits(self, state):
        self.calls["draft"] += 1
        logits = super()._draft_logits(state)
        pad = torch.full((*logits.shape[:2], self.PAD), -torch.inf, device=logits.device)
        return torch.cat([logits, pad], dim=-1)

    def _topk(self, logits, k):
        self.calls["topk"] += 1
        return super()._topk(logits[..., : -self.PAD], k)

    def _argmax(self, logits):
        self.calls["argmax"] += 1
        return super()._argmax(logits[..., : -self.PAD])

    def _target_tokens(self, logits):
        self.calls["target"] += 1
        return super()._target_tokens(logits)


@pytest.mark.parametrize(("mode", "kind"), [("chain", "random"), ("tree", "oracle")])
def test_decision_hooks_are_used_and_lossless(target, ar_tokens, mode, kind):
    if kind == "oracle":
        drafter = OracleDrafter(target, block_size=BS)
    else:
        gen = torch.Generator().manual_seed(3)
        drafter = RandomDrafter(target.config.vocab_size, BS, generator=gen)
    eng = CountingEngine(target, drafter, mode=mode, budget=6, top_k=2)
    tokens, recs = _run(eng)
    assert tokens == ar_tokens
    n = len(recs)
    want = {"draft": n, "target": n, "topk": n * (mode == "tree"), "argmax": n * (mode != "tree")}
    assert eng.calls == want


def test_verify_kwargs_reach_the_target(target, ar_tokens):
    seen: list[object] = []
    orig = target.forward

    def forward(*args, probe=None, **kwargs):
        seen.append(probe)
        return orig(*args, **kwargs)

    eng = SpecEngine(target, OracleDrafter(target, block_size=BS), mode="tree", budget=4)
    eng._verify_kwargs = {"probe": "verify"}
    target.forward = forward
    try:
        tokens, recs = _run(eng)
    finally:
        del target.forward
    assert tokens == ar_tokens
    assert seen == [None] + ["verify"] * len(recs)  # the prefill gets no verify kwargs


@pytest.mark.parametrize("fixed", [True, False], ids=["padded", "shrunk"])
def test_budget_policy_picks_the_budget(target, ar_tokens, fixed):
    budget, pick = 8, 3
    asked: list[tuple[np.ndarray, list[int], list[int]]] = []

    def policy(expected, context_lens, active):
        asked.append((expected.copy(), list(context_lens), list(active)))
        return pick

    cls = type("Eng", (SpecEngine,), {"fixed_tree_size": fixed})
    eng = cls(target, OracleDrafter(target, block_size=BS), mode="tree", budget=budget,
              top_k=2, budget_policy=policy)  # fmt: skip
    state = eng.prefill(PROMPTS, max_new_tokens=MAX_NEW)
    trees = eng._build(state, {})
    assert trees.tokens.shape[1] == (budget + 1 if fixed else pick + 1)
    assert trees.sizes == [pick + 1] * len(PROMPTS)
    full = SpecEngine(target, OracleDrafter(target, block_size=BS), mode="tree", budget=budget,
                      top_k=2)._build(state, {})  # fmt: skip
    for b, tree in enumerate(trees.trees):  # the first pick + 1 pops of the max-budget tree
        assert torch.equal(tree.tokens, full.trees[b].tokens[: pick + 1])
    expected, ctx, active = asked[0]
    assert expected.shape == (len(PROMPTS), budget + 1)
    assert ctx == state.context_lens and active == [0, 1]
    q = np.exp(full.trees[0].scores.double().numpy())
    assert np.allclose(expected[0], 1.0 + np.cumsum(q) - q[0])
    assert np.all(np.diff(expected, axis=1) >= 0) and np.all(expected[:, 0] == 1.0)
    tokens, recs = _run(eng)
    assert tokens == ar_tokens
    assert all(set(r.tree_size) == {pick + 1} for r in recs)
    assert all(r.accepted_len[i] <= pick + 1 for r in recs for i in range(len(r.batch_index)))


def test_budget_policy_bad_inputs(target):
    drafter = OracleDrafter(target, block_size=BS)
    with pytest.raises(TypeError, match="budget_policy"):
        SpecEngine(target, drafter, mode="tree", budget_policy=3)
    with pytest.raises(ValueError, match="budget_policy"):
        SpecEngine(target, drafter, mode="chain", budget_policy=lambda e, c, a: 0)
    for bad in (5, -1, 2.0, True):
        eng = SpecEngine(target, drafter, mode="tree", budget=4,
                         budget_policy=lambda e, c, a, bad=bad: bad)  # fmt: skip
        state = eng.prefill(PROMPTS, max_new_tokens=4)
        with pytest.raises(ValueError, match=r"budget_policy: returned .* 0\.\.4"):
            eng.step(state)
