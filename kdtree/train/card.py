"""Model cards (``model_card.md``) and the JSON metadata (``training.json``) behind them.

A card says how to reproduce the checkpoint (command), what it was trained on (corpus digest and
every file's sha256, or the generation recipe), how long, where, and what it scored.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any


def environment() -> dict[str, str]:
    """Device, versions and the command line of this process."""
    import torch

    dev = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else (f"cpu:{platform.processor() or platform.machine()}")
    )
    return {
        "device": dev,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "command": shlex.join(["kdtree", *sys.argv[1:]]) if sys.argv else "",
    }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return "`" + json.dumps(v, sort_keys=True) + "`"
    return str(v)


def write_card(
    out_dir: str | Path,
    title: str,
    summary: str,
    meta: dict[str, Any],
    corpus: dict[str, Any] | None = None,
) -> Path:
    """Write ``model_card.md`` (people) and ``training.json`` (machines) into ``out_dir``.

    ``meta`` holds flat sections: ``{"training": {...}, "metrics": {...}, "environment": {...},
    "config": {...}}``; ``corpus`` is :func:`kdtree.train.corpus.manifest` (its file list goes
    into the card in full, with checksums).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", "", summary.strip(), ""]
    for section, values in meta.items():
        lines += [f"## {section.capitalize()}", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in values.items()]
        lines.append("")
    if corpus is not None:
        lines += [
            "## Data",
            "",
            f"Python standard library sources under `{corpus['root']}`: {corpus['n_files']} files, "
            f"corpus digest (sha256 over sorted `path<TAB>sha256` lines) `{corpus['digest']}`.",
            "Whole modules are held out for validation (a sha256 hash of the module name).",
            "",
            "| split | files | bytes | modules |",
            "|---|---|---|---|",
        ]
        for s, v in corpus["splits"].items():
            lines.append(f"| {s} | {v['files']} | {v['bytes']} | {v['modules']} |")
        lines += [
            "",
            "Validation modules: " + ", ".join(f"`{m}`" for m in corpus["val_modules"]),
            "",
            "<details><summary>Every file (path, split, sha256)</summary>",
            "",
            "```",
        ]
        lines += [f"{f['rel']}\t{f['split']}\t{f['sha256']}" for f in corpus["files"]]
        lines += ["```", "", "</details>", ""]
    path = out_dir / "model_card.md"
    path.write_text("\n".join(lines))
    record = dict(meta)
    if corpus is not None:
        record["corpus"] = {k: v for k, v in corpus.items() if k != "files"}
    (out_dir / "training.json").write_text(
        json.dumps(record, indent=1, sort_keys=True, default=str) + "\n"
    )
    return path


def read_training_json(model_dir: str | Path) -> dict[str, Any]:
    """The ``training.json`` next to a checkpoint (clear error naming the file)."""
    path = Path(model_dir) / "training.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
