"""Every ``KDTREE_*`` environment variable, read once at import. Documented in ``ENVS.md``.

Modules import the constants from here instead of calling ``os.environ`` themselves, so the
full set of knobs is visible in one place and reading them costs nothing on hot paths.
"""

from __future__ import annotations

import os
from pathlib import Path


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected 0/1 (or true/false, yes/no, on/off)")


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: expected an integer") from exc
    if value < minimum:
        raise ValueError(f"{name}={value}: expected an integer >= {minimum}")
    return value


_REPO_ROOT = Path(__file__).resolve().parent.parent

#: Phase profiler on/off (``kdtree.profiler``). Off: a shared no-op context manager.
PROFILE: bool = _flag("KDTREE_PROFILE", False)
#: Emit one ``[kdtree-prof]`` log line per phase every N calls.
PROFILE_EVERY: int = _int("KDTREE_PROFILE_EVERY", 50)
#: Time phases on the GPU with pooled CUDA events as well (only when CUDA is available).
PROFILE_GPU: bool = _flag("KDTREE_PROFILE_GPU", True)
#: Where raw samples (Parquet) and Chrome traces go. Empty: ``runs/profile``.
PROFILE_DIR: Path = Path(os.environ.get("KDTREE_PROFILE_DIR") or (_REPO_ROOT / "runs" / "profile"))
#: Folder with the shipped checkpoints, traces and benchmark CSVs.
DATA_DIR: Path = Path(os.environ.get("KDTREE_DATA_DIR") or (_REPO_ROOT / "data"))
#: Verify-attention backend used by the engine when the caller says ``"auto"``.
#: ``auto`` picks ``triton`` on CUDA and ``ref`` elsewhere.
VERIFY_BACKEND: str = os.environ.get("KDTREE_VERIFY_BACKEND", "auto")
#: Folder holding ``libcupti.so`` for DRAM sampling (the ``nvidia-cuda-cupti`` wheel's lib dir).
#: Empty: searched under the installed ``nvidia`` packages.
CUPTI_LIB_DIR: str = os.environ.get("KDTREE_CUPTI_LIB_DIR", "")
#: Tuning table for the tree-verify kernels (``kdtree.kernels.tuned``): a JSON path, ``off``, or
#: empty (the packaged table of the running device kind, if any).
KERNEL_TUNING: str = os.environ.get("KDTREE_KERNEL_TUNING", "")
