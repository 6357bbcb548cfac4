"""Batched sampling with the trained target: the drafter's training data.

DFlash drafters are trained on the *target's own* continuations (``ddtree_spec.md`` §1.3). This
module runs a plain batched autoregressive loop on the model's cached forward (paged MLA cache,
``prefill`` attention metadata with the committed prefix), with one temperature per row
(0 = greedy) so a batch mixes greedy and sampled continuations. All rows have the same prompt
length, so slots and positions are computed once, on the device, for the whole run.
"""

from __future__ import annotations

import torch

from kdtree.train.target import autocast


def sample_next(
    logits: torch.Tensor, temperature: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row of ``logits [B, V]``: argmax where ``temperature == 0``, else a sample
    from ``softmax(logits / temperature)`` (Gumbel-max, no host sync)."""
    if logits.dim() != 2 or temperature.shape != logits.shape[:1]:
        raise ValueError(
            f"logits [B, V] and temperature [B]: got {tuple(logits.shape)}, "
            f"{tuple(temperature.shape)}"
        )
    greedy = logits.argmax(-1)
    t = temperature.clamp(min=1e-6)[:, None].to(logits.dtype)
    u = torch.rand(logits.shape, generator=generator, device=logits.device).clamp_(1e-10, 1.0)
    sampled = (logits.float() / t - torch.log(-torch.log(u))).argmax(-1)
    return torch.where(temperature > 0, sampled, greedy)


@torch.no_grad()
def generate_batch(
    model,
    prompts: torch.Tensor,
    new_tokens: int,
    temperature: torch.Tensor,
    generator: torch.Generator | None = None,
    page_size: int = 16,
) -> torch.Tensor:
    """``prompts int64 [B, P]`` → ``[B, P + new_tokens]`` (prompt, then the continuation)."""
    from kdtree.attention import AttnMetadata
    from kdtree.cache import PagedKVCache

    if prompts.dim() != 2 or prompts.dtype != torch.int64:
        raise ValueError(
            f"prompts: expected int64 [B, P], got {prompts.dtype} {tuple(prompts.shape)}"
        )
    if new_tokens < 1:
        raise ValueError(f"new_tokens={new_tokens}: expected >= 1")
    device = model.device
    b, p = prompts.shape
    total = p + new_tokens
    cache_dtype = model.dtype
    cache = PagedKVCache.for_model(
        model.config,
        max_batch=b,
        max_len=total,
        page_size=page_size,
        dtype=cache_dtype,
        device=device,
    )
    reqs = list(range(b))
    cache.reserve(reqs, total)
    page_table = cache.batch_page_table(reqs)
    pos = torch.arange(total, device=device)
    slots = page_table.long()[:, pos // page_size] * page_size + pos % page_size  # [B, total]
    positions = pos.expand(b, total)
    temperature = temperature.to(device)
    out = torch.empty(b, total, dtype=torch.int64, device=device)
    out[:, :p] = prompts.to(device)
    was_training = model.training
    model.eval()
    try:
        cur, start, n = out[:, :p], 0, p
        for i in range(new_tokens):
            attn = AttnMetadata(
                mode="prefill",
                slot_mapping=slots[:, start : start + n],
                page_table=page_table,
                prefix_lens=torch.full((b,), start, dtype=torch.int32, device=device),
            )
            with autocast(device):
                logits = model(cur, positions[:, start : start + n], cache, attn).logits[:, -1]
            nxt = sample_next(logits.float(), temperature, generator)
            out[:, p + i] = nxt
            start, n = start + n, 1
            cur = out[:, p + i : p + i + 1]
    finally:
        model.train(was_training)
    return out


def temperature_mix(n: int, temperatures: tuple[float, ...]) -> torch.Tensor:
    """``float32 [n]``: the temperatures repeated in order (an even mix over rows)."""
    if not temperatures:
        raise ValueError("temperatures: expected at least one value")
    if any(t < 0 for t in temperatures):
        raise ValueError(f"temperatures={temperatures}: expected values >= 0")
    reps = -(-n // len(temperatures))
    return torch.tensor(temperatures * reps, dtype=torch.float32)[:n]


def prompt_windows(
    stream: torch.Tensor, n: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``n`` random windows of ``length`` tokens from a token stream (``int64 [n, length]``)."""
    if stream.numel() < length + 1:
        raise ValueError(f"stream has {stream.numel()} tokens, need > {length}")
    starts = torch.randint(0, stream.numel() - length, (n,), generator=generator)
    return stream[starts[:, None] + torch.arange(length)].long()
