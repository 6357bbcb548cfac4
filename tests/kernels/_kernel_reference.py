"""Dense references for the kernel tests: fp64 truth, and the same math run in a low dtype."""

from __future__ import annotations

import torch

from kdtree.attention import gather_prefix, tree_visibility


def _keys(cache, table_row, n):
    return gather_prefix(cache, table_row, n)


def gqa_dense(q, k_cache, v_cache, page_table, prefix_lens, tree_mask, sm_scale, dtype):
    """Attention computed with every tensor in ``dtype`` (fp64: the truth)."""
    b, t, hq, _ = q.shape
    hkv = k_cache.shape[2]
    out = torch.empty(b, t, hq, v_cache.shape[3], dtype=dtype)
    for i in range(b):
        n = int(prefix_lens[i]) + t
        k = _keys(k_cache, page_table[i], n).to(dtype).repeat_interleave(hq // hkv, dim=1)
        v = _keys(v_cache, page_table[i], n).to(dtype).repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("thd,shd->hts", q[i].to(dtype), k) * sm_scale
        vis = tree_visibility(int(prefix_lens[i]), tree_mask[i], t)
        p = s.masked_fill(~vis[None], float("-inf")).softmax(-1)
        out[i] = torch.einsum("hts,shd->thd", p, v)
    return out


def mla_dense(q_nope, q_pe, kv_cache, page_table, prefix_lens, tree_mask, sm_scale, dtype):
    """Absorbed-MLA attention computed with every tensor in ``dtype``."""
    b, t, h, rank = q_nope.shape
    out = torch.empty(b, t, h, rank, dtype=dtype)
    for i in range(b):
        n = int(prefix_lens[i]) + t
        lat = _keys(kv_cache, page_table[i], n).to(dtype)
        c, kp = lat[:, :rank], lat[:, rank:]
        s = torch.einsum("thr,sr->hts", q_nope[i].to(dtype), c)
        s = (s + torch.einsum("thp,sp->hts", q_pe[i].to(dtype), kp)) * sm_scale
        vis = tree_visibility(int(prefix_lens[i]), tree_mask[i], t)
        p = s.masked_fill(~vis[None], float("-inf")).softmax(-1)
        out[i] = torch.einsum("hts,sr->thr", p, c)
    return out


def assert_close_to_truth(got, truth, baseline, atol, what=""):
    """Kernel error vs the fp64 truth at most 2x the baseline's error (same dtype) + atol."""
    assert torch.isfinite(got).all(), f"{what}: non-finite output (unwritten or NaN)"
    err = (got.double() - truth).abs().max().item()
    base = (baseline.double() - truth).abs().max().item()
    assert err <= 2 * base + atol, f"{what}: error {err:.3g} > 2 x baseline {base:.3g} + {atol}"
