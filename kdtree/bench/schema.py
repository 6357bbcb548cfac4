"""The long-format benchmark row every suite writes (``data/bench/*.csv``).

One row per (suite, name, provider, shape, metric). Physical units, quantiles and the exact
command that reproduces the row travel with it, so a CSV in ``data/bench`` is self-describing.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COLUMNS = [
    "suite",
    "name",
    "provider",
    "mode",
    "metric",
    "unit",
    "x_name",
    "x_value",
    "p50",
    "p20",
    "p80",
    "config_json",
    "device",
    "torch",
    "triton",
    "git_sha",
    "timestamp",
    "command",
]


@dataclass
class BenchRow:
    suite: str
    name: str
    provider: str
    metric: str
    unit: str
    p50: float
    p20: float | None = None
    p80: float | None = None
    mode: str = ""
    x_name: str = ""
    x_value: float | str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def to_record(self, env: dict[str, str]) -> dict[str, Any]:
        rec = asdict(self)
        rec["config_json"] = json.dumps(rec.pop("config"), sort_keys=True)
        rec.update(env)
        return {k: rec.get(k, "") for k in COLUMNS}


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            timeout=5,
            check=False,
        )
        sha = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            timeout=5,
            check=False,
        ).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu:{platform.processor() or platform.machine()}"


def run_env(command: str | None = None) -> dict[str, str]:
    """Columns shared by every row of one run: device, versions, sha, time, command."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    return {
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "git_sha": git_sha(),
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": command if command is not None else shlex.join(["kdtree", *sys.argv[1:]]),
    }


def append_rows(path: str | Path, rows: Iterable[BenchRow], command: str | None = None) -> int:
    """Append rows to a long-format CSV (header written when the file is new)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    env = run_env(command)
    records = [r.to_record(env) for r in rows]
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerows(records)
    return len(records)


def write_dicts(path: str | Path, rows: list[dict]) -> Path:
    """Write ``rows`` (dicts with the same keys, in the first row's order) as a CSV with LF line
    ends, creating the folder: the per-run CSVs of the device tools."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_rows(path: str | Path):
    """Load a bench CSV as a pandas DataFrame (config_json parsed lazily by the caller)."""
    import pandas as pd

    return pd.read_csv(path)
