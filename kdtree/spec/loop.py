"""``generate``: prefill, then engine steps until every request has finished."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kdtree.spec.engine import SpecEngine
from kdtree.spec.records import GenerateResult

__all__ = ["generate"]


def generate(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    mode: str = "tree",
    budget: int = 64,
    top_k: int = 8,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    stop_tokens: Sequence[int] = (),
    backend: str = "auto",
    generator: torch.Generator | None = None,
    dense_mask: bool = False,
    *,
    page_size: int = 16,
    timings: bool = False,
    commit: str = "auto",
) -> GenerateResult:
    """Generate up to ``max_new_tokens`` per request with ``mode`` ``ar`` | ``chain`` | ``tree``.

    ``prompts`` are token-id lists (lengths may differ). A request stops after a token in
    ``stop_tokens`` (kept in its output) or ``max_new_tokens`` tokens. ``generator`` (on the
    target's device) drives sampling when ``temperature > 0``.
    """
    engine = SpecEngine(
        target,
        drafter,
        mode=mode,
        budget=budget,
        top_k=top_k,
        temperature=temperature,
        backend=backend,
        page_size=page_size,
        dense_mask=dense_mask,
        timings=timings,
        generator=generator,
        commit=commit,
    )
    state = engine.prefill(prompts, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens)
    steps = []
    while state.active:
        steps.append(engine.step(state))
    return GenerateResult(tokens=[list(t) for t in state.tokens], steps=steps, mode=mode)
