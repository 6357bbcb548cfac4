"""Measured launch choices for the tree-verify kernels: a table written by the benchmark's
``--tune`` sweep (CUDA-graph timings of every candidate tile config and split count) and read
back at launch time, in front of the static heuristics.

A table is a JSON object ``{"device": "<substring of the CUDA device name>", "entries": [...]}``;
each entry names a shape (``kind``, ``group`` = query heads per KV head, ``T``, ``dk``,
``batch``, ``L`` = the static prefix-length bound) and the winner (tile config and split
count) with its time and the heuristic's time at the same point. Only winners that beat the
heuristic are written.

Which table applies: ``KDTREE_KERNEL_TUNING`` = a path (that table, whatever the device name),
``off`` (none), or unset (the packaged table of this device kind, ``tuning/<name>.json``, if its
``device`` string is in the CUDA device name). A lookup matches kind, group, T, dk and batch
exactly and the nearest tuned ``L`` within a factor of two of the call's bound. At the tuned
length the entry's split count is used as is; elsewhere it scales with the length ratio (each
split keeps the tuned chunk size) and the caller never goes below the split model's count for
that config (:attr:`TunedChoice.exact`): scaled down from 128k to 64k, a 16-split entry of GQA
32/8 left half the SMs idle (181 µs against the model's 108, session 6, call b). Everything is
decided from static shapes, so a CUDA graph stays valid.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from kdtree import env as _env
from kdtree.kernels.heuristics import MAX_SPLITS, TileConfig

__all__ = ["TunedChoice", "load_table", "tuned_choice", "best_entries", "PACKAGED"]

#: Packaged tables, by file name; each says which devices it is for.
PACKAGED = Path(__file__).with_name("tuning")

_KEYS = ("kind", "group", "T", "dk", "batch", "L", "block_m", "block_n", "num_warps",
         "num_stages", "splits")  # fmt: skip


@dataclass(frozen=True)
class TunedChoice:
    config: TileConfig
    splits: int
    source: str  # the table it came from
    #: True when the call's length bound is the tuned one (within 5 %): the split count was
    #: measured there; otherwise it was scaled from another length
    exact: bool = True


def _validate(table: dict, where: str) -> dict:
    if not isinstance(table, dict) or not isinstance(table.get("entries"), list):
        raise ValueError(f"{where}: expected a JSON object with an 'entries' list")
    for i, e in enumerate(table["entries"]):
        missing = [k for k in _KEYS if k not in e]
        if missing:
            raise ValueError(f"{where}: entry {i} lacks {missing}")
    return table


@lru_cache(maxsize=16)
def load_table(path: str) -> dict:
    """The table at ``path`` (validated; a clear error naming the file otherwise)."""
    p = Path(path)
    try:
        table = json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"KDTREE_KERNEL_TUNING: no tuning table at {p}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None
    return _validate(table, str(p))


@lru_cache(maxsize=8)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


def _tables_for(device: torch.device) -> list[tuple[str, dict]]:
    setting = _env.KERNEL_TUNING
    if setting and setting.lower() == "off":
        return []
    if setting:
        return [(setting, load_table(setting))]
    if device.type != "cuda":
        return []
    name = _device_name(device)
    out = []
    for f in sorted(PACKAGED.glob("*.json")):
        t = load_table(str(f))
        if t.get("device") and t["device"] in name:
            out.append((f.name, t))
    return out


def tuned_choice(
    kind: str,
    device: torch.device,
    *,
    group: int,
    tree: int,
    dk: int,
    batch: int,
    max_len: int,
) -> TunedChoice | None:
    """The measured winner for this shape, or None (then the heuristics decide)."""
    best, best_dist = None, math.inf
    for source, table in _tables_for(torch.device(device)):
        for e in table["entries"]:
            if (e["kind"], e["group"], e["T"], e["dk"], e["batch"]) != (
                kind,
                group,
                tree,
                dk,
                batch,
            ):
                continue
            dist = abs(math.log2(max(max_len, 1) / e["L"]))
            if dist <= 1.0 and dist < best_dist:
                best, best_dist = (source, e), dist
    if best is None:
        return None
    source, e = best
    splits = max(1, min(MAX_SPLITS, round(e["splits"] * max_len / e["L"])))
    cfg = TileConfig(
        e["block_m"],
        e["block_n"],
        e["num_warps"],
        e["num_stages"],
        int(e.get("pt_prefetch", 0)),
        int(e.get("tail", 0)),
    )
    return TunedChoice(cfg, splits, source, exact=best_dist < math.log2(1.05))


def best_entries(rows: list[dict], min_gain: float = 0.03) -> list[dict]:
    """Winners from tuning rows: dicts with ``kind, group, T, dk, batch, L`` (the static
    bound), ``tile`` (a TileConfig), ``splits``, ``p50`` (ms) and ``heuristic`` (True for the
    heuristic's own config and split count). One entry per shape whose best candidate beats
    the heuristic by more than ``min_gain``."""
    by_shape: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["kind"], r["group"], r["T"], r["dk"], r["batch"], r["L"])
        by_shape.setdefault(key, []).append(r)
    out = []
    for key, rs in sorted(by_shape.items()):
        heur = [r for r in rs if r["heuristic"]]
        win = min(rs, key=lambda r: r["p50"])
        if not heur or win["p50"] >= heur[0]["p50"] * (1.0 - min_gain):
            continue
        tc: TileConfig = win["tile"]
        out.append(
            dict(
                zip(("kind", "group", "T", "dk", "batch", "L"), key, strict=True),
                block_m=tc.block_m,
                block_n=tc.block_n,
                num_warps=tc.num_warps,
                num_stages=tc.num_stages,
                pt_prefetch=tc.pt_prefetch,
                tail=tc.tail,
                splits=int(win["splits"]),
                p50_ms=round(float(win["p50"]), 5),
                heuristic_ms=round(float(heur[0]["p50"]), 5),
            )
        )
    return out
