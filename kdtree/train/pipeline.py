"""The reproducible pipeline: tokenizer → target → target-generated data → drafter → offline τ.

Every stage writes into one output folder (``data/models`` by default)::

    tokenizer.json
    target/   config.json  model.safetensors  model_card.md  training.json
    drafter/  config.json  model.safetensors  model_card.md  training.json

Weights are saved in bf16. ``train_all`` splits one wall-clock budget across the stages so a
fixed-length GPU session always finishes with both checkpoints written.
"""

from __future__ import annotations

import json
import math
import shutil
import tarfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from kdtree.train import card
from kdtree.train.anchors import default_gamma
from kdtree.train.corpus import (
    corpus_source,
    list_corpus,
    manifest,
    read_text,
    small_corpus_warnings,
    stdlib_root,
)
from kdtree.train.data import encode_files
from kdtree.train.evaluate import offline_tau
from kdtree.train.generate import generate_batch, prompt_windows, temperature_mix
from kdtree.train.optim import Deadline, resolve_device, seed_everything
from kdtree.train.presets import Preset, get_preset, target_config
from kdtree.train.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    eos_id,
    load_tokenizer,
    mask_id,
    train_tokenizer,
)

TARGET_DIR = "target"
DRAFTER_DIR = "drafter"
TOKENIZER_FILE = "tokenizer.json"
#: Share of ``train_all``'s budget per stage; ``eval`` (offline τ) and the rest are not
#: enforced: they are the slack for evaluation, loading and saving.
STAGE_SHARES = {"target": 0.52, "gen": 0.14, "drafter": 0.26, "eval": 0.03}


def shipped_models_dir() -> Path:
    from kdtree import env

    return Path(env.DATA_DIR) / "models"


def _log(msg: str) -> None:
    print(msg, flush=True)


def _warn_loudly(stage: str, warnings: list[str], log) -> None:
    """Each warning framed so it stands out in a long training log."""
    for w in warnings:
        bar = "!" * 78
        log(f"{bar}\n[{stage}] WARNING: {w}\n{bar}")


def _warning_lines(warnings: list[str]) -> str:
    return "".join(f"\n\n**WARNING:** {w}" for w in warnings)


# ----------------------------------------------------------------------------- tokenizer


