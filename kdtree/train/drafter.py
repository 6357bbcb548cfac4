"""Train the DFlash drafter on target-generated continuations (``ddtree_spec.md`` §1.3-1.4).

Per step: the frozen target runs the clean sequences once (``no_grad``) for the tap features
(and its logits, for the optional KL term); random anchors are drawn among generated tokens;
the drafter's packed block-sparse forward (``DFlashDrafter.forward_train``) gives every block's
per-position logits through the target's frozen LM head; the loss is the γ-decayed
cross-entropy against same-position labels, plus ``kl_weight`` × KL(target ‖ drafter) at the
same positions when asked for. Steps are capped by epochs over the generated tokens; with a
held-out set (greedy continuations of validation prompts) the best weights by held-out loss are
kept and restored, and the run stops early when that loss stops improving.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kdtree.train.anchors import (
    IGNORE,
    default_gamma,
    loss_weights,
    make_blocks,
    sample_anchors,
    target_soft_labels,
)
from kdtree.train.early_stop import BestKeeper
from kdtree.train.evaluate import accepted_lengths, full_block_anchors
from kdtree.train.optim import Deadline, cosine_lr, make_adamw, set_lr
from kdtree.train.presets import DrafterPreset, eval_interval, planned_steps
from kdtree.train.target import autocast, enable_tf32


@dataclass
class DraftData:
    """Target-generated training sequences: ``tokens int64 [M, S]``, ``loss_mask bool [M, S]``
    (True on generated tokens), and the temperature each row was sampled at."""

    tokens: torch.Tensor
    loss_mask: torch.Tensor
    temperature: torch.Tensor

    def __post_init__(self) -> None:
        if self.tokens.shape != self.loss_mask.shape or self.tokens.dim() != 2:
            raise ValueError(
                f"tokens {tuple(self.tokens.shape)} / loss_mask "
                f"{tuple(self.loss_mask.shape)}: expected equal [M, S] shapes"
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]


@dataclass
class DrafterResult:
    steps: int  # steps run
    steps_planned: int  # the preset's steps after the max_epochs cap
    epochs: float  # anchor blocks seen per generated token
    wall_s: float
    train_loss: float
    train_acc1: float  # top-1 accuracy at block position 1
    stopped_by: str  # "steps" | "time" | "early_stop"
    stop_reason: str
    eval_every: int
    best_step: int  # step of the returned weights
    best_val_loss: float  # held-out loss of the returned weights (NaN without val data)
    best_val_tau: float  # held-out offline τ of the returned weights
    last_val_loss: float  # held-out loss of the last weights
    restored_best: bool
    history: list[dict]

    def metrics(self) -> dict:
        d = asdict(self)
        d.pop("history")
        return d


def freeze(model) -> None:
    for p in model.parameters():
        p.requires_grad_(False)


def drafter_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    target_logits: torch.Tensor | None = None,
    kl_weight: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """γ-weighted CE over ``logits [B, N, bs, V]`` vs ``labels [B, N, bs]`` (IGNORE skipped),
    normalised by the summed weight; plus ``kl_weight`` × weighted KL(target ‖ drafter) when
    ``target_logits [B, N, bs, V]`` (the target's logits for the same tokens) are given."""
    v = logits.shape[-1]
    keep = labels != IGNORE
    w = weights.to(logits.device)[None, None, :].expand_as(labels) * keep
    denom = w.sum().clamp(min=1e-6)
    ce = F.cross_entropy(
        logits.reshape(-1, v).float(), labels.clamp(min=0).reshape(-1), reduction="none"
    ).view_as(labels)
    loss = (ce * w).sum() / denom
    stats = {"ce": float(loss.detach())}
    if target_logits is not None and kl_weight > 0:
        logp = F.log_softmax(logits.float(), -1)
        logq = F.log_softmax(target_logits.float(), -1)
        kl = (logq.exp() * (logq - logp)).sum(-1)
        kl_term = (kl * w).sum() / denom
        loss = loss + kl_weight * kl_term
        stats["kl"] = float(kl_term.detach())
    with torch.no_grad():
        pos1 = keep[..., 1]
        hit = (logits[..., 1, :].argmax(-1) == labels[..., 1]) & pos1
        stats["acc1"] = float(hit.sum() / pos1.sum().clamp(min=1))
    return loss, stats


@dataclass
class DraftVal:
    """Held-out greedy target continuations with fixed full-block anchors: the data that picks
    the best drafter. ``tokens [M, S]``; anchors ``[M, N]`` inside the generated part."""

    tokens: torch.Tensor
    anchors: torch.Tensor
    gen_start: int

    @classmethod
    def build(
        cls, tokens: torch.Tensor, gen_start: int, block_size: int, anchors_per_seq: int, seed=0
    ) -> DraftVal:
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected [M, S], got {tuple(tokens.shape)}")
        gen = torch.Generator().manual_seed(seed)
        s = tokens.shape[1]
        anchors = torch.stack(
            [
                full_block_anchors(gen_start, s, block_size, anchors_per_seq, gen)
                for _ in range(tokens.shape[0])
            ]
        )
        return cls(tokens, anchors, gen_start)


@torch.no_grad()
def validate_drafter(
    drafter, target, val: DraftVal, weights: torch.Tensor, batch_size: int = 64
) -> dict[str, float]:
    """γ-weighted CE (``loss``), block-position-1 accuracy and offline τ (greedy acceptance
    length, bonus included) of ``drafter`` on ``val``; the modules' modes are kept."""
    device = drafter.device
    bs = drafter.config.block_size
    mask_id = drafter.config.mask_token_id
    was = drafter.training
    drafter.eval()
    tot_loss = tot_w = tot_hit = tot_pos1 = 0.0
    acc_all = []
    for ids, anchors in zip(
        val.tokens.split(batch_size), val.anchors.split(batch_size), strict=True
    ):
        ids, anchors = ids.to(device), anchors.to(device)
        lmask = torch.zeros_like(ids, dtype=torch.bool)
        lmask[:, val.gen_start :] = True
        valid = torch.ones_like(anchors, dtype=torch.bool)
        blocks = make_blocks(ids, lmask, anchors, valid, bs, mask_id)
        with autocast(device):
            taps = target.forward_dense(ids, return_taps=True).taps
            out = drafter.forward_train(taps, ids, anchors, valid)
        loss, stats = drafter_loss(out.logits, blocks.labels, weights)
        keep = blocks.labels != IGNORE
        wsum = float((weights.to(device)[None, None, :] * keep).sum())
        tot_loss += float(loss) * wsum
        tot_w += wsum
        n1 = float(keep[..., 1].sum())
        tot_hit += stats["acc1"] * n1
        tot_pos1 += n1
        pred = out.logits[:, :, 1:].argmax(-1)
        acc_all.append(accepted_lengths(pred, blocks.labels[:, :, 1:]).flatten().cpu())
    drafter.train(was)
    acc = torch.cat(acc_all).float()
    return {
        "loss": tot_loss / max(tot_w, 1e-9),
        "acc1": tot_hit / max(tot_pos1, 1.0),
        "tau": float(acc.mean() + 1),
    }


def train_drafter(
    drafter,
    target,
    data: DraftData,
    p: DrafterPreset,
    device: torch.device,
    seed: int = 0,
    time_budget_s: float | None = None,
    progress: bool = True,
    log=print,
    val: DraftVal | None = None,
    eval_every: int | None = None,
) -> DrafterResult:
    """Train ``drafter`` in place on ``data`` (the target stays frozen).

    Steps are ``p.steps`` cut to ``p.max_epochs`` passes over the generated tokens (in anchor
    blocks). With ``val``, every ``eval_every`` steps the held-out loss and τ are measured, the
    weights of the lowest held-out loss are kept on the CPU and restored at the end, and the run
    stops after ``p.patience`` evaluations without a new best.
    """
    from tqdm.auto import tqdm

    enable_tf32(device)
    freeze(target)
    target.to(device).eval()
    drafter.to(device).train()
    bs = drafter.config.block_size
    mask_id = drafter.config.mask_token_id
    weights = loss_weights(bs, default_gamma(bs), device=device)
    gen = torch.Generator().manual_seed(seed)
    m = len(data)
    blocks_per_step = min(p.batch_size, m) * p.anchors_per_seq
    gen_tokens = max(1, int(data.loss_mask.sum()))
    steps, _ = planned_steps(p.steps, blocks_per_step, gen_tokens, p.max_epochs)
    if eval_every is None:
        eval_every = eval_interval(steps, p.eval_every, p.min_evals)
    if eval_every < 1:
        raise ValueError(f"eval_every={eval_every}: expected >= 1")
    if steps < p.steps:
        log(
            f"[drafter] {p.steps} steps would be {p.steps * blocks_per_step / gen_tokens:.1f} "
            f"epochs of {gen_tokens} generated tokens: capped at {steps} steps "
            f"(max_epochs {p.max_epochs})"
        )
    opt = make_adamw(
        [q for q in drafter.parameters() if q.requires_grad], lr=p.lr, weight_decay=p.weight_decay
    )
    keeper = BestKeeper(patience=p.patience if val is not None else 0, mode="min")
    deadline = Deadline(time_budget_s)
    history: list[dict] = []
    stopped_by = "steps"
    ema_loss, ema_acc = math.nan, math.nan
    t0 = time.perf_counter()

    def _eval(at: int, stats: dict) -> bool:
        row = {"step": at, "loss": ema_loss, "acc1": ema_acc, "wall_s": time.perf_counter() - t0}
        row.update(stats)
        msg = f"[drafter] step {at}: loss {ema_loss:.3f} acc@1 {ema_acc:.3f}"
        stop = False
        if val is not None:
            v = validate_drafter(drafter, target, val, weights)
            stop = keeper.update(v["loss"], at, drafter)
            row.update({f"val_{k}": x for k, x in v.items()}, best=keeper.best_step == at)
            msg += (
                f"; val loss {v['loss']:.3f} acc@1 {v['acc1']:.3f} tau {v['tau']:.2f}; "
                f"best {keeper.best:.3f} @ {keeper.best_step}"
            )
        history.append(row)
        log(msg)
        return stop

    bar = tqdm(total=steps, desc="drafter", disable=not progress, mininterval=2.0)
    done = 0
    stats: dict = {}
    for step in range(steps):
        frac = deadline.progress(step, steps)
        if frac >= 1.0:
            stopped_by = "time"
            break
        set_lr(opt, cosine_lr(frac, p.lr))
        rows = torch.randint(0, m, (min(p.batch_size, m),), generator=gen)
        ids = data.tokens[rows].to(device, non_blocking=True)
        lmask = data.loss_mask[rows].to(device, non_blocking=True)
        anchors, valid = sample_anchors(lmask, p.anchors_per_seq, generator=gen)
        blocks = make_blocks(ids, lmask, anchors, valid, bs, mask_id)
        with torch.no_grad(), autocast(device):
            tout = target.forward_dense(ids, return_taps=True)
        soft = None
        if p.kl_weight > 0:
            soft = target_soft_labels(tout.logits, blocks.positions, blocks.labels)
        with autocast(device):
            out = drafter.forward_train(tout.taps, ids, blocks.anchors, blocks.valid)
        loss, stats = drafter_loss(out.logits, blocks.labels, weights, soft, p.kl_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        done = step + 1
        lv = float(loss.detach())
        ema_loss = lv if math.isnan(ema_loss) else 0.95 * ema_loss + 0.05 * lv
        ema_acc = stats["acc1"] if math.isnan(ema_acc) else 0.95 * ema_acc + 0.05 * stats["acc1"]
        bar.set_postfix(loss=f"{ema_loss:.3f}", acc1=f"{ema_acc:.2f}", refresh=False)
        bar.update(1)
        if done % eval_every == 0 and _eval(done, stats):
            stopped_by = "early_stop"
            break
    bar.close()
    if val is not None and (not history or history[-1]["step"] != done):
        _eval(done, stats)
    restored = val is not None and keeper.best_step != done and keeper.restore(drafter)
    drafter.eval()
    last = history[-1] if history else {}
    best_row = next((h for h in history if h["step"] == keeper.best_step), last)
    reason = {
        "steps": f"reached the planned {steps} steps",
        "time": f"wall-clock budget {time_budget_s}s used up at step {done}",
        "early_stop": f"no better held-out loss for {p.patience} evaluations "
        f"({p.patience * eval_every} steps) after step {keeper.best_step}",
    }[stopped_by]
    if val is not None:
        log(
            f"[drafter] stop at step {done}: {reason}; "
            + (
                f"restored the best weights of step {keeper.best_step} "
                f"(val loss {keeper.best:.3f}, tau {best_row.get('val_tau', math.nan):.2f}; "
                f"last {last.get('val_loss', math.nan):.3f})"
                if restored
                else f"the last weights are the best (val loss {keeper.best:.3f})"
            )
        )
    return DrafterResult(
        steps=done,
        steps_planned=steps,
        epochs=done * blocks_per_step / gen_tokens,
        wall_s=time.perf_counter() - t0,
        train_loss=ema_loss,
        train_acc1=ema_acc,
        stopped_by=stopped_by,
        stop_reason=reason,
        eval_every=eval_every,
        best_step=keeper.best_step if val is not None else done,
        best_val_loss=keeper.best if val is not None else math.nan,
        best_val_tau=best_row.get("val_tau", math.nan),
        last_val_loss=last.get("val_loss", math.nan),
        restored_best=bool(restored),
        history=history,
    )
