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
replicated: every rank drafts the same block. ``step`` repeats ``SpecEngine.step`` with those
two calls swapped; see the report of issue 10 for the engine hook that would remove the copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from kdtree.profiler import step as profiler_step
from kdtree.spec.accept import Acceptance, walk_trees
from kdtree.spec.commit import commit_kv, drafter_context_update
from kdtree.spec.engine import EngineState, SpecEngine
from kdtree.spec.records import GenerateResult, StepRecord
from kdtree.spec.tree import BatchedTrees, build_trees, chain_tree, pad_trees
from kdtree.spec.verify import prepare_for_verify
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

    # ------------------------------------------------------------------ draft + tree

    def _local_draft_logits(self, state: EngineState) -> torch.Tensor:
        bonus = torch.tensor(state.bonus, dtype=torch.int64).to(self.device)
        start = torch.tensor(state.context_lens, dtype=torch.int64).to(self.device)
        head = getattr(self.drafter, "lm_head", None)
        if isinstance(head, VocabParallelLMHead) and hasattr(self.drafter, "forward_block"):
            logits = draft_local(self.drafter, state.draft_ctx, bonus, start)
        else:  # a drafter with full-vocabulary rows: take this rank's columns
            logits = self.shard.slice_full(self.drafter.draft(state.draft_ctx, bonus, start))
        if logits.dim() != 3 or logits.shape[:2] != (state.batch, self.block_size - 1):
            raise ValueError(
                f"drafter: expected logits [{state.batch}, {self.block_size - 1}, V], got "
                f"{tuple(logits.shape)}"
            )
        return logits

    def _build(self, state: EngineState, times: dict[str, float]) -> BatchedTrees:
        if self.mode == "ar":
            return pad_trees([chain_tree([], b) for b in state.bonus], 1)
        with self._phase("draft", times):
            local = self._local_draft_logits(state)
        with self._phase("tree_build", times):
            if self.mode == "chain":
                proposals = dist_argmax(local, self.shard, self.tp).cpu()
                trees = [chain_tree(proposals[b], state.bonus[b]) for b in range(state.batch)]
                return pad_trees(trees, self.tree_size)
            lp, tok = dist_topk(local, self.top_k, self.shard, self.tp)
            return build_trees(lp, tok, self.budget, state.bonus)

    # ------------------------------------------------------------------ one step

    @torch.no_grad()
    def step(self, state: EngineState) -> StepRecord:
        """One speculative step (``SpecEngine.step`` on sharded logits)."""
        active = state.active
        if not active:
            raise RuntimeError("step: every request of this state has finished")
        times: dict[str, float] = {}
        prefix = state.context_lens
        trees = self._build(state, times)
        with self._phase("prepare_for_verify", times):
            vin = prepare_for_verify(
                state.cache, state.reqs, trees, backend=self.backend, dense=self.dense_mask
            )
        with self._phase("verify", times):
            out = self.target(
                vin.input_ids,
                vin.positions,
                state.cache,
                vin.attn,
                return_taps=self.drafter is not None,
                gather_logits=False,
            )
        with self._phase("accept", times):
            post = dist_target_tokens(
                out.logits, self.temperature, self.shard, self.tp, self.generator
            )
            walks = walk_trees(trees.trees, post)
            accepts: list[Acceptance | None] = [
                walks[b] if not state.done[b] else None for b in range(state.batch)
            ]
        with self._phase("commit", times):
            commit_kv(
                state.cache, state.reqs, prefix, vin.slot_mapping, accepts,
                method=self.commit_method,
            )  # fmt: skip
            if self.drafter is not None:
                drafter_context_update(
                    self.drafter, state.draft_ctx, out.taps, vin.input_ids, accepts, prefix
                )
            emitted = self._emit(state, trees, accepts)
        profiler_step()
        rec = StepRecord(
            step=state.step_index,
            mode=self.mode,
            batch_index=tuple(active),
            tree_size=tuple(trees.sizes[b] for b in active),
            accepted_len=tuple(accepts[b].accepted_len for b in active),
            bonus_token=tuple(accepts[b].bonus for b in active),
            emitted=tuple(emitted[b] for b in active),
            context_len=tuple(prefix[b] for b in active),
            phase_ms=times,
        )
        state.step_index += 1
        return rec


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
