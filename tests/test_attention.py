"""Verify attention: the torch backends against a brute-force fp64 attention, the registry, input
validation, and causal prefill attention."""

from __future__ import annotations

import pytest
import torch

import kdtree.attention as A
from kdtree.spec.bitmask import pack_bits


def random_tree(t: int, n_real: int, gen: torch.Generator) -> torch.Tensor:
    """``bool [t, t]`` ancestor-or-self visibility of a random tree over the first ``n_real``
    nodes (parents precede children); rows past ``n_real`` are padding and see only
    themselves."""
    vis = torch.eye(t, dtype=torch.bool)
    for i in range(1, n_real):
        parent = int(torch.randint(0, i, (1,), generator=gen))
        vis[i] |= vis[parent]
    return vis


def paged_layout(lengths: list[int], page_size: int, gen: torch.Generator, max_pages: int):
    """A shuffled physical layout: ``page_table int32 [B, max_pages]`` and the page count."""
    need = [-(-n // page_size) for n in lengths]
    num_pages = sum(need) + 3
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.zeros(len(lengths), max_pages, dtype=torch.int32)
    start = 0
    for b, k in enumerate(need):
        table[b, :k] = torch.tensor(perm[start : start + k], dtype=torch.int32)
        start += k
    return table, num_pages


def scatter_contiguous(contig: list[torch.Tensor], table, num_pages: int, page_size: int):
    """Place per-request contiguous rows ``[n_b, ...]`` into a paged tensor (poisoned first)."""
    tail = contig[0].shape[1:]
    paged = torch.full((num_pages * page_size, *tail), float("nan"), dtype=contig[0].dtype)
    for b, rows in enumerate(contig):
        pos = torch.arange(rows.shape[0])
        slots = table[b].long()[pos // page_size] * page_size + pos % page_size
        paged[slots] = rows
    return paged.view(num_pages, page_size, *tail)


def brute_gqa(q, keys, vals, vis, scale):
    """fp64: ``q [T, Hq, D]``, ``keys/vals [S, Hkv, D]``, ``vis bool [T, S]``."""
    rep = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(rep, 1)
    v = vals.double().repeat_interleave(rep, 1)
    s = torch.einsum("thd,shd->hts", q.double(), k) * scale
    s = s.masked_fill(~vis, float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), v)


def make_gqa_case(b_lens, t, hq, hkv, d, page_size, gen, dtype=torch.float32):
    max_pages = max(-(-(n + t) // page_size) for n in b_lens) + 1
    table, num_pages = paged_layout([n + t for n in b_lens], page_size, gen, max_pages)
    ks = [torch.randn(n + t, hkv, d, generator=gen).to(dtype) for n in b_lens]
    vs = [torch.randn(n + t, hkv, d, generator=gen).to(dtype) for n in b_lens]
    k_cache = scatter_contiguous(ks, table, num_pages, page_size)
    v_cache = scatter_contiguous(vs, table, num_pages, page_size)
    q = torch.randn(len(b_lens), t, hq, d, generator=gen).to(dtype)
    trees = [random_tree(t, max(1, t - i), gen) for i in range(len(b_lens))]
    tree_mask = pack_bits(torch.stack(trees))
    prefix = torch.tensor(b_lens, dtype=torch.int32)
    return q, k_cache, v_cache, table, prefix, tree_mask, ks, vs, trees


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("t", [1, 7, 65])
def test_gqa_ref_matches_brute_force(page_size, t, gen):
    lens = [0, 37, 130]
    q, kc, vc, table, prefix, tm, ks, vs, trees = make_gqa_case(lens, t, 4, 2, 16, page_size, gen)
    scale = 0.25
    out = A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=scale, backend="ref")
    assert out.dtype == q.dtype and out.shape == q.shape
    for b, n in enumerate(lens):
        vis = torch.cat([torch.ones(t, n, dtype=torch.bool), trees[b]], dim=1)
        want = brute_gqa(q[b], ks[b], vs[b], vis, scale)
        assert torch.allclose(out[b].double(), want, atol=2e-5, rtol=1e-5), b


@pytest.mark.parametrize("page_size", [1, 16])
def test_gqa_dense_mask_matches_ref(page_size, gen):
    q, kc, vc, table, prefix, tm, *_ = make_gqa_case([5, 70], 9, 8, 2, 32, page_size, gen)
    ref = A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=0.2, backend="ref")
    got = A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=0.2, backend="dense_mask")
    assert torch.allclose(got, ref, atol=1e-5)
    dense = A.build_dense_mask(prefix, tm)
    assert dense.shape == (2, 9, 70 + 9)
    got2 = A.tree_attention(
        q, kc, vc, table, prefix, tm, sm_scale=0.2, backend="dense_mask", dense_mask=dense
    )
    assert torch.allclose(got2, ref, atol=1e-5)


def test_build_dense_mask_layout(gen):
    tree = random_tree(5, 5, gen)
    tm = pack_bits(torch.stack([tree, tree]))
    dense = A.build_dense_mask(torch.tensor([3, 0], dtype=torch.int32), tm)
    assert dense.shape == (2, 5, 8)
    assert dense[0, :, :3].all() and torch.equal(dense[0, :, 3:], tree)
    assert torch.equal(dense[1, :, :5], tree) and not dense[1, :, 5:].any()


def test_ref_fp16_returns_fp16(gen):
    q, kc, vc, table, prefix, tm, ks, vs, trees = make_gqa_case(
        [20], 4, 2, 2, 8, 16, gen, dtype=torch.float16
    )
    out = A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=0.3, backend="ref")
    assert out.dtype == torch.float16
    vis = torch.cat([torch.ones(4, 20, dtype=torch.bool), trees[0]], dim=1)
    want = brute_gqa(q[0], ks[0], vs[0], vis, 0.3)
    assert (out[0].double() - want).abs().max() < 2e-3


