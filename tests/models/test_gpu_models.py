"""On a CUDA GPU: the models in bf16 through the cache and the auto backend (Triton when
registered) agree with the dense forward; fp32 on the GPU agrees tightly."""

from __future__ import annotations

import pytest
import torch

from kdtree.attention import AttnMetadata, available_backends, resolve_backend
from kdtree.cache import PagedKVCache
from kdtree.spec.bitmask import pack_bits

pytestmark = pytest.mark.gpu


def decode_through_cache(model, seqs, prefill, page_size, dtype):
    """Prefill ``prefill`` tokens, then T=1 steps (tree mode, backend auto): logits [B, S, V]."""
    dev = seqs.device
    b, s = seqs.shape
    cache = PagedKVCache.for_model(
        model.config, max_batch=b, max_len=s, page_size=page_size, dtype=dtype, device=dev
    )
    reqs = list(range(b))
    cache.reserve(reqs, prefill)
    attn = AttnMetadata(
        "prefill",
        cache.slot_mapping(reqs, [0] * b, prefill),
        cache.batch_page_table(reqs),
        torch.zeros(b, dtype=torch.int32, device=dev),
    )
    pos = torch.arange(prefill, device=dev).expand(b, prefill)
    outs = [model(seqs[:, :prefill], pos, cache, attn).logits]
    for r in reqs:
        cache.set_length(r, prefill)
    one = pack_bits(torch.ones(b, 1, 1, dtype=torch.bool, device=dev))
    for t in range(prefill, s):
        cache.reserve(reqs, 1)
        attn = AttnMetadata(
            "tree",
            cache.slot_mapping(reqs, [t] * b, 1),
            cache.batch_page_table(reqs),
            cache.batch_lengths(reqs),
            one,
        )
        outs.append(
            model(seqs[:, t : t + 1], torch.full((b, 1), t, device=dev), cache, attn).logits
        )
        for r in reqs:
            cache.advance(r, 1)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-3), (torch.bfloat16, 0.15)])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cached_decode_matches_dense_on_gpu(
    target_name, dtype, atol, page_size, gen, random_model
):
    dev = torch.device("cuda")
    model = random_model(target_name, gen).to(dev, dtype)
    seqs = torch.randint(0, model.config.vocab_size, (2, 40), generator=gen).to(dev)
    with torch.no_grad():
        dense = model.forward_dense(seqs).logits
        got = decode_through_cache(model, seqs, 24, page_size, dtype)
    kind = "mla" if target_name == "tiny-mla" else "gqa"
    print(
        f"{target_name} {dtype} backend={resolve_backend(kind, 'auto', dev)} "
        f"available={available_backends(kind)} max|diff|={(got - dense).abs().max().item():.3g}"
    )
    assert torch.isfinite(got).all()
    if dtype == torch.float32:
        torch.testing.assert_close(got, dense, atol=atol, rtol=0)
    else:  # bf16: rounding can flip an MoE routing decision at a rare position
        close = ((got - dense).abs().amax(-1) <= atol).float().mean().item()
        assert close >= 0.9, f"only {close:.0%} of positions within {atol}"
