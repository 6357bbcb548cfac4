"""Chrome/Perfetto trace export of the recorded samples, and reading such traces back."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from kdtree.profiling.core import _S, SAMPLE_COLUMNS
from kdtree.profiling.report import _pd, samples


def chrome_trace(sync: bool = True) -> dict:
    """The samples as a Chrome/Perfetto trace dict (``ts``/``dur`` in µs from the Unix epoch)."""
    df = samples(sync)
    with _S.lock:
        names = dict(_S.thread_names)
    pid = os.getpid()
    events: list[dict] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "args": {"name": f"kdtree pid {pid}"},
        }
    ]
    for tid, tname in names.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": tname}}
        )
    for row in df.itertuples(index=False):
        args = {
            "step": int(row.step),
            "depth": int(row.depth),
            "parent": row.parent,
            "seq": int(row.seq),
        }
        if not math.isnan(row.gpu_ms):
            args["gpu_ms"] = float(row.gpu_ms)
        events.append(
            {
                "name": row.phase,
                "cat": "kdtree",
                "ph": "X",
                "pid": int(row.pid),
                "tid": int(row.tid),
                "ts": row.start_ns / 1e3,
                "dur": row.dur_ns / 1e3,
                "args": args,
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "unix_epoch", "producer": "kdtree.profiler"},
    }


def export_chrome_trace(path: str | Path, sync: bool = True) -> Path:
    """Write ``chrome_trace()`` as JSON (open in https://ui.perfetto.dev)."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(sync)))
    return path


def load_chrome_trace(path: str | Path):
    """Read a Chrome trace (ours or any ``ph: X`` events) back into ``SAMPLE_COLUMNS``."""

    pd = _pd()
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON Chrome trace ({exc})") from exc
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    rows = []
    for ev in events:
        if ev.get("ph") != "X":
            continue
        args = ev.get("args", {})
        start_ns = round(float(ev["ts"]) * 1e3)
        dur_ns = round(float(ev.get("dur", 0.0)) * 1e3)
        rows.append(
            {
                "seq": args.get("seq", len(rows)),
                "phase": ev["name"],
                "parent": args.get("parent", ""),
                "depth": args.get("depth", 0),
                "step": args.get("step", -1),
                "pid": ev.get("pid", 0),
                "tid": ev.get("tid", 0),
                "start_ns": start_ns,
                "dur_ns": dur_ns,
                "host_ms": dur_ns / 1e6,
                "gpu_ms": args.get("gpu_ms", math.nan),
            }
        )
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
