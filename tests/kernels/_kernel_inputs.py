"""Random tree-verify inputs: paged caches with shuffled pages, random trees, mixed lengths."""

from __future__ import annotations

import math

import torch

from kdtree.spec.bitmask import pack_bits


def random_tree_mask(batch: int, t: int, gen: torch.Generator, pad_from=None) -> torch.Tensor:
    """``int64 [B, T, W]`` ancestor bitmasks of random trees (parent index < child index).
    Rows ``>= pad_from[b]`` are padding and see only themselves."""
    masks = []
    for b in range(batch):
        vis = torch.zeros(t, t, dtype=torch.bool)
        real = t if pad_from is None else pad_from[b]
        for i in range(t):
            vis[i, i] = True
            if 0 < i < real:
                parent = int(torch.randint(0, i, (1,), generator=gen))
                vis[i] |= vis[parent]
        masks.append(vis)
    return pack_bits(torch.stack(masks))


def paged(lengths, t: int, page_size: int, gen: torch.Generator, extra_pages: int = 1):
    """A page table ``int32 [B, max_pages]`` over shuffled physical pages covering
    ``L_b + T`` tokens per request; returns (page_table, num_pages)."""
    per_req = [math.ceil((length + t) / page_size) for length in lengths]
    max_pages = max(per_req) + extra_pages
    total = sum(per_req) + 3
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    table = torch.zeros(len(lengths), max_pages, dtype=torch.int32)
    at = 0
    for b, n in enumerate(per_req):
        table[b, :n] = perm[at : at + n]
        at += n
    return table, total


def ramp_pages(pool: torch.Tensor, table: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``pool`` (a paged cache ``[num_pages, page_size, ...]``) with each request's logical page
    ``i`` of ``n`` scaled by ``lo * (hi / lo) ** (i / (n - 1))``: scores that rise steadily along
    the prefix, so a kernel's running row max moves by small steps on most tiles and by large
    ones where the ramp is steep (pages no request maps keep their values)."""
    out = pool.double().clone()
    n = table.shape[1]
    f = lo * (hi / lo) ** (torch.arange(n, dtype=torch.float64) / max(n - 1, 1))
    for b in range(table.shape[0]):
        for i in range(n):
            out[int(table[b, i])] = pool[int(table[b, i])].double() * f[i]
    return out.to(pool.dtype)


def gqa_inputs(lengths, t, hq, hkv, d, page_size, dtype, gen, pad_from=None):
    b = len(lengths)
    table, num_pages = paged(lengths, t, page_size, gen)
    q = torch.randn(b, t, hq, d, generator=gen).to(dtype)
    k = torch.randn(num_pages, page_size, hkv, d, generator=gen).to(dtype)
    v = torch.randn(num_pages, page_size, hkv, d, generator=gen).to(dtype)
    plen = torch.tensor(lengths, dtype=torch.int32)
    mask = random_tree_mask(b, t, gen, pad_from)
    return q, k, v, table, plen, mask


def mla_inputs(lengths, t, h, rank, rope, page_size, dtype, gen, pad_from=None):
    b = len(lengths)
    table, num_pages = paged(lengths, t, page_size, gen)
    qn = torch.randn(b, t, h, rank, generator=gen).to(dtype)
    qp = torch.randn(b, t, h, rope, generator=gen).to(dtype)
    kv = torch.randn(num_pages, page_size, rank + rope, generator=gen).to(dtype)
    plen = torch.tensor(lengths, dtype=torch.int32)
    mask = random_tree_mask(b, t, gen, pad_from)
    return qn, qp, kv, table, plen, mask
