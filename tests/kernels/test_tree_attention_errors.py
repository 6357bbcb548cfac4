"""Bad input to the Triton tree-verify backend raises clear errors."""

from __future__ import annotations

import pytest
import torch
from _kernel_inputs import gqa_inputs, mla_inputs

from kdtree.kernels import MAX_TREE_TOKENS, TreeAttentionPlan
from kdtree.kernels import tree_attention_mla_triton as mla
from kdtree.kernels import tree_attention_triton as gqa


@pytest.fixture
def args(gen):
    return list(gqa_inputs([20, 3], 5, 4, 2, 32, 16, torch.float32, gen))


def test_dtype_mismatch(args):
    args[1] = args[1].half()
    with pytest.raises(TypeError, match="k_cache"):
        gqa(*args, sm_scale=0.1)


def test_unsupported_dtype(args):
    args = [args[0].double(), args[1].double(), args[2].double(), *args[3:]]
    with pytest.raises(TypeError, match="q: dtype"):
        gqa(*args, sm_scale=0.1)


def test_head_mismatch(args):
    args[0] = args[0][:, :, :3].contiguous()
    with pytest.raises(ValueError, match="not a multiple"):
        gqa(*args, sm_scale=0.1)


def test_head_dim_not_pow2(gen):
    args = gqa_inputs([4], 2, 2, 1, 48, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="head dim 48"):
        gqa(*args, sm_scale=0.1)


def test_tree_mask_shape(args):
    args[5] = args[5][:, :4]
    with pytest.raises(ValueError, match="tree_mask"):
        gqa(*args, sm_scale=0.1)


def test_page_table_dtype(args):
    args[3] = args[3].long()
    with pytest.raises(ValueError, match="page_table"):
        gqa(*args, sm_scale=0.1)


def test_prefix_longer_than_page_table(args):
    args[4] = torch.tensor([20, 10_000], dtype=torch.int32)
    with pytest.raises(ValueError, match="capacity"):
        gqa(*args, sm_scale=0.1)


def test_tree_above_compiled_max(gen):
    t = MAX_TREE_TOKENS + 1
    q = torch.zeros(1, t, 2, 32)
    k = torch.zeros(4, 16, 2, 32)
    table = torch.zeros(1, 4, dtype=torch.int32)
    mask = torch.zeros(1, t, (t + 63) // 64, dtype=torch.int64)
    with pytest.raises(ValueError, match="compiled maximum"):
        gqa(q, k, k, table, torch.zeros(1, dtype=torch.int32), mask, sm_scale=0.1)


@pytest.mark.parametrize(
    ("max_batch", "num_q_heads", "options", "match"),
    [
        (1, 4, {}, "plan"),
        (4, 8, {}, "plan: built for"),
        (2, 4, {"num_splits": 10_000}, "workspace holds"),
    ],
    ids=["too_small", "wrong_layout", "forced_splits_beyond_the_plan"],
)
def test_plan_mismatch(args, max_batch, num_q_heads, options, match):
    plan = TreeAttentionPlan.for_gqa(
        max_batch=max_batch,
        max_tree=8,
        num_q_heads=num_q_heads,
        num_kv_heads=2,
        head_dim=32,
        max_prefix_len=64,
        device="cpu",
    )
    with pytest.raises(ValueError, match=match):
        gqa(*args, sm_scale=0.1, plan=plan, **options)


def test_out_shape(args):
    with pytest.raises(ValueError, match="out"):
        gqa(*args, sm_scale=0.1, out=torch.empty(1, 2, 3, 4))


def test_cpu_without_interpreter(args, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        gqa(*args, sm_scale=0.1)


def test_mla_kv_width(gen):
    qn, qp, kv, pt, pl, m = mla_inputs([10], 3, 2, 64, 16, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="kv_cache"):
        mla(qn, qp, kv[..., :70], pt, pl, m, sm_scale=0.1)


def test_mla_q_pe_shape(gen):
    qn, qp, kv, pt, pl, m = mla_inputs([10], 3, 2, 64, 16, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="q_pe"):
        mla(qn, qp[:, :2], kv, pt, pl, m, sm_scale=0.1)
