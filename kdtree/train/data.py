"""Token streams and random training windows.

A split of the corpus becomes one flat ``int32`` stream (files joined by ``<|endoftext|>``);
batches are random windows of ``seq_len + 1`` tokens drawn with a private generator, so a run
is reproducible from its seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kdtree.train.corpus import CorpusFile, read_text
from kdtree.train.tokenizer import eos_id


def encode_files(
    tok, files: list[CorpusFile], root: str | Path | None = None, max_tokens: int | None = None
) -> torch.Tensor:
    """One ``int32`` stream of the files' tokens, each file followed by ``<|endoftext|>``."""
    if not files:
        raise ValueError("encode_files: files is empty")
    texts = [read_text(root, f) for f in files]
    eos = eos_id(tok)
    chunks: list[torch.Tensor] = []
    total = 0
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids = torch.tensor([*enc.ids, eos], dtype=torch.int32)
        chunks.append(ids)
        total += ids.numel()
        if max_tokens is not None and total >= max_tokens:
            break
    stream = torch.cat(chunks)
    return stream[:max_tokens] if max_tokens is not None else stream


@dataclass
class WindowSampler:
    """Random ``[batch, seq_len + 1]`` windows from a token stream (inputs + shifted labels)."""

    stream: torch.Tensor
    seq_len: int
    batch_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.stream.dim() != 1:
            raise ValueError(
                f"stream: expected a 1-D token tensor, got shape {tuple(self.stream.shape)}"
            )
        if self.stream.numel() < self.seq_len + 2:
            raise ValueError(
                f"stream has {self.stream.numel()} tokens, expected at least "
                f"seq_len + 2 = {self.seq_len + 2}"
            )
        self.gen = torch.Generator().manual_seed(self.seed)
        self._offsets = torch.arange(self.seq_len + 1)

    def sample(self) -> torch.Tensor:
        """``int64 [batch_size, seq_len + 1]``."""
        hi = self.stream.numel() - self.seq_len - 1
        starts = torch.randint(0, hi + 1, (self.batch_size,), generator=self.gen)
        return self.stream[starts[:, None] + self._offsets].long()

    def fixed_batches(self, n_batches: int) -> list[torch.Tensor]:
        """Evenly spaced, non-random windows (validation: the same every time)."""
        hi = self.stream.numel() - self.seq_len - 1
        n = n_batches * self.batch_size
        starts = torch.linspace(0, hi, n).long()
        wins = self.stream[starts[:, None] + self._offsets].long()
        return list(wins.split(self.batch_size))
