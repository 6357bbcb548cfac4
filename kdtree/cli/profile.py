"""``kdtree profile``: parse ``[kdtree-prof]`` logs, summarise saved samples, test hypotheses."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Phase profiler: parse logs, summarise samples, hypothesis sweeps.", no_args_is_help=True
)


def _table(df, title: str, columns: list[str]) -> Table:
    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="left" if df[c].dtype == object else "right")
    for row in df[columns].itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    return table


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{name}={text!r}: expected comma-separated integers") from exc
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{name}={text!r}: expected integers >= 1")
    return values


def _jsonable(records: list[dict]) -> list[dict]:
    return [
        {
            k: (
                None
                if isinstance(v, float) and math.isnan(v)
                else (v.item() if hasattr(v, "item") else v)
            )
            for k, v in r.items()
        }
        for r in records
    ]


@app.command("parse")
def parse_cmd(
    log: Path = typer.Argument(..., exists=True, dir_okay=False, help="Log file (any text)."),
    latest: bool = typer.Option(True, help="Only the last line per process and phase."),
    out: Path | None = typer.Option(None, "--out", help="Write the rows as CSV here."),
) -> None:
    """Read kdtree-prof log lines (plain logs, journalctl with several pids/ranks)."""
    from kdtree.profiler import parse_log

    df = parse_log(log, latest=latest)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    cols = [
        c
        for c in (
            "host",
            "pid",
            "rank",
            "phase",
            "n",
            "mean_ms",
            "p50_ms",
            "p99_ms",
            "last_ms",
            "share",
            "gpu_mean_ms",
        )
        if df[c].notna().any()
    ]
    Console().print(_table(df.astype(object), f"{log}: {len(df)} rows", cols))
    print(
        json.dumps(
            {
                "log": str(log),
                "rows": len(df),
                "out": str(out) if out else None,
                "processes": int(df[["pid", "rank", "host"]].drop_duplicates().shape[0]),
                "phases": sorted(df["phase"].unique().tolist()),
            }
        )
    )


@app.command("show")
def show_cmd(
    samples: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="A samples .parquet written by profiler.save()."
    ),
) -> None:
    """Per-phase table of a saved samples file."""
    from kdtree.profiler import load_samples, summarize

    df = summarize(load_samples(samples))
    cols = [
        "phase",
        "parent",
        "n",
        "mean_ms",
        "p50_ms",
        "p99_ms",
        "total_ms",
        "share",
        "gpu_mean_ms",
    ]
    Console().print(_table(df.astype(object), str(samples), cols))
    print(json.dumps({"samples": str(samples), "phases": _jsonable(df.to_dict("records"))}))


@app.command("hypothesis")
def hypothesis_cmd(
    contexts: str = typer.Option("2048,4096,16384,46000", help="Context lengths (comma list)."),
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for the result files."),
    batch_sizes: str = typer.Option("1", help="Batch sizes (comma list)."),
    repeats: int = typer.Option(8, min=2, help="Measured steps per configuration."),
    warmup: int = typer.Option(2, min=1, help="Unmeasured steps per configuration."),
    model: str = typer.Option("tiny-mla", help="Target config (kdtree.models.get_config)."),
    budget: int = typer.Option(64, min=1, help="Tree node budget B."),
    top_k: int = typer.Option(8, min=1, help="Top-K per depth."),
    device: str = typer.Option("auto", help="auto | cpu | cuda[:N]."),
    dtype: str = typer.Option("auto", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | ..."),
    gap_ms: float = typer.Option(200.0, help="Idle gap per step the claim must explain (ms)."),
    observed_context: int = typer.Option(46000, help="Context where the gap was observed."),
    seed: int = typer.Option(0, help="Seed for weights, synthetic KV and the bootstrap."),
    threads: int = typer.Option(
        0, min=0, help="torch.set_num_threads (0: leave the default; 1 steadies shared CPUs)."
    ),
) -> None:
    """Does O(context) mask construction in prepare_for_verify explain the idle gap?

    Writes OUT/hypothesis_<device>.csv (bench schema rows: measurements, fits, verdict; appended)
    and OUT/hypothesis_<device>_steps.csv (one row per step and phase; overwritten).
    """
    from kdtree.bench.schema import append_rows
    from kdtree.hypothesis import Hypothesis, mask_build_experiment, resolve_device, to_bench_rows

    ctx = _ints(contexts, "contexts")
    batches = _ints(batch_sizes, "batch_sizes")
    try:
        dev = resolve_device(device)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    hyp = Hypothesis(
        phase="prepare_for_verify",
        claim=f"O(context) mask construction explains an idle gap of {gap_ms:g} ms per step",
        gap_ms=gap_ms,
        context=observed_context,
        batch_size=batches[0],
    )
    if threads:
        import torch

        torch.set_num_threads(threads)
    err = Console(stderr=True)
    res = mask_build_experiment(
        ctx,
        batches,
        repeats=repeats,
        warmup=warmup,
        model=model,
        budget=budget,
        top_k=top_k,
        device=dev,
        dtype=dtype,
        hypothesis=hyp,
        seed=seed,
        log=err.print,
    )
    command = shlex.join(
        [
            "kdtree",
            "profile",
            "hypothesis",
            "--contexts",
            ",".join(map(str, ctx)),
            "--out",
            str(out),
            "--batch-sizes",
            ",".join(map(str, batches)),
            "--repeats",
            str(repeats),
            "--warmup",
            str(warmup),
            "--model",
            model,
            "--budget",
            str(budget),
            "--top-k",
            str(top_k),
            "--device",
            device,
            "--dtype",
            dtype,
            "--gap-ms",
            f"{gap_ms:g}",
            "--observed-context",
            str(observed_context),
            "--seed",
            str(seed),
            *(["--threads", str(threads)] if threads else []),
        ]
    )
    tag = dev.split(":")[0]
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / f"hypothesis_{tag}.csv"
    steps_path = out / f"hypothesis_{tag}_steps.csv"
    n = append_rows(csv_path, to_bench_rows(res), command=command)
    # Per-step table: not schema rows, but it carries its command like every file in data/bench.
    res.steps.assign(command=command).to_csv(steps_path, index=False)

    med = (
        res.steps.groupby(["batch", "context", "phase"])["host_ms"]
        .median()
        .unstack("phase")
        .reset_index()
    )
    phases = [
        p
        for p in (
            "draft",
            "tree_build",
            "prepare_for_verify",
            "verify",
            "accept",
            "commit",
            "step",
        )
        if p in med.columns
    ]
    Console().print(
        _table(med.astype(object), "median host ms per step", ["batch", "context", *phases])
    )
    f = res.fits
    fits = f[["phase", "metric", "batch"]].copy()
    for col, (p, lo, hi) in {
        "ms per 1k tokens": ("slope_ms_per_1k", "slope_lo", "slope_hi"),
        "log-log exponent": ("exponent", "exponent_lo", "exponent_hi"),
        f"ms at {observed_context}": ("cost_ms", "cost_lo", "cost_hi"),
    }.items():
        fits[col] = [
            f"{a:.3g} [{b:.3g}, {c:.3g}]" for a, b, c in zip(f[p], f[lo], f[hi], strict=True)
        ]
    Console().print(_table(fits.astype(object), "fits (95% bootstrap CI)", list(fits.columns)))
    Console().print(res.verdict.summary)
    print(
        json.dumps(
            {
                "verdict": res.verdict.outcome,
                "summary": res.verdict.summary,
                "csv": str(csv_path),
                "steps_csv": str(steps_path),
                "rows": n,
                "device": dev,
                "command": command,
                "table": _jsonable(res.verdict.table.to_dict("records")),
            }
        )
    )


if __name__ == "__main__":
    app()
