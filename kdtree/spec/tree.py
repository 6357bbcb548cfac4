"""DDTree draft trees: per-depth top-K, the best-first heap (reference), batching, brute force.

The reference builder follows the contract in ``docs/ARCHITECTURE.md`` exactly, because the GPU
builder (``kdtree/spec/gpu/``) reproduces it bit for bit:

* node = (depth ``d >= 1``, rank tuple ``(r_1, .., r_d)``); the root (bonus token) is node 0;
* ``score(child) = score(parent) + lp[d - 1, r_d]`` in float32, in that order (root score 0);
* pop order: larger score first, ties broken by the smaller rank tuple (Python tuple order);
* after a pop, push the next sibling (rank + 1 if < K) and the first child (rank 0 at depth
  + 1 if <= D); stop after ``budget`` pops or when the heap runs dry.
"""

from __future__ import annotations

import heapq
import itertools
import struct
from dataclasses import dataclass, field

import numpy as np
import torch

from kdtree.spec.bitmask import ancestor_mask_np, num_words, pack_bits_np

__all__ = [
    "BatchedTrees",
    "Tree",
    "brute_force_tree",
    "build_tree_ref",
    "build_trees",
    "chain_tree",
    "draft_topk",
    "pad_trees",
    "self_only_mask",
]


@dataclass
class Tree:
    """One request's draft tree in pop order (root first, ``parents[i] < i``).

    ``tokens``/``parents``/``depths`` are ``int64 [n]``, ``scores`` ``float32 [n]`` (root 0),
    ``ranks`` the rank tuple of each node (root ``()``), ``mask`` the packed ancestor-or-self
    bitmask ``int64 [n, ceil(n / 64)]`` and ``children[i]`` maps a child's token to its index.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    ranks: list[tuple[int, ...]]
    mask: torch.Tensor
    children: list[dict[int, int]] = field(repr=False)

    @property
    def size(self) -> int:
        """Number of nodes including the root."""
        return int(self.tokens.shape[0])


@dataclass
class BatchedTrees:
    """Trees of a batch padded to ``T = budget + 1`` nodes.

    Padding nodes have token 0, parent -1, depth 0 and see only themselves in ``mask``
    (``int64 [B, T, W]``). ``sizes`` is the real node count of each tree.
    """

    tokens: torch.Tensor  # int64 [B, T]
    parents: torch.Tensor  # int64 [B, T]
    depths: torch.Tensor  # int64 [B, T]
    mask: torch.Tensor  # int64 [B, T, W]
    sizes: list[int]
    trees: list[Tree]

    @property
    def T(self) -> int:
        return int(self.tokens.shape[1])


def draft_topk(draft_logits: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-depth sorted top-K log-probs: one fp32 ``log_softmax`` then ``topk`` (on a GPU, one
    fused Triton launch that selects the same values: :mod:`kdtree.spec.gpu.topk_triton`).

    ``draft_logits [B, D, V]`` → ``(lp float32 [B, D, K], tok int64 [B, D, K])``, descending.
    """
    if not isinstance(draft_logits, torch.Tensor) or draft_logits.dim() != 3:
        shape = tuple(draft_logits.shape) if isinstance(draft_logits, torch.Tensor) else None
        raise ValueError(f"draft_logits: expected a tensor [B, D, V], got shape {shape}")
    if not draft_logits.is_floating_point():
        raise TypeError(f"draft_logits: expected a floating dtype, got {draft_logits.dtype}")
    V = draft_logits.shape[-1]
    if not 1 <= K <= V:
        raise ValueError(f"K={K}: expected 1 <= K <= vocabulary size {V}")
    if draft_logits.is_cuda:
        from kdtree.spec.gpu.topk_triton import MAX_VOCAB, draft_topk_triton

        if V <= MAX_VOCAB:
            return draft_topk_triton(draft_logits, K)
    logp = torch.log_softmax(draft_logits, dim=-1, dtype=torch.float32)
    lp, tok = torch.topk(logp, K, dim=-1, largest=True, sorted=True)
    return lp, tok


