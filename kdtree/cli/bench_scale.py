"""``kdtree bench k2-layer | moe-load | budget``: Kimi-K2 scale on one TP8 rank.

* ``k2-layer``: per-layer verify timing of a shape-faithful TP8 rank slice (random bf16
  weights) for T × L, our Triton MLA kernel and the eager peer, three MoE executions; the
  modelled 61-layer step with TP8 all-reduces → ``OUT/k2_layer.csv``.
* ``moe-load``: distinct experts touched vs T (the mini model's real routing; uniform, Zipf and
  tree-correlated routing at K2 scale) and the measured time per MoE layer → ``moe_load.csv``.
* ``budget``: cost-aware budget vs fixed budgets on the trained pair (offline replay and live),
  optionally under the modelled K2 step from ``k2_layer.csv`` → ``budget.csv``.

Each prints a table and ends stdout with one JSON line. Also runnable as
``python -m kdtree.cli.bench_scale <command> ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

_TEXTS = (
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):\n        ",
    "for i in range(10):\n    ",
)


def _ints(text: str, name: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1000 if part.endswith("k") else 1
        try:
            out.append(int(float(part.rstrip("k")) * mult))
        except ValueError as exc:
            raise typer.BadParameter(f"{name}={text!r}: expected integers like 4k,46k") from exc
    if not out:
        raise typer.BadParameter(f"{name}={text!r}: expected at least one integer")
    return out


def _strs(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise typer.BadParameter(f"device={name!r}: CUDA is not available on this machine")
    return torch.device(name)


def _spec(reduce: int, device):
    from kdtree.scale.spec import K2_REFERENCE

    factor = reduce if reduce > 0 else (1 if device.type == "cuda" else 16)
    return K2_REFERENCE.reduced(factor)


def _log(msg: str) -> None:
    Console(stderr=True).print(msg)


def _table(title: str, rows, columns=("name", "provider", "metric", "x_value")) -> None:
    table = Table(title=title)
    for c in (*columns, "p50", "unit"):
        table.add_column(c)
    for r in rows:
        table.add_row(*(str(getattr(r, c)) for c in columns), f"{r.p50:.4g}", r.unit)
    Console(width=150).print(table)


def _fail(exc: Exception) -> None:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    raise typer.Exit(2)


def k2_layer_cmd(
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for k2_layer.csv."),
    contexts: str = typer.Option("4k,46k,91k,185k", help="Prefix lengths L (k = 1000)."),
    trees: str = typer.Option("1,9,17,65,257", help="Tree sizes T (budget + 1)."),
    layers: int = typer.Option(3, help="Layers to build (first dense, then MoE), full size."),
    reduce: int = typer.Option(0, help="Width divisor (0: 1 on CUDA, 16 on CPU — labelled)."),
    attn_providers: str = typer.Option("triton,eager", help="Attention providers."),
    moe_providers: str = typer.Option("loop,bmm,grouped", help="Routed-expert providers."),
    rep_ms: float = typer.Option(60.0, help="Timing window per measurement (ms)."),
    max_seconds: float = typer.Option(150.0, help="Wall budget; later points are skipped."),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
) -> None:
    """Per-layer verify timing of one TP8 rank of Kimi-K2 and the modelled 61-layer step."""
    from kdtree.bench.schema import append_rows
    from kdtree.scale.bench import run_k2_layer
    from kdtree.scale.spec import ShapeDoesNotFitError

    dev = _device(device)
    spec = _spec(reduce, dev)
    try:
        rows, summary = run_k2_layer(
            spec,
            n_layers=layers,
            contexts=_ints(contexts, "contexts"),
            trees=_ints(trees, "trees"),
            attn_providers=_strs(attn_providers),
            moe_providers=_strs(moe_providers),
            device=dev,
            rep_ms=rep_ms,
            max_seconds=max_seconds,
            log=_log,
        )
    except ShapeDoesNotFitError as exc:
        _fail(exc)
    path = Path(out) / "k2_layer.csv"
    n = append_rows(path, rows)
    _table(
        f"{spec.label}: modelled 61-layer step",
        [r for r in rows if r.name == "step_61_layers" and r.metric == "time"],
        ("provider", "x_value"),
    )
    print(json.dumps({"suite": "k2_layer", "rows": n, "csv": str(path), **summary}, default=str))


def _mini_rounds(dev, budget: int, new_tokens: int, n_prompts: int):
    from kdtree import nb_live
    from kdtree.scale.record import record_rounds

    pair = nb_live.load_pair(str(dev), config="tiny-mla")
    prompts = [nb_live.prompt_ids(pair, t, seed=i) for i, t in enumerate(_TEXTS[:n_prompts])]
    rounds = record_rounds(pair.target, pair.drafter, prompts, budget=budget, top_k=8,
                           max_new_tokens=new_tokens)  # fmt: skip
    return pair, rounds


def moe_load_cmd(
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for moe_load.csv."),
    trees: str = typer.Option("1,2,5,9,17,33,65,129,257", help="Tree sizes T."),
    kinds: str = typer.Option("uniform,zipf,correlated", help="Routing cases at K2 scale."),
    providers: str = typer.Option("loop,bmm,grouped", help="Routed-expert providers."),
    trials: int = typer.Option(8, help="Monte-Carlo routings per (case, T)."),
    zipf_s: float = typer.Option(1.0, help="Zipf exponent of expert popularity."),
    rho: float = typer.Option(0.6, help="Tree correlation when --no-mini (else calibrated)."),
    mini: bool = typer.Option(True, help="Record the mini model's routing; calibrate rho."),
    mini_budget: int = typer.Option(64, help="Budget of the mini model's recorded trees."),
    reduce: int = typer.Option(0, help="Width divisor (0: 1 on CUDA, 16 on CPU — labelled)."),
    rep_ms: float = typer.Option(40.0, help="Timing window per measurement (ms)."),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
) -> None:
    """Experts touched by verify batches and the time per MoE layer against T."""
    from kdtree.bench.schema import append_rows
    from kdtree.scale.bench import run_moe_load
    from kdtree.scale.budget_bench import mini_routing_rows
    from kdtree.scale.spec import ShapeDoesNotFitError

    dev = _device(device)
    spec = _spec(reduce, dev)
    rows, excess, mini_summary = [], None, {}
    if mini:
        pair, rounds = _mini_rounds(dev, mini_budget, 24, 4)
        mode = "gpu" if dev.type == "cuda" else "cpu"
        rows, stats = mini_routing_rows(pair.target.config, rounds, mode, pair.source)
        excess = stats["excess_overlap"]
        mini_summary = {"mini_source": pair.source, "mini_overlap": stats["overlap"],
                        "mini_excess_overlap": excess}  # fmt: skip
        _log(f"mini model ({pair.source}): parent-child overlap {stats['overlap']:.3f}")
    try:
        more, summary = run_moe_load(spec, trees=_ints(trees, "trees"), kinds=_strs(kinds),
                                     providers=_strs(providers), device=dev, trials=trials,
                                     zipf_s=zipf_s, rho=rho, rep_ms=rep_ms,
                                     mini_excess=excess, log=_log)  # fmt: skip
    except ShapeDoesNotFitError as exc:
        _fail(exc)
    rows += more
    path = Path(out) / "moe_load.csv"
    n = append_rows(path, rows)
    _table(f"{spec.label}: routed experts per MoE layer",
           [r for r in rows if r.name == "experts_time"], ("provider", "x_value"))  # fmt: skip
    print(json.dumps({"suite": "moe_load", "rows": n, "csv": str(path), **mini_summary,
                      **summary}, default=str))  # fmt: skip


def budget_cmd(
    out: Path = typer.Option(Path("data/bench"), "--out", help="Folder for budget.csv."),
    fixed: str = typer.Option("4,16,64", help="Fixed budgets to compare."),
    candidates: str = typer.Option("0,1,2,4,8,16,32,64", help="Budgets the policy may pick."),
    prompts: int = typer.Option(4, help="Prompts (of 4)."),
    new_tokens: int = typer.Option(32, help="Tokens per prompt."),
    top_k: int = typer.Option(8, help="Top-K per depth."),
    k2_csv: Path = typer.Option(None, help="k2_layer.csv: also simulate under the K2 step."),
    k2_context: int = typer.Option(46000, help="Context for the K2-modelled simulation."),
    k2_fixed_ms: float = typer.Option(0.0, help="Per-step fixed ms added to the K2 model."),
    live: bool = typer.Option(True, help="Also run the engines live (fixed vs cost-aware)."),
    device: str = typer.Option("auto", help="auto | cpu | cuda."),
) -> None:
    """Cost-aware budget vs fixed budgets: offline replay and live decode on the trained pair."""
    from kdtree import nb_live
    from kdtree.bench.schema import append_rows, read_rows
    from kdtree.scale.budget_bench import run_budget
    from kdtree.scale.spec import K2_REFERENCE
    from kdtree.scale.tables import pick_providers, step_model_from_rows

    dev = _device(device)
    pair = nb_live.load_pair(str(dev), config="tiny-mla")
    ps = [nb_live.prompt_ids(pair, t, seed=i) for i, t in enumerate(_TEXTS[: max(1, prompts)])]
    k2_model = None
    if k2_csv is not None:
        df = read_rows(k2_csv)
        gpu = df[~df["device"].astype(str).str.startswith("cpu")]
        df = gpu if len(gpu) else df
        ap, mp = pick_providers(df)
        k2_model = step_model_from_rows(df, K2_REFERENCE, attn_provider=ap, moe_provider=mp)
    rows, summary = run_budget(pair.target, pair.drafter, ps, source=pair.source,
                               fixed_budgets=_ints(fixed, "fixed"),
                               candidates=_ints(candidates, "candidates"), top_k=top_k,
                               max_new_tokens=new_tokens, k2_model=k2_model,
                               k2_context=k2_context, k2_fixed_ms=k2_fixed_ms, live=live,
                               log=_log)  # fmt: skip
    path = Path(out) / "budget.csv"
    n = append_rows(path, rows)
    _table(f"budget policy ({pair.source} pair)",
           [r for r in rows if r.metric == "tokens_per_s"], ("name", "provider"))  # fmt: skip
    print(json.dumps({"suite": "budget", "rows": n, "csv": str(path), **summary}, default=str))


def register(bench_app: typer.Typer) -> None:
    """Add ``k2-layer``, ``moe-load`` and ``budget`` to ``kdtree bench``."""
    bench_app.command("k2-layer")(k2_layer_cmd)
    bench_app.command("moe-load")(moe_load_cmd)
    bench_app.command("budget")(budget_cmd)


app = typer.Typer(help="Kimi-K2 scale benchmarks (k2-layer, moe-load, budget).",
                  no_args_is_help=True)  # fmt: skip
register(app)

if __name__ == "__main__":
    app()
