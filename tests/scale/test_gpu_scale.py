"""Full-size TP8 rank slice on a GPU: the parts agree across providers at K2 shapes."""

from __future__ import annotations

import pytest
import torch

from kdtree.scale.layer_timing import LayerParts
from kdtree.scale.slice import build_k2_slice, make_verify_batch
from kdtree.scale.spec import K2_REFERENCE


@pytest.mark.gpu
def test_full_size_slice_providers_agree():
    model = build_k2_slice(K2_REFERENCE, 2, device="cuda", seed=0, context=4096, tree=17)
    vb = make_verify_batch(model, 4096, 17, backend="triton", seed=1)
    lp = LayerParts(model, 1, vb, seed=2)
    with torch.no_grad():
        tri = lp.attn_kernel("triton")().float()
        eag = lp.attn_kernel("eager")().float()
        torch.testing.assert_close(tri, eag, atol=2e-2, rtol=2e-2)
        loop = lp.experts("loop")().float()
        for prov in ("bmm", "grouped"):
            torch.testing.assert_close(lp.experts(prov)().float(), loop, atol=2e-2, rtol=5e-2)
        assert torch.isfinite(lp.layer_model()).all()
    assert 8 < lp.distinct_experts <= 17 * 8
