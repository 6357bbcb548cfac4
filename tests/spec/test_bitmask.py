"""Packed bitmask helpers: round trips (bit 63 included), ancestor and chain masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdtree.spec.bitmask import (
    ancestor_mask,
    chain_mask,
    num_words,
    pack_bits,
    pack_bits_np,
    unpack_bits,
)


@pytest.mark.parametrize("T", [1, 7, 63, 64, 65, 97, 128, 257])
def test_pack_unpack_round_trip(T, gen):
    bits = torch.rand(3, 5, T, generator=gen) > 0.5
    words = pack_bits(bits)
    assert words.dtype == torch.int64 and words.shape == (3, 5, num_words(T))
    assert torch.equal(unpack_bits(words, T), bits)
    assert np.array_equal(pack_bits_np(bits.numpy()), words.numpy())


def test_bit_layout_and_sign_bit():
    bits = torch.zeros(130, dtype=torch.bool)
    bits[[0, 5, 63, 64, 129]] = True
    words = pack_bits(bits)
    assert words[0].item() == (1 | (1 << 5)) - 2**63  # bit 63 is the int64 sign
    assert words[1].item() == 1
    assert words[2].item() == 2
    only_63 = torch.zeros(64, dtype=torch.bool)
    only_63[63] = True
    w = pack_bits(only_63)
    assert w.item() == -(2**63)
    assert torch.equal(unpack_bits(w, 64), only_63)


def test_ancestor_mask_is_closure_of_parents():
    parents = [-1, 0, 0, 1, 3, 2, -1]  # node 6: a padded row (sees only itself)
    m = ancestor_mask(parents)
    expect = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 2, 5}, 6: {6}}
    for i, row in expect.items():
        assert set(torch.nonzero(m[i]).flatten().tolist()) == row


def test_ancestor_mask_rejects_forward_parents():
    with pytest.raises(ValueError, match=r"parents\[2\]=2"):
        ancestor_mask([-1, 0, 2])


def test_chain_mask_equals_path_ancestors():
    assert torch.equal(chain_mask(9), ancestor_mask(list(range(-1, 8))))


def test_bad_inputs():
    with pytest.raises(TypeError, match="bits"):
        pack_bits(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="words"):
        unpack_bits(torch.zeros(3, dtype=torch.int32), 3)
    with pytest.raises(ValueError, match="T=65"):
        unpack_bits(torch.zeros(1, dtype=torch.int64), 65)
