"""Train the DFlash drafter on target-generated continuations (``ddtree_spec.md`` §1.3-1.4).

Per step: the frozen target runs the clean sequences once (``no_grad``) for the tap features
(and its logits, for the optional KL term); random anchors are drawn among generated tokens;
the drafter's packed block-sparse forward (``DFlashDrafter.forward_train``) gives every block's
per-position logits through the target's frozen LM head; the loss is the γ-decayed
cross-entropy against same-position labels, plus ``kl_weight`` × KL(target ‖ drafter) at the
same positions when asked for.
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
from kdtree.train.optim import Deadline, cosine_lr, make_adamw, set_lr
from kdtree.train.presets import DrafterPreset
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
    steps: int
    wall_s: float
    train_loss: float
    train_acc1: float  # top-1 accuracy at block position 1
    stopped_by: str
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
) -> DrafterResult:
    """Train ``drafter`` in place on ``data`` (the target stays frozen)."""
    from tqdm.auto import tqdm

    enable_tf32(device)
    freeze(target)
    target.to(device).eval()
    drafter.to(device).train()
    bs = drafter.config.block_size
    mask_id = drafter.config.mask_token_id
    weights = loss_weights(bs, default_gamma(bs), device=device)
    gen = torch.Generator().manual_seed(seed)
    opt = make_adamw([q for q in drafter.parameters() if q.requires_grad], lr=p.lr)
    deadline = Deadline(time_budget_s)
    history: list[dict] = []
    stopped_by = "steps"
    ema_loss, ema_acc = math.nan, math.nan
    t0 = time.perf_counter()
    bar = tqdm(total=p.steps, desc="drafter", disable=not progress, mininterval=2.0)
    step = 0
    m = len(data)
    for step in range(p.steps):
        frac = deadline.progress(step, p.steps)
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
        lv = float(loss.detach())
        ema_loss = lv if math.isnan(ema_loss) else 0.95 * ema_loss + 0.05 * lv
        ema_acc = stats["acc1"] if math.isnan(ema_acc) else 0.95 * ema_acc + 0.05 * stats["acc1"]
        bar.set_postfix(loss=f"{ema_loss:.3f}", acc1=f"{ema_acc:.2f}", refresh=False)
        bar.update(1)
        if (step + 1) % 200 == 0:
            history.append(
                {
                    "step": step + 1,
                    "loss": ema_loss,
                    "acc1": ema_acc,
                    "wall_s": time.perf_counter() - t0,
                    **stats,
                }
            )
            log(f"[drafter] step {step + 1}: loss {ema_loss:.3f} acc@1 {ema_acc:.3f}")
    else:
        step = p.steps
    bar.close()
    drafter.eval()
    return DrafterResult(
        steps=step,
        wall_s=time.perf_counter() - t0,
        train_loss=ema_loss,
        train_acc1=ema_acc,
        stopped_by=stopped_by,
        history=history,
    )
