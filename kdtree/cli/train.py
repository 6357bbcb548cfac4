"""``kdtree train tokenizer|target|drafter|all``: reproduce the shipped models from scratch.

Each command prints progress, a summary table, and ends stdout with one JSON line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)

_OUT = typer.Option(None, "--out", help="Output folder (default: the shipped data/models).")
_PRESET = typer.Option("h200", "--preset", help="Size preset: h200 | cpu | toy.")
_DEVICE = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N.")
_SEED = typer.Option(0, "--seed", help="Seed of every random choice (init, data, anchors).")
_THREADS = typer.Option(
    0,
    "--threads",
    help="CPU threads for torch (0: 1 unless OMP_NUM_THREADS is set; "
    "more threads than free cores make torch spin).",
)
_PROGRESS = typer.Option(True, "--progress/--no-progress", help="Progress bars.")
_CORPUS = typer.Option(None, "--corpus-root", help="Corpus folder (default: the stdlib).")


def _setup(threads: int, out: Path | None) -> Path:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    elif not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    if out is None:
        from kdtree.train.pipeline import shipped_models_dir

        out = shipped_models_dir()
    return Path(out)


def _finish(title: str, result: dict) -> None:
    table = Table(title=title, show_header=False)
    for k, v in result.items():
        if isinstance(v, (dict, list)):
            continue
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console(stderr=False).print(table)
    print(json.dumps(result, default=str))


def _overrides(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


@app.command("tokenizer")
def tokenizer_cmd(
    out: Path = _OUT,
    vocab_size: int = typer.Option(
        8192, "--vocab-size", help="Total vocabulary (specials incl.)."
    ),
    corpus_root: Path = _CORPUS,
) -> None:
    """Train the byte-level BPE on the stdlib's training split (-> OUT/tokenizer.json)."""
    from kdtree.train.pipeline import TOKENIZER_FILE, train_tokenizer_file

    out = _setup(0, out)
    path = out / TOKENIZER_FILE
    tok = train_tokenizer_file(path, vocab_size, corpus_root=corpus_root)
    _finish("tokenizer", {"path": str(path), "vocab_size": tok.get_vocab_size()})


@app.command("target")
def target_cmd(
    out: Path = _OUT,
    preset: str = _PRESET,
    device: str = _DEVICE,
    seed: int = _SEED,
    steps: int = typer.Option(None, "--steps", help="Override the preset's step count."),
    batch_size: int = typer.Option(None, "--batch-size", help="Override the batch size."),
    time_budget_s: float = typer.Option(None, "--time-budget-s", help="Wall-clock cap."),
    threads: int = _THREADS,
    progress: bool = _PROGRESS,
    corpus_root: Path = _CORPUS,
) -> None:
    """Train the MLA + MoE target (-> OUT/target)."""
    from kdtree.train.pipeline import run_target
    from kdtree.train.presets import get_preset

    out = _setup(threads, out)
    p = get_preset(preset, **_overrides(target_steps=steps, target_batch_size=batch_size))
    res = run_target(out, p, device, seed, time_budget_s, progress, corpus_root=corpus_root)
    _finish("target", res)


@app.command("drafter")
def drafter_cmd(
    out: Path = _OUT,
    preset: str = _PRESET,
    device: str = _DEVICE,
    seed: int = _SEED,
    steps: int = typer.Option(None, "--steps", help="Override the preset's step count."),
    sequences: int = typer.Option(None, "--sequences", help="Generated training sequences."),
    kl_weight: float = typer.Option(None, "--kl-weight", help="Weight of KL to the target."),
    doc_share: float = typer.Option(
        None, "--doc-share", help="Share of prompts cut just past a docstring (0..1)."
    ),
    gen_budget_s: float = typer.Option(None, "--gen-budget-s", help="Cap on data generation."),
    time_budget_s: float = typer.Option(None, "--time-budget-s", help="Cap on training."),
    name: str = typer.Option("drafter", "--name", help="Output subfolder (A/B runs)."),
    threads: int = _THREADS,
    progress: bool = _PROGRESS,
    corpus_root: Path = _CORPUS,
) -> None:
    """Generate data with OUT/target, train the DFlash drafter (-> OUT/NAME), offline τ."""
    from kdtree.train.pipeline import run_drafter
    from kdtree.train.presets import get_preset

    out = _setup(threads, out)
    p = get_preset(
        preset,
        **_overrides(
            drafter_steps=steps,
            drafter_gen_sequences=sequences,
            drafter_kl_weight=kl_weight,
            drafter_gen_doc_share=doc_share,
        ),
    )
    res = run_drafter(
        out,
        p,
        device,
        seed,
        gen_budget_s,
        time_budget_s,
        progress,
        corpus_root=corpus_root,
        name=name,
    )
    _finish("drafter", res)


@app.command("all")
def all_cmd(
    out: Path = _OUT,
    preset: str = _PRESET,
    device: str = _DEVICE,
    seed: int = _SEED,
    time_budget_s: float = typer.Option(
        None, "--time-budget-s", help="Total wall-clock budget, split across the stages."
    ),
    target_steps: int = typer.Option(None, "--target-steps", help="Override target steps."),
    drafter_steps: int = typer.Option(None, "--drafter-steps", help="Override drafter steps."),
    kl_weight: float = typer.Option(None, "--kl-weight", help="Drafter KL-to-target weight."),
    doc_share: float = typer.Option(
        None, "--doc-share", help="Share of drafter prompts cut just past a docstring (0..1)."
    ),
    pack: Path = typer.Option(
        None, "--pack", help="Also write target.tar.gz + drafter.tar.gz into this folder."
    ),
    threads: int = _THREADS,
    progress: bool = _PROGRESS,
    corpus_root: Path = _CORPUS,
) -> None:
    """Tokenizer (if missing) → target → generated data → drafter → offline τ (→ pack)."""
    from kdtree.train.pipeline import train_all

    out = _setup(threads, out)
    res = train_all(
        out,
        preset,
        device,
        seed,
        time_budget_s,
        pack,
        progress,
        corpus_root=corpus_root,
        **_overrides(
            target_steps=target_steps,
            drafter_steps=drafter_steps,
            drafter_kl_weight=kl_weight,
            drafter_gen_doc_share=doc_share,
        ),
    )
    flat = {
        "preset": res["preset"],
        "wall_s": res["wall_s"],
        "target_val_loss": res["target"]["val_loss"],
        "target_val_ppl": res["target"]["val_ppl"],
        "target_steps": res["target"]["steps"],
        "drafter_steps": res["drafter"]["steps"],
        "offline_tau": res["drafter"]["offline_tau"],
        "offline_tau_doc": res["drafter"]["offline_tau_doc"],
        "out_dir": res["out_dir"],
    }
    _finish("train all", {**flat, "detail": res})