def ensure_tokenizer(
    out_dir: str | Path,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    retrain: bool = False,
    log=_log,
    corpus_root: str | Path | None = None,
):
    """``out_dir/tokenizer.json``: reuse it, else copy the shipped one, else train it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TOKENIZER_FILE
    shipped = shipped_models_dir() / TOKENIZER_FILE
    if not retrain and path.is_file():
        return load_tokenizer(path)
    if not retrain and shipped.is_file() and shipped.resolve() != path.resolve():
        shutil.copyfile(shipped, path)
        log(f"[tokenizer] copied the shipped {shipped}")
        return load_tokenizer(path)
    return train_tokenizer_file(path, vocab_size, log=log, corpus_root=corpus_root)


def train_tokenizer_file(
    path: str | Path,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    log=_log,
    corpus_root: str | Path | None = None,
):
    """Train on the training split of the stdlib corpus and save to ``path``."""
    t0 = time.perf_counter()
    root = Path(corpus_root) if corpus_root is not None else stdlib_root()
    files = [f for f in list_corpus(root) if f.split == "train"]
    tok = train_tokenizer((read_text(root, f) for f in files), vocab_size)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    log(
        f"[tokenizer] trained {tok.get_vocab_size()} tokens on {len(files)} files in "
        f"{time.perf_counter() - t0:.1f}s -> {path}"
    )
    return tok


# ----------------------------------------------------------------------------- helpers


def save_bf16(model, directory: Path) -> None:
    """Save ``model`` with bf16 weights (the in-memory model keeps its dtype)."""
    from kdtree.models import save_pretrained

    dtype = next(model.parameters()).dtype
    model.to(torch.bfloat16)
    try:
        save_pretrained(model, directory)
    finally:
        model.to(dtype)


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_streams(tok, max_train_tokens: int | None = None, corpus_root: str | Path | None = None):
    """(corpus files, train stream, val stream) of the stdlib (or ``corpus_root``)."""
    root = Path(corpus_root) if corpus_root is not None else stdlib_root()
    files = list_corpus(root)
    train = encode_files(tok, [f for f in files if f.split == "train"], root, max_train_tokens)
    val = encode_files(tok, [f for f in files if f.split == "val"], root)
    return files, train, val


# ----------------------------------------------------------------------------- target


def run_target(
    out_dir: str | Path,
    preset: Preset,
    device: str = "auto",
    seed: int = 0,
    time_budget_s: float | None = None,
    progress: bool = True,
    log=_log,
    streams=None,
    corpus_root: str | Path | None = None,
) -> dict:
    """Train the target and write ``out_dir/target``; returns its metrics."""
    from kdtree.models import build_model
    from kdtree.train.target import extend_context, train_target

    dev = resolve_device(device)
    seed_everything(seed)
    out_dir = Path(out_dir)
    tok = ensure_tokenizer(out_dir, log=log, corpus_root=corpus_root)
    files, train, val = streams or load_streams(tok, corpus_root=corpus_root)
    files_root = corpus_root if corpus_root is not None else stdlib_root()
    source = corpus_source(files_root, files)
    log(
        f"[target] corpus: {train.numel()} train / {val.numel()} val tokens from "
        f"{source['root']} (Python {source['python_version']}); device {dev}"
    )
    warnings = small_corpus_warnings(
        int(train.numel()), preset.target.expected_train_tokens, source
    )
    _warn_loudly("target", warnings, log)
    cfg = target_config(preset.target, tok.get_vocab_size(), eos_id(tok))
    with torch.device("cpu"):
        model = build_model(cfg)
    model.init_weights(torch.Generator().manual_seed(seed))
    n_params = param_count(model)
    log(
        f"[target] MLA+MoE {n_params / 1e6:.2f}M parameters "
        f"(bf16 checkpoint {2 * n_params / 2**20:.1f} MiB), "
        f"{train.numel() / n_params:.2f} training tokens per parameter"
    )
    pt = preset.target
    extends = bool(pt.extend_seq_lens) and pt.extend_steps > 0
    t_stage = time.perf_counter()
    res = train_target(
        model,
        train,
        val,
        pt,
        dev,
        seed=seed,
        time_budget_s=(
            time_budget_s * (1 - pt.extend_budget_share)
            if extends and time_budget_s is not None
            else time_budget_s
        ),
        progress=progress,
        log=log,
    )
    ext = None
    if extends:  # what the main run left of the stage budget, at least the extension's share
        ext_budget = (
            None
            if time_budget_s is None
            else max(
                time_budget_s - (time.perf_counter() - t_stage),
                time_budget_s * pt.extend_budget_share,
            )
        )
        ext = extend_context(
            model, train, val, pt, dev, seed=seed, time_budget_s=ext_budget,
            progress=progress, log=log,
        )  # fmt: skip
    val_loss = ext.val_loss_after if ext else res.val_loss
    # with an extension the reported validation loss is the one after it
    ext_metrics = (
        {
            "val_loss_main_run": res.val_loss,
            "val_loss": val_loss,
            "val_ppl": math.exp(val_loss),
            "extension": _extension_metrics(ext),
        }
        if ext
        else {}
    )
    tdir = out_dir / TARGET_DIR
    save_bf16(model.cpu(), tdir)
    meta = {
        "training": {
            "preset": preset.name,
            "seed": seed,
            "steps_preset": preset.target.steps,
            "steps_planned": res.steps_planned,
            **{k: v for k, v in asdict(preset.target).items() if k != "steps"},
            "time_budget_s": time_budget_s,
            "optimizer": f"AdamW(0.9,0.95) wd {preset.target.weight_decay}",
            "selection": f"best validation loss, evaluated every {res.eval_every} steps; "
            f"early stop after {preset.target.patience} evaluations without a new best; "
            "best weights restored",
            "schedule": "warmup 4% + cosine to 10% (by steps or time)",
            "precision": "fp32 + TF32 matmuls" if dev.type == "cuda" else "fp32",
            "checkpoint_dtype": "bfloat16",
            "expert_balance": "aux-loss-free bias update, rate 1e-3",
            "train_tokens_corpus": int(train.numel()),
            "val_tokens_corpus": int(val.numel()),
            "train_tokens_per_param": train.numel() / n_params,
            "corpus_source": source,
        },
        "metrics": {
            **res.metrics(),
            **ext_metrics,
            "params": n_params,
            "checkpoint_bytes": (tdir / "model.safetensors").stat().st_size,
        },
        "environment": card.environment(),
        "config": {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "layers": cfg.num_hidden_layers,
            "heads": cfg.num_attention_heads,
            "experts": f"{cfg.n_routed_experts} routed top-{cfg.num_experts_per_tok} "
            f"+ {cfg.n_shared_experts} shared",
            "first_k_dense": cfg.first_k_dense_replace,
            "tied_embeddings": cfg.tie_word_embeddings,
        },
        "history": {
            str(h["step"]): {"val": round(h["val_loss"], 4), "train": round(h["train_loss"], 4)}
            for h in res.history
        },
    }
    if warnings:
        meta["warnings"] = {f"corpus_{i}": w for i, w in enumerate(warnings)}
    where = "an NVIDIA GPU" if dev.type == "cuda" else "the CPU"
    summary = (
        f"DeepSeek-V3 style MLA + MoE target trained from scratch on {where} "
        f"(preset `{preset.name}`) on the Python standard library. Validation loss "
        f"{val_loss:.3f} (perplexity {math.exp(val_loss):.1f}) on held-out modules"
        + (
            f" after the long-context extension below (main run: {res.val_loss:.3f})"
            if ext
            else ""
        )
        + ". Main run: the best "
        f"weights, of step {res.best_step} of {res.steps} run ({res.epochs:.2f} epochs, "
        f"{res.wall_s:.0f} s; stopped: {res.stop_reason}; last weights' validation loss "
        f"{res.last_val_loss:.3f}). Tokenizer: `../tokenizer.json`."
        + (_extension_summary(ext, res.val_loss) if ext else "")
        + _warning_lines(warnings)
    )
    card.write_card(
        tdir, f"kdtree target `{preset.name}`", summary, meta, manifest(files, files_root)
    )
    log(
        f"[target] done: val loss {val_loss:.3f} ppl {math.exp(val_loss):.1f} (best step "
        f"{res.best_step}), {res.steps} steps, {res.wall_s:.0f}s ({res.stopped_by}) -> {tdir}"
    )
    return {
        **res.metrics(),
        **ext_metrics,
        "params": n_params,
        "warnings": warnings,
        "dir": str(tdir),
    }


def _extension_metrics(ext) -> dict:
    """JSON-safe extension metrics (window lengths as string keys)."""
    m = ext.metrics()
    for k in ("steps_per_len", "tail_loss_before", "tail_loss_after"):
        m[k] = {str(n): v for n, v in m[k].items()}
    return m


def _extension_summary(ext, main_val: float) -> str:
    pairs = ", ".join(
        f"{n}: {ext.tail_loss_before[n]:.2f} → {ext.tail_loss_after[n]:.2f}"
        for n in ext.tail_loss_after
    )
    return (
        f" Then a long-context extension: {ext.steps} steps on windows of "
        f"{', '.join(str(n) for n in ext.steps_per_len)} tokens ({ext.wall_s:.0f} s, "
        f"{ext.tokens_seen / 1e6:.1f}M tokens). Held-out loss on the last {ext.tail} tokens of "
        f"a window, by window length, before → after: {pairs}. Short-window validation loss "
        f"{main_val:.3f} → {ext.val_loss_after:.3f} (the reported validation loss)."
    )


# ----------------------------------------------------------------------------- drafter data


def mixed_prompts(
    stream: torch.Tensor,
    n: int,
    length: int,
    generator: torch.Generator,
    doc=None,
    doc_share: float = 0.0,
    tok=None,
) -> torch.Tensor:
    """``int64 [n, length]``: ``n * doc_share`` (rounded half up) docstring-cut prompts from
    ``doc`` first, then random windows of ``stream``."""
    if not 0.0 <= doc_share <= 1.0:
        raise ValueError(f"doc_share={doc_share}: expected 0..1")
    n_doc = math.floor(n * doc_share + 0.5) if doc is not None else 0  # half up, not to even
    if n_doc and tok is None:
        raise ValueError("docstring prompts need the tokenizer (tok=...)")
    parts = []
    if n_doc:
        parts.append(doc.sample(tok, n_doc, length, generator))
    if n - n_doc:
        parts.append(prompt_windows(stream, n - n_doc, length, generator))
    return torch.cat(parts)


def doc_samplers(files, corpus_root, length: int):
    """Docstring-cut prompt samplers of the training and the validation split."""
    from kdtree.train.docprompts import CHARS_PER_TOKEN, DocPromptSampler

    root = Path(corpus_root) if corpus_root is not None else stdlib_root()
    min_chars = CHARS_PER_TOKEN * length
    return tuple(
        DocPromptSampler.from_files([f for f in files if f.split == split], root, min_chars)
        for split in ("train", "val")
    )


def make_draft_data(
    target,
    stream: torch.Tensor,
    n_sequences: int,
    prompt_len: int,
    new_tokens: int,
    batch: int,
    temperatures: tuple[float, ...],
    seed: int = 0,
    time_budget_s: float | None = None,
    progress: bool = True,
    doc=None,
    doc_share: float = 0.0,
    tok=None,
):
    """Target-generated continuations of random windows of ``stream`` (the drafter's data);
    with ``doc`` (a :class:`~kdtree.train.docprompts.DocPromptSampler`), ``doc_share`` of each
    batch's prompts end just past a function docstring instead."""
    from tqdm.auto import tqdm

    from kdtree.train.drafter import DraftData

    gen = torch.Generator().manual_seed(seed)
    dev_gen = torch.Generator(device=target.device).manual_seed(seed + 1)
    deadline = Deadline(time_budget_s)
    toks, temps = [], []
    done = 0
    bar = tqdm(total=n_sequences, desc="generate", disable=not progress, mininterval=2.0)
    while done < n_sequences and (not toks or not deadline.expired()):
        n = min(batch, n_sequences - done)
        prompts = mixed_prompts(stream, n, prompt_len, gen, doc, doc_share, tok)
        temp = temperature_mix(n, temperatures)
        out = generate_batch(target, prompts, new_tokens, temp, generator=dev_gen)
        toks.append(out.cpu())
        temps.append(temp)
        done += n
        bar.update(n)
    bar.close()
    tokens = torch.cat(toks)
    loss_mask = torch.zeros_like(tokens, dtype=torch.bool)
    loss_mask[:, prompt_len:] = True
    return DraftData(tokens, loss_mask, torch.cat(temps))


# ----------------------------------------------------------------------------- drafter


def load_target(out_dir: str | Path, device: torch.device):
    from kdtree.models import load_model

    return load_model(Path(out_dir) / TARGET_DIR, device=device, dtype=torch.float32)


def run_drafter(
    out_dir: str | Path,
    preset: Preset,
    device: str = "auto",
    seed: int = 0,
    gen_budget_s: float | None = None,
    train_budget_s: float | None = None,
    progress: bool = True,
    log=_log,
    streams=None,
    corpus_root: str | Path | None = None,
    name: str = DRAFTER_DIR,
) -> dict:
    """Generate data with ``out_dir/target``, train the drafter, write ``out_dir/drafter``."""
    from kdtree.models import DFlashDrafter, dflash_config_for
    from kdtree.train.drafter import DraftVal, train_drafter

    dev = resolve_device(device)
    seed_everything(seed)
    out_dir = Path(out_dir)
    tok = ensure_tokenizer(out_dir, log=log, corpus_root=corpus_root)
    files, train, val = streams or load_streams(tok, corpus_root=corpus_root)
    target = load_target(out_dir, dev)
    d = preset.drafter
    if not 0.0 <= d.gen_doc_share <= 1.0:
        raise ValueError(f"gen_doc_share={d.gen_doc_share}: expected 0..1")
    doc_train = doc_val = None
    if d.gen_doc_share > 0:
        t0 = time.perf_counter()
        doc_train, doc_val = doc_samplers(files, corpus_root, d.gen_prompt_len)
        log(
            f"[drafter] docstring cuts: {len(doc_train)} train / {len(doc_val)} val; "
            f"{d.gen_doc_share:.0%} of prompts end at one ({time.perf_counter() - t0:.0f}s)"
        )
    t0 = time.perf_counter()
    data = make_draft_data(
        target,
        train,
        d.gen_sequences,
        d.gen_prompt_len,
        d.gen_new_tokens,
        d.gen_batch,
        d.temperatures,
        seed,
        gen_budget_s,
        progress,
        doc=doc_train,
        doc_share=d.gen_doc_share,
        tok=tok,
    )
    gen_s = time.perf_counter() - t0
    n_gen_tok = int(data.loss_mask.sum())
    log(f"[drafter] generated {len(data)} sequences ({n_gen_tok} tokens) in {gen_s:.0f}s")
    warnings = []
    if len(data) < 0.5 * d.gen_sequences:
        warnings.append(
            f"only {len(data)} of {d.gen_sequences} planned training sequences were generated "
            f"within the {gen_budget_s}s generation budget; steps are capped at "
            f"{d.max_epochs} epochs of them and early stopping keeps the best weights"
        )
    _warn_loudly("drafter", warnings, log)

    cfg = dflash_config_for(
        target.config,
        num_layers=d.num_layers,
        n_taps=d.n_taps,
        block_size=d.block_size,
        mask_token_id=mask_id(tok),
        target_name=TARGET_DIR,
        intermediate_size=d.intermediate,
    )
    # inference attends to at most the context the drafter is trained on (prompt + generation):
    # beyond it the relative positions are unseen and acceptance collapses with context length
    cfg.context_window = d.gen_prompt_len + d.gen_new_tokens
    with torch.device("cpu"):
        drafter = DFlashDrafter(cfg, target.cpu())
    drafter.init_weights(torch.Generator().manual_seed(seed))
    target.to(dev)
    n_params = param_count(drafter)
    log(
        f"[drafter] DFlash {cfg.num_hidden_layers} layers, taps {cfg.target_layer_ids}, "
        f"block {cfg.block_size}, {n_params / 1e6:.2f}M parameters"
    )
    # model selection: greedy continuations of held-out prompts (not the τ evaluation set; the
    # docstring cuts of the validation files are split by file between the two)
    doc_sel, doc_eval = doc_val.halves() if doc_val is not None else (None, None)
    n_sel = max(1, d.select_sequences)
    sel_prompts = mixed_prompts(
        val,
        n_sel,
        d.gen_prompt_len,
        torch.Generator().manual_seed(seed + 11),
        doc_sel,
        d.gen_doc_share,
        tok,
    )
    sel = generate_batch(target, sel_prompts, d.gen_new_tokens, torch.zeros(n_sel))
    select = DraftVal.build(sel.cpu(), d.gen_prompt_len, cfg.block_size, d.anchors_per_seq, seed)
    res = train_drafter(
        drafter,
        target,
        data,
        d,
        dev,
        seed=seed,
        time_budget_s=train_budget_s,
        progress=progress,
        log=log,
        val=select,
    )

    t1 = time.perf_counter()
    n_eval = max(1, d.eval_sequences)
    eval_prompts = prompt_windows(
        val, n_eval, d.gen_prompt_len, torch.Generator().manual_seed(seed + 7)
    )
    greedy, tau = _greedy_tau(target, drafter, eval_prompts, d, seed)
    log(
        f"[drafter] offline tau {tau.tau:.2f} on {tau.n_blocks} held-out blocks "
        f"(per-position acceptance {[round(x, 2) for x in tau.per_position[:6]]}...) "
        f"in {time.perf_counter() - t1:.0f}s"
    )
    tau_doc = None
    if doc_eval is not None:
        # the HumanEval shape on held-out modules: prompts cut just past a docstring
        doc_prompts = doc_eval.sample(
            tok, n_eval, d.gen_prompt_len, torch.Generator().manual_seed(seed + 13)
        )
        _, tau_doc = _greedy_tau(target, drafter, doc_prompts, d, seed)
        log(
            f"[drafter] offline tau {tau_doc.tau:.2f} on {tau_doc.n_blocks} held-out blocks "
            "after docstring cuts"
        )

    ddir = out_dir / name
    save_bf16(drafter.cpu(), ddir)  # written before the live check, which may fail
    drafter.to(dev)
    live = live_check(target, drafter, eval_prompts[:4], greedy[:4].cpu(), log)
    meta = {
        "training": {
            "preset": preset.name,
            "seed": seed,
            **asdict(d),
            "gen_sequences_done": len(data),
            "gen_tokens": n_gen_tok,
            "gen_wall_s": gen_s,
            "gen_budget_s": gen_budget_s,
            "train_budget_s": train_budget_s,
            "gamma": default_gamma(cfg.block_size),
            "steps_planned": res.steps_planned,
            "selection": f"best held-out loss on {n_sel} greedy continuations of validation "
            f"prompts, evaluated every {res.eval_every} steps; early stop after {d.patience} "
            "evaluations without a new best; best weights restored",
            "data": "continuations generated by ../target from random windows of the "
            "stdlib training split"
            + (
                f" ({d.gen_doc_share:.0%} of them from prompts cut just past a function "
                "docstring instead, the HumanEval shape)"
                if d.gen_doc_share > 0
                else ""
            )
            + "; loss on generated tokens only",
        },
        "metrics": {
            **res.metrics(),
            "params": n_params,
            "offline_tau": tau.tau,
            "offline_tau_blocks": tau.n_blocks,
            "offline_per_position": [round(x, 4) for x in tau.per_position],
            "offline_histogram": tau.as_dict()["histogram"],
            **({"offline_tau_doc": tau_doc.tau} if tau_doc is not None else {}),
            **{f"live_{k}": v for k, v in live.items()},
            "checkpoint_bytes": (ddir / "model.safetensors").stat().st_size,
        },
        "environment": card.environment(),
        "history": {
            str(h["step"]): {k: round(h[k], 4) for k in ("loss", "val_loss", "val_tau") if k in h}
            for h in res.history
        },
        "config": {
            "target_layer_ids": cfg.target_layer_ids,
            "block_size": cfg.block_size,
            "layers": cfg.num_hidden_layers,
            "mask_token_id": cfg.mask_token_id,
            "heads": cfg.num_attention_heads,
            "head_dim": cfg.head_dim,
        },
    }
    where = "an NVIDIA GPU" if dev.type == "cuda" else "the CPU"
    summary = (
        f"DFlash block drafter (block {cfg.block_size}, {cfg.num_hidden_layers} layers, "
        f"taps {cfg.target_layer_ids}) for `../target`, trained on {where} (preset "
        f"`{preset.name}`) on {len(data)} target-generated continuations. Offline "
        f"acceptance length on held-out modules (greedy): τ = {tau.tau:.2f}"
        + (f" (after docstring cuts: τ = {tau_doc.tau:.2f})" if tau_doc is not None else "")
        + ". Weights of step "
        f"{res.best_step} of {res.steps} run (best held-out loss {res.best_val_loss:.3f}; "
        f"stopped: {res.stop_reason})." + _warning_lines(warnings)
    )
    if warnings:
        meta["warnings"] = {f"data_{i}": w for i, w in enumerate(warnings)}
    card.write_card(ddir, f"kdtree DFlash drafter `{preset.name}`", summary, meta)
    log(
        f"[drafter] done: loss {res.train_loss:.3f}, {res.steps} steps, {res.wall_s:.0f}s "
        f"({res.stopped_by}) -> {ddir}"
    )
    return {
        **res.metrics(),
        "params": n_params,
        "offline_tau": tau.tau,
        "offline_tau_doc": tau_doc.tau if tau_doc is not None else None,
        "offline_per_position": tau.per_position,
        "live": live,
        "gen_sequences": len(data),
        "gen_tokens": n_gen_tok,
        "warnings": warnings,
        "dir": str(ddir),
    }


def _greedy_tau(target, drafter, prompts, d, seed: int):
    """(greedy continuations of ``prompts``, the drafter's offline τ on them)."""
    greedy = generate_batch(target, prompts, d.gen_new_tokens, torch.zeros(len(prompts)))
    tau = offline_tau(
        drafter,
        target,
        greedy.cpu(),
        gen_start=d.gen_prompt_len,
        anchors_per_seq=d.anchors_per_seq,
        seed=seed,
    )
    return greedy, tau


def live_check(target, drafter, prompts, greedy, log=_log) -> dict:
    """:func:`kdtree.train.evaluate.live_tau` for chain and tree; an engine failure is
    reported (logged and written to the card), not raised, so trained weights are kept."""
    from kdtree.train.evaluate import live_tau

    out: dict = {}
    for mode in ("chain", "tree"):
        try:
            r = live_tau(target, drafter, prompts, greedy, mode=mode)
        except Exception as exc:  # the engine is another module; keep the checkpoints
            out[f"{mode}_error"] = repr(exc)
            log(f"[drafter] live {mode} check FAILED: {exc!r}")
            continue
        out.update({f"{mode}_tau": r["tau"], f"{mode}_match_greedy": r["match_greedy"]})
        log(
            f"[drafter] live {mode} (engine, T=0): tau {r['tau']:.2f}, "
            f"{r['fwd_per_tok']:.3f} forwards/token, {100 * r['match_greedy']:.1f}% of tokens "
            "equal the target's greedy continuation"
        )
    return out


# ----------------------------------------------------------------------------- all + pack


def stage_budgets(total_s: float | None) -> dict[str, float | None]:
    if total_s is None:
        return dict.fromkeys(STAGE_SHARES)
    if total_s <= 0 or not math.isfinite(total_s):
        raise ValueError(f"time_budget_s={total_s}: expected a positive number of seconds")
    return {k: v * total_s for k, v in STAGE_SHARES.items()}


def train_all(
    out_dir: str | Path,
    preset: str | Preset = "h200",
    device: str = "auto",
    seed: int = 0,
    time_budget_s: float | None = None,
    pack_dir: str | Path | None = None,
    progress: bool = True,
    log=_log,
    corpus_root: str | Path | None = None,
    **overrides,
) -> dict:
    """Tokenizer (if missing) → target → drafter data → drafter → offline τ, within budget."""
    t0 = time.perf_counter()
    p = preset if isinstance(preset, Preset) else get_preset(preset, **overrides)
    stage_budgets(time_budget_s)  # validate before spending time
    out_dir = Path(out_dir)
    tok = ensure_tokenizer(out_dir, log=log, corpus_root=corpus_root)
    streams = load_streams(tok, corpus_root=corpus_root)
    # the budget covers the whole run: what setup used is taken off before the split
    left = (
        None
        if time_budget_s is None
        else max(time_budget_s - (time.perf_counter() - t0), 0.2 * time_budget_s)
    )
    budgets = stage_budgets(left)
    log(
        f"[all] preset {p.name}, budgets { ({k: round(v) for k, v in budgets.items() if v}) }, "
        f"setup {time.perf_counter() - t0:.0f}s"
    )
    tres = run_target(
        out_dir, p, device, seed, budgets["target"], progress, log, streams, corpus_root
    )
    if time_budget_s is not None:
        # a target that stopped early (epochs cap, early stop) leaves its time to the rest
        rest = max(time_budget_s - (time.perf_counter() - t0), 0.1 * time_budget_s)
        budgets = {k: rest * v / (1.0 - STAGE_SHARES["target"]) for k, v in STAGE_SHARES.items()}
        log(f"[all] drafter budgets { ({k: round(budgets[k]) for k in ('gen', 'drafter')}) }")
    dres = run_drafter(
        out_dir,
        p,
        device,
        seed,
        budgets["gen"],
        budgets["drafter"],
        progress,
        log,
        streams,
        corpus_root,
    )
    summary = {
        "preset": p.name,
        "wall_s": time.perf_counter() - t0,
        "target": tres,
        "drafter": dres,
        "out_dir": str(out_dir),
    }
    (out_dir / "train_all.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    if pack_dir is not None:
        summary["packed"] = [str(x) for x in pack(out_dir, pack_dir)]
    return summary


def pack(out_dir: str | Path, pack_dir: str | Path) -> list[Path]:
    """Few files for a transfer: ``target.tar.gz`` (target + tokenizer), ``drafter.tar.gz``
    (drafter + run summary). Unpack with ``tar xzf X -C data/models``."""
    out_dir, pack_dir = Path(out_dir), Path(pack_dir)
    pack_dir.mkdir(parents=True, exist_ok=True)
    groups = {
        "target.tar.gz": [TARGET_DIR, TOKENIZER_FILE],
        "drafter.tar.gz": [DRAFTER_DIR, "train_all.json"],
    }
    written = []
    for name, members in groups.items():
        path = pack_dir / name
        with tarfile.open(path, "w:gz") as tf:
            for m in members:
                if (out_dir / m).exists():
                    tf.add(out_dir / m, arcname=m)
        written.append(path)
    return written
