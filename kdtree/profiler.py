"""Minimal phase hook (the full env-gated profiler replaces this module; see issue 3)."""

from __future__ import annotations

from contextlib import nullcontext

_NULL = nullcontext()


def phase(name: str):
    """Context manager around a named engine phase. Off: a shared no-op."""
    return _NULL


def step() -> None:
    """Mark the end of one decode step."""
    return None
