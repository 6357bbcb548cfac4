"""Offline acceptance: the drafter's block argmax against the target's greedy continuation.

On sequences the target generated *greedily* from held-out prompts, the target's greedy
continuation of any prefix ``x[:a+1]`` (inside the generated part) is ``x[a+1:]`` itself. So
at anchor ``a`` (the bonus token, whose own target feature is not yet known) the chain DFlash
step would accept the longest prefix of ``j = 1, 2, ...`` with ``argmax_j == x[a + j]``, and
τ = 1 + that length (the bonus counts), exactly as in the live loop at T = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdtree.train.target import autocast


@dataclass
class OfflineTau:
    tau: float  # mean acceptance length, bonus included (1 .. bs)
    per_position: list[float]  # P(draft j accepted | all before accepted), j = 1 .. bs-1
    histogram: dict[int, int]  # τ -> count
    n_blocks: int

    def as_dict(self) -> dict:
        return {
            "tau": self.tau,
            "per_position": self.per_position,
            "histogram": {str(k): v for k, v in self.histogram.items()},
            "n_blocks": self.n_blocks,
        }


def full_block_anchors(
    gen_start: int, seq_len: int, block_size: int, n: int, generator: torch.Generator
) -> torch.Tensor:
    """``n`` anchors (sorted, distinct when possible) with the whole block inside the generated
    part: ``gen_start <= a <= seq_len - block_size``."""
    hi = seq_len - block_size
    if hi < gen_start:
        raise ValueError(
            f"no anchor fits: generated part starts at {gen_start}, sequence length "
            f"{seq_len}, block size {block_size}"
        )
    span = hi - gen_start + 1
    pick = torch.randperm(span, generator=generator)[: min(n, span)]
    return (gen_start + pick).sort().values


def accepted_lengths(pred: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``pred, truth [..., bs-1]`` → number of leading matches ``[...]`` (int64)."""
    return (pred == truth).long().cumprod(-1).sum(-1)


@torch.no_grad()
def offline_tau(
    drafter,
    target,
    tokens: torch.Tensor,
    gen_start: int,
    anchors_per_seq: int = 16,
    batch_size: int = 64,
    seed: int = 0,
) -> OfflineTau:
    """Mean τ over random full blocks of greedy target continuations ``tokens [M, S]``."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens: expected [M, S], got {tuple(tokens.shape)}")
    device = drafter.device
    bs = drafter.config.block_size
    s = tokens.shape[1]
    gen = torch.Generator().manual_seed(seed)
    acc_all = []
    drafter.eval()
    target.eval()
    for rows in tokens.split(batch_size):
        ids = rows.to(device)
        anchors = torch.stack(
            [
                full_block_anchors(gen_start, s, bs, anchors_per_seq, gen)
                for _ in range(ids.shape[0])
            ]
        ).to(device)
        with autocast(device):
            taps = target.forward_dense(ids, return_taps=True).taps
            out = drafter.forward_train(taps, ids, anchors)
        pred = out.logits[:, :, 1:].argmax(-1)  # [B, N, bs-1]
        pos = anchors[:, :, None] + torch.arange(1, bs, device=device)
        truth = ids.gather(1, pos.flatten(1)).view_as(pos)
        acc_all.append(accepted_lengths(pred, truth).flatten().cpu())
    acc = torch.cat(acc_all)
    tau = acc.float() + 1
    per_pos = []
    for j in range(1, bs):
        reached = (acc >= j - 1).sum()
        per_pos.append(float((acc >= j).sum() / reached.clamp(min=1)))
    hist = {
        int(k): int(v) for k, v in zip(*torch.unique(tau.long(), return_counts=True), strict=True)
    }
    return OfflineTau(
        tau=float(tau.mean()), per_position=per_pos, histogram=hist, n_blocks=int(acc.numel())
    )


@torch.no_grad()
def live_tau(
    target,
    drafter,
    prompts: torch.Tensor,
    greedy: torch.Tensor,
    mode: str = "chain",
    budget: int = 16,
) -> dict:
    """The same pair in the real engine loop (``kdtree.spec.generate``, T = 0) on held-out
    prompts ``[n, P]``: mean τ, forwards per token, and the share of generated tokens equal to
    the target's own greedy continuation ``greedy [n, P + G]`` (lossless ⇒ 1.0 up to fp ties)."""
    from kdtree.spec import generate

    p = prompts.shape[1]
    g = greedy.shape[1] - p
    res = generate(
        target,
        drafter,
        prompts.tolist(),
        mode=mode,
        budget=budget,
        max_new_tokens=g,
        temperature=0.0,
    )
    same = total = 0
    for row, toks in zip(greedy[:, p:].tolist(), res.tokens, strict=True):
        n = min(len(row), len(toks))
        same += sum(a == b for a, b in zip(row[:n], toks[:n], strict=True))
        total += len(row)
    return {
        "mode": mode,
        "tau": res.tau_mean,
        "fwd_per_tok": res.target_forwards_per_token,
        "match_greedy": same / max(total, 1),
        "prompts": int(prompts.shape[0]),
    }
