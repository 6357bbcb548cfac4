"""Engine losslessness (greedy chain/tree == ar), stop/length handling, records, bad inputs."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import DFlashDrafter, build_model, dflash_config_for, get_config
from kdtree.spec import generate
from kdtree.spec.engine import SpecEngine
from kdtree.spec.records import PHASES
from kdtree.spec.testing import OracleDrafter, RandomDrafter

PROMPTS = [[1, 5, 7, 9, 11], [3, 4, 100, 200, 300, 11, 12, 13, 14]]
MAX_NEW = 14
BS = 5  # drafter block size: depth <= 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread is several times faster."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_target(name: str, vocab: int | None = None, seed: int = 0):
    cfg = get_config(name).replace(initializer_range=0.2)
    if vocab is not None:
        cfg = cfg.replace(vocab_size=vocab)
    model = build_model(cfg).eval()
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-mla"])
def target(request):
    return make_target(request.param)


@pytest.fixture(scope="module")
def ar_tokens(target):
    return generate(target, None, PROMPTS, mode="ar", max_new_tokens=MAX_NEW).tokens


CASES = [
    # id, mode, drafter, budget, top_k, page_size
    ("chain-oracle-p16", "chain", "oracle", 0, 1, 16),
    ("chain-random-p1", "chain", "random", 0, 1, 1),
    ("tree-oracle-b4k2-p1", "tree", "oracle", 4, 2, 1),
    ("tree-oracle-b16k3-p64", "tree", "oracle", 16, 3, 64),
    ("tree-random-b12k4-p16", "tree", "random", 12, 4, 16),
    ("tree-dflash-b8k2-p16", "tree", "dflash", 8, 2, 16),
]


def _drafter(kind: str, target):
    if kind == "oracle":
        return OracleDrafter(target, block_size=BS)
    if kind == "random":
        gen = torch.Generator().manual_seed(3)
        return RandomDrafter(target.config.vocab_size, BS, generator=gen)
    cfg = dflash_config_for(target.config, block_size=BS)
    drafter = DFlashDrafter(cfg, target).eval()
    drafter.init_weights(torch.Generator().manual_seed(1))
    return drafter


@pytest.mark.parametrize(("mode", "kind", "budget", "top_k", "page_size"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])  # fmt: skip
def test_greedy_equals_ar(target, ar_tokens, mode, kind, budget, top_k, page_size):
    res = generate(
        target,
        _drafter(kind, target),
        PROMPTS,
        mode=mode,
        budget=budget,
        top_k=top_k,
        max_new_tokens=MAX_NEW,
        page_size=page_size,
    )
    assert res.tokens == ar_tokens
    assert all(len(t) == MAX_NEW for t in res.tokens)
    taus = [t for rec in res.steps for t in rec.accepted_len]
    assert all(1 <= t <= BS for t in taus)
    if kind == "oracle" and mode == "chain":
        assert res.tau_mean >= BS - 0.5  # everything accepted (up to a rare near-tie)
    if kind == "oracle" and mode == "tree":
        assert res.tau_mean > 2.0
    if kind == "random":
        assert res.tau_mean < 1.5
    # Generated tokens = prefill token + what the steps emitted.
    assert sum(sum(r.emitted) for r in res.steps) == sum(len(t) - 1 for t in res.tokens)


def test_stop_tokens_finish_requests_at_different_times(target, ar_tokens):
    stop = ar_tokens[0][3]  # request 0 stops early at its 4th token; request 1 maybe later
    want = []
    for toks in ar_tokens:
        cut = toks.index(stop) + 1 if stop in toks else len(toks)
        want.append(toks[:cut])
    for mode, drafter in (("ar", None), ("chain", _drafter("oracle", target))):
        res = generate(
            target, drafter, PROMPTS, mode=mode, max_new_tokens=MAX_NEW, stop_tokens=[stop]
        )
        assert res.tokens == want
        assert res.steps[-1].batch_index == (1,) or len(want[1]) == len(want[0])


def test_dense_mask_baseline_gives_the_same_tokens(target, ar_tokens):
    res = generate(
        target,
        _drafter("oracle", target),
        PROMPTS,
        mode="tree",
        budget=6,
        top_k=2,
        max_new_tokens=MAX_NEW,
        dense_mask=True,
    )
    assert res.tokens == ar_tokens


def test_records_and_result_tables(target):
    res = generate(target, _drafter("oracle", target), PROMPTS[:1], mode="chain", max_new_tokens=9)
    hist = res.acceptance_histogram()
    assert sum(hist.values()) == sum(len(r.batch_index) for r in res.steps)
    table = res.phase_table()
    assert list(table["phase"]) == list(PHASES)
    assert (table["calls"] == res.num_steps).all()
    assert abs(table["share_pct"].sum() - 100.0) < 1e-6
    frame = res.frame()
    assert len(frame) == res.num_steps and "verify_ms" in frame.columns
    rec = res.steps[0]
    assert rec.tree_size == (BS,) and rec.context_len == (len(PROMPTS[0]),)
    assert res.target_forwards_per_token <= 1.0 / (BS - 0.5) + 1e-9 or res.num_steps <= 2
    ar = generate(target, None, PROMPTS[:1], mode="ar", max_new_tokens=5)
    assert ar.target_forwards_per_token == 1.0 and ar.tau_mean == 1.0
    assert set(ar.phase_table()["phase"]) == {"prepare_for_verify", "verify", "accept", "commit"}


def test_synthetic_state_step(target):
    drafter = _drafter("dflash", target)
    eng = SpecEngine(target, drafter, mode="tree", budget=6, top_k=2, timings=True)
    state = eng.synthetic_state(2, 300, torch.Generator().manual_seed(0))
    assert state.context_lens == [300, 300]
    rec = eng.step(state)
    assert rec.context_len == (300, 300)
    assert set(rec.phase_ms) == set(PHASES)
    assert all(v >= 0 for v in rec.phase_ms.values())
    assert state.context_lens == [300 + t for t in rec.accepted_len]
    rec2 = eng.step(state)
    assert rec2.step == 1


def test_bad_inputs():
    t = make_target("tiny-llama")
    d = RandomDrafter(t.config.vocab_size, BS)
    with pytest.raises(ValueError, match="budget=-1"):
        SpecEngine(t, d, mode="tree", budget=-1)
    with pytest.raises(ValueError, match="mode='beam'"):
        SpecEngine(t, d, mode="beam")
    with pytest.raises(ValueError, match="temperature"):
        SpecEngine(t, d, temperature=-0.5)
    with pytest.raises(ValueError, match="top_k"):
        SpecEngine(t, d, top_k=0)
    with pytest.raises(ValueError, match="top_k=100000"):
        SpecEngine(t, d, top_k=100000)
    with pytest.raises(ValueError, match="drafter"):
        SpecEngine(t, None, mode="tree")
    with pytest.raises(ValueError, match="block_size"):
        RandomDrafter(10, block_size=1)
    eng = SpecEngine(t, d, mode="chain")
    with pytest.raises(ValueError, match="prompts"):
        eng.prefill([])
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        eng.prefill([[1, 2, 10**6]])
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.prefill([[1, 2]], max_new_tokens=0)
    state = eng.prefill([[1, 2]], max_new_tokens=1)
    assert state.tokens[0] and state.done == [True]
    with pytest.raises(RuntimeError, match="finished"):
        eng.step(state)


def test_tree_with_top1_is_the_chain(target):
    """Tree mode with K = 1 and budget = depth accepts exactly what chain mode accepts."""
    kw = dict(max_new_tokens=MAX_NEW)
    drafter = _drafter("dflash", target)
    chain = generate(target, drafter, PROMPTS, mode="chain", **kw)
    tree = generate(target, drafter, PROMPTS, mode="tree", budget=BS - 1, top_k=1, **kw)
    assert tree.tokens == chain.tokens
    assert [r.accepted_len for r in tree.steps] == [r.accepted_len for r in chain.steps]
    assert [r.tree_size for r in tree.steps] == [r.tree_size for r in chain.steps]
