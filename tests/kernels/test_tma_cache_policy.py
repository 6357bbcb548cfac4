"""The CUDA kernels' TMA tile copies carry the L2 evict-first policy (session 27: the KV prefix
and the latent cache are read once a call), and the measurement build ``KDTREE_TMA_EVICT_NORMAL``
issues them without it. Read off the PTX of the local nvcc: no GPU needed."""

from __future__ import annotations

import re

import pytest

from kdtree.kernels import cuda_gqa, cuda_mla
from kdtree.kernels.cuda_build import find_nvcc

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc")

COPY = re.compile(r"^\s*cp\.async\.bulk\.tensor\.\dd\.[^\n]*", re.M)
FRACTION = re.compile(r"createpolicy\.fractional\.L2::evict_first\.b64\s+%rd\d+, ([0-9.]+);")


def _copies(ptx: str) -> list[str]:
    copies = COPY.findall(ptx)
    assert copies, "no TMA tile copies in the PTX"
    return copies


@pytest.mark.parametrize("module", [cuda_gqa, cuda_mla], ids=["gqa", "mla"])
def test_tma_copies_carry_the_evict_first_policy(module, tmp_path):
    ptx = module._SRC.ptx(tmp_path)
    assert all(".L2::cache_hint" in c for c in _copies(ptx))
    assert set(FRACTION.findall(ptx)) == {"1.0"}  # every line of a copy evict-first


def test_evict_normal_build_copies_without_a_policy(tmp_path):
    ptx = cuda_mla._SRC.ptx(tmp_path, ("KDTREE_TMA_EVICT_NORMAL",))
    assert not any("cache_hint" in c for c in _copies(ptx))
    assert "createpolicy" not in ptx