def make_mla_case(lens, t, h, rank, rope, page_size, gen):
    max_pages = max(-(-(n + t) // page_size) for n in lens) + 1
    table, num_pages = paged_layout([n + t for n in lens], page_size, gen, max_pages)
    lat = [torch.randn(n + t, rank + rope, generator=gen) for n in lens]
    kv = scatter_contiguous(lat, table, num_pages, page_size)
    q_nope = torch.randn(len(lens), t, h, rank, generator=gen)
    q_pe = torch.randn(len(lens), t, h, rope, generator=gen)
    trees = [random_tree(t, t - i, gen) for i in range(len(lens))]
    return (
        q_nope,
        q_pe,
        kv,
        table,
        torch.tensor(lens, dtype=torch.int32),
        pack_bits(torch.stack(trees)),
        lat,
        trees,
    )


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_mla_ref_and_dense_mask_match_brute_force(page_size, gen):
    lens, t, rank = [3, 90], 6, 32
    q_nope, q_pe, kv, table, prefix, tm, lat, trees = make_mla_case(
        lens, t, 4, rank, 8, page_size, gen
    )
    scale = 0.1
    ref = A.tree_attention_mla(q_nope, q_pe, kv, table, prefix, tm, sm_scale=scale, backend="ref")
    dense = A.tree_attention_mla(
        q_nope, q_pe, kv, table, prefix, tm, sm_scale=scale, backend="dense_mask"
    )
    assert ref.shape == (2, t, 4, rank)
    for b, n in enumerate(lens):
        c, k_pe = lat[b][:, :rank].double(), lat[b][:, rank:].double()
        s = torch.einsum("thr,sr->hts", q_nope[b].double(), c)
        s = (s + torch.einsum("thp,sp->hts", q_pe[b].double(), k_pe)) * scale
        vis = torch.cat([torch.ones(t, n, dtype=torch.bool), trees[b]], dim=1)
        want = torch.einsum("hts,sr->thr", s.masked_fill(~vis, float("-inf")).softmax(-1), c)
        assert torch.allclose(ref[b].double(), want, atol=2e-5)
        assert torch.allclose(dense[b].double(), want, atol=2e-5)


# ----------------------------------------------------------------------------- registry


def test_registry_and_auto(monkeypatch, gen):
    assert {"ref", "dense_mask"} <= set(A.available_backends("gqa"))
    assert {"ref", "dense_mask"} <= set(A.available_backends("mla"))
    assert A.resolve_backend("gqa", "auto", torch.device("cpu")) == "ref"
    calls = []

    def spy(*args, **kw):
        calls.append(kw["sm_scale"])
        return A.tree_attention_ref(*args, **kw)

    A.register_backend("gqa", "spy_test", spy)
    monkeypatch.setattr(A.env, "VERIFY_BACKEND", "spy_test")
    q, kc, vc, table, prefix, tm, *_ = make_gqa_case([4], 3, 2, 1, 8, 16, gen)
    A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=0.5)
    assert calls == [0.5]
    A._BACKENDS["gqa"].pop("spy_test")
    with pytest.raises(ValueError, match="not registered"):
        A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=0.5, backend="nope")
    with pytest.raises(ValueError, match="kind"):
        A.register_backend("xyz", "a", spy)


def test_tree_attention_hands_auto_its_shape(monkeypatch, gen):
    """tree_attention resolves ``auto`` from the call's static shape: head dims, dtype, packed
    rows G * T, the page table's keys and requests x KV heads (the CUDA GQA kernel's rule below
    64 rows, session 26)."""
    seen = []
    real = A.resolve_backend

    def spy(*args, **kw):
        seen.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(A, "resolve_backend", spy)
    q, kc, vc, table, prefix, tm, *_ = make_gqa_case([4, 9, 2], 3, 6, 2, 8, 16, gen)
    A.tree_attention(q, kc, vc, table, prefix, tm, sm_scale=0.5)
    (args,) = seen
    assert args[0] == "gqa" and args[1] == "auto" and args[3] == (8,)
    assert args[5:] == (3 * 3, table.shape[1] * 16, 3 * 2)  # rows, keys, requests x KV heads


