"""``kdtree trace``: capture DRAM traces (CUPTI PM sampling), convert, summarise, attribute.

Every command prints a table for people and ends stdout with one JSON line.
Also runnable as ``python -m kdtree.cli.trace ...``.
"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="DRAM traces: capture (CUPTI), summarize, attribute gaps to phases.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
_err = Console(stderr=True)
_REEXEC_FLAG = "_KDT_TRACE_REEXEC"  # internal guard, not a user setting
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"


def _json_line(doc: dict) -> None:
    print(json.dumps(doc, default=str), flush=True)


def _reexec_with_loader_path(exc: Exception) -> None:
    """Once, re-run this command with the CUPTI lib folder on LD_LIBRARY_PATH."""
    from kdtree.trace.cupti import find_cupti_lib_dir

    lib = find_cupti_lib_dir()
    if lib is None or os.environ.get(_REEXEC_FLAG):
        return
    ld = os.environ.get("LD_LIBRARY_PATH", "")
    if str(lib) in ld.split(":"):
        return
    env = dict(os.environ, LD_LIBRARY_PATH=f"{lib}:{ld}" if ld else str(lib))
    env[_REEXEC_FLAG] = "1"
    module = "kdtree.cli.trace" if Path(sys.argv[0]).name == "trace.py" else "kdtree"
    _err.print(f"[yellow]{exc}; retrying with LD_LIBRARY_PATH={lib}[/yellow]")
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


def _fail(exc: Exception, what: str) -> None:
    _err.print(f"[red]{what}: {exc}[/red]")
    _json_line({"ok": False, "error": type(exc).__name__, "message": str(exc)})
    raise typer.Exit(2)


def _start_sampler(sampler) -> None:
    from kdtree.trace.cupti import CaptureError, CuptiUnavailableError

    try:
        sampler.start()
    except CuptiUnavailableError as exc:
        _reexec_with_loader_path(exc)
        _fail(exc, "capture")
    except CaptureError as exc:
        _fail(exc, "capture")


def _print_capture(trace, out_path: Path) -> None:
    m = trace.meta
    t = Table(title=f"DRAM capture -> {out_path}", show_header=False)
    for k in ("device_name", "metrics_collected", "interval_ns", "interval_ns_measured",
              "n_samples", "sampling_holes"):  # fmt: skip
        t.add_row(k, str(m.get(k)))
    for r in m.get("metrics_refused", []):
        t.add_row("[red]refused[/red]", f"{r['metrics']}: {r['reason']}")
    al = m.get("alignment", {})
    t.add_row("clock mapping", f"{al.get('mapping')} (approximate: {al.get('approximate')})")
    t.add_row("alignment error (ns)", f"{al.get('error_estimate_ns')} ({al.get('how')})")
    for w in m.get("warnings", []):
        t.add_row("[yellow]warning[/yellow]", w)
    Console().print(t)


def _run_target(command: list[str], in_process: bool) -> int:
    """Run the traced command: a subprocess, or (``python ...`` only) this interpreter."""
    if not in_process:
        return subprocess.run(command, check=False).returncode
    exe = Path(command[0]).name
    if not exe.startswith("python") or len(command) < 2:
        raise typer.BadParameter(
            f"--in-process: expected 'python SCRIPT|-m MODULE ...', got {command}"
        )
    old = sys.argv
    try:
        if command[1] == "-m":
            if len(command) < 3:
                raise typer.BadParameter("--in-process: 'python -m' needs a module name")
            sys.argv = command[2:]
            runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command[1:]
            runpy.run_path(command[1], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = old
    return 0


@app.command()
def capture(
    command: list[str] = typer.Argument(None, help="The command to trace, after '--'."),
    metric: list[str] = typer.Option(
        [DRAM], "--metric", "-m", help="PM-sampling metric (repeatable)."
    ),
    interval_us: float = typer.Option(100.0, help="Sampling interval in microseconds."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Trace name: writes NAME.trace.json + CSVs."
    ),
    device: int = typer.Option(0, help="CUDA device index."),
    in_process: bool = typer.Option(False, help="Run a 'python ...' command in this process."),
    calibrate: bool = typer.Option(True, help="Copy bursts at start/stop to measure alignment."),
    hw_buffer_mb: int = typer.Option(512, help="PM-sampling hardware buffer (MiB)."),
) -> None:
    """Sample DRAM throughput while COMMAND runs (PM counters are device-wide)."""
    from kdtree.trace.cupti import CaptureError, DramSampler
    from kdtree.trace.store import save_trace

    if not command:
        raise typer.BadParameter("expected a command after '--', e.g. -- python -m kdtree demo")
    sampler = DramSampler(metric, interval_us, device=device, calibrate=calibrate,
                          hw_buffer_mb=hw_buffer_mb)  # fmt: skip
    _start_sampler(sampler)
    t0 = time.perf_counter()
    rc = 1
    try:
        rc = _run_target(command, in_process)
    finally:
        try:
            trace = sampler.stop()
        except CaptureError as exc:
            _fail(exc, "capture")
    trace.meta.update(command=shlex.join(command), command_rc=rc,
                      command_s=time.perf_counter() - t0, in_process=in_process)  # fmt: skip
    path = save_trace(trace, out)
    _print_capture(trace, path)
    _json_line({"ok": rc == 0, "trace": str(path), "command_rc": rc,
                "n_samples": trace.meta["n_samples"],
                "metrics_collected": trace.meta["metrics_collected"],
                "metrics_refused": trace.meta["metrics_refused"],
                "alignment_error_ns": trace.meta["alignment"].get("error_estimate_ns"),
                "clock_mapping": trace.meta["alignment"].get("mapping")})  # fmt: skip
    if rc != 0:
        raise typer.Exit(rc)


@app.command()
def probe(
    metric: list[str] = typer.Option([DRAM], "--metric", "-m", help="Metrics to try together."),
    interval_us: float = typer.Option(100.0, help="Sampling interval in microseconds."),
    device: int = typer.Option(0, help="CUDA device index."),
) -> None:
    """Which metric combinations the GPU accepts in one PM-sampling pass (a 20 ms capture)."""
    from kdtree.trace.cupti import DramSampler

    s = DramSampler(metric, interval_us, device=device, calibrate=False)
    _start_sampler(s)
    time.sleep(0.02)
    trace = s.stop()
    t = Table(title="PM-sampling metric probe")
    t.add_column("metrics")
    t.add_column("result")
    t.add_row(", ".join(s.accepted), "[green]accepted together[/green]")
    for r in s.refused:
        t.add_row(", ".join(r["metrics"]), f"[red]refused[/red]: {r['reason']}")
    Console().print(t)
    _json_line({"accepted": s.accepted, "refused": s.refused,
                "n_samples": trace.meta["n_samples"], "device": trace.meta.get("device_name")})  # fmt: skip


def _load(path: Path, fmt: str, time_unit: str | None):
    from kdtree.trace.loaders import load_trace
    from kdtree.trace.schema import TraceFormatError

    try:
        return load_trace(path, fmt, time_unit=time_unit)
    except (TraceFormatError, FileNotFoundError, ValueError) as exc:
        _fail(exc, f"cannot load {path}")


@app.command()
def summarize(
    file: Path = typer.Argument(..., help="Trace in any supported format."),
    phases: Path | None = typer.Option(None, "--phases", help="File with phase intervals."),
    metric: str | None = typer.Option(None, help="Metric to analyse (default: the DRAM one)."),
    fmt: str = typer.Option(
        "auto", "--format", help="auto|native|csv|ncu-raw|ncu-details|nsys|chrome."
    ),
    time_unit: str | None = typer.Option(None, help="Plain CSV time unit: s|ms|us|ns."),
    high: float | None = typer.Option(None, help="Burst threshold (enter)."),
    low: float | None = typer.Option(None, help="Burst threshold (stay)."),
    min_burst_us: float = typer.Option(0.0, help="Drop bursts shorter than this."),
    min_gap_us: float = typer.Option(0.0, help="Close gaps shorter than this."),
) -> None:
    """Bursts, gaps, duty cycle, per-step idle and idle time by phase."""
    from kdtree.trace.analysis import analyze

    trace = _load(file, fmt, time_unit)
    ph = _load(phases, "auto", None) if phases is not None else None
    try:
        s = analyze(trace, ph, metric=metric, high=high, low=low,
                    min_burst_ns=int(min_burst_us * 1000), min_gap_ns=int(min_gap_us * 1000))  # fmt: skip
    except ValueError as exc:
        _fail(exc, "summarize")
    doc = s.to_json()
    con = Console()
    t = Table(title=f"{file.name}: {s.metric}", show_header=False)
    for k in ("n_samples", "interval_us", "span_ms", "bursts", "gaps", "duty_cycle",
              "mean_burst_level", "threshold_high", "threshold_low", "gap_ms_total",
              "gap_ms_median", "gap_ms_max", "step_source", "period_ms", "n_steps",
              "step_idle_ms_mean"):  # fmt: skip
        t.add_row(k, str(doc[k]))
    con.print(t)
    if len(s.attribution):
        a = Table(title="idle time by phase")
        for c in ("phase", "idle ms", "share", "gaps"):
            a.add_column(c)
        for r in s.attribution.itertuples():
            a.add_row(r.phase, f"{r.idle_ms:.3f}", f"{r.share:.1%}", str(r.n_gaps))
        con.print(a)
    _json_line(doc)


@app.command()
def convert(
    file: Path = typer.Argument(..., help="Trace in any supported format."),
    out: Path = typer.Option(..., "--out", "-o", help="Output name (NAME.trace.json + CSVs)."),
    fmt: str = typer.Option("auto", "--format", help="Input format (see summarize)."),
    time_unit: str | None = typer.Option(None, help="Plain CSV time unit: s|ms|us|ns."),
) -> None:
    """Convert any supported trace into our CSV + JSON sidecar format."""
    from kdtree.trace.store import save_trace

    trace = _load(file, fmt, time_unit)
    path = save_trace(trace, out)
    Console().print(f"{file} -> {path}: {len(trace.series)} samples, "
                    f"{len(trace.intervals)} intervals, metrics {trace.metrics}")  # fmt: skip
    _json_line({"trace": str(path), "samples": len(trace.series),
                "intervals": len(trace.intervals), "metrics": trace.metrics})  # fmt: skip


@app.command()
def overhead(
    out: Path = typer.Option(..., "--out", "-o", help="Folder for trace_overhead.csv/.json."),
    workload: str = typer.Option("auto", help="auto (engine, else fixed) | engine | fixed."),
    context: int = typer.Option(4096, help="Engine workload: context length."),
    mode: str = typer.Option("eager", help="Engine workload: eager-dense | eager | graph."),
    model: str = typer.Option("tiny-llama", help="Engine workload: config name or checkpoint."),
    steps: int = typer.Option(200, help="Decode steps per timed run."),
    repeats: int = typer.Option(5, help="A/B repeats (alternating order)."),
    interval_us: float = typer.Option(100.0, help="Sampling interval in microseconds."),
) -> None:
    """Per-step time of a decode loop without and with the DRAM sampler -> % overhead."""
    from kdtree.trace.cupti import CaptureError
    from kdtree.trace.workloads import engine_decode_step, fixed_gpu_step, measure_overhead

    if workload not in ("auto", "engine", "fixed"):
        raise typer.BadParameter(f"workload={workload!r}: expected auto, engine or fixed")
    info: dict = {}
    try:
        if workload in ("auto", "engine"):
            try:
                step, info = engine_decode_step(context=context, mode=mode, model=model,
                                                max_steps=(steps + 2) * (2 * repeats + 1) + 32)  # fmt: skip
            except (ImportError, AttributeError) as exc:
                if workload == "engine":
                    raise
                _err.print(
                    f"[yellow]engine unavailable ({exc}); using the fixed workload[/yellow]"
                )
                step, info = fixed_gpu_step()
        else:
            step, info = fixed_gpu_step()
        res = measure_overhead(step, steps=steps, repeats=repeats,
                               sampler_kwargs={"interval_us": interval_us},
                               log=lambda s: _err.print(s))  # fmt: skip
    except CaptureError as exc:
        _fail(exc, "overhead")
    res["workload"] = info
    res["interval_us"] = interval_us
    _write_overhead(out, res)
    t = Table(title="DRAM sampler overhead on the decode loop", show_header=False)
    for k in ("ms_per_step_off_median", "ms_per_step_on_median", "overhead_pct",
              "sampler_start_s_median", "sampler_stop_decode_s_median"):  # fmt: skip
        t.add_row(k, f"{res[k]:.4f}")
    t.add_row("workload", json.dumps(info))
    Console().print(t)
    _json_line({k: v for k, v in res.items() if not isinstance(v, list) or k == "metrics"})


def _write_overhead(out: Path, res: dict) -> None:
    from kdtree.bench.schema import BenchRow, append_rows

    out.mkdir(parents=True, exist_ok=True)
    (out / "trace_overhead.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    cfg = {"workload": res["workload"], "interval_us": res["interval_us"], "steps": res["steps"],
           "repeats": res["repeats"]}  # fmt: skip
    name = res["workload"].get("mode", res["workload"].get("workload", "fixed"))
    rows = [
        BenchRow("trace_overhead", name, "no_sampler", "ms_per_step", "ms",
                 res["ms_per_step_off_median"], min(res["ms_per_step_off"]),
                 max(res["ms_per_step_off"]), config=cfg),
        BenchRow("trace_overhead", name, "cupti_pm_sampling", "ms_per_step", "ms",
                 res["ms_per_step_on_median"], min(res["ms_per_step_on"]),
                 max(res["ms_per_step_on"]), config=cfg),
        BenchRow("trace_overhead", name, "cupti_pm_sampling", "overhead", "%",
                 res["overhead_pct"], min(res["overhead_pct_per_repeat"]),
                 max(res["overhead_pct_per_repeat"]), config=cfg),
    ]  # fmt: skip
    append_rows(out / "trace_overhead.csv", rows, command=shlex.join(sys.argv))


@app.command("record-decode")
def record_decode_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Folder for dram.* + phases.chrome.json."),
    context: int = typer.Option(4096, help="Context length (synthetic prefix KV)."),
    mode: str = typer.Option("eager", help="eager-dense | eager | graph."),
    steps: int = typer.Option(64, help="Traced decode steps."),
    warmup: int = typer.Option(8, help="Untraced warm-up steps."),
    interval_us: float = typer.Option(100.0, help="Sampling interval in microseconds."),
    metric: list[str] = typer.Option(
        [DRAM], "--metric", "-m", help="PM-sampling metric (repeatable)."
    ),
    model: str = typer.Option("tiny-llama", help="Target config name or checkpoint folder."),
    drafter: str | None = typer.Option(None, help="Drafter checkpoint folder (default: random)."),
    batch: int = typer.Option(1, help="Batch size."),
    budget: int = typer.Option(64, help="Tree budget B."),
    top_k: int = typer.Option(8, help="Top-K per depth."),
) -> None:
    """Trace the engine's decode loop (DRAM series + profiler phases, side by side)."""
    from kdtree.trace.cupti import CaptureError, CuptiUnavailableError
    from kdtree.trace.record import record_decode

    try:
        doc = record_decode(out, context=context, mode=mode, steps=steps, warmup=warmup,
                            interval_us=interval_us, metrics=metric, model=model,
                            drafter=drafter, batch=batch, budget=budget, top_k=top_k,
                            command=shlex.join(["kdtree", "trace", *sys.argv[2:]]),
                            log=lambda s: _err.print(s))  # fmt: skip
    except CuptiUnavailableError as exc:
        _reexec_with_loader_path(exc)
        _fail(exc, "record-decode")
    except CaptureError as exc:
        _fail(exc, "record-decode")
    al = doc.get("alignment") or {}
    t = Table(title=f"decode trace -> {out}", show_header=False)
    for k in ("ms_per_step", "bursts", "gaps", "duty_cycle", "mean_burst_level",
              "step_idle_ms_mean", "idle_by_phase"):  # fmt: skip
        t.add_row(k, str(doc.get(k)))
    t.add_row("clock mapping", f"{al.get('mapping')} (approximate: {al.get('approximate')})")
    t.add_row("alignment error (ns)", str(al.get("error_estimate_ns")))
    for w in al.get("warnings", []):
        t.add_row("[yellow]warning[/yellow]", w)
    if not doc.get("ok", True):
        t.add_row("[red]error[/red]", f"{doc.get('error')}: {doc.get('message')}")
    Console().print(t)
    _json_line({k: doc[k] for k in doc if k not in ("platform",)})
    if not doc.get("ok", True):
        raise typer.Exit(3)


if __name__ == "__main__":
    app()
