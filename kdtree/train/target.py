"""Train the MLA + MoE target on the stdlib corpus (next-token cross-entropy).

fp32 with TF32 matmuls on CUDA (fp32 on the CPU), AdamW with warmup + cosine, gradient clipping,
DeepSeek-V3's auxiliary-loss-free expert balancing (the router's ``e_score_correction_bias`` is
nudged towards equal expert load after every step), a step count capped by epochs over the
corpus found, periodic validation on held-out modules with early stopping and restoring of the
best weights, and a wall-clock budget that ends the run early (the cosine schedule is then cut,
not stretched).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kdtree.train.data import WindowSampler
from kdtree.train.early_stop import BestKeeper
from kdtree.train.optim import Deadline, cosine_lr, make_adamw, set_lr
from kdtree.train.presets import TargetPreset, eval_interval, planned_steps


@dataclass
class TargetResult:
    steps: int  # steps run
    steps_planned: int  # the preset's steps after the max_epochs cap
    epochs: float  # passes over the training tokens
    tokens_seen: int
    wall_s: float
    train_loss: float
    val_loss: float  # of the returned (best) weights
    val_ppl: float
    stopped_by: str  # "steps" | "time" | "early_stop"
    stop_reason: str
    best_step: int
    best_val: float
    last_val_loss: float  # of the last weights, before the best were restored
    restored_best: bool
    eval_every: int
    expert_load_cv: float  # coefficient of variation of per-expert load (final eval)
    history: list[dict]

    def metrics(self) -> dict:
        d = asdict(self)
        d.pop("history")
        return d


def autocast(device: torch.device):
    """The numeric context of training forwards: fp32 weights and activations everywhere,
    with TF32 tensor-core matmuls on CUDA (see :func:`enable_tf32`).

    Not bf16 autocast: the models mix dtypes under autocast (RoPE tables follow the fp32
    embedding output while projections come out in bf16) and attention rejects mixed q/k/v
    dtypes. At this model size the step is launch-bound, so TF32 costs little.
    """
    return contextlib.nullcontext()


def enable_tf32(device: torch.device) -> None:
    """TF32 matmuls and convolutions on CUDA (no effect on the CPU)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``windows [B, S+1]`` (inputs ``[:, :-1]``)."""
    out = model.forward_dense(windows[:, :-1])
    logits = out.logits
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), windows[:, 1:].reshape(-1)
    )


@torch.no_grad()
def evaluate(model, batches: list[torch.Tensor], device: torch.device) -> tuple[float, float]:
    """(mean loss, expert-load coefficient of variation) over fixed validation batches."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    loads: dict[int, torch.Tensor] = {}
    for wins in batches:
        wins = wins.to(device)
        with autocast(device):
            loss = lm_loss(model, wins)
        total += float(loss) * wins.shape[0]
        n += wins.shape[0]
        for layer, idx in getattr(model, "last_routing", {}).items():
            cnt = torch.bincount(idx.reshape(-1), minlength=_n_experts(model)).float().cpu()
            loads[layer] = loads.get(layer, 0) + cnt
    model.train(was_training)
    cv = 0.0
    if loads:
        cvs = [float(c.std() / c.mean().clamp(min=1e-9)) for c in loads.values()]
        cv = sum(cvs) / len(cvs)
    return total / max(n, 1), cv


def _n_experts(model) -> int:
    return int(getattr(model.config, "n_routed_experts", 1))


@torch.no_grad()
def balance_experts(model, rate: float) -> None:
    """Aux-loss-free balancing: ``bias += rate * sign(mean_load - load)`` per MoE layer."""
    if rate <= 0:
        return
    n = _n_experts(model)
    for layer, idx in getattr(model, "last_routing", {}).items():
        router = model.model.layers[layer].mlp.gate
        load = torch.bincount(idx.reshape(-1), minlength=n).float()
        router.e_score_correction_bias += rate * torch.sign(load.mean() - load).to(
            router.e_score_correction_bias.device
        )


def train_step(model, opt, wins: torch.Tensor, balance_rate: float) -> torch.Tensor:
    """One optimiser step on ``wins [B, S+1]`` (loss, clipped backward, AdamW, expert
    balancing); returns the loss."""
    with autocast(wins.device):
        loss = lm_loss(model, wins)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    balance_experts(model, balance_rate)
    return loss


def validation_batches(val_stream: torch.Tensor, p: TargetPreset, seed: int) -> list[torch.Tensor]:
    """The fixed held-out ``seq_len`` windows every validation loss is measured on."""
    val_seq = min(p.seq_len, val_stream.numel() - 2)
    return WindowSampler(val_stream, val_seq, p.batch_size, seed=seed).fixed_batches(
        p.eval_batches
    )


