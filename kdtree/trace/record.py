"""Record a decode loop under the DRAM sampler with the phase profiler on.

Writes, under ``out_dir``::

    dram.trace.json / dram.series.csv.gz / dram.intervals.csv.gz   the DRAM series (ours)
    phases.chrome.json                                         kdtree.profiler Chrome trace
    phase_report.csv                                           profiler.report()
    summary.json                                               analysis + provenance

Both files use Unix-epoch nanoseconds, so ``analyze(load_trace(dram), load_trace(phases))``
attributes the DRAM gaps to the engine's phases on any machine.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kdtree.trace.cupti import DEFAULT_METRICS, DramSampler
from kdtree.trace.store import save_trace
from kdtree.trace.workloads import engine_decode_step, run_steps


def record_decode(
    out_dir: str | Path,
    *,
    context: int,
    mode: str,
    steps: int = 64,
    warmup: int = 8,
    interval_us: float = 100.0,
    metrics: Sequence[str] = DEFAULT_METRICS,
    model: str = "tiny-llama",
    drafter: str | None = None,
    batch: int = 1,
    budget: int = 64,
    top_k: int = 8,
    command: str = "",
    device: str = "cuda",
    sampler_kwargs: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Build the engine, warm up, then trace ``steps`` decode steps; returns the summary.
    When the trace cannot be analysed (no samples) every file is still written and the
    summary has ``ok: False`` with ``error``/``message``.
    ``device``/``sampler_kwargs`` exist for CPU tests (a fake collector)."""
    from kdtree import profiler
    from kdtree.trace.analysis import analyze
    from kdtree.trace.kineto import load_chrome_trace

    if steps < 1 or warmup < 0:
        raise ValueError(f"steps={steps}, warmup={warmup}: expected steps >= 1, warmup >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    step, info = engine_decode_step(context=context, mode=mode, model=model, drafter=drafter,
                                    batch=batch, budget=budget, top_k=top_k,
                                    max_steps=steps + warmup + 4, device=device)  # fmt: skip
    log(f"built {info}")
    if warmup:
        run_steps(step, warmup)
    profiler.reset()
    profiler.enable(gpu=True, every=10**9)
    t0 = time.time_ns()
    with DramSampler(metrics, interval_us, **(sampler_kwargs or {})) as sampler:
        ms_per_step = run_steps(step, steps)
    profiler.flush(sync=True)
    profiler.disable()
    trace = sampler.trace
    trace.meta.update({"workload": info, "steps": steps, "ms_per_step": ms_per_step,
                       "command": command})  # fmt: skip
    dram_path = save_trace(trace, out / "dram", compress=True)
    phases_path = profiler.export_chrome_trace(out / "phases.chrome.json", sync=False)
    profiler.report(sync=False).to_csv(out / "phase_report.csv", index=False)
    phases = load_chrome_trace(phases_path)
    try:
        analysis: dict[str, Any] = {"ok": True, **analyze(trace, phases).to_json()}
    except ValueError as exc:  # e.g. an empty series: keep the files, report the reason
        analysis = {"ok": False, "error": type(exc).__name__, "message": str(exc),
                    "n_samples": trace.meta.get("n_samples"),
                    "n_samples_raw": trace.meta.get("n_samples_raw"),
                    "warnings": trace.meta.get("warnings", [])}  # fmt: skip
    doc = {
        **analysis,
        "workload": info,
        "steps": steps,
        "ms_per_step": ms_per_step,
        "alignment": trace.meta.get("alignment"),
        "raw_timestamps": trace.meta.get("raw_timestamps"),
        "metrics_collected": trace.meta.get("metrics_collected"),
        "metrics_refused": trace.meta.get("metrics_refused"),
        "recorded_at_ns": t0,
        "device": trace.meta.get("device_name"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": command,
        "files": {
            "dram": dram_path.name,
            "phases": phases_path.name,
            "phase_report": "phase_report.csv",
        },  # fmt: skip
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return doc
