"""Signature + docstring prompts from the corpus: the shape of a HumanEval prompt.

A HumanEval prompt ends right after a function's docstring; the model is asked for the body.
Random windows of the stdlib rarely end there, so a drafter trained only on continuations of
random windows sees the target's behaviour after a docstring seldom (on HumanEval its τ was 3.4
against 5.4 on held-out stdlib text). This module finds, with :mod:`ast`, every function in the
corpus whose body starts with a docstring and has more statements after it, and cuts prompts
that end just past the docstring's closing line, like HumanEval's. HumanEval itself is never
read: it stays the evaluation set.

The prompt text is the ``length`` tokens before the cut, encoded from a text slice that ends at
the cut, so the last tokens are what the tokenizer makes of a text ending in ``\"\"\"\\n`` (as
for a HumanEval prompt encoded on its own).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from kdtree.train.corpus import CorpusFile, read_text

__all__ = ["DocPromptSampler", "docstring_ends"]

#: Characters taken before a cut per requested token (byte-level BPE on Python source averages
#: 3-4 characters a token; the slack covers runs of short tokens).
CHARS_PER_TOKEN = 12
_NEWLINE = re.compile(r"\r\n|\r|\n")


def docstring_ends(text: str) -> list[int]:
    """Character offsets just past the line that closes a function docstring, for every
    (async) function whose body is a docstring followed by at least one more statement and
    whose docstring line holds nothing after the closing quotes. ``[]`` if ``text`` does not
    parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    # line breaks as the tokenizer counts them (str.splitlines also breaks on \f, \x1c, ...)
    starts = [0, *(m.end() for m in _NEWLINE.finditer(text))]
    if starts[-1] != len(text):
        starts.append(len(text))
    ends = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or len(node.body) < 2:
            continue
        doc = node.body[0]
        if not (
            isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)
            and doc.end_lineno is not None
        ):
            continue
        line = text[starts[doc.end_lineno - 1] : starts[doc.end_lineno]]
        # the closing quotes end the line (col offsets are in UTF-8 bytes)
        if line.encode("utf-8")[doc.end_col_offset :].strip():
            continue
        ends.append(starts[doc.end_lineno])
    return sorted(ends)


@dataclass
class DocPromptSampler:
    """Cut points (file, character offset) of one corpus split, and prompts sampled from them."""

    texts: list[str]
    cuts: list[tuple[int, int]]  # (index into texts, character offset of the cut)

    @classmethod
    def from_files(
        cls, files: list[CorpusFile], root: str | Path | None, min_chars: int = 0
    ) -> DocPromptSampler:
        """Every cut in ``files`` at least ``min_chars`` into its file (so a prompt of the
        requested length fits before it)."""
        texts, cuts = [], []
        for f in files:
            text = read_text(root, f)
            ends = [e for e in docstring_ends(text) if e >= min_chars]
            if ends:
                cuts.extend((len(texts), e) for e in ends)
                texts.append(text)
        if not cuts:
            raise ValueError(
                f"no function with a docstring and a body at least {min_chars} characters into "
                f"any of the {len(files)} files"
            )
        return cls(texts, cuts)

    def __len__(self) -> int:
        return len(self.cuts)

    def halves(self) -> tuple[DocPromptSampler, DocPromptSampler]:
        """Two samplers over disjoint files (even / odd file index): prompts drawn from one
        never share a function with the other (model selection vs evaluation)."""
        parts = tuple([c for c in self.cuts if c[0] % 2 == r] for r in (0, 1))
        if not all(parts):
            raise ValueError(f"{len(self.texts)} file(s) with cuts: too few to split in two")
        return tuple(DocPromptSampler(self.texts, p) for p in parts)

    def prompt_text(self, i: int, chars: int) -> str:
        fi, end = self.cuts[i]
        return self.texts[fi][max(0, end - chars) : end]

    def sample(self, tok, n: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """``int64 [n, length]``: the last ``length`` tokens before ``n`` random cuts. A cut
        whose slice encodes to fewer tokens is replaced by another draw."""
        if n < 0 or length < 1:
            raise ValueError(f"n={n}, length={length}: expected n >= 0 and length >= 1")
        if n == 0:
            return torch.empty(0, length, dtype=torch.int64)
        rows: list[list[int]] = []
        tries = 0
        while len(rows) < n:
            need = n - len(rows)
            idx = torch.randint(0, len(self.cuts), (need,), generator=generator).tolist()
            slices = [self.prompt_text(i, CHARS_PER_TOKEN * length) for i in idx]
            for enc in tok.encode_batch(slices, add_special_tokens=False):
                if len(enc.ids) >= length:
                    rows.append(enc.ids[-length:])
            tries += 1
            if tries > 20 and len(rows) < n:
                raise ValueError(
                    f"could not cut {n} prompts of {length} tokens: the slices before the cuts "
                    "are too short (raise min_chars)"
                )
        return torch.tensor(rows, dtype=torch.int64)
