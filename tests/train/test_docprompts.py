"""Signature + docstring prompts: where the cuts fall, and what the sampled prompts hold."""

from __future__ import annotations

import pytest
import torch

from kdtree.train.docprompts import DocPromptSampler, docstring_ends

SRC = '''import os


def documented(a, b):
    """Add two numbers.

    >>> documented(1, 2)
    3
    """
    return a + b


def doc_only():
    """Nothing after the docstring."""


def no_doc(x):
    return x


class K:
    def method(self):
        \'\'\'One line.\'\'\'
        return 1

    async def coro(self):
        "Plain string docstring."
        await self.other()

    def same_line(self):
        """Doc."""; return 2
'''


def test_cuts_fall_just_past_the_closing_line_of_bodies_with_docstrings():
    ends = docstring_ends(SRC)
    heads = [SRC[:e].rstrip("\n").splitlines()[-1].strip() for e in ends]
    assert heads == ['"""', "'''One line.'''", '"Plain string docstring."']
    for e in ends:
        assert SRC[e - 1] == "\n"  # the prompt ends with the docstring's newline
    # the text after each cut is the body's first statement
    nxt = [SRC[e:].splitlines()[0].strip() for e in ends]
    assert nxt == ["return a + b", "return 1", "await self.other()"]


def test_unparsable_source_has_no_cuts():
    assert docstring_ends("def f(:\n    pass\n") == []
    assert docstring_ends("") == []


def test_non_ascii_before_the_closing_quotes_is_measured_in_bytes():
    src = 'def f():\n    """Grüße, 日本."""\n    return 0\n'
    (e,) = docstring_ends(src)
    assert src[:e].endswith('日本."""\n')
    # ast's end_col_offset counts UTF-8 bytes: read as characters it would point into the
    # docstring and miss the code after the quotes
    assert docstring_ends('def g():\n    """日本日本日本."""; y = 1\n    return y\n') == []


def test_lines_are_counted_as_python_counts_them():
    """A form feed (or \\x1c, \\u2028) splits a line for str.splitlines, not for ast."""
    src = 'x = 1\n\x0c\ndef f():\n    """d"""\n    return 1\n'
    (e,) = docstring_ends(src)
    assert src[:e].endswith('"""d"""\n') and src[e:].startswith("    return 1")
    crlf = 'def f():\r\n    """d"""\r\n    return 1\r\n'
    (e,) = docstring_ends(crlf)
    assert crlf[:e].endswith('"""d"""\r\n')


def _sampler_over(tmp_path, text: str) -> DocPromptSampler:
    from kdtree.train.corpus import list_corpus

    (tmp_path / "m.py").write_text(text)
    files = list_corpus(tmp_path)
    return DocPromptSampler.from_files(files, tmp_path)


def test_sampled_prompts_end_at_a_cut(tmp_path, tiny_tok):
    body = "\n".join(f"x{i} = {i}" for i in range(60)) + "\n\n\n" + SRC
    s = _sampler_over(tmp_path, body)
    assert len(s) == 3
    rows = s.sample(tiny_tok, 6, 12, torch.Generator().manual_seed(0))
    assert rows.shape == (6, 12) and rows.dtype == torch.int64
    endings = {s.prompt_text(i, 10**6) for i in range(len(s))}
    for r in rows:
        text = tiny_tok.decode(r.tolist())
        assert any(e.endswith(text) for e in endings), text


def test_no_prompts_and_disjoint_halves(tmp_path, tiny_tok):
    from kdtree.train.corpus import list_corpus

    (tmp_path / "a.py").write_text(SRC)
    (tmp_path / "b.py").write_text(SRC.replace("documented", "other"))
    s = DocPromptSampler.from_files(list_corpus(tmp_path), tmp_path)
    assert s.sample(tiny_tok, 0, 12, torch.Generator()).shape == (0, 12)
    one, two = s.halves()
    assert len(one) + len(two) == len(s) == 6
    assert {f for f, _ in one.cuts}.isdisjoint({f for f, _ in two.cuts})
    with pytest.raises(ValueError, match="too few"):
        DocPromptSampler(s.texts[:1], s.cuts[:3]).halves()


def test_min_chars_drops_cuts_near_the_file_start(tmp_path):
    from kdtree.train.corpus import list_corpus

    (tmp_path / "m.py").write_text(SRC)
    files = list_corpus(tmp_path)
    assert len(DocPromptSampler.from_files(files, tmp_path, min_chars=0)) == 3
    with pytest.raises(ValueError, match="no function with a docstring"):
        DocPromptSampler.from_files(files, tmp_path, min_chars=10 * len(SRC))


def test_mixed_prompts_put_the_docstring_share_first(tmp_path, tiny_tok):
    from kdtree.train.pipeline import mixed_prompts

    body = "\n".join(f"x{i} = {i}" for i in range(60)) + "\n\n\n" + SRC
    s = _sampler_over(tmp_path, body)
    stream = torch.arange(1000, 1500, dtype=torch.int32)  # ids no tokenizer row can hold
    out = mixed_prompts(stream, 8, 12, torch.Generator().manual_seed(1), s, 0.25, tiny_tok)
    assert out.shape == (8, 12)
    assert (out[:2] < 400).all() and (out[2:] >= 1000).all()
    # consecutive windows of the stream
    assert ((out[2:, 1:] - out[2:, :-1]) == 1).all()
    assert (mixed_prompts(stream, 4, 12, torch.Generator(), s, 0.0, tiny_tok) >= 1000).all()
    # half up: one row at share 0.5 is a docstring prompt (round() would give 0)
    assert (mixed_prompts(stream, 1, 12, torch.Generator(), s, 0.5, tiny_tok) < 400).all()
    with pytest.raises(ValueError, match="doc_share"):
        mixed_prompts(stream, 4, 12, torch.Generator(), s, 1.5, tiny_tok)
    with pytest.raises(ValueError, match="tokenizer"):
        mixed_prompts(stream, 4, 12, torch.Generator(), s, 0.5, None)