def _check_tree_inputs(lp, tok, budget: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget < 0:
        raise ValueError(f"budget={budget!r}: expected an integer >= 0")
    lp_t = torch.as_tensor(lp)
    tok_t = torch.as_tensor(tok)
    if lp_t.dtype != torch.float32:
        raise TypeError(f"lp: expected float32 log-probs, got {lp_t.dtype}")
    if tok_t.dtype != torch.int64:
        raise TypeError(f"tok: expected int64 token ids, got {tok_t.dtype}")
    if lp_t.dim() != 2 or tok_t.shape != lp_t.shape:
        raise ValueError(
            f"lp, tok: expected matching [D, K] tensors, got {tuple(lp_t.shape)} and "
            f"{tuple(tok_t.shape)}"
        )
    lp_np = lp_t.detach().cpu().numpy()
    if lp_np.size and (lp_np[:, 1:] > lp_np[:, :-1]).any():
        raise ValueError("lp: expected log-probs sorted in descending order along K")
    if lp_np.size and (np.isnan(lp_np).any() or (lp_np > 0).any()):
        raise ValueError("lp: expected log-probabilities (<= 0, no NaN)")
    return lp_np, tok_t.detach().cpu().numpy()


def _make_tree(
    tokens: list[int],
    parents: list[int],
    depths: list[int],
    scores: list[float] | list[np.float32],
    ranks: list[tuple[int, ...]],
) -> Tree:
    children: list[dict[int, int]] = [{} for _ in tokens]
    for i in range(1, len(tokens)):
        children[parents[i]][tokens[i]] = i
    n = len(tokens)
    vis = ancestor_mask_np(parents)
    return Tree(
        tokens=torch.tensor(tokens, dtype=torch.int64),
        parents=torch.tensor(parents, dtype=torch.int64),
        depths=torch.tensor(depths, dtype=torch.int64),
        scores=torch.tensor(np.asarray(scores, dtype=np.float32).reshape(n)),
        ranks=ranks,
        mask=torch.from_numpy(pack_bits_np(vis)),
        children=children,
    )


_F32 = struct.Struct("<f")


def _f32(x: float) -> float:
    """Round a Python float to the nearest float32 (kept as a Python float).

    The sum of two float32 values computed in float64 and then rounded to float32 equals the
    float32 sum (53 >= 2 * 24 + 2 bits), so scores match a float32 ``a + b`` bit for bit.
    """
    return _F32.unpack(_F32.pack(x))[0]


def build_tree_ref(lp, tok, budget: int, bonus: int) -> Tree:
    """Best-first DDTree heap (paper Algorithm 1) with the contract's float32 scores and ties.

    ``lp float32 [D, K]`` / ``tok int64 [D, K]`` sorted descending per depth, ``budget`` pops
    (the root does not count), ``bonus`` the root token.
    """
    lp_np, tok_np = _check_tree_inputs(lp, tok, budget)
    D, K = lp_np.shape
    lpl: list[list[float]] = lp_np.tolist()  # float32 values held exactly in Python floats
    tkl: list[list[int]] = tok_np.tolist()
    tokens, parents, depths = [int(bonus)], [-1], [0]
    scores: list[float] = [0.0]
    ranks: list[tuple[int, ...]] = [()]
    # Entry: (-score, rank tuple, parent index, depth); negation is exact.
    heap: list[tuple[float, tuple[int, ...], int, int]] = []
    if D > 0 and K > 0 and budget > 0:
        heap.append((-_f32(0.0 + lpl[0][0]), (0,), 0, 1))
    pop, push = heapq.heappop, heapq.heappush
    while heap and len(tokens) <= budget:
        neg, rt, parent, d = pop(heap)
        i = len(tokens)
        r = rt[-1]
        tokens.append(tkl[d - 1][r])
        parents.append(parent)
        depths.append(d)
        scores.append(-neg)
        ranks.append(rt)
        if r + 1 < K:
            push(heap, (-_f32(scores[parent] + lpl[d - 1][r + 1]), (*rt[:-1], r + 1), parent, d))
        if d < D:
            push(heap, (-_f32(scores[i] + lpl[d][0]), (*rt, 0), i, d + 1))
    return _make_tree(tokens, parents, depths, scores, ranks)


def chain_tree(draft_tokens, bonus: int) -> Tree:
    """The DFlash chain ``[bonus, d_1 .. d_D]`` as a tree (what ``build_tree_ref`` gives at K=1,
    without scores: they are 0 here since the chain needs no log-probs)."""
    toks = [int(t) for t in torch.as_tensor(draft_tokens).reshape(-1).tolist()]
    n = len(toks) + 1
    return _make_tree(
        [int(bonus), *toks],
        list(range(-1, n - 1)),
        list(range(n)),
        [np.float32(0.0)] * n,
        [(0,) * d for d in range(n)],
    )


def brute_force_tree(lp, tok, budget: int, bonus: int) -> Tree:
    """Top-``budget`` prefixes over all rank tuples, sorted by (-score, ranks). Tests only:
    enumerates ``sum_d K^d`` prefixes."""
    lp_np, tok_np = _check_tree_inputs(lp, tok, budget)
    D, K = lp_np.shape
    cands: list[tuple[np.float32, tuple[int, ...]]] = []
    score_of: dict[tuple[int, ...], np.float32] = {(): np.float32(0.0)}
    for d in range(1, D + 1):
        for rt in itertools.product(range(K), repeat=d):
            s = score_of[rt[:-1]] + lp_np[d - 1, rt[-1]]
            score_of[rt] = s
            cands.append((-s, rt))
    cands.sort()
    chosen = [rt for _, rt in cands[:budget]]
    index = {(): 0}
    tokens, parents, depths, scores, ranks = [int(bonus)], [-1], [0], [np.float32(0.0)], [()]
    for rt in chosen:
        if rt[:-1] not in index:
            raise AssertionError(f"brute force: prefix of {rt} not chosen (not prefix-closed)")
        index[rt] = len(tokens)
        tokens.append(int(tok_np[len(rt) - 1, rt[-1]]))
        parents.append(index[rt[:-1]])
        depths.append(len(rt))
        scores.append(score_of[rt])
        ranks.append(rt)
    return _make_tree(tokens, parents, depths, scores, ranks)


def self_only_mask(T: int) -> torch.Tensor:
    """Packed identity ``int64 [T, W]``: every row sees only itself."""
    rows = torch.arange(T, dtype=torch.int64)
    mask = torch.zeros(T, num_words(T), dtype=torch.int64)
    mask[rows, rows // 64] = torch.ones_like(rows) << (rows % 64)
    return mask


def pad_trees(trees: list[Tree], T: int) -> BatchedTrees:
    """Stack trees into ``[B, T]`` tensors; padding rows see only themselves."""
    B = len(trees)
    W = num_words(T)
    tokens = torch.zeros(B, T, dtype=torch.int64)
    parents = torch.full((B, T), -1, dtype=torch.int64)
    depths = torch.zeros(B, T, dtype=torch.int64)
    mask = self_only_mask(T).unsqueeze(0).repeat(B, 1, 1)  # real rows overwritten below
    sizes = []
    for b, tree in enumerate(trees):
        n = tree.size
        if n > T:
            raise ValueError(f"trees[{b}]: {n} nodes do not fit the padded size T={T}")
        tokens[b, :n] = tree.tokens
        parents[b, :n] = tree.parents
        depths[b, :n] = tree.depths
        mask[b, :n, : tree.mask.shape[1]] = tree.mask
        mask[b, :n, tree.mask.shape[1] :] = 0
        sizes.append(n)
    assert mask.shape[-1] == W
    return BatchedTrees(tokens, parents, depths, mask, sizes, list(trees))


def build_trees(lp: torch.Tensor, tok: torch.Tensor, budget: int, bonus) -> BatchedTrees:
    """Batched reference build: one host copy of ``lp``/``tok [B, D, K]``, one heap per request,
    padded to ``T = budget + 1``."""
    if lp.dim() != 3 or tok.shape != lp.shape:
        raise ValueError(
            f"lp, tok: expected matching [B, D, K] tensors, got {tuple(lp.shape)} and "
            f"{tuple(tok.shape)}"
        )
    bonus_list = [int(x) for x in torch.as_tensor(bonus).reshape(-1).tolist()]
    if len(bonus_list) != lp.shape[0]:
        raise ValueError(f"bonus: expected {lp.shape[0]} root tokens, got {len(bonus_list)}")
    lp_h, tok_h = lp.detach().cpu(), tok.detach().cpu()
    trees = [
        build_tree_ref(lp_h[b], tok_h[b], budget, bonus_list[b]) for b in range(len(bonus_list))
    ]
    return pad_trees(trees, budget + 1)
