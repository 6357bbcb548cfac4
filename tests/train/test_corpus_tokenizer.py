"""Corpus listing/split/checksums and the tokenizer's special tokens and error messages."""

from __future__ import annotations

import hashlib

import pytest

from kdtree.train.corpus import (
    corpus_digest,
    list_corpus,
    manifest,
    read_text,
    split_of,
    split_unit,
)
from kdtree.train.tokenizer import EOS_TOKEN, MASK_TOKEN, decode, encode, load_tokenizer


def test_split_unit_and_split_are_stable():
    assert split_unit("json/decoder.py") == "json"
    assert split_unit("heapq.py") == "heapq"
    assert split_unit("test/test_json/test_dump.py") == "test/test_json"
    assert split_unit("test/test_heapq.py") == "test/test_heapq"
    # deterministic: a hash of the name, not of the process
    expect = (
        "val" if int.from_bytes(hashlib.sha256(b"json").digest()[:8], "big") % 100 < 8 else "train"
    )
    assert split_of("json", 8) == expect
    assert split_of("anything", 0) == "train" and split_of("anything", 100) == "val"
    with pytest.raises(ValueError, match="val_percent"):
        split_of("x", 101)


def test_list_corpus_sorted_checksummed_and_whole_modules_held_out(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "b.py").write_text("x = 1\n")
    (tmp_path / "a.py").write_text("y = 2\n")
    (tmp_path / "pkg" / "__init__.py").write_text("z = 3\n")
    (tmp_path / "pkg" / "mod.py").write_text("w = 4\n")
    (tmp_path / "latin.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8: skipped
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("nope\n")
    files = list_corpus(tmp_path, val_percent=50)
    assert [f.rel for f in files] == ["a.py", "b.py", "pkg/__init__.py", "pkg/mod.py"]
    assert files[0].sha256 == hashlib.sha256(b"y = 2\n").hexdigest()
    pkg = [f.split for f in files if f.unit == "pkg"]
    assert len(set(pkg)) == 1  # a module is never split between train and val
    m = manifest(files, tmp_path)
    assert m["digest"] == corpus_digest(files) and m["n_files"] == 4
    (tmp_path / "a.py").write_text("y = 3\n")
    with pytest.raises(ValueError, match="changed since it was listed"):
        read_text(tmp_path, files[0])
    assert corpus_digest(list_corpus(tmp_path, 50)) != m["digest"]


def test_list_corpus_empty_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Python sources"):
        list_corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        list_corpus(tmp_path / "missing")


def test_tokenizer_specials_and_roundtrip(tiny_tok):
    assert tiny_tok.token_to_id(EOS_TOKEN) == 0
    assert tiny_tok.token_to_id(MASK_TOKEN) == 1
    assert tiny_tok.get_vocab_size() == 400
    text = "def f(x):\n    return x + 1  # café\n"
    ids = encode(tiny_tok, text)
    assert 0 not in ids and 1 not in ids
    assert decode(tiny_tok, ids) == text


def test_tokenizer_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "tokenizer.json"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_tokenizer(missing)
    missing.write_text("{not json")
    with pytest.raises(ValueError, match=str(missing)):
        load_tokenizer(missing)


def test_shipped_tokenizer_is_valid():
    from kdtree.train.pipeline import TOKENIZER_FILE, shipped_models_dir

    path = shipped_models_dir() / TOKENIZER_FILE
    if not path.is_file():
        pytest.skip("no shipped tokenizer")
    tok = load_tokenizer(path)
    assert tok.get_vocab_size() == 8192
