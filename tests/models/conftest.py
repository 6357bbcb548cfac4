"""Helpers for the model tests: random weights from a private generator."""

from __future__ import annotations

import pytest
import torch

from kdtree.models import build_model, get_config


@torch.no_grad()
def randomize(module: torch.nn.Module, gen: torch.Generator, std: float = 0.1) -> None:
    """Matrices N(0, std); norms 1 + N(0, 0.1); biases and router bias N(0, 0.1)."""
    for name, p in module.named_parameters():
        noise = torch.randn(p.shape, generator=gen).to(p.dtype)
        if p.dim() >= 2:
            p.copy_(noise * std)
        elif "norm" in name:
            p.copy_(1.0 + 0.1 * noise)
        else:
            p.copy_(0.1 * noise)
    for name, b in module.named_buffers():
        if "e_score_correction_bias" in name:
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def random_model(name: str, gen: torch.Generator):
    model = build_model(get_config(name)).eval()
    randomize(model, gen)
    return model


@pytest.fixture(params=["tiny-llama", "tiny-qwen3", "tiny-mla"])
def target_name(request) -> str:
    return request.param


@pytest.fixture(name="randomize")
def randomize_fixture():
    """The ``randomize(module, gen)`` helper."""
    return randomize


@pytest.fixture(name="random_model")
def random_model_fixture():
    """The ``random_model(name, gen)`` helper."""
    return random_model


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread (and do not fight the other tests for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
