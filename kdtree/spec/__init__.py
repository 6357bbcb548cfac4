"""The DDTree engine: tree build, verify inputs, acceptance walk, KV commit and ``generate``.

Exports resolve lazily: ``kdtree.attention`` imports ``kdtree.spec.bitmask``, and the engine
imports ``kdtree.attention``, so this package must not import the engine eagerly. No submodule
is named like an export (``generate`` lives in ``loop.py``): importing a submodule binds its
name on the package, which would shadow the lazily resolved function.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kdtree.spec.engine import SpecEngine
    from kdtree.spec.loop import generate
    from kdtree.spec.records import PHASES, GenerateResult, StepRecord

__all__ = ["PHASES", "GenerateResult", "SpecEngine", "StepRecord", "generate"]

_WHERE = {
    "generate": "kdtree.spec.loop",
    "SpecEngine": "kdtree.spec.engine",
    "PHASES": "kdtree.spec.records",
    "GenerateResult": "kdtree.spec.records",
    "StepRecord": "kdtree.spec.records",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kdtree.spec' has no attribute {name!r}")
