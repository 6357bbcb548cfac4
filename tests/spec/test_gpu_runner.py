"""GraphStepRunner: eager mode equals the reference engine token for token; graph = eager (GPU)."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import DFlashDrafter, build_model, dflash_config_for, get_config
from kdtree.spec.engine import SpecEngine
from kdtree.spec.gpu.runner import GraphStepRunner
from kdtree.spec.testing import OracleDrafter


def _models(device, drafter_kind, block_size=5):
    torch.manual_seed(0)
    target = build_model(get_config("tiny-llama")).to(device).eval()
    if drafter_kind == "oracle":
        drafter = OracleDrafter(target, block_size=block_size)
    else:
        cfg = dflash_config_for(target.config, block_size=block_size)
        drafter = DFlashDrafter(cfg, target).to(device).eval()
    return target, drafter


def _prompts(gen, vocab, lens=(7, 12)):
    return [torch.randint(0, vocab - 1, (n,), generator=gen).tolist() for n in lens]


def _reference(target, drafter, prompts, device, max_new, **kw):
    eng = SpecEngine(target, drafter, mode="tree", device=device, **kw)
    st = eng.prefill(prompts, max_new_tokens=max_new)
    while st.active:
        eng.step(st)
    return st.tokens


@pytest.mark.parametrize(
    "drafter_kind,sync_every",
    [
        ("oracle", 3),
        ("dflash", 1),
        pytest.param("oracle", 1, marks=pytest.mark.slow),
        pytest.param("dflash", 4, marks=pytest.mark.slow),
    ],
)
def test_eager_runner_equals_engine(drafter_kind, sync_every, gen):
    dev = torch.device("cpu")
    target, drafter = _models(dev, drafter_kind, block_size=4)
    prompts = _prompts(gen, target.config.vocab_size)
    kw = dict(budget=10, top_k=3, page_size=4, backend="ref")
    ref = _reference(target, drafter, prompts, dev, 10, **kw)
    eng = SpecEngine(target, drafter, mode="tree", device=dev, **kw)
    st = eng.prefill(prompts, max_new_tokens=10)
    runner = GraphStepRunner(eng, st, mode="eager", sync_every=sync_every, tree_backend="torch")
    pos_ptr = runner.vbuf.positions.data_ptr()
    tokens = runner.run(100)
    assert tokens == ref
    assert all(len(t) == 10 for t in tokens)
    # the verify read the same static position buffer every step (the graph trap)
    assert runner.vbuf.positions.data_ptr() == pos_ptr
    if drafter_kind == "oracle":  # the oracle's proposals are accepted: long paths
        assert max(max(r.accepted_len) for r in runner.records) > 2


def test_eager_runner_with_triton_kernels_equals_engine(gen):
    """The fused fill, one-launch commit and the tree kernel (interpreter on CPU) in the step."""
    dev = torch.device("cpu")
    target, drafter = _models(dev, "dflash", block_size=4)
    prompts = _prompts(gen, target.config.vocab_size, (6,))
    kw = dict(budget=8, top_k=3, page_size=4, backend="ref")
    ref = _reference(target, drafter, prompts, dev, 6, **kw)
    eng = SpecEngine(target, drafter, mode="tree", device=dev, **kw)
    st = eng.prefill(prompts, max_new_tokens=6)
    runner = GraphStepRunner(
        eng,
        st,
        mode="eager",
        tree_backend="triton",
        commit_backend="triton",
        fill_backend="triton",
    )
    assert runner.run(50) == ref


def test_positions_follow_depths_each_step(gen):
    """Depth positions land in the static buffer every step (not frozen at the first step)."""
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle", block_size=3)
    eng = SpecEngine(
        target, drafter, mode="tree", device=dev, budget=6, top_k=2, page_size=4, backend="ref"
    )
    st = eng.prefill(_prompts(gen, target.config.vocab_size, (5,)), max_new_tokens=30)
    runner = GraphStepRunner(eng, st, mode="eager", tree_backend="torch")
    seen = []
    orig = target.forward

    def spy(input_ids, positions, cache, attn, return_taps=False):
        assert positions.data_ptr() == runner.vbuf.positions.data_ptr()
        seen.append(positions.clone())
        L = attn.prefix_lens.to(torch.int64)[:, None]
        depth = positions - L
        assert int(depth[0, 0]) == 0 and int(depth.max()) >= 1  # real depths, root at L
        return orig(input_ids, positions, cache, attn, return_taps)

    target.forward = spy
    try:
        runner.step()
        runner.step()
    finally:
        del target.forward
    assert not torch.equal(seen[0], seen[1])  # the prefix advanced: positions moved


def test_bad_shapes_raise(gen):
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle")
    eng = SpecEngine(target, drafter, mode="tree", device=dev, budget=8, top_k=2, backend="ref")
    st = eng.prefill(_prompts(gen, target.config.vocab_size), max_new_tokens=4)
    with pytest.raises(ValueError, match="batch=2"):
        GraphStepRunner(eng, st, mode="eager", max_batch=1)
    with pytest.raises(ValueError, match="budget=8"):
        GraphStepRunner(eng, st, mode="eager", max_budget=4)
    runner = GraphStepRunner(eng, st, mode="eager")
    with pytest.raises(ValueError, match="budget=16"):
        runner.check_shape(2, 16)
    with pytest.raises(ValueError, match="mode"):
        GraphStepRunner(eng, st, mode="cuda")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            GraphStepRunner(eng, st, mode="graph")


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graph_equals_eager_on_gpu(temperature, gen):
    dev = torch.device("cuda")
    target, drafter = _models(dev, "dflash", block_size=8)
    prompts = _prompts(gen, target.config.vocab_size, (9, 17, 33))
    outs = []
    for mode in ("eager", "graph"):
        eng = SpecEngine(
            target,
            drafter,
            mode="tree",
            device=dev,
            budget=32,
            top_k=4,
            page_size=16,
            temperature=temperature,
        )
        st = eng.prefill(prompts, max_new_tokens=40)
        runner = GraphStepRunner(eng, st, mode=mode, sync_every=4, seed=3)
        outs.append(runner.run(200))
        if mode == "graph":
            assert runner.graph is not None and runner._total_steps > runner.warmup + 1
            # the trap: the replayed graph wrote this step's positions (prefix + depth)
            last = (runner._total_steps - 1) % runner.sync_every
            L = runner.hist_prefix[last].to(torch.int64)
            assert torch.equal(runner.vbuf.positions[:, 0], L)
            assert (runner.vbuf.positions.max(dim=1).values > L).all()
    assert outs[0] == outs[1]


# ---------------------------------------------------------------------- ar / chain / tree


def _engine_run(target, drafter, prompts, mode, max_new, stop_tokens=(), **kw):
    eng = SpecEngine(target, drafter, mode=mode, device=target.device, **kw)
    st = eng.prefill(prompts, max_new_tokens=max_new, stop_tokens=stop_tokens)
    recs = []
    while st.active:
        recs.append(eng.step(st))
    return st.tokens, recs


def _rec_view(recs):
    return [
        (r.mode, r.batch_index, r.tree_size, r.accepted_len, r.bonus_token, r.emitted)
        for r in recs
    ]


@pytest.mark.parametrize(
    "mode,drafter_kind,sync_every",
    [
        ("ar", "dflash", 1),
        ("ar", "dflash", 4),
        ("chain", "oracle", 1),
        ("chain", "oracle", 4),
        ("chain", "dflash", 3),
        ("tree", "oracle", 4),
    ],
)
def test_eager_runner_equals_engine_per_mode(mode, drafter_kind, sync_every, gen):
    """Greedy: the runner's tokens and step records are the eager engine's, for every mode."""
    dev = torch.device("cpu")
    target, drafter = _models(dev, drafter_kind, block_size=4)
    prompts = _prompts(gen, target.config.vocab_size)
    kw = dict(budget=6, top_k=2, page_size=4, backend="ref")
    ref_tokens, ref_recs = _engine_run(target, drafter, prompts, mode, 11, **kw)
    eng = SpecEngine(target, drafter, mode=mode, device=dev, **kw)
    st = eng.prefill(prompts, max_new_tokens=11)
    runner = GraphStepRunner(eng, st, mode="eager", sync_every=sync_every, tree_backend="torch")
    assert eng.tree_size == runner.T and runner.kind == mode
    assert runner.run(100) == ref_tokens
    assert all(len(t) == 11 for t in ref_tokens)
    assert _rec_view(runner.records) == _rec_view(ref_recs)
    if drafter_kind == "oracle":  # the chain / tree accepts (most of) the oracle's block
        assert max(max(r.accepted_len) for r in runner.records) > 2
    if mode == "ar":
        assert {a for r in runner.records for a in r.accepted_len} == {1}


@pytest.mark.parametrize("mode", ["ar", "chain"])
def test_eager_runner_with_triton_fill_equals_engine_per_mode(mode, gen):
    """The fused fill kernel (interpreter on CPU) on the path trees, T = 1 (ar) and T = 4."""
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle", block_size=4)
    prompts = _prompts(gen, target.config.vocab_size, (6,))
    kw = dict(page_size=4, backend="ref")
    ref_tokens, _ = _engine_run(target, drafter, prompts, mode, 7, **kw)
    eng = SpecEngine(target, drafter, mode=mode, device=dev, **kw)
    st = eng.prefill(prompts, max_new_tokens=7)
    runner = GraphStepRunner(
        eng, st, mode="eager", sync_every=2, fill_backend="triton", commit_backend="triton"
    )
    assert runner.run(50) == ref_tokens


def test_ar_runner_never_drafts_and_verifies_the_root_alone(gen):
    dev = torch.device("cpu")
    target, _ = _models(dev, "oracle")
    eng = SpecEngine(target, None, mode="ar", device=dev, budget=32, page_size=4, backend="ref")
    st = eng.prefill(_prompts(gen, target.config.vocab_size), max_new_tokens=5)
    runner = GraphStepRunner(eng, st, mode="eager", sync_every=2)
    assert (runner.budget, runner.T, runner.P) == (0, 1, 1)  # engine.budget is not used
    shapes = []
    orig = target.forward

    def spy(input_ids, positions, cache, attn, return_taps=False):
        shapes.append((tuple(input_ids.shape), return_taps))
        return orig(input_ids, positions, cache, attn, return_taps)

    target.forward = spy
    try:
        runner.run(20)
    finally:
        del target.forward
    assert shapes and set(shapes) == {((2, 1), False)}


def test_chain_path_tree_is_the_ddtree_at_top_k_1(gen):
    """The runner's chain = the DDTree of the drafter's top-1 per depth at budget D."""
    from kdtree.spec.gpu.tree_build import build_trees_torch
    from kdtree.spec.tree import draft_topk

    dev = torch.device("cpu")
    target, drafter = _models(dev, "dflash", block_size=6)
    eng = SpecEngine(target, drafter, mode="chain", device=dev, page_size=4, backend="ref")
    st = eng.prefill(_prompts(gen, target.config.vocab_size), max_new_tokens=4)
    runner = GraphStepRunner(eng, st, mode="eager")
    assert (runner.budget, runner.T) == (5, 6)
    logits = torch.randn(2, 5, target.config.vocab_size, generator=gen)
    lp, tok = draft_topk(logits, 1)
    ddtree = build_trees_torch(lp, tok, 5, runner.bonus)
    chain = runner._path_tree(torch.cat([runner.bonus[:, None], logits.argmax(-1)], dim=1))
    for name in ("tokens", "parents", "depths", "mask", "n_nodes"):
        assert torch.equal(getattr(chain, name), getattr(ddtree, name)), name


def test_runner_honours_stop_tokens_mid_window(gen):
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle", block_size=4)
    prompts = _prompts(gen, target.config.vocab_size)
    kw = dict(budget=6, top_k=2, page_size=4, backend="ref")
    free, _ = _engine_run(target, drafter, prompts, "chain", 16, **kw)
    stop = (free[0][5],)  # request 0 stops at its 6th token; request 1 may stop too
    for mode in ("ar", "chain", "tree"):
        ref_tokens, ref_recs = _engine_run(target, drafter, prompts, mode, 16, stop, **kw)
        assert ref_tokens[0][-1] == stop[0] and len(ref_tokens[0]) <= 6
        eng = SpecEngine(target, drafter, mode=mode, device=dev, **kw)
        st = eng.prefill(prompts, max_new_tokens=16, stop_tokens=stop)
        runner = GraphStepRunner(eng, st, mode="eager", sync_every=4, tree_backend="torch")
        assert runner.run(100) == ref_tokens, mode
        assert _rec_view(runner.records) == _rec_view(ref_recs), mode


def test_long_window_near_max_new_tokens_stays_in_its_pages(gen):
    """A window of sync_every steps past max_new_tokens used to run off the page table
    (IndexError on the CPU, writes into page 0 on a GPU); finished requests now stop
    committing on the device and each request gets pages for its worst case."""
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle", block_size=8)
    prompts = _prompts(gen, target.config.vocab_size)
    kw = dict(budget=10, top_k=2, page_size=4, backend="ref")
    ref = SpecEngine(target, drafter, mode="tree", device=dev, **kw)
    ref_st = ref.prefill(prompts, max_new_tokens=10)
    while ref_st.active:
        ref.step(ref_st)
    eng = SpecEngine(target, drafter, mode="tree", device=dev, **kw)
    st = eng.prefill(prompts, max_new_tokens=10)
    runner = GraphStepRunner(eng, st, mode="eager", sync_every=8, tree_backend="torch")
    assert runner.run(100) == ref_st.tokens
    # nothing committed after the last step (the engine also commits its whole last path)
    assert runner.prefix.tolist() == ref_st.context_lens == st.context_lens
    assert runner._total_steps == 8  # one full window, the tail steps idle on the device


def test_unbounded_state_shortens_the_window_then_reports_a_full_cache():
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle", block_size=4)
    eng = SpecEngine(
        target, drafter, mode="chain", device=dev, page_size=4, backend="ref", max_len=40
    )
    st = eng.synthetic_state(1, 16)  # no max_new_tokens: only the page table bounds it
    runner = GraphStepRunner(eng, st, mode="eager", sync_every=8)
    windows = []
    with pytest.raises(RuntimeError, match="KV cache full"):
        for _ in range(50):
            windows.append(runner._window)
            runner.step()
    assert max(windows) < 8  # 40 - 16 slots never fit 8 steps of 4
    assert int(runner.prefix[0]) <= 40


def test_runner_validation_names_what_it_expects(gen):
    dev = torch.device("cpu")
    target, drafter = _models(dev, "oracle", block_size=5)
    eng = SpecEngine(target, drafter, mode="chain", device=dev, backend="ref")
    st = eng.prefill(_prompts(gen, target.config.vocab_size), max_new_tokens=4)
    with pytest.raises(ValueError, match="budget=4: above the captured budget 2"):
        GraphStepRunner(eng, st, mode="eager", max_budget=2)
    eng.mode = "beam"
    with pytest.raises(ValueError, match=r"engine.mode='beam'.*'ar', 'chain', 'tree'"):
        GraphStepRunner(eng, st, mode="eager")
    eng.mode, eng.drafter = "chain", None
    with pytest.raises(ValueError, match="engine.drafter: required"):
        GraphStepRunner(eng, st, mode="eager")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["ar", "chain"])
def test_graph_equals_eager_on_gpu_ar_chain(mode, gen):
    dev = torch.device("cuda")
    target, drafter = _models(dev, "dflash", block_size=8)
    prompts = _prompts(gen, target.config.vocab_size, (9, 17, 33))
    outs = []
    for runner_mode in ("eager", "graph"):
        eng = SpecEngine(target, drafter, mode=mode, device=dev, page_size=16)
        st = eng.prefill(prompts, max_new_tokens=40)
        runner = GraphStepRunner(eng, st, mode=runner_mode, sync_every=4)
        outs.append(runner.run(200))
        if runner_mode == "graph":
            assert runner.graph is not None and runner._total_steps > runner.warmup + 1
    assert outs[0] == outs[1]
    assert all(len(t) == 40 for t in outs[1])
