"""``TPSpecEngine``: the step engine on a tensor-parallel target, SPMD (every rank runs it in
lockstep on the same prompts).

Differences from :class:`kdtree.spec.engine.SpecEngine`, all on vocabulary-sharded logits:

* ``tree_build``: the drafter's logits stay sharded (DFlash drafters share the target's
  vocabulary-parallel LM head); per-depth top-K through :func:`kdtree.tp.decide.dist_topk`.
  ``chain``: proposals through :func:`dist_argmax`. Drafters that return full rows (test
  drafters) are cut to this rank's shard and go through the same path.
* ``verify`` runs the target with ``gather_logits=False``; ``accept`` picks the target's tokens
  with :func:`dist_target_tokens` (greedy: distributed argmax; sampling: rank 0 decides and
  broadcasts).
* ``prefill``: the first token is rank 0's, broadcast.

Every tree, walk and commit is then identical on all ranks. The drafter (its own layers) is
replicated: every rank drafts the same block. All of this goes through ``SpecEngine``'s hooks
(``_draft_logits``, ``_topk``, ``_argmax``, ``_target_tokens``, ``_verify_kwargs``); ``step`` and
``_build`` are the base engine's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from kdtree.spec.engine import EngineState, SpecEngine
from kdtree.spec.records import GenerateResult
from kdtree.tp.decide import dist_argmax, dist_target_tokens, dist_topk
from kdtree.tp.layers import VocabParallelLMHead
from kdtree.tp.model import _TPCausalLM

__all__ = ["TPSpecEngine", "draft_local", "generate_tp"]


def draft_local(drafter, ctx, bonus: torch.Tensor, start_positions: torch.Tensor):
    """The drafter's logits ``[B, bs - 1, per]`` on this rank's vocabulary shard: DFlash's
    ``draft`` with the LM head's local half (no all-gather)."""
    bs = drafter.config.block_size
    b = ctx.batch
    dev = ctx.lengths.device
    block = torch.full((b, bs), drafter.config.mask_token_id, dtype=torch.int64, device=dev)
    block[:, 0] = bonus.to(dev, torch.int64)
    positions = start_positions.to(dev, torch.int64)[:, None] + torch.arange(bs, device=dev)
    hidden = drafter.forward_block(ctx, block, positions)
    return drafter.lm_head.forward_local(hidden[:, 1:]).float()


class TPSpecEngine(SpecEngine):
    """Speculative decoding on a TP target (``kdtree.tp.shard_model`` / ``build_tp_model``);
    same arguments as ``SpecEngine``. ``generator`` matters on rank 0 only (it samples)."""

    def __init__(self, target, drafter=None, **kwargs) -> None:
        if not isinstance(target, _TPCausalLM):
            raise TypeError(
                f"target: expected a TP model (kdtree.tp.shard_model), got {type(target).__name__}"
            )
        super().__init__(target, drafter, **kwargs)
        self.tp = target.tp
        self.shard = target.vocab_shard
        self._verify_kwargs = {"gather_logits": False}

    @contextmanager
    def _phase(self, name: str, times: dict[str, float]) -> Iterator[None]:
        """``SpecEngine._phase``, also tagging the group's comm timer (if any) with ``name``."""
        timer = self.tp.timer
        if timer is not None:
            timer.phase = name
        try:
            with super()._phase(name, times):
                yield
        finally:
            if timer is not None:
                timer.phase = None

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | None = None,
        stop_tokens: Sequence[int] = (),
    ) -> EngineState:
        """``SpecEngine.prefill``, then rank 0's first tokens replace everyone's."""
        state = super().prefill(prompts, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens)
        if self.tp.size > 1:
            first = torch.tensor(state.bonus, dtype=torch.int64, device=self.device)
            first = self.tp.broadcast_from_first(first).tolist()
            state.bonus = [int(t) for t in first]
            state.tokens = [[t] for t in state.bonus]
            state.done = [t in state.stop_tokens or max_new_tokens == 1 for t in state.bonus]
        return state

    # ------------------------------------------------------------------ decision hooks

    def _draft_logits(self, state: EngineState) -> torch.Tensor:
        """This rank's shard of the drafter's logits ``[B, bs - 1, per]``."""
        bonus = torch.tensor(state.bonus, dtype=torch.int64).to(self.device)
        start = torch.tensor(state.context_lens, dtype=torch.int64).to(self.device)
        head = getattr(self.drafter, "lm_head", None)
        if isinstance(head, VocabParallelLMHead) and hasattr(self.drafter, "forward_block"):
            return draft_local(self.drafter, state.draft_ctx, bonus, start)
        # a drafter with full-vocabulary rows: take this rank's columns
        return self.shard.slice_full(self.drafter.draft(state.draft_ctx, bonus, start))

    def _topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return dist_topk(logits, k, self.shard, self.tp)

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return dist_argmax(logits, self.shard, self.tp)

    def _target_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        return dist_target_tokens(logits, self.temperature, self.shard, self.tp, self.generator)


def generate_tp(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    mode: str = "tree",
    max_new_tokens: int = 64,
    stop_tokens: Sequence[int] = (),
    **engine_kwargs,
) -> GenerateResult:
    """``kdtree.spec.generate`` on a TP target (every rank calls it with the same prompts and
    gets the same tokens)."""
    engine = TPSpecEngine(target, drafter, mode=mode, **engine_kwargs)
    state = engine.prefill(prompts, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens)
    steps = []
    while state.active:
        steps.append(engine.step(state))
    return GenerateResult(tokens=[list(t) for t in state.tokens], steps=steps, mode=mode)
