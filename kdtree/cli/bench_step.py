"""``kdtree bench tree-build`` and ``kdtree bench step``: the device decode step's benchmarks."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{name}={text!r}: expected comma-separated integers") from exc
    if not values:
        raise typer.BadParameter(f"{name}={text!r}: expected at least one integer")
    return values


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise typer.BadParameter(f"device={name!r}: CUDA is not available on this machine")
    return name


def _print_rows(title: str, rows, columns=("name", "provider", "metric", "x_value")) -> None:
    table = Table(title=title)
    for c in (*columns, "p50", "p20", "p80", "unit"):
        table.add_column(c)
    for r in rows:
        table.add_row(
            *(str(getattr(r, c)) for c in columns),
            *(_fmt(getattr(r, q)) for q in ("p50", "p20", "p80")),
            r.unit,
        )
    Console(width=140).print(table)


def _fmt(value) -> str:
    return "" if value is None else f"{value:.4g}"


def tree_build_cmd(
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for tree_build.csv."),
    batches: str = typer.Option("1,8,32", help="Batch sizes (comma-separated)."),
    budgets: str = typer.Option("16,64,256,1024", help="Node budgets B (comma-separated)."),
    depth: int = typer.Option(15, help="Draft depth D (block size - 1)."),
    top_k: int = typer.Option(32, help="Top-K per depth cap (K = min(B, top_k))."),
    vocab: int = typer.Option(32768, help="Vocabulary of the synthetic draft logits."),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
    providers: str = typer.Option(
        "heap,device_torch,device_torch_graph,device_triton,device_triton_thresh,"
        "device_triton_heap,device_cuda",
        help="Providers to time (device_triton: the Triton builder, algo=auto; "
        "device_triton_thresh: the threshold builder; device_triton_heap: the heap replay; "
        "device_cuda: the CUDA C++ builder, the engine's on an sm_90 GPU with nvcc).",
    ),
    fast: bool = typer.Option(False, help="Shorter timing windows (smoke runs)."),
) -> None:
    """Heap path (top-K, D→H copy, heap, mask, H→D) vs the device tree builder."""
    from kdtree.bench.schema import append_rows
    from kdtree.bench.tree_build import SUITE, run_tree_build

    rows = run_tree_build(
        _ints(batches, "batches"),
        _ints(budgets, "budgets"),
        depth=depth,
        top_k=top_k,
        vocab=vocab,
        device=_device(device),
        providers=tuple(providers.split(",")),
        fast=fast,
        log=lambda s: Console(stderr=True).print(s),
    )
    path = Path(out) / f"{SUITE}.csv"
    n = append_rows(path, rows)
    _print_rows("tree build: time per step", rows, ("name", "provider", "metric", "x_value"))
    best = {}
    for r in rows:
        if r.metric == "speedup_vs_heap":
            key = f"{r.name}_B{r.x_value}"
            best[key] = max(best.get(key, 0.0), r.p50)
    print(json.dumps({"suite": SUITE, "rows": n, "csv": str(path), "best_speedup": best}))


def step_cmd(
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for step.csv."),
    contexts: str = typer.Option("4096,46000,131072", help="Context lengths (comma-separated)."),
    model: str = typer.Option("tiny-llama", help="Target config name (kdtree.models)."),
    batch: int = typer.Option(1, help="Batch size."),
    budget: int = typer.Option(64, help="Node budget B."),
    top_k: int = typer.Option(8, help="Top-K per depth."),
    steps: int = typer.Option(20, help="Timed decode steps per mode."),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
    modes: str = typer.Option("graph,eager,generic", help="Step modes to time."),
    profile_kernels: bool = typer.Option(True, help="torch.profiler kernel timeline (CUDA)."),
    num_layers: int = typer.Option(0, help="Override the target's layer count (0: keep)."),
) -> None:
    """Verify-input cost vs context, and the whole step: graph vs eager vs generic."""
    from kdtree.bench.schema import append_rows
    from kdtree.bench.step import SUITE, run_step_bench

    rows, summary = run_step_bench(
        _ints(contexts, "contexts"),
        model=model,
        batch=batch,
        budget=budget,
        top_k=top_k,
        steps=steps,
        device=_device(device),
        modes=tuple(modes.split(",")),
        profile_kernels=profile_kernels,
        log=lambda s: Console(stderr=True).print(s),
    )
    path = Path(out) / f"{SUITE}.csv"
    n = append_rows(path, rows)
    _print_rows("decode step", rows, ("name", "provider", "metric", "x_value"))
    print(json.dumps({"suite": SUITE, "rows": n, "csv": str(path), **summary}))


def register(bench_app: typer.Typer) -> None:
    """Add ``tree-build`` and ``step`` to ``kdtree bench``."""
    bench_app.command("tree-build")(tree_build_cmd)
    bench_app.command("step")(step_cmd)
