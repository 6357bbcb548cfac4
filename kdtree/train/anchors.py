"""DFlash training blocks: random anchors, block inputs, same-position labels, loss weights.

This is where the known alignment traps live (``research/ddtree_spec.md`` §1.3, §5, §7), so each
rule is one small function that the tests pin down:

- block ``n`` is ``[x[a_n], MASK x (bs-1)]`` at positions ``a_n .. a_n+bs-1``;
- block output ``j >= 1`` predicts ``x[a_n + j]`` (same-position labels; ``j = 0`` is ignored);
- block ``n`` may see context features of positions ``i < a_n`` only (the anchor's own target
  feature does not exist yet at inference) and its own block, in both directions;
- loss weight ``w_j = exp(-(j-1)/gamma)`` for ``j >= 1``, ``0`` for ``j = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

IGNORE = -100


@dataclass
class Blocks:
    """A batch of training blocks (``N`` per sequence, block size ``bs``)."""

    anchors: torch.Tensor  # int64 [B, N], sorted per row; padding rows repeat a valid anchor
    valid: torch.Tensor  # bool [B, N]
    input_ids: torch.Tensor  # int64 [B, N, bs]: [x[a], MASK, ...]
    positions: torch.Tensor  # int64 [B, N, bs]: a + j
    labels: torch.Tensor  # int64 [B, N, bs]: x[a + j] (j >= 1) or IGNORE

    @property
    def block_size(self) -> int:
        return self.input_ids.shape[-1]


def eligible_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """``bool [B, S]``: ``a`` is an anchor candidate iff ``loss_mask[a]`` and ``loss_mask[a+1]``."""
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask: expected [B, S], got shape {tuple(loss_mask.shape)}")
    lm = loss_mask.bool()
    out = torch.zeros_like(lm)
    out[:, :-1] = lm[:, :-1] & lm[:, 1:]
    return out


def sample_anchors(
    loss_mask: torch.Tensor, n_anchors: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``n_anchors`` distinct random anchors per row, sorted; ``(anchors, valid)``.

    Rows with fewer candidates are padded by repeating their last anchor, flagged invalid.
    """
    if n_anchors < 1:
        raise ValueError(f"n_anchors={n_anchors}: expected >= 1")
    elig = eligible_anchors(loss_mask).cpu()
    b, s = elig.shape
    noise = torch.rand(b, s, generator=generator)
    score = torch.where(elig, noise, torch.full_like(noise, 2.0))  # candidates first
    n = min(n_anchors, s)
    picked = score.topk(n, dim=1, largest=False)
    valid = picked.values < 2.0
    anchors = torch.where(valid, picked.indices, torch.full_like(picked.indices, s))
    anchors, order = anchors.sort(dim=1)
    valid = valid.gather(1, order)
    # invalid slots: point at a real position (0) so gathers stay in range; they carry no loss
    anchors = torch.where(valid, anchors, torch.zeros_like(anchors))
    return anchors.to(loss_mask.device), valid.to(loss_mask.device)


def make_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
) -> Blocks:
    """Block inputs, positions and same-position labels for the given anchors."""
    if input_ids.shape != loss_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and loss_mask "
            f"{tuple(loss_mask.shape)}: expected equal shapes"
        )
    if block_size < 2:
        raise ValueError(f"block_size={block_size}: expected >= 2")
    b, s = input_ids.shape
    j = torch.arange(block_size, device=input_ids.device)
    pos = anchors[:, :, None] + j  # [B, N, bs]
    in_range = pos < s
    gathered = input_ids.gather(1, pos.clamp(max=s - 1).flatten(1)).view_as(pos)
    lm = loss_mask.bool().gather(1, pos.clamp(max=s - 1).flatten(1)).view_as(pos)
    keep = in_range & lm & valid[:, :, None] & (j >= 1)
    labels = torch.where(keep, gathered, torch.full_like(gathered, IGNORE))
    block_in = torch.full_like(gathered, mask_token_id)
    block_in[:, :, 0] = gathered[:, :, 0]
    return Blocks(anchors, valid, block_in, pos, labels)


def loss_weights(block_size: int, gamma: float | None, device=None) -> torch.Tensor:
    """``float32 [bs]``: 0 at the anchor, ``exp(-(j-1)/gamma)`` after it (1 when gamma is None)."""
    j = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.ones_like(j) if gamma is None else torch.exp(-(j - 1) / gamma)
    w[0] = 0.0
    return w


def default_gamma(block_size: int) -> float:
    """DFlash's decay constant: 7 for bs=16, 5 for bs=10, 4 for bs=8 (interpolated otherwise)."""
    table = {16: 7.0, 10: 5.0, 8: 4.0}
    return table.get(block_size, max(1.0, 7.0 * math.log(block_size) / math.log(16)))


def packed_visibility(
    anchors: torch.Tensor, valid: torch.Tensor, seq_len: int, block_size: int
) -> torch.Tensor:
    """``bool [B, N*bs, S + N*bs]``: the training attention pattern as a dense mask.

    Query (n, j) sees context key ``i`` iff ``i < a_n`` and block key (n', j') iff ``n' == n``;
    invalid blocks see only themselves (never a fully masked row). The reference the packed
    forward is checked against.
    """
    b, n = anchors.shape
    dev = anchors.device
    ctx = torch.arange(seq_len, device=dev)[None, None, :] < anchors[:, :, None]  # [B, N, S]
    ctx = ctx & valid[:, :, None]
    ctx = ctx.repeat_interleave(block_size, dim=1)  # [B, N*bs, S]
    blk_id = torch.arange(n, device=dev).repeat_interleave(block_size)
    same = blk_id[:, None] == blk_id[None, :]
    blk = same[None].expand(b, -1, -1)
    return torch.cat([ctx, blk], dim=2)


def target_soft_labels(
    target_logits: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Target logits that predict each block label: row ``p - 1`` predicts the token at ``p``.

    ``target_logits [B, S, V]``, ``positions [B, N, bs]`` → ``[B, N, bs, V]`` (rows whose label is
    ignored point at row 0; their weight is zero).
    """
    b, s, v = target_logits.shape
    src = (positions - 1).clamp(min=0, max=s - 1)
    src = torch.where(labels == IGNORE, torch.zeros_like(src), src)
    rows = target_logits.gather(1, src.flatten(1)[:, :, None].expand(-1, -1, v))
    return rows.view(*positions.shape, v)
