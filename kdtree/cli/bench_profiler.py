"""``kdtree bench profiler``: per-call cost of the phase profiler, off and on."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kdtree import env


def register(bench_app: typer.Typer) -> None:
    bench_app.command("profiler", help="Per-call cost of the phase profiler (off / on, host).")(
        profiler_cmd
    )


def profiler_cmd(
    out: Path = typer.Option(env.DATA_DIR / "bench", "--out", help="Folder for profiler.csv."),
    number: int = typer.Option(20_000, help="Calls per sample.", min=100),
    repeat: int = typer.Option(15, help="Samples per case.", min=3),
    gpu: bool = typer.Option(True, help="Also time CUDA-event mode when CUDA is available."),
) -> None:
    """Measure and append rows to OUT/profiler.csv; the last stdout line is JSON."""
    from kdtree.bench import profiler_cost
    from kdtree.bench.schema import append_rows

    results = profiler_cost.measure(number=number, repeat=repeat, gpu=gpu)
    path = out / "profiler.csv"
    n = append_rows(path, profiler_cost.to_rows(results, number, repeat))
    table = Table(title=f"profiler cost per instrumented call (µs), {n} rows -> {path}")
    for col in ("case", "mode", "p50", "p20", "p80", "target", "ok"):
        table.add_column(col, justify="right" if col not in ("case", "mode") else "left")
    for r in results:
        t = r.per_call_us
        table.add_row(
            r.name,
            r.provider,
            f"{t.p50:.4f}",
            f"{t.p20:.4f}",
            f"{t.p80:.4f}",
            "" if r.target_us is None else f"< {r.target_us:g}",
            "" if r.ok is None else ("yes" if r.ok else "NO"),
        )
    Console().print(table)
    summary = {
        "suite": profiler_cost.SUITE,
        "out": str(path),
        "rows": n,
        "per_call_us": {f"{r.provider}/{r.name}": round(r.per_call_us.p50, 5) for r in results},
        "targets_us": {"off": profiler_cost.TARGET_OFF_US, "on": profiler_cost.TARGET_ON_US},
        "all_within_target": all(r.ok for r in results if r.ok is not None),
    }
    print(json.dumps(summary))
