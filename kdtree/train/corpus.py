"""The training corpus: the Python standard library sources of the running interpreter.

The file list is deterministic (sorted relative paths, each with its sha256), and whole modules
are held out for validation by a hash of the module name, so no validation text was ever seen in
training, not even as a neighbouring function of the same file.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

#: Folders under the stdlib that are not the interpreter's own Python sources (or are data).
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "pydoc_data"})
#: Files larger than this are generated tables, not code; they are skipped.
MAX_FILE_BYTES = 400_000
#: Percent of modules (by hash of the module name) held out for validation.
DEFAULT_VAL_PERCENT = 8


@dataclass(frozen=True)
class CorpusFile:
    """One source file of the corpus."""

    rel: str  # path relative to the stdlib root, '/'-separated
    unit: str  # the module the split is decided on
    split: str  # "train" or "val"
    sha256: str
    nbytes: int


def stdlib_root() -> Path:
    """The standard-library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def split_unit(rel: str) -> str:
    """The module a file belongs to for the train/val split.

    The top-level module (``json/decoder.py`` -> ``json``); inside the large ``test`` package
    the second-level module (``test/test_json/x.py`` -> ``test/test_json``) so that the split
    does not hinge on one coin flip for half of the corpus.
    """
    parts = rel.split("/")
    first = parts[0].removesuffix(".py")
    if first in ("test", "idlelib") and len(parts) > 1:
        return f"{first}/{parts[1].removesuffix('.py')}"
    return first


def split_of(unit: str, val_percent: int = DEFAULT_VAL_PERCENT) -> str:
    """``"val"`` for a stable ``val_percent`` % of module names, ``"train"`` otherwise."""
    if not 0 <= val_percent <= 100:
        raise ValueError(f"val_percent={val_percent}: expected 0..100")
    h = int.from_bytes(hashlib.sha256(unit.encode()).digest()[:8], "big")
    return "val" if h % 100 < val_percent else "train"


def list_corpus(
    root: str | Path | None = None, val_percent: int = DEFAULT_VAL_PERCENT
) -> list[CorpusFile]:
    """Every ``*.py`` under ``root`` (default: the stdlib) that decodes as UTF-8, sorted."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus root {root} is not a directory")
    files: list[CorpusFile] = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel_parts = path.relative_to(root).parts
        if any(part in EXCLUDED_DIRS for part in rel_parts) or not path.is_file():
            continue
        data = path.read_bytes()
        if len(data) == 0 or len(data) > MAX_FILE_BYTES:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        rel = "/".join(rel_parts)
        unit = split_unit(rel)
        files.append(
            CorpusFile(
                rel, unit, split_of(unit, val_percent), hashlib.sha256(data).hexdigest(), len(data)
            )
        )
    if not files:
        raise FileNotFoundError(f"no Python sources found under corpus root {root}")
    return files


def read_text(root: str | Path | None, f: CorpusFile) -> str:
    """The text of one corpus file; fails if the file changed since it was listed."""
    root = Path(root) if root is not None else stdlib_root()
    data = (root / f.rel).read_bytes()
    if hashlib.sha256(data).hexdigest() != f.sha256:
        raise ValueError(f"corpus file {root / f.rel} changed since it was listed (sha256)")
    return data.decode("utf-8")


def corpus_digest(files: list[CorpusFile]) -> str:
    """One sha256 over the sorted (path, sha256) list: the corpus identity for model cards."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.rel}\t{f.sha256}\n".encode())
    return h.hexdigest()


def manifest(files: list[CorpusFile], root: str | Path | None = None) -> dict:
    """A JSON-able summary plus the full per-file list (path, split, sha256, bytes)."""
    root = Path(root) if root is not None else stdlib_root()
    by_split = {s: [f for f in files if f.split == s] for s in ("train", "val")}
    return {
        "root": str(root),
        "n_files": len(files),
        "digest": corpus_digest(files),
        "splits": {
            s: {
                "files": len(fs),
                "bytes": sum(f.nbytes for f in fs),
                "modules": len({f.unit for f in fs}),
            }
            for s, fs in by_split.items()
        },
        "val_modules": sorted({f.unit for f in by_split["val"]}),
        "files": [asdict(f) for f in files],
    }


def write_manifest(files: list[CorpusFile], path: str | Path, root: str | Path | None = None):
    """Write :func:`manifest` as JSON (sorted keys, so it diffs cleanly)."""
    Path(path).write_text(json.dumps(manifest(files, root), indent=1, sort_keys=True))


#: Below this share of the expected training tokens the corpus is reported as too small.
SMALL_CORPUS_SHARE = 0.5


def corpus_source(root: str | Path | None, files: list[CorpusFile]) -> dict:
    """Where the corpus came from: interpreter, stdlib path, file counts, and whether the
    stdlib's ``test`` package (a large share of the tokens; some distributions split it into a
    separate package) is there."""
    import platform
    import sys

    root = Path(root) if root is not None else stdlib_root()
    return {
        "root": str(root),
        "python_executable": sys.executable,
        "python_version": platform.python_version(),
        "files": len(files),
        "train_files": sum(f.split == "train" for f in files),
        "test_package_files": sum(f.rel.startswith("test/") for f in files),
    }


def small_corpus_warnings(train_tokens: int, expected_tokens: int, source: dict) -> list[str]:
    """One warning when ``train_tokens`` is under ``SMALL_CORPUS_SHARE`` of ``expected_tokens``
    (``expected_tokens <= 0``: no check), naming the interpreter and stdlib path used."""
    if expected_tokens <= 0 or train_tokens >= SMALL_CORPUS_SHARE * expected_tokens:
        return []
    msg = (
        f"corpus much smaller than expected: {train_tokens:,} training tokens, expected about "
        f"{expected_tokens:,} ({train_tokens / expected_tokens:.0%}); corpus root "
        f"{source['root']} of Python {source['python_version']} ({source['python_executable']}), "
        f"{source['train_files']} training files"
    )
    if source.get("test_package_files", 0) == 0:
        msg += (
            "; its `test` package is missing (often a separate distro package, e.g. "
            "libpythonX.Y-testsuite)"
        )
    msg += ". Steps are capped by max_epochs and early stopping keeps the best weights."
    return [msg]
