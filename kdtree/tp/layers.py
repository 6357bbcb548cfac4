"""Tensor-parallel building blocks: row-parallel linear (partial sums + all-reduce), the
vocabulary-parallel embedding and LM head.

Vocabulary split: ``per = ceil(V / size)`` rows per rank, rank ``r`` owns token ids
``[r * per, min((r + 1) * per, V))``; the last shard is padded with zero rows whose logits are
``-inf``, so every rank's local logits have the same width (``per``) and an all-gather of them,
cut to ``V``, is the full row. Parameter names stay ``weight`` / ``bias`` so HF tensor names of the
wrapped model do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kdtree.tp.dist import TPGroup

__all__ = ["RowParallelLinear", "VocabParallelEmbedding", "VocabParallelLMHead", "VocabShard"]


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice of a vocabulary of ``vocab`` tokens: ids ``[start, end)``, padded to
    ``per`` columns (``per * size >= vocab``)."""

    vocab: int
    start: int
    end: int
    per: int

    @classmethod
    def of(cls, vocab: int, rank: int, size: int) -> VocabShard:
        if vocab < 1:
            raise ValueError(f"vocab={vocab}: expected a positive vocabulary size")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank={rank}, size={size}: expected 0 <= rank < size")
        per = -(-vocab // size)
        start = min(rank * per, vocab)
        return cls(vocab=vocab, start=start, end=min(start + per, vocab), per=per)

    @property
    def real(self) -> int:
        """Real (non-padding) columns on this rank."""
        return self.end - self.start

    def slice_full(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's padded columns of full-vocabulary ``full [..., V]`` (padding ``-inf``)."""
        if full.shape[-1] != self.vocab:
            raise ValueError(
                f"full: expected last dim {self.vocab} (the vocabulary), got {full.shape[-1]}"
            )
        local = full[..., self.start : self.end]
        if self.real == self.per:
            return local
        pad = full.new_full((*full.shape[:-1], self.per - self.real), float("-inf"))
        return torch.cat([local, pad], dim=-1)


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local @ W_local^T) + b``: the input features are split across ranks
    (``weight [out, in / size]``), the bias (if any) is whole and added once, after the sum."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.in_features, self.out_features = in_local, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    @classmethod
    def like(cls, linear: nn.Linear, tp: TPGroup) -> RowParallelLinear:
        """Same shapes as ``linear`` (whose ``in_features`` is already the local width)."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows of this rank's vocabulary shard; ids outside it give zeros, the
    all-reduce fills them in (exactly: every id has one non-zero contribution)."""

    def __init__(self, vocab: int, dim: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.shard = VocabShard.of(vocab, tp.rank, tp.size)
        self.num_embeddings, self.embedding_dim = vocab, dim
        self.weight = nn.Parameter(torch.empty(self.shard.per, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        s = self.shard
        outside = (ids < s.start) | (ids >= s.end)
        out = F.embedding((ids - s.start).masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill(outside[..., None], 0))


class VocabParallelLMHead(nn.Module):
    """LM head over this rank's vocabulary shard. ``forward_local(h) [..., per]`` gives the
    local logits (padding columns ``-inf``); ``forward(h) [..., V]`` all-gathers them, unless
    ``gather`` is False (set by the TP model's ``forward(gather_logits=False)``), in which case
    ``forward`` returns the local logits too."""

    def __init__(self, vocab: int, dim: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.shard = VocabShard.of(vocab, tp.rank, tp.size)
        self.in_features, self.out_features = dim, vocab
        self.weight = nn.Parameter(torch.empty(self.shard.per, dim))
        self.gather = True

    def forward_local(self, h: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, self.weight)
        if self.shard.real < self.shard.per:
            logits[..., self.shard.real :] = float("-inf")
        return logits

    def gather_full(self, local: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits from every rank's ``forward_local`` output."""
        if self.tp.size == 1:
            return local[..., : self.shard.vocab]
        return self.tp.all_gather(local, dim=-1)[..., : self.shard.vocab]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        local = self.forward_local(h)
        return self.gather_full(local) if self.gather else local
