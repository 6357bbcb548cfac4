"""The same engine on a CUDA device: greedy chain/tree == ar (fp32 exactly; bf16 runs clean)."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import DFlashDrafter, build_model, dflash_config_for, get_config
from kdtree.spec import generate
from kdtree.spec.engine import SpecEngine
from kdtree.spec.records import PHASES
from kdtree.spec.testing import OracleDrafter

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 5, 7, 9, 11], [3, 4, 100, 200, 300, 11, 12, 13, 14]]


def _pair(name: str, dtype: torch.dtype):
    cfg = get_config(name).replace(initializer_range=0.2)
    gen = torch.Generator().manual_seed(0)
    target = build_model(cfg)
    target.init_weights(gen)
    target = target.to("cuda", dtype).eval()
    drafter = DFlashDrafter(dflash_config_for(cfg, block_size=6), target)
    drafter.init_weights(gen)
    return target, drafter.to("cuda", dtype).eval()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_fp32_greedy_equals_ar(name, page_size):
    target, drafter = _pair(name, torch.float32)
    ar = generate(target, None, PROMPTS, mode="ar", max_new_tokens=20, page_size=page_size)
    oracle = OracleDrafter(target, block_size=6)
    for mode, d, kw in (
        ("chain", oracle, {}),
        ("tree", oracle, {"budget": 12, "top_k": 3}),
        ("tree", drafter, {"budget": 12, "top_k": 3}),
    ):
        res = generate(target, d, PROMPTS, mode=mode, max_new_tokens=20, page_size=page_size, **kw)
        assert res.tokens == ar.tokens, (mode, type(d).__name__)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
def test_cuda_bf16_runs_and_records(name):
    target, drafter = _pair(name, torch.bfloat16)
    res = generate(target, OracleDrafter(target, 6), PROMPTS, mode="chain", max_new_tokens=24,
                   timings=True)  # fmt: skip
    assert all(len(t) == 24 for t in res.tokens)
    assert res.tau_mean > 3.0  # the oracle's proposals survive bf16 verify (near-ties aside)
    eng = SpecEngine(target, drafter, mode="tree", budget=32, top_k=4, timings=True)
    state = eng.synthetic_state(2, 4096, torch.Generator().manual_seed(0))
    rec = eng.step(state)
    assert set(rec.phase_ms) == set(PHASES)
    assert state.context_lens == [4096 + t for t in rec.accepted_len]
    dense = SpecEngine(target, drafter, mode="tree", budget=32, top_k=4, dense_mask=True)
    dstate = dense.synthetic_state(2, 4096, torch.Generator().manual_seed(0))
    assert dense.step(dstate).tree_size == (33, 33)