# ----------------------------------------------------------------------------- validation


def test_bad_inputs_raise(gen):
    q, kc, vc, table, prefix, tm, *_ = make_gqa_case([10, 20], 5, 4, 2, 8, 16, gen)
    call = lambda **kw: A.tree_attention(  # noqa: E731
        kw.get("q", q),
        kw.get("kc", kc),
        kw.get("vc", vc),
        kw.get("table", table),
        kw.get("prefix", prefix),
        kw.get("tm", tm),
        sm_scale=0.1,
        backend="ref",
    )
    with pytest.raises(ValueError, match="tree_mask"):
        call(tm=tm.to(torch.int32))
    with pytest.raises(ValueError, match="tree_mask"):
        call(tm=tm[:, :4])
    with pytest.raises(ValueError, match="page_table"):
        call(table=table.long())
    with pytest.raises(ValueError, match="prefix_lens"):
        call(prefix=prefix.long())
    with pytest.raises(TypeError, match="k_cache"):
        call(kc=kc.double())
    with pytest.raises(ValueError, match="q"):
        call(q=q[0])
    with pytest.raises(ValueError, match="multiple"):
        call(q=q[:, :, :3])
    too_long = torch.tensor([10, table.shape[1] * 16 - 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="capacity"):
        call(prefix=too_long)
    with pytest.raises(ValueError, match="dense_mask"):
        A.tree_attention(
            q, kc, vc, table, prefix, tm, sm_scale=0.1, dense_mask=torch.ones(2, 5, 3)
        )


# ----------------------------------------------------------------------------- prefill


def test_causal_attention_chunked_equals_full(gen):
    b, s, hq, hkv, d = 2, 23, 4, 2, 16
    q = torch.randn(b, s, hq, d, generator=gen)
    k = torch.randn(b, s, hkv, d, generator=gen)
    v = torch.randn(b, s, hkv, d, generator=gen)
    full = A.causal_attention(q, k, v, sm_scale=0.25)
    vis = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(b):
        assert torch.allclose(full[i].double(), brute_gqa(q[i], k[i], v[i], vis, 0.25), atol=1e-5)
    chunk = A.causal_attention(q[:, 15:], k, v, sm_scale=0.25, q_offset=15)
    assert torch.allclose(chunk, full[:, 15:], atol=1e-6)
    # per-request offsets; request 1 has 3 keys fewer (its tail is padding)
    offs = torch.tensor([15, 12])
    per = A.causal_attention(q[:, 15:19], k, v, sm_scale=0.25, q_offset=offs, kv_lens=offs + 4)
    assert torch.allclose(per[0], full[0, 15:19], atol=1e-6)
    assert torch.allclose(
        per[1],
        A.causal_attention(q[1:, 15:19], k[1:, :16], v[1:, :16], sm_scale=0.25, q_offset=12)[0],
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="q_offset"):
        A.causal_attention(q[:, 15:], k, v, sm_scale=0.25, q_offset=16)


def test_auto_falls_back_to_ref_for_head_dims_the_kernels_do_not_cover():
    import kdtree.kernels  # noqa: F401  (registers "triton")
    from kdtree.attention import available_backends, resolve_backend

    cuda = torch.device("cuda")
    assert "triton" in available_backends("mla")
    assert resolve_backend("mla", "auto", cuda, (512, 64)) == "triton"
    assert resolve_backend("mla", "auto", cuda, (32, 8)) == "ref"  # tiny-mla's rope dim 8
    assert resolve_backend("gqa", "auto", cuda, (128,)) == "triton"
    assert resolve_backend("gqa", "auto", cuda, (24,)) == "ref"
    assert resolve_backend("gqa", "auto", torch.device("cpu"), (128,)) == "ref"
    assert resolve_backend("gqa", "ref", cuda, (24,)) == "ref"


def test_auto_picks_the_cuda_mla_kernel_on_sm90_for_bf16_and_fp16(monkeypatch):
    import kdtree.kernels  # noqa: F401  (registers "triton" and "cuda")
    from kdtree.attention import resolve_backend
    from kdtree.kernels import cuda_mla

    cuda = torch.device("cuda")
    monkeypatch.setattr(cuda_mla, "available_on", lambda device: True)
    assert resolve_backend("mla", "auto", cuda, (512, 64), torch.bfloat16) == "cuda"
    assert resolve_backend("mla", "auto", cuda, (512, 64), torch.float16) == "cuda"
    assert resolve_backend("mla", "auto", cuda, (512, 64), torch.float32) == "triton"
    assert resolve_backend("mla", "auto", cuda, (256, 64), torch.bfloat16) == "triton"
    assert resolve_backend("mla", "auto", torch.device("cpu"), (512, 64), torch.bfloat16) == "ref"
    monkeypatch.setattr(cuda_mla, "available_on", lambda device: False)
    assert resolve_backend("mla", "auto", cuda, (512, 64), torch.bfloat16) == "triton"
