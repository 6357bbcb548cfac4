"""``kdtree bench tp``: tensor-parallel decode on 1-8 GPUs, launched with torchrun.

    torchrun --standalone --nproc-per-node 8 -m kdtree bench tp --model llama3-8b \\
        --tp 1,2,4,8 --contexts 4096,46000 --out runs/tp

One process per GPU (NCCL); each ``--tp`` degree ``d`` runs on the first ``d`` ranks. Every
process sets ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and
``NVSHMEM_DISABLE_NVLS=1`` (``os.environ.setdefault``, before ``init_process_group``): NVLink
multicast stays off. Without torchrun the command runs as a single process (``--tp 1``; gloo-free,
CPU smoke runs). World rank 0 writes ``OUT/tp.csv``, prints the table and ends stdout with one
JSON line; the other ranks print nothing to stdout.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{name}={text!r}: expected comma-separated integers") from exc
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{name}={text!r}: expected positive integers")
    return values


def _print_rows(rows) -> None:
    table = Table(title="tensor-parallel decode (rank 0 unless named)")
    for c in ("provider", "context", "name", "metric", "p50", "p20", "p80", "unit"):
        table.add_column(c)
    keep = {"step_ms", "tokens_per_s", "accept_len", "comm_ms_per_step",
            "verify_attention_step_ms", "phase_verify_ms", "phase_draft_ms",
            "phase_tree_build_ms", "phase_accept_ms", "phase_commit_ms"}  # fmt: skip
    for r in rows:
        if r.metric not in keep:
            continue
        table.add_row(
            r.provider, str(r.x_value), r.name, r.metric,
            *("" if v is None else f"{v:.4g}" for v in (r.p50, r.p20, r.p80)), r.unit,
        )  # fmt: skip
    Console(width=150).print(table)


def tp_cmd(
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for tp.csv."),
    model: str = typer.Option(
        "llama3-8b", help="Target: llama3-8b | kimi-k2-3l | a kdtree config name (tiny-llama)."
    ),
    layers: int = typer.Option(0, help="Override the target's layer count (0: the preset's)."),
    tp: str = typer.Option("1,2", help="TP degrees (comma-separated, each <= the world size)."),
    contexts: str = typer.Option("4096,46000", help="Context lengths (comma-separated)."),
    batch: int = typer.Option(1, help="Requests per step."),
    budget: int = typer.Option(64, help="Tree node budget B (T = B + 1)."),
    top_k: int = typer.Option(8, help="Top-K per depth."),
    block_size: int = typer.Option(16, help="DFlash block size (depth = block size - 1)."),
    drafter_layers: int = typer.Option(1, help="DFlash drafter layers (replicated)."),
    steps: int = typer.Option(20, help="Timed steps per pass (breakdown and throughput)."),
    warmup: int = typer.Option(3, help="Untimed steps first."),
    dtype: str = typer.Option("auto", help="auto (bfloat16 on CUDA, float32 on CPU) | ..."),
    backend: str = typer.Option("auto", help="Verify-attention backend."),
    seed: int = typer.Option(0, help="Weight / synthetic-state seed."),
) -> None:
    """Per-step breakdown (phases, all-reduce time by phase, verify attention per rank) and
    decode tokens/s against TP degree, at each context. Launch with torchrun."""
    from kdtree.tp.dist import TPGroup, disable_nvlink_multicast, init_from_env

    nvls = disable_nvlink_multicast()  # every process, before init_process_group
    import torch
    import torch.distributed as dist

    from kdtree.bench.schema import append_rows
    from kdtree.tp.bench import SUITE, TPBenchConfig, run_tp_bench

    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = init_from_env() if under_torchrun else TPGroup.single()
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" else "float32"
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise typer.BadParameter(f"dtype={dtype!r}: expected a torch dtype name (bfloat16 ...)")
    bc = TPBenchConfig(
        model=model, layers=layers or None, tps=_ints(tp, "tp"),
        contexts=_ints(contexts, "contexts"), batch=batch, budget=budget, top_k=top_k,
        block_size=block_size, drafter_layers=drafter_layers, steps=steps, warmup=warmup,
        dtype=dtype, backend=backend, seed=seed,
    )  # fmt: skip
    err = Console(stderr=True)
    try:
        rows, summary = run_tp_bench(world, bc, device, log=err.print)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    finally:
        if under_torchrun and dist.is_initialized():
            dist.destroy_process_group()
    if not world.is_first:
        return
    prefix = f"torchrun --nproc-per-node {world.size} -m kdtree " if under_torchrun else "kdtree "
    command = prefix + shlex.join(sys.argv[1:])
    path = Path(out) / f"{SUITE}.csv"
    n = append_rows(path, rows, command=command)
    _print_rows(rows)
    print(json.dumps({"suite": SUITE, "rows": n, "csv": str(path), "world_size": world.size,
                      "device": str(device), "nvls_env": nvls, **summary}))  # fmt: skip


def register(bench_app: typer.Typer) -> None:
    """Add ``tp`` to ``kdtree bench``."""
    bench_app.command("tp")(tp_cmd)
