"""Train the MLA + MoE target on the stdlib corpus (next-token cross-entropy).

fp32 with TF32 matmuls on CUDA (fp32 on the CPU), AdamW with warmup + cosine, gradient clipping,
DeepSeek-V3's auxiliary-loss-free expert balancing (the router's ``e_score_correction_bias`` is
nudged towards equal expert load after every step), periodic validation on held-out modules,
and a wall-clock budget that ends the run early (the cosine schedule is then cut, not stretched).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kdtree.train.data import WindowSampler
from kdtree.train.optim import Deadline, cosine_lr, make_adamw, set_lr
from kdtree.train.presets import TargetPreset


@dataclass
class TargetResult:
    steps: int
    tokens_seen: int
    wall_s: float
    train_loss: float
    val_loss: float
    val_ppl: float
    stopped_by: str  # "steps" | "time"
    expert_load_cv: float  # coefficient of variation of per-expert load (last eval)
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


def train_target(
    model,
    train_stream: torch.Tensor,
    val_stream: torch.Tensor,
    p: TargetPreset,
    device: torch.device,
    seed: int = 0,
    time_budget_s: float | None = None,
    eval_every: int = 250,
    balance_rate: float = 1e-3,
    progress: bool = True,
    log=print,
) -> TargetResult:
    """Train ``model`` in place; returns metrics and a loss history."""
    from tqdm.auto import tqdm

    enable_tf32(device)
    model.to(device).train()
    sampler = WindowSampler(train_stream, p.seq_len, p.batch_size, seed=seed)
    val_seq = min(p.seq_len, val_stream.numel() - 2)
    val_batches = WindowSampler(val_stream, val_seq, p.batch_size, seed=seed).fixed_batches(
        p.eval_batches
    )
    opt = make_adamw(model.parameters(), lr=p.lr)
    deadline = Deadline(time_budget_s)
    history: list[dict] = []
    stopped_by = "steps"
    ema = math.nan
    t0 = time.perf_counter()
    bar = tqdm(total=p.steps, desc="target", disable=not progress, mininterval=2.0)
    step = 0
    for step in range(p.steps):
        frac = deadline.progress(step, p.steps)
        if frac >= 1.0:
            stopped_by = "time"
            break
        set_lr(opt, cosine_lr(frac, p.lr))
        wins = sampler.sample().to(device, non_blocking=True)
        with autocast(device):
            loss = lm_loss(model, wins)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        balance_experts(model, balance_rate)
        if step % 10 == 0 or step == p.steps - 1:
            lv = float(loss.detach())
            ema = lv if math.isnan(ema) else 0.9 * ema + 0.1 * lv
            bar.set_postfix(loss=f"{ema:.3f}")
        bar.update(1)
        if eval_every and (step + 1) % eval_every == 0:
            vl, cv = evaluate(model, val_batches, device)
            history.append(
                {
                    "step": step + 1,
                    "train_loss": ema,
                    "val_loss": vl,
                    "wall_s": time.perf_counter() - t0,
                    "expert_load_cv": cv,
                }
            )
            log(
                f"[target] step {step + 1}: train {ema:.3f} val {vl:.3f} "
                f"(ppl {math.exp(vl):.1f}) load-cv {cv:.2f}"
            )
    else:
        step = p.steps
    bar.close()
    steps_done = step if stopped_by == "time" else p.steps
    vl, cv = evaluate(model, val_batches, device)
    wall = time.perf_counter() - t0
    history.append(
        {
            "step": steps_done,
            "train_loss": ema,
            "val_loss": vl,
            "wall_s": wall,
            "expert_load_cv": cv,
        }
    )
    return TargetResult(
        steps=steps_done,
        tokens_seen=steps_done * p.batch_size * p.seq_len,
        wall_s=wall,
        train_loss=ema,
        val_loss=vl,
        val_ppl=math.exp(vl),
        stopped_by=stopped_by,
        expert_load_cv=cv,
        history=history,
    )
