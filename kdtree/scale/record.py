"""Engines that record, per verify round, what the budget policy and the expert-load statistics
need: the tree (scores in pop order, parents), the accepted path and the verify's routing.

Two facts make one recording at a large budget ``B_max`` answer questions about every smaller
budget exactly (greedy decoding):

* the tree of budget ``B`` is the first ``B + 1`` nodes of the ``B_max`` tree (pop order), and
  a node's target logits and routing depend only on its ancestors (the tree mask), so
* ``τ(B)`` = 1 + the accepted path's leading nodes with index ≤ ``B``, and the experts a
  ``B``-tree touches are those of the first ``B + 1`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from kdtree.spec.engine import EngineState, SpecEngine
from kdtree.spec.records import StepRecord

__all__ = ["RecordingEngine", "Round", "record_rounds", "tau_at_budget", "verify_backend"]


@dataclass
class Round:
    """One request's verify round: ``scores float64 [n]`` (root 0, pop order), ``parents``,
    ``path`` (accepted node indices, root first), ``context`` (prefix L) and ``routing``
    (MoE layer → ``int64 [n, k]`` experts chosen by the verify's tree tokens)."""

    scores: np.ndarray
    parents: np.ndarray
    path: tuple[int, ...]
    context: int
    routing: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.scores.shape[0])

    @property
    def expected_accepted(self) -> np.ndarray:
        """``E[τ | B]`` for ``B = 0 .. size-1``: ``1 + Σ_{i ≤ B} exp(score_i)`` (DDTree Prop. 1
        plus the bonus token)."""
        q = np.exp(self.scores.astype(np.float64))
        q[0] = 0.0
        return 1.0 + np.cumsum(q)


def tau_at_budget(path: Sequence[int], budget: int) -> int:
    """Accepted length (root included) if the tree had been cut to ``budget`` nodes: the path's
    leading nodes with index ≤ ``budget`` (indices increase along a path)."""
    if budget < 0:
        raise ValueError(f"budget={budget}: expected >= 0")
    n = 0
    for i in path:
        if i > budget:
            break
        n += 1
    return max(n, 1)


def verify_backend(target) -> str:
    """``"auto"`` unless the target's MLA shapes are ones the Triton kernel rejects on a GPU
    (latent and rope dims must be powers of two >= 16, e.g. the tiny random config's rope 8):
    then the torch ``"ref"`` backend."""
    cfg = target.config
    rank, rope = getattr(cfg, "kv_lora_rank", None), getattr(cfg, "qk_rope_head_dim", None)
    if rank is None or target.device.type != "cuda":
        return "auto"
    ok = all(x >= 16 and x & (x - 1) == 0 for x in (rank, rope))
    return "auto" if ok else "ref"


def _path_from_tokens(children: list[dict[int, int]], tokens: Sequence[int]) -> tuple[int, ...]:
    cur, path = 0, [0]
    for tok in tokens:
        nxt = children[cur].get(int(tok))
        if nxt is None:
            raise RuntimeError(f"emitted token {tok} is not a child of node {cur}")
        cur = nxt
        path.append(cur)
    return tuple(path)


class RecordingEngine(SpecEngine):
    """A tree-mode ``SpecEngine`` that appends a :class:`Round` per (request, step) to
    ``self.rounds`` (routing only for targets with ``last_routing``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.mode != "tree":
            raise ValueError(f"mode={self.mode!r}: RecordingEngine records trees ('tree' mode)")
        self.rounds: list[Round] = []
        self._trees = None

    def _build(self, state, times):
        trees = super()._build(state, times)
        self._trees = trees
        return trees

    @torch.no_grad()
    def step(self, state: EngineState) -> StepRecord:
        before = [len(t) for t in state.tokens]
        rec = super().step(state)
        routing = getattr(self.target, "last_routing", None) or {}
        for i, b in enumerate(rec.batch_index):
            tau, emitted = rec.accepted_len[i], rec.emitted[i]
            if emitted != tau:  # cut short by a stop token / max_new_tokens: path unknown
                continue
            tree = self._trees.trees[b]
            new = state.tokens[b][before[b] : before[b] + emitted]
            path = _path_from_tokens(tree.children, new[: tau - 1])
            n = tree.size
            self.rounds.append(
                Round(
                    scores=tree.scores.detach().cpu().double().numpy(),
                    parents=tree.parents.detach().cpu().numpy(),
                    path=path,
                    context=rec.context_len[i],
                    routing={
                        layer: idx[b, :n].detach().cpu().numpy() for layer, idx in routing.items()
                    },
                )
            )
        return rec


def record_rounds(
    target,
    drafter,
    prompts: Sequence[Sequence[int]],
    *,
    budget: int,
    top_k: int = 8,
    max_new_tokens: int = 32,
    backend: str | None = None,
) -> list[Round]:
    """Greedy tree decoding of ``prompts`` at ``budget`` (one request at a time), recorded.
    ``backend=None``: :func:`verify_backend`."""
    backend = backend or verify_backend(target)
    rounds: list[Round] = []
    for p in prompts:
        eng = RecordingEngine(
            target, drafter, mode="tree", budget=budget, top_k=top_k, backend=backend
        )
        state = eng.prefill([list(p)], max_new_tokens=max_new_tokens)
        while state.active:
            eng.step(state)
        rounds.extend(eng.rounds)
    return rounds
