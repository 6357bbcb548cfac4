"""Shared fixtures for the training tests: a tiny corpus folder, a tiny tokenizer, a toy
MLA + MoE target and a DFlash drafter on top of it (all built in seconds on a CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kdtree.train.corpus import stdlib_root

# small, stable stdlib modules: enough text for a 400-token BPE and a few hundred windows
_FILES = [
    "abc.py",
    "bisect.py",
    "colorsys.py",
    "copy.py",
    "fnmatch.py",
    "glob.py",
    "heapq.py",
    "keyword.py",
    "numbers.py",
    "opcode.py",
    "operator.py",
    "queue.py",
    "sched.py",
    "shlex.py",
    "stat.py",
    "textwrap.py",
    "this.py",
    "token.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "json/scanner.py",
]


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Torch spins when it has more threads than free cores; tests share 2 cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    src = stdlib_root()
    for rel in _FILES:
        if (src / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, root / rel)
    return root


@pytest.fixture(scope="session")
def tiny_tok(tiny_corpus, tmp_path_factory):
    from kdtree.train.pipeline import train_tokenizer_file

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer_file(path, vocab_size=400, corpus_root=tiny_corpus, log=lambda m: None)


@pytest.fixture(scope="session")
def toy_pair():
    """(target, drafter) at toy size, fp32, seeded; vocabulary 400, mask id 1."""
    from kdtree.models import DFlashDrafter, build_model, dflash_config_for
    from kdtree.train.presets import get_preset, target_config

    p = get_preset("toy")
    cfg = target_config(p.target, 400, 0)
    target = build_model(cfg)
    target.init_weights(torch.Generator().manual_seed(0))
    dcfg = dflash_config_for(
        cfg, num_layers=1, n_taps=3, block_size=8, mask_token_id=1, intermediate_size=64
    )
    drafter = DFlashDrafter(dcfg, target)
    drafter.init_weights(torch.Generator().manual_seed(1))
    # larger weights than the init std so that small input changes show in the logits
    with torch.no_grad():
        for prm in drafter.parameters():
            if prm.dim() >= 2:
                prm.mul_(10.0)
    return target.eval(), drafter.eval()


@pytest.fixture(scope="session")
def trained(tiny_corpus, tiny_tok, tmp_path_factory):
    """``kdtree train all --preset toy`` through the CLI: (out dir, final JSON line)."""
    from typer.testing import CliRunner

    from kdtree.cli.train import app

    out = tmp_path_factory.mktemp("models")
    tiny_tok.save(str(out / "tokenizer.json"))
    pack = out / "pack"
    res = CliRunner().invoke(
        app,
        [
            "all",
            "--preset",
            "toy",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--corpus-root",
            str(tiny_corpus),
            "--target-steps",
            "3",
            "--drafter-steps",
            "3",
            "--doc-share",
            "0.5",
            "--pack",
            str(pack),
            "--no-progress",
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    return out, json.loads(res.output.strip().splitlines()[-1])
