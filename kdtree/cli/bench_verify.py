"""``kdtree bench verify-attention``: tree-verify attention, ours against the peers, on a GPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

_HELP_PROVIDERS = (
    "Comma-separated providers (default: all): "
    "ours,ours_graph,ours_cuda_graph,ours_wgmma_graph,ours_seesaw_graph,ours_gqa_graph,ref,sdpa_dense,flex,fi_mask,fi_cascade,fi_mla,eager_mla"
)


def _ints(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if not text:
        return default
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        mult = 1024 if part.endswith("k") else 1
        out.append(int(part.rstrip("k")) * mult)
    return tuple(out)


def verify_attention(
    out: Path = typer.Option(
        ..., "--out", help="Directory for verify_attention.csv and summary.json."
    ),
    quick: bool = typer.Option(
        False, "--quick", help="Core subset: batch 1, L in {16k, 128k}, T in {17, 65}."
    ),
    providers: str = typer.Option("", "--providers", help=_HELP_PROVIDERS),
    layouts: str = typer.Option(
        "",
        "--layouts",
        help="Comma-separated head layouts (gqa_32q8kv_d128, gqa_8q1kv_d128, mla_h8, mla_h16).",
    ),
    lengths: str = typer.Option("", "--lengths", help="Prefix lengths, e.g. 16k,128k."),
    trees: str = typer.Option("", "--trees", help="Tree sizes T, e.g. 17,65."),
    batches: str = typer.Option("", "--batches", help="Batch sizes, e.g. 1,8."),
    page_size: int = typer.Option(16, "--page-size", help="Tokens per KV page."),
    page_order: str = typer.Option(
        "random",
        "--page-order",
        help="Each request's pages: 'random' (a permutation of the pool, a fragmented cache) "
        "or 'sequential' (consecutive, a cache allocated in order).",
    ),
    min_rotations: int = typer.Option(
        1,
        "--min-rotations",
        help="Rotate at least this many disjoint copies of the KV pages (default: as many as "
        "keep 2 x L2 of KV in rotation, so one copy above 120 MB).",
    ),
    max_seconds: float = typer.Option(
        360.0,
        "--max-seconds",
        help="Wall budget; points left when it is spent are recorded as skipped.",
    ),
    all_points: bool = typer.Option(
        False,
        "--all-points",
        help="Run the slow peers (ref, "
        "sdpa, flex, eager) on every point, not their default "
        "domain.",
    ),
    smoke: bool = typer.Option(
        False,
        "--smoke",
        help="Tiny shapes that run on the CPU (interpreter) to check the plumbing.",
    ),
    tune: bool = typer.Option(
        False,
        "--tune",
        help="Also time our kernels under candidate "
        "tile configs and 0.5x-4x split counts (batch 1; at --lengths/--trees when given, "
        "else L in {16k, 64k, 128k}, T in {17, 65}; rows 'ours_tune[...]').",
    ),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Time tree-verify attention per provider over (layout, batch, L, T); rows (ms, GB/s,
    TFLOP/s, fraction of the floor measured in this run) go to OUT/verify_attention.csv."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from kdtree.bench import verify_attention as va
    from kdtree.bench.roofline import measure_ceilings
    from kdtree.bench.schema import BenchRow, append_rows

    console = Console()
    chosen = tuple(p.strip() for p in providers.split(",") if p.strip()) or va.ALL_PROVIDERS
    unknown = [p for p in chosen if p not in va.SETUPS]
    if unknown:
        raise typer.BadParameter(f"unknown providers {unknown}; expected {va.ALL_PROVIDERS}")
    if smoke:
        defaults = (va.SMOKE_L, va.SMOKE_T, va.SMOKE_B)
    elif quick:
        defaults = (va.QUICK_L, va.QUICK_T, va.QUICK_B)
    else:
        defaults = (va.FULL_L, va.FULL_T, va.FULL_B)
    if page_order not in va.PAGE_ORDERS:
        raise typer.BadParameter(f"--page-order {page_order!r}: expected one of {va.PAGE_ORDERS}")
    if not 1 <= min_rotations <= va.MAX_ROTATIONS:
        raise typer.BadParameter(
            f"--min-rotations {min_rotations}: expected 1..{va.MAX_ROTATIONS}"
        )
    known, default = va.known_layouts(smoke)
    lay_names = tuple(x.strip() for x in layouts.split(",") if x.strip()) or tuple(default)
    bad = [x for x in lay_names if x not in known]
    if bad:
        raise typer.BadParameter(f"unknown layouts {bad}; expected {tuple(known)}")
    opts = va.Options(
        providers=chosen,
        layouts=lay_names,
        lengths=_ints(lengths, defaults[0]),
        trees=_ints(trees, defaults[1]),
        batches=_ints(batches, defaults[2]),
        page_size=page_size,
        page_order=page_order,
        min_rotations=min_rotations,
        max_seconds=max_seconds,
        all_points=all_points,
        seed=seed,
        smoke=smoke,
        tune=tune,
        # --tune visits the lengths and trees asked for, else its own core points
        tune_lengths=_ints(lengths, va.TUNE_L),
        tune_trees=_ints(trees, va.QUICK_T),
        dtype=torch.float32 if smoke else torch.bfloat16,
    )
    if torch.cuda.is_available():
        device = torch.device("cuda")
        ceilings = measure_ceilings(device)
        console.print(
            f"ceilings: copy {ceilings.copy_TBps:.3f} TB/s, bf16 matmul "
            f"{ceilings.matmul_TFLOPs:.1f} TFLOP/s"
        )
    elif smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        device, ceilings = torch.device("cpu"), None
    else:
        raise typer.BadParameter("verify-attention needs a CUDA GPU (or --smoke on the CPU)")

    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "verify_attention.csv"
    if ceilings is not None:
        append_rows(
            csv_path,
            [
                BenchRow(
                    va.SUITE,
                    "ceilings",
                    "device",
                    "copy_bandwidth",
                    "TB/s",
                    ceilings.copy_TBps,
                    config=ceilings.as_dict(),
                ),
                BenchRow(
                    va.SUITE,
                    "ceilings",
                    "device",
                    "matmul_rate",
                    "TFLOP/s",
                    ceilings.matmul_TFLOPs,
                    config=ceilings.as_dict(),
                ),
            ],
        )
    result = va.run_suite(
        opts,
        device,
        log=console.print,
        ceilings=ceilings,
        on_rows=lambda rows: append_rows(csv_path, rows),
    )

    table = Table(title="verify attention: p50 ms (fraction of the floor)")
    for col in ("point", "provider", "mode", "ms", "floor"):
        table.add_column(col)
    headline = {}
    for r in result.rows:
        if r.metric != "time":
            continue
        frac = r.config.get("floor_ms", math.nan) / r.p50 if r.p50 else math.nan
        table.add_row(
            r.name, r.provider, r.mode, f"{r.p50:.4f}", "" if math.isnan(frac) else f"{frac:.1%}"
        )
        cfg = r.config
        if cfg.get("batch") == 1 and cfg.get("T") in (17, 65) and cfg.get("L") == 131072:
            headline.setdefault(r.name, {})[r.provider] = round(r.p50, 4)
    console.print(table)
    summary = dict(
        result.summary,
        csv=str(csv_path),
        device=str(device),
        ceilings=ceilings.as_dict() if ceilings else None,
        headline_L128k_B1_ms=headline,
    )
    if tune:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        table = va.tuned_table(result.rows, name)
        (out / "tuned.json").write_text(json.dumps(table, indent=1))
        summary["tuned"] = {"path": str(out / "tuned.json"), "entries": len(table["entries"])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, default=str))


def register(bench_app: typer.Typer) -> None:
    """Add ``verify-attention`` to ``kdtree bench``."""
    bench_app.command("verify-attention")(verify_attention)
