"""Decisions on vocabulary-parallel logits, without all-gathering ``[.., V]`` rows.

* :func:`dist_topk` (tree build): each rank computes its shard's max ``m`` and
  ``sum exp(x - m)`` and its local top-K; one all-gather carries both, every rank merges the
  log-sum-exp (``M = max m``, ``S = sum s exp(m - M)``) and finishes with a global top-K over the
  ``size x K`` candidates. (The max/sum all-reduce pair and the candidate all-gather are fused
  into one collective: at decode sizes each collective costs latency, not bandwidth.)
* :func:`dist_argmax` (greedy walk): local max/argmax, all-gather of one pair per row per rank;
  every rank reduces the same gathered pairs, so all agree (ties: lowest token id, as
  ``torch.argmax``).
* :func:`dist_target_tokens` (the acceptance walk's target tokens): greedy through
  ``dist_argmax``; sampling: the shards are gathered to rank 0, which samples with its
  generator exactly like :func:`kdtree.spec.accept.target_tokens`, then broadcasts.

``local`` logits are a rank's padded shard ``[..., per]`` (padding ``-inf``), ``shard`` its
:class:`~kdtree.tp.layers.VocabShard`.
"""

from __future__ import annotations

import torch

from kdtree.spec.accept import target_tokens
from kdtree.tp.dist import TPGroup
from kdtree.tp.layers import VocabShard

__all__ = ["dist_argmax", "dist_logsumexp", "dist_target_tokens", "dist_topk"]


def _check_local(local: torch.Tensor, shard: VocabShard, name: str = "local") -> None:
    if not isinstance(local, torch.Tensor) or not local.is_floating_point():
        raise TypeError(f"{name}: expected floating-point logits, got {type(local).__name__}")
    if local.dim() < 1 or local.shape[-1] != shard.per:
        raise ValueError(
            f"{name}: expected last dim {shard.per} (this rank's padded vocabulary shard), got "
            f"shape {tuple(local.shape)}"
        )


def _local_lse_pieces(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2]``: this shard's max ``m`` and ``sum exp(x - m)`` (``0`` for an all-padding
    shard)."""
    m = x.amax(dim=-1)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.exp(x - m_safe[..., None]).sum(dim=-1)
    return torch.stack([m, s], dim=-1)


def _merge_lse(pieces: torch.Tensor) -> torch.Tensor:
    """Global log-sum-exp from every rank's ``(m, s)`` pieces ``[size, ..., 2]``."""
    m, s = pieces[..., 0], pieces[..., 1]
    big = m.amax(dim=0)
    return big + torch.log((s * torch.exp(m - big)).sum(dim=0))


def dist_logsumexp(local: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Global ``logsumexp`` over the vocabulary (fp32, ``local.shape[:-1]``): one all-gather of
    each shard's max and rescaled sum, merged on every rank."""
    pieces = _local_lse_pieces(local.float()).double()
    return _merge_lse(tp.stack_gather(pieces)).float()


def dist_topk(
    local: torch.Tensor, k: int, shard: VocabShard, tp: TPGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted top-``k`` log-probs and global token ids (``float32 / int64 [..., k]``) of the
    full-vocabulary ``log_softmax``, as :func:`kdtree.spec.tree.draft_topk` gives them.

    One collective: each rank packs its log-sum-exp pieces, local top-``k`` values and ids
    into one float64 row (exact for fp32 values and ids below 2**53), all-gathered."""
    _check_local(local, shard)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= shard.vocab:
        raise ValueError(f"k={k!r}: expected 1 <= k <= vocabulary size {shard.vocab}")
    x = local.float()
    k_local = min(k, shard.per)
    vals, idx = torch.topk(x, k_local, dim=-1, largest=True, sorted=True)
    packed = torch.cat(
        [_local_lse_pieces(x).double(), vals.double(), (idx + shard.start).double()], dim=-1
    )
    every = tp.stack_gather(packed)  # [size, ..., 2 + 2 k_local]
    lse = _merge_lse(every[..., :2]).float()
    cand_vals = torch.cat(every[..., 2 : 2 + k_local].unbind(0), dim=-1).float()
    cand_ids = torch.cat(every[..., 2 + k_local :].unbind(0), dim=-1).long()
    top, pos = torch.topk(cand_vals, k, dim=-1, largest=True, sorted=True)
    return top - lse[..., None], cand_ids.gather(-1, pos)


def dist_argmax(local: torch.Tensor, shard: VocabShard, tp: TPGroup) -> torch.Tensor:
    """Global argmax token ids (``int64``, ``local.shape[:-1]``); ties → the lowest id. One
    all-gather of a ``(max, id)`` pair per row."""
    _check_local(local, shard)
    m, i = local.max(dim=-1)
    if tp.size == 1:
        return i + shard.start
    every = tp.stack_gather(torch.stack([m.double(), (i + shard.start).double()], dim=-1))
    best = every[..., 0].argmax(dim=0, keepdim=True)  # first (lowest-rank, lowest-id) maximum
    return every[..., 1].gather(0, best)[0].long()


def dist_target_tokens(
    local: torch.Tensor,
    temperature: float,
    shard: VocabShard,
    tp: TPGroup,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The target's token at every node from vocabulary-sharded ``local [B, T, per]``:
    ``int64 [B, T]``, identical on every rank. ``temperature == 0``: :func:`dist_argmax`;
    ``> 0``: rank 0 gathers the full rows and samples them with ``generator`` (its own), exactly
    as :func:`kdtree.spec.accept.target_tokens`; the result is broadcast."""
    if local.dim() != 3:
        raise ValueError(f"local: expected [B, T, per] logits, got shape {tuple(local.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: expected >= 0")
    _check_local(local, shard)
    if temperature == 0:
        return dist_argmax(local, shard, tp)
    full = tp.gather_to_first(local.float(), dim=-1)
    out = torch.empty(local.shape[:2], dtype=torch.int64, device=local.device)
    if tp.is_first:
        out.copy_(target_tokens(full[..., : shard.vocab], temperature, generator))
    return tp.broadcast_from_first(out)