def train_target(
    model,
    train_stream: torch.Tensor,
    val_stream: torch.Tensor,
    p: TargetPreset,
    device: torch.device,
    seed: int = 0,
    time_budget_s: float | None = None,
    eval_every: int | None = None,
    balance_rate: float = 1e-3,
    progress: bool = True,
    log=print,
) -> TargetResult:
    """Train ``model`` in place; returns metrics and a loss history.

    The step count is ``p.steps`` cut to ``p.max_epochs`` passes over ``train_stream``. Every
    ``eval_every`` steps (default: :func:`eval_interval` of the preset) the held-out loss is
    measured; the best weights are kept on the CPU and put back at the end, and the run stops
    once ``p.patience`` evaluations in a row brought no new best.
    """
    from tqdm.auto import tqdm

    enable_tf32(device)
    model.to(device).train()
    tokens_per_step = p.batch_size * p.seq_len
    steps, epochs = planned_steps(p.steps, tokens_per_step, train_stream.numel(), p.max_epochs)
    if eval_every is None:
        eval_every = eval_interval(steps, p.eval_every, p.min_evals)
    if eval_every < 1:
        raise ValueError(f"eval_every={eval_every}: expected >= 1")
    if steps < p.steps:
        log(
            f"[target] {p.steps} steps would be {p.steps * tokens_per_step / train_stream.numel():.1f}"
            f" epochs of {train_stream.numel()} tokens: capped at {steps} steps "
            f"({epochs:.2f} epochs, max_epochs {p.max_epochs})"
        )
    sampler = WindowSampler(train_stream, p.seq_len, p.batch_size, seed=seed)
    val_batches = validation_batches(val_stream, p, seed)
    opt = make_adamw(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    keeper = BestKeeper(patience=p.patience, mode="min")
    deadline = Deadline(time_budget_s)
    history: list[dict] = []
    stopped_by = "steps"
    ema = math.nan
    t0 = time.perf_counter()

    def _eval(at: int) -> bool:
        vl, cv = evaluate(model, val_batches, device)
        stop = keeper.update(vl, at, model)
        history.append(
            {
                "step": at,
                "train_loss": ema,
                "val_loss": vl,
                "wall_s": time.perf_counter() - t0,
                "expert_load_cv": cv,
                "best": keeper.best_step == at,
            }
        )
        log(
            f"[target] step {at}: train {ema:.3f} val {vl:.3f} (ppl {math.exp(vl):.1f}) "
            f"load-cv {cv:.2f}; best {keeper.best:.3f} @ {keeper.best_step}"
        )
        return stop

    bar = tqdm(total=steps, desc="target", disable=not progress, mininterval=2.0)
    done = 0
    for step in range(steps):
        frac = deadline.progress(step, steps)
        if frac >= 1.0:
            stopped_by = "time"
            break
        set_lr(opt, cosine_lr(frac, p.lr))
        wins = sampler.sample().to(device, non_blocking=True)
        loss = train_step(model, opt, wins, balance_rate)
        done = step + 1
        if step % 10 == 0 or done == steps:
            lv = float(loss.detach())
            ema = lv if math.isnan(ema) else 0.9 * ema + 0.1 * lv
            bar.set_postfix(loss=f"{ema:.3f}")
        bar.update(1)
        if done % eval_every == 0 and _eval(done):
            stopped_by = "early_stop"
            break
    bar.close()
    if not history or history[-1]["step"] != done:
        _eval(done)
    last_val = history[-1]["val_loss"]
    restored = keeper.best_step != done and keeper.restore(model)
    vl, cv = (
        evaluate(model, val_batches, device)
        if restored
        else (last_val, history[-1]["expert_load_cv"])
    )
    wall = time.perf_counter() - t0
    reason = {
        "steps": f"reached the planned {steps} steps",
        "time": f"wall-clock budget {time_budget_s}s used up at step {done}",
        "early_stop": f"no better validation loss for {p.patience} evaluations "
        f"({p.patience * eval_every} steps) after step {keeper.best_step}",
    }[stopped_by]
    log(
        f"[target] stop at step {done}: {reason}; "
        + (
            f"restored the best weights of step {keeper.best_step} "
            f"(val {vl:.3f}, last {last_val:.3f})"
            if restored
            else f"the last weights are the best (val {vl:.3f})"
        )
    )
    return TargetResult(
        steps=done,
        steps_planned=steps,
        epochs=done * tokens_per_step / train_stream.numel(),
        tokens_seen=done * tokens_per_step,
        wall_s=wall,
        train_loss=ema,
        val_loss=vl,
        val_ppl=math.exp(vl),
        stopped_by=stopped_by,
        stop_reason=reason,
        best_step=keeper.best_step,
        best_val=keeper.best,
        last_val_loss=last_val,
        restored_best=bool(restored),
        eval_every=eval_every,
        expert_load_cv=cv,
        history=history,
    )


# ----------------------------------------------------------------------------- context extension


@dataclass
class ExtensionResult:
    steps: int
    steps_planned: int
    steps_per_len: dict[int, int]
    tokens_seen: int
    wall_s: float
    stopped_by: str  # "steps" | "time"
    #: held-out loss on the last ``tail`` tokens of a window of each length, before / after
    tail_loss_before: dict[int, float]
    tail_loss_after: dict[int, float]
    tail: int
    #: the main run's validation loss (``seq_len`` windows) before / after the extension
    val_loss_before: float
    val_loss_after: float

    def metrics(self) -> dict:
        return asdict(self)


def tail_windows(stream: torch.Tensor, length: int, n: int) -> list[torch.Tensor]:
    """``n`` evenly spaced, fixed ``[1, length + 1]`` windows of ``stream`` (validation)."""
    return WindowSampler(stream, length, 1).fixed_batches(n)


@torch.no_grad()
def tail_loss(model, windows: list[torch.Tensor], tail: int, device: torch.device) -> float:
    """Mean next-token loss on the last ``tail`` positions of each window: how well the model
    predicts text ``length - tail`` tokens deep into a context (a model that only learned
    short windows degrades here even though its short-window loss is fine)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for wins in windows:
        wins = wins.to(device)
        with autocast(device):
            logits = model.forward_dense(wins[:, :-1]).logits[:, -tail:]
        total += float(
            F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), wins[:, -tail:].reshape(-1)
            )
        )
    model.train(was_training)
    return total / max(len(windows), 1)


def extend_context(
    model,
    train_stream: torch.Tensor,
    val_stream: torch.Tensor,
    p: TargetPreset,
    device: torch.device,
    seed: int = 0,
    time_budget_s: float | None = None,
    balance_rate: float = 1e-3,
    tail_windows_per_len: int = 2,
    progress: bool = True,
    log=print,
) -> ExtensionResult:
    """Long-context phase after :func:`train_target`: ``p.extend_steps`` steps (cut by
    ``time_budget_s``) on windows of ``p.extend_seq_lens`` in turn, ``p.extend_tokens_per_step``
    tokens a step, warmup + cosine to ``p.extend_lr``. The held-out tail loss at every length
    (and at ``seq_len``) and the short-window validation loss are measured before and after."""
    from tqdm.auto import tqdm

    if not p.extend_seq_lens or p.extend_steps < 1:
        raise ValueError("extend_context: the preset has no extension (extend_seq_lens/steps)")
    enable_tf32(device)
    model.to(device).train()
    lens = tuple(int(n) for n in p.extend_seq_lens)
    too_long = [n for n in lens if n + 2 > train_stream.numel()]
    if too_long:
        raise ValueError(
            f"extend_seq_lens {too_long}: longer than the {train_stream.numel()} train tokens"
        )
    eval_lens = sorted({p.seq_len, *lens})
    eval_lens = [n for n in eval_lens if n + 2 <= val_stream.numel() and n > p.extend_tail]
    tail = p.extend_tail
    evals = {n: tail_windows(val_stream, n, tail_windows_per_len) for n in eval_lens}
    val_batches = validation_batches(val_stream, p, seed)

    def measure() -> tuple[dict[int, float], float]:
        tails = {n: tail_loss(model, w, tail, device) for n, w in evals.items()}
        return tails, evaluate(model, val_batches, device)[0]

    deadline = Deadline(time_budget_s)  # the evaluation before training counts in the budget
    before, val_before = measure()
    log(
        "[extend] before: tail loss "
        + ", ".join(f"{n}: {v:.3f}" for n, v in before.items())
        + f"; val {val_before:.3f}"
    )
    samplers = {
        n: WindowSampler(train_stream, n, max(1, p.extend_tokens_per_step // n), seed=seed + 1 + i)
        for i, n in enumerate(lens)
    }
    opt = make_adamw(model.parameters(), lr=p.extend_lr, weight_decay=p.weight_decay)
    per_len = dict.fromkeys(lens, 0)
    tokens, done, stopped_by = 0, 0, "steps"
    t0 = time.perf_counter()
    bar = tqdm(total=p.extend_steps, desc="extend", disable=not progress, mininterval=2.0)
    for step in range(p.extend_steps):
        frac = deadline.progress(step, p.extend_steps)
        if frac >= 1.0:
            stopped_by = "time"
            break
        n = lens[step % len(lens)]
        set_lr(opt, cosine_lr(frac, p.extend_lr))
        wins = samplers[n].sample().to(device, non_blocking=True)
        loss = train_step(model, opt, wins, balance_rate)
        per_len[n] += 1
        tokens += wins.shape[0] * n
        done = step + 1
        bar.set_postfix(len=n, loss=f"{float(loss.detach()):.3f}")
        bar.update(1)
    bar.close()
    wall = time.perf_counter() - t0
    after, val_after = measure()
    log(
        f"[extend] {done} steps {per_len} in {wall:.0f}s ({stopped_by}); after: tail loss "
        + ", ".join(f"{n}: {v:.3f}" for n, v in after.items())
        + f"; val {val_after:.3f}"
    )
    return ExtensionResult(
        steps=done,
        steps_planned=p.extend_steps,
        steps_per_len=per_len,
        tokens_seen=tokens,
        wall_s=wall,
        stopped_by=stopped_by,
        tail_loss_before=before,
        tail_loss_after=after,
        tail=tail,
        val_loss_before=val_before,
        val_loss_after=val_after,
    )
