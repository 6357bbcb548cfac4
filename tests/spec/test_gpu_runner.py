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
