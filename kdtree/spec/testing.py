"""Drafters with known acceptance, for tests and the demo.

Both follow the drafter interface of ``docs/ARCHITECTURE.md`` (``block_size``, ``new_context``,
``append_context``, ``draft``). :class:`OracleDrafter` additionally sets ``needs_tokens = True``:
the engine then also hands it the committed token ids through ``append_tokens(ctx, tokens [B, N],
lengths [B])`` — a real DFlash drafter works from tap features alone and never needs this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["OracleDrafter", "RandomDrafter"]


def _check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size={block_size!r}: expected an integer >= 2")
    return block_size


@dataclass
class _TokenContext:
    tokens: list[list[int]] = field(default_factory=list)


class OracleDrafter:
    """Proposes the target's own greedy continuation: ``draft`` row ``j`` is the target's logits
    at the ``j``-th position of its greedy continuation after ``[committed .. bonus]``.

    At temperature 0 every proposal is accepted (τ = ``block_size`` up to near-ties in the
    logits); the rows are the target's real distributions, so the top-K branches of a tree are
    meaningful too. Runs ``block_size - 1`` dense target forwards per request per draft: tiny
    models only.
    """

    needs_tokens = True

    def __init__(self, target, block_size: int = 8) -> None:
        self.target = target
        self.block_size = _check_block_size(block_size)

    def new_context(self, batch: int, max_len: int, device) -> _TokenContext:
        return _TokenContext([[] for _ in range(batch)])

    def append_context(self, ctx, taps_new, positions_new, lengths_new) -> None:
        """Tap features are not used: the oracle reads token ids (``append_tokens``)."""
        return None

    def append_tokens(self, ctx: _TokenContext, tokens: torch.Tensor, lengths) -> None:
        rows = tokens.tolist()
        for b, n in enumerate(torch.as_tensor(lengths).tolist()):
            ctx.tokens[b].extend(rows[b][: int(n)])

    @torch.no_grad()
    def draft(self, ctx: _TokenContext, bonus: torch.Tensor, start_positions) -> torch.Tensor:
        D = self.block_size - 1
        device = self.target.device
        out = []
        for b, root in enumerate(bonus.tolist()):
            seq = [*ctx.tokens[b], int(root)]
            rows = []
            for _ in range(D):
                ids = torch.tensor([seq], dtype=torch.int64, device=device)
                logits = self.target.forward_dense(ids).logits[0, -1].float()
                rows.append(logits)
                seq.append(int(logits.argmax()))
            out.append(torch.stack(rows))
        return torch.stack(out)


class RandomDrafter:
    """Random draft logits from a private generator: proposals are mostly rejected (τ ≈ 1)."""

    needs_tokens = False

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 8,
        *,
        scale: float = 3.0,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size}: expected >= 1")
        self.vocab_size = vocab_size
        self.block_size = _check_block_size(block_size)
        self.scale = scale
        self.device = torch.device(device)
        self.generator = generator or torch.Generator().manual_seed(0)

    def new_context(self, batch: int, max_len: int, device) -> None:
        return None

    def append_context(self, ctx, taps_new, positions_new, lengths_new) -> None:
        return None

    def draft(self, ctx, bonus: torch.Tensor, start_positions) -> torch.Tensor:
        B = bonus.shape[0]
        logits = torch.randn(
            B, self.block_size - 1, self.vocab_size, generator=self.generator, dtype=torch.float32
        )
        return (logits * self.scale).to(bonus.device)
