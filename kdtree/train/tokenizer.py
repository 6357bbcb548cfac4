"""Byte-level BPE tokenizer (``tokenizers``) trained on the corpus' training split.

Two special tokens come first: ``<|endoftext|>`` (id 0, separates files, stops generation)
and ``<|mask|>`` (id 1, fills the not-yet-known positions of a DFlash draft block). Both exist
in the target's embedding table, as the drafter requires.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)
DEFAULT_VOCAB_SIZE = 8192


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2
):
    """Train a byte-level BPE with ``vocab_size`` entries in total (specials included)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size={vocab_size}: expected >= {256 + len(SPECIAL_TOKENS)} "
            "(the 256 byte symbols plus the special tokens)"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    check_special_ids(tok)
    return tok


def check_special_ids(tok) -> None:
    """The special tokens must be ids 0 and 1 (models and drafter configs rely on it)."""
    for want, name in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(name)
        if got != want:
            raise ValueError(f"tokenizer: {name} has id {got}, expected {want}")


def load_tokenizer(path: str | Path):
    """Load ``tokenizer.json``; a clear error names the file when it is missing or broken."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer file {path} does not exist (train one with `kdtree train tokenizer`)"
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise ValueError(f"tokenizer file {path} is not a valid tokenizers JSON: {exc}") from exc
    check_special_ids(tok)
    return tok


def eos_id(tok) -> int:
    return tok.token_to_id(EOS_TOKEN)


def mask_id(tok) -> int:
    return tok.token_to_id(MASK_TOKEN)


def encode(tok, text: str) -> list[int]:
    """Token ids of ``text`` (no specials added)."""
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok, ids: Iterable[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False)
