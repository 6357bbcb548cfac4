"""The step engine: prefill, then ``draft → tree_build → prepare_for_verify → verify → accept →
commit`` per step, for the modes ``ar`` (plain decoding), ``chain`` (DFlash: verify the argmax
block) and ``tree`` (DDTree: best-first tree of ``budget`` nodes from top-``top_k`` per depth).

Every request of the batch takes part in every step (static shapes, as a CUDA-graph runner needs);
finished requests commit nothing and their outputs are ignored. Each phase is a profiler phase
and is also timed on the host into the step's :class:`~kdtree.spec.records.StepRecord`
(synchronising the device at each phase end only when ``timings=True``).

Subclasses change *how* a step decides, not the step itself, through these hooks (the
tensor-parallel engine ``kdtree.tp.engine.TPSpecEngine`` overrides them for vocabulary-sharded
logits; ``kdtree.scale.budget.CostAwareEngine`` sets ``budget_policy``):

* ``_draft_logits(state)`` → the drafter's logits ``[B, block_size - 1, V']`` (``draft`` phase);
* ``_topk(logits, k)`` → per-depth sorted ``(lp float32, tok int64) [B, D, k]`` (``tree``);
* ``_argmax(logits)`` → the proposal ids ``int64 [B, D]`` (``chain``);
* ``_target_tokens(logits)`` → the target's token at every node ``int64 [B, T]`` (``accept``);
* ``self._verify_kwargs`` → extra keyword arguments of the target call in ``verify``;
* ``budget_policy(expected, context_lens, active) -> B`` → the tree budget of this round
  (``tree``; see :meth:`SpecEngine._policy_budget`); ``fixed_tree_size`` says whether a smaller
  tree is padded to ``tree_size`` (default) or verified at ``B + 1`` nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kdtree.attention import AttnMetadata
from kdtree.cache import PagedKVCache
from kdtree.profiler import phase, step
from kdtree.spec.accept import Acceptance, target_tokens, walk_trees
from kdtree.spec.commit import commit_kv, drafter_context_update
from kdtree.spec.records import StepRecord
from kdtree.spec.tree import BatchedTrees, build_trees, chain_tree, draft_topk, pad_trees
from kdtree.spec.verify import prepare_for_verify

__all__ = ["MODES", "BudgetPolicy", "EngineState", "SpecEngine"]

MODES = ("ar", "chain", "tree")

#: ``policy(expected [batch, budget + 1] float64, context_lens [batch], active) -> B``:
#: ``expected[b, B]`` = ``E[τ | B]`` of request ``b``'s tree cut to ``B`` nodes (see
#: :meth:`SpecEngine._policy_budget`); returns one budget ``0 <= B <= engine.budget``.
BudgetPolicy = Callable[[np.ndarray, list[int], list[int]], int]


@dataclass
class EngineState:
    """Decode state of one batch; ``SpecEngine.step`` advances it in place.

    ``bonus`` is each request's next root token (chosen by the target, not yet in the KV cache);
    ``tokens`` the generated tokens (the prefill's first token included, prompt excluded).
    """

    cache: PagedKVCache
    reqs: list[int]
    bonus: list[int]
    tokens: list[list[int]]
    done: list[bool]
    draft_ctx: Any = None
    max_new_tokens: int | None = None
    stop_tokens: frozenset[int] = frozenset()
    prompt_lens: list[int] = field(default_factory=list)
    step_index: int = 0

    @property
    def batch(self) -> int:
        return len(self.reqs)

    @property
    def active(self) -> list[int]:
        return [b for b, d in enumerate(self.done) if not d]

    @property
    def context_lens(self) -> list[int]:
        return [self.cache.length(r) for r in self.reqs]


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}")
    return value


class SpecEngine:
    """Speculative decoding over a target and a drafter (see ``docs/ARCHITECTURE.md``).

    ``budget``: tree nodes besides the root (``tree``); ``top_k``: candidates per depth
    (``tree``). ``chain`` verifies the drafter's argmax block (``block_size`` tokens, root
    included). ``dense_mask=True`` runs the generic O(context) mask path (backend
    ``dense_mask``), the baseline. ``commit``: ``auto`` | ``copy`` | ``remap`` (page size 1).
    ``budget_policy`` (``tree`` only): picks each round's budget ``<= budget`` (module docstring).
    """

    #: Pad trees built at a policy's smaller budget to ``tree_size`` (static shapes, as a
    #: CUDA-graph runner needs). ``False``: verify ``B + 1`` nodes (the shape varies per round).
    fixed_tree_size: bool = True

    def __init__(
        self,
        target,
        drafter=None,
        *,
        mode: str = "tree",
        budget: int = 64,
        top_k: int = 8,
        temperature: float = 0.0,
        backend: str = "auto",
        device: torch.device | str | None = None,
        page_size: int = 16,
        dense_mask: bool = False,
        timings: bool = False,
        generator: torch.Generator | None = None,
        commit: str = "auto",
        max_len: int | None = None,
        budget_policy: BudgetPolicy | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        _check_int("budget", budget, 0)
        _check_int("top_k", top_k, 1)
        _check_int("page_size", page_size, 1)
        if not isinstance(temperature, int | float) or temperature < 0:
            raise ValueError(f"temperature={temperature!r}: expected a number >= 0")
        if commit not in ("auto", "copy", "remap"):
            raise ValueError(f"commit={commit!r}: expected 'auto', 'copy' or 'remap'")
        if mode != "ar" and drafter is None:
            raise ValueError(f"drafter: required for mode={mode!r}")
        if budget_policy is not None and not callable(budget_policy):
            raise TypeError(f"budget_policy: expected a callable, got {type(budget_policy)}")
        if budget_policy is not None and mode != "tree":
            raise ValueError(f"budget_policy: only for mode='tree', got mode={mode!r}")
        self.budget_policy = budget_policy
        #: Extra keyword arguments of the target call in ``verify`` (a TP target: no gather).
        self._verify_kwargs: dict[str, Any] = {}
        self.target = target
        self.drafter = drafter if mode != "ar" else None
        self.mode = mode
        self.budget = budget
        self.top_k = top_k
        self.temperature = float(temperature)
        want = torch.device(device) if device is not None else target.device
        have = target.device
        if want.type != have.type or (want.index is not None and want.index != have.index):
            raise ValueError(f"device={want}: the target lives on {have}")
        self.device = have  # "cuda" resolves to the target's "cuda:N"
        self.page_size = page_size
        self.dense_mask = dense_mask
        self.backend = "dense_mask" if dense_mask else backend
        if dense_mask and backend not in ("auto", "dense_mask"):
            raise ValueError(f"backend={backend!r}: dense_mask=True runs the 'dense_mask' backend")
        self.timings = timings
        self.commit_method = commit
        self.max_len = max_len
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0)
        if generator.device.type != self.device.type:
            raise ValueError(f"generator: on {generator.device}, expected {self.device}")
        self.generator = generator
        if self.drafter is not None:
            bs = getattr(drafter, "block_size", None)
            if bs is None:
                bs = drafter.config.block_size
            self.block_size = _check_int("drafter.block_size", int(bs), 2)
        else:
            self.block_size = 1
        if mode == "tree" and top_k > target.config.vocab_size:
            raise ValueError(
                f"top_k={top_k}: more than the vocabulary ({target.config.vocab_size})"
            )

    # ------------------------------------------------------------------ shapes

    @property
    def tree_size(self) -> int:
        """Padded nodes verified per request per step (``T``)."""
        if self.mode == "ar":
            return 1
        if self.mode == "chain":
            return self.block_size
        return self.budget + 1

    def _new_cache(self, batch: int, max_len: int) -> PagedKVCache:
        return PagedKVCache.for_model(
            self.target.config,
            max_batch=batch,
            max_len=max_len,
            page_size=self.page_size,
            dtype=self.target.dtype,
            device=self.device,
        )

    # ------------------------------------------------------------------ timing

    @contextmanager
    def _phase(self, name: str, times: dict[str, float]) -> Iterator[None]:
        t0 = time.perf_counter()
        with phase(name):
            yield
            if self.timings and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        times[name] = (time.perf_counter() - t0) * 1e3

    # ------------------------------------------------------------------ drafter plumbing

    def _feed_drafter(
        self,
        ctx,
        feats: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        lengths: torch.Tensor,
    ) -> None:
        """Give the drafter new committed positions (features, and token ids if it asks)."""
        self.drafter.append_context(ctx, feats, positions, lengths)
        if getattr(self.drafter, "needs_tokens", False):
            self.drafter.append_tokens(ctx, tokens, lengths)

    # ------------------------------------------------------------------ prefill

    @torch.no_grad()
    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | None = None,
        stop_tokens: Sequence[int] = (),
    ) -> EngineState:
        """Run the prompts through the target (one batched causal forward), sample the first
        token of each request and seed the drafter's context with the prompt's tap features."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: expected a non-empty list of non-empty token lists")
        if max_new_tokens is not None:
            _check_int("max_new_tokens", max_new_tokens, 1)
        vocab = self.target.config.vocab_size
        for i, p in enumerate(prompts):
            if min(p) < 0 or max(p) >= vocab:
                raise ValueError(f"prompts[{i}]: token ids must lie in [0, {vocab})")
        B = len(prompts)
        lens = [len(p) for p in prompts]
        P = max(lens)
        room = (max_new_tokens or 256) + self.tree_size + self.block_size
        cache = self._new_cache(B, self.max_len or P + room)
        reqs = list(range(B))
        cache.reserve(reqs, lens)
        ids = torch.zeros(B, P, dtype=torch.int64)
        slots = torch.full((B, P), -1, dtype=torch.int64)
        for b, p in enumerate(prompts):
            ids[b, : lens[b]] = torch.tensor(list(p), dtype=torch.int64)
            slots[b, : lens[b]] = cache.slots(b, 0, lens[b]).cpu()
        ids, slots = ids.to(self.device), slots.to(self.device)
        positions = torch.arange(P, dtype=torch.int64, device=self.device).expand(B, P)
        attn = AttnMetadata(
            mode="prefill",
            slot_mapping=slots,
            page_table=cache.batch_page_table(reqs),
            prefix_lens=torch.zeros(B, dtype=torch.int32, device=self.device),
            backend=self.backend,
        )
        out = self.target(ids, positions, cache, attn, return_taps=self.drafter is not None)
        last = torch.tensor([n - 1 for n in lens], device=self.device)
        last_logits = out.logits[torch.arange(B, device=self.device), last]  # [B, V]
        first = target_tokens(last_logits[:, None], self.temperature, self.generator)[:, 0]
        for b in reqs:
            cache.set_length(b, lens[b])
        ctx = None
        if self.drafter is not None:
            ctx = self.drafter.new_context(
                B, cache.max_pages_per_req * cache.page_size, self.device
            )
            lengths = torch.tensor(lens, dtype=torch.int64, device=self.device)
            self._feed_drafter(ctx, out.taps, ids, positions.contiguous(), lengths)
        bonus = [int(t) for t in first.tolist()]
        stops = frozenset(int(s) for s in stop_tokens)
        done = [t in stops or max_new_tokens == 1 for t in bonus]
        return EngineState(
            cache=cache,
            reqs=reqs,
            bonus=bonus,
            tokens=[[t] for t in bonus],
            done=done,
            draft_ctx=ctx,
            max_new_tokens=max_new_tokens,
            stop_tokens=stops,
            prompt_lens=lens,
        )

    @torch.no_grad()
    def synthetic_state(
        self, batch: int, context_len: int, generator: torch.Generator | None = None
    ) -> EngineState:
        """A state with ``context_len`` committed tokens of random K/V per request and no
        prefill: the whole cache is filled with N(0, 1) values, the drafter gets random tap
        features, bonus tokens are random. For timing a single step at long context."""
        _check_int("batch", batch, 1)
        _check_int("context_len", context_len, 1)
        gen = generator or torch.Generator().manual_seed(0)
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        dev_gen = torch.Generator(device=self.device).manual_seed(seed)
        slack = 4 * (self.tree_size + self.block_size)
        cache = self._new_cache(batch, self.max_len or context_len + slack)
        reqs = list(range(batch))
        cache.reserve(reqs, context_len)
        for b in reqs:
            cache.set_length(b, context_len)
        tensors = [*cache.k, *cache.v] if cache.kind == "gqa" else list(cache.kv)
        for t in tensors:
            t.copy_(
                torch.randn(t.shape, generator=dev_gen, device=self.device, dtype=torch.float32)
            )
        vocab = self.target.config.vocab_size
        bonus = torch.randint(0, vocab, (batch,), generator=dev_gen, device=self.device)
        ctx = None
        if self.drafter is not None:
            ctx = self.drafter.new_context(
                batch, cache.max_pages_per_req * cache.page_size, self.device
            )
            cfg = self.target.config
            n_feat = len(self.target.tap_layer_ids) * cfg.hidden_size
            feats = torch.randn(
                batch, context_len, n_feat, generator=dev_gen, device=self.device
            ).to(self.target.dtype)
            toks = torch.randint(
                0, vocab, (batch, context_len), generator=dev_gen, device=self.device
            )
            pos = torch.arange(context_len, device=self.device).expand(batch, context_len)
            lengths = torch.full((batch,), context_len, dtype=torch.int64, device=self.device)
            self._feed_drafter(ctx, feats, toks, pos.contiguous(), lengths)
        bonus_list = [int(t) for t in bonus.tolist()]
        return EngineState(
            cache=cache,
            reqs=reqs,
            bonus=bonus_list,
            tokens=[[] for _ in reqs],
            done=[False] * batch,
            draft_ctx=ctx,
            prompt_lens=[context_len] * batch,
        )

    # ------------------------------------------------------------------ decision hooks

    def _draft_logits(self, state: EngineState) -> torch.Tensor:
        """The drafter's logits for this step, ``[batch, block_size - 1, V]`` (hook)."""
        bonus = torch.tensor(state.bonus, dtype=torch.int64).to(self.device)
        start = torch.tensor(state.context_lens, dtype=torch.int64).to(self.device)
        return self.drafter.draft(state.draft_ctx, bonus, start)

    def _topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-depth sorted top-``k`` log-probs and token ids of the draft logits (hook)."""
        return draft_topk(logits, k)

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's argmax token ids ``int64 [batch, D]`` (``chain`` proposals; hook)."""
        return logits.argmax(dim=-1)

    def _target_tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's token at every verified node, ``int64 [batch, T]`` (hook)."""
        return target_tokens(logits, self.temperature, self.generator)

    def _policy_budget(self, state: EngineState, full: BatchedTrees) -> int:
        """Ask ``budget_policy`` for this round's budget, given the trees at the max budget.

        ``expected[b, B] = 1 + Σ_{1 <= i <= B} exp(score_i)`` (pop order; ``E[τ | B]``, DDTree
        Prop. 1 plus the bonus), held at its last value past a tree that ran dry."""
        expected = np.empty((state.batch, self.budget + 1), dtype=np.float64)
        for b, tree in enumerate(full.trees):
            q = np.exp(tree.scores.double().numpy())
            q[0] = 0.0
            e = 1.0 + np.cumsum(q)
            expected[b] = np.pad(e, (0, self.budget + 1 - len(e)), mode="edge")
        choice = self.budget_policy(expected, state.context_lens, state.active)
        if (
            isinstance(choice, bool)
            or not isinstance(choice, int | np.integer)
            or not 0 <= choice <= self.budget
        ):
            raise ValueError(
                f"budget_policy: returned {choice!r}, expected an integer in 0..{self.budget}"
            )
        return int(choice)

    # ------------------------------------------------------------------ one step

    def _build(self, state: EngineState, times: dict[str, float]) -> BatchedTrees:
        """``draft`` and ``tree_build`` phases (``ar``: the root alone, no phases)."""
        if self.mode == "ar":
            return pad_trees([chain_tree([], b) for b in state.bonus], 1)
        with self._phase("draft", times):
            logits = self._draft_logits(state)
        if logits.dim() != 3 or logits.shape[:2] != (state.batch, self.block_size - 1):
            raise ValueError(
                f"drafter.draft: expected logits [{state.batch}, {self.block_size - 1}, V], got "
                f"{tuple(logits.shape)}"
            )
        with self._phase("tree_build", times):
            if self.mode == "chain":
                proposals = self._argmax(logits).cpu()
                trees = [chain_tree(proposals[b], state.bonus[b]) for b in range(state.batch)]
                return pad_trees(trees, self.tree_size)
            lp, tok = self._topk(logits, self.top_k)
            full = build_trees(lp, tok, self.budget, state.bonus)
            if self.budget_policy is None:
                return full
            budget = self._policy_budget(state, full)
            if budget == self.budget:
                return full
            trees = build_trees(lp, tok, budget, state.bonus)  # = the first budget + 1 pops
            return pad_trees(trees.trees, self.tree_size) if self.fixed_tree_size else trees

    @torch.no_grad()
    def step(self, state: EngineState) -> StepRecord:
        """One speculative step for every unfinished request; advances ``state`` in place."""
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
                **self._verify_kwargs,
            )
        with self._phase("accept", times):
            post = self._target_tokens(out.logits)
            walks = walk_trees(trees.trees, post)
            accepts: list[Acceptance | None] = [
                walks[b] if not state.done[b] else None for b in range(state.batch)
            ]
        with self._phase("commit", times):
            commit_kv(
                state.cache,
                state.reqs,
                prefix,
                vin.slot_mapping,
                accepts,
                method=self.commit_method,
            )
            if self.drafter is not None:
                drafter_context_update(
                    self.drafter, state.draft_ctx, out.taps, vin.input_ids, accepts, prefix
                )
            emitted = self._emit(state, trees, accepts)
        step()
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

    def _emit(
        self, state: EngineState, trees: BatchedTrees, accepts: list[Acceptance | None]
    ) -> dict[int, int]:
        """Append accepted tokens + the new bonus to the outputs; apply stop / length limits."""
        emitted: dict[int, int] = {}
        for b, acc in enumerate(accepts):
            if acc is None:
                continue
            tree_tokens = trees.trees[b].tokens
            new = [int(tree_tokens[i]) for i in acc.path[1:]] + [acc.bonus]
            out = state.tokens[b]
            kept = 0
            for t in new:
                if state.max_new_tokens is not None and len(out) >= state.max_new_tokens:
                    state.done[b] = True
                    break
                out.append(t)
                kept += 1
                if t in state.stop_tokens:
                    state.done[b] = True
                    break
            if state.max_new_tokens is not None and len(out) >= state.max_new_tokens:
                state.done[b] = True
            emitted[b] = kept
            state.bonus[b] = acc.bonus
        return emitted
