"""Device DDTree builder: exactly the heap's tree, batched, no host round trip.

Why it is exact. With per-depth log-probs sorted descending, a node's float32 score never
exceeds its parent's or its previous sibling's (rounding is monotone), and on a tie the heap's
rank-tuple order puts the parent / previous sibling first. So the heap pops nodes in the total
order ``(-score, rank tuple)`` and the first ``budget`` pops are the global top-``budget`` in
that order. That set is prefix-closed, so:

1. level-synchronously keep ``S_d`` = top-``N`` (in the total order) of the children of
   ``S_{d-1}`` (at most ``N · min(K, N)`` candidates; a rank ``r >= N`` can never make it);
2. number the union ``U = ∪ S_d`` in depth-first preorder with children by rank (that *is* the
   lexicographic order of rank tuples), via subtree sizes (bottom-up) and prefix sums
   (top-down);
3. take the global top-``N`` of ``U`` by the packed key ``(score, preorder)`` — sorted, that is
   the pop order — then gather tokens, parents and the packed ancestor bitmask.

Every comparison uses one ``int64`` key: the float32 score mapped to an order-preserving int32
in the high half, ``2^32 - 1 - tiebreak`` in the low half. Shapes are static (``T = budget +
1``), nothing reads a device value on the host, so the whole build can sit in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdtree.spec.bitmask import num_words

__all__ = [
    "BACKENDS",
    "CUDA_MIN_BUDGET",
    "DeviceTree",
    "auto_backend",
    "build_trees_device",
    "build_trees_torch",
    "check_tree_inputs",
]

_INVALID_KEY = -(2**63)
_LOW_MASK = 2**32 - 1


@dataclass
class DeviceTree:
    """A batch of trees padded to ``T = budget + 1`` nodes, in heap pop order, on one device.

    Padding nodes have token 0, parent -1, depth 0, score ``-inf``, rank -1 and see only
    themselves in ``mask``. ``depths`` are the position offsets (position = prefix + depth).
    """

    tokens: torch.Tensor  # int64 [B, T] (node 0 = bonus)
    parents: torch.Tensor  # int64 [B, T] (root and padding -1)
    depths: torch.Tensor  # int64 [B, T]
    mask: torch.Tensor  # int64 [B, T, W]
    scores: torch.Tensor  # float32 [B, T]
    ranks: torch.Tensor  # int64 [B, T]: rank of the node at its own depth (r_d)
    n_nodes: torch.Tensor  # int64 [B]: real nodes including the root

    @classmethod
    def empty(cls, batch: int, T: int, W: int, device) -> DeviceTree:
        """Uninitialised output buffers for ``batch`` trees of ``T`` nodes and ``W`` mask words
        (what the kernels fill)."""
        i64 = dict(dtype=torch.int64, device=device)
        return cls(
            tokens=torch.empty(batch, T, **i64),
            parents=torch.empty(batch, T, **i64),
            depths=torch.empty(batch, T, **i64),
            mask=torch.empty(batch, T, W, **i64),
            scores=torch.empty(batch, T, dtype=torch.float32, device=device),
            ranks=torch.empty(batch, T, **i64),
            n_nodes=torch.empty(batch, **i64),
        )

    @property
    def T(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def valid(self) -> torch.Tensor:
        """``bool [B, T]``: real (non-padding) nodes."""
        idx = torch.arange(self.T, device=self.tokens.device)
        return idx.unsqueeze(0) < self.n_nodes.unsqueeze(1)


def check_tree_inputs(lp: torch.Tensor, tok: torch.Tensor, budget: int, bonus: torch.Tensor):
    """Shape/dtype/device checks only (no value checks: those would sync the device)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget={budget!r}: expected an integer >= 0")
    if not isinstance(lp, torch.Tensor) or lp.dim() != 3 or lp.dtype != torch.float32:
        got = (tuple(lp.shape), lp.dtype) if isinstance(lp, torch.Tensor) else type(lp)
        raise ValueError(f"lp: expected a float32 tensor [B, D, K], got {got}")
    if not isinstance(tok, torch.Tensor) or tok.shape != lp.shape or tok.dtype != torch.int64:
        got = (tuple(tok.shape), tok.dtype) if isinstance(tok, torch.Tensor) else type(tok)
        raise ValueError(f"tok: expected an int64 tensor of shape {tuple(lp.shape)}, got {got}")
    if not isinstance(bonus, torch.Tensor) or bonus.shape != (lp.shape[0],):
        got = tuple(bonus.shape) if isinstance(bonus, torch.Tensor) else type(bonus)
        raise ValueError(f"bonus: expected a tensor [{lp.shape[0]}] of root tokens, got {got}")
    if tok.device != lp.device or bonus.device != lp.device:
        raise ValueError(
            f"lp, tok, bonus: expected one device, got {lp.device}, {tok.device}, {bonus.device}"
        )


def check_out_buffer(name: str, t: torch.Tensor | None, shape: tuple, dtype, device) -> None:
    """An optional output buffer a kernel writes: ``None``, or contiguous with this shape,
    dtype and device (else a clear error)."""
    if t is not None and (
        tuple(t.shape) != tuple(shape)
        or t.dtype != dtype
        or t.device != device
        or not t.is_contiguous()
    ):
        what = str(dtype).replace("torch.", "")
        raise ValueError(f"{name}: expected a contiguous {what} tensor {list(shape)} on {device}")


def score_key(score: torch.Tensor, tiebreak: torch.Tensor) -> torch.Tensor:
    """``int64`` key, larger = popped earlier: float32 score high, smaller ``tiebreak`` wins.

    ``-0.0`` is folded into ``+0.0`` first (they compare equal in the heap). ``tiebreak`` must
    lie in ``[0, 2^32)``.
    """
    s = torch.where(score == 0, torch.zeros_like(score), score)
    bits = s.view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (ordered.to(torch.int64) << 32) + (_LOW_MASK - tiebreak.to(torch.int64))


def _bit_words(idx: torch.Tensor, W: int) -> torch.Tensor:
    """``int64 [..., W]`` with only bit ``idx`` set (nothing for ``idx < 0``)."""
    words = torch.arange(W, device=idx.device)
    hit = (idx.unsqueeze(-1) // 64) == words
    bit = torch.ones_like(idx) << (idx.clamp(min=0) % 64)
    return torch.where(
        hit, bit.unsqueeze(-1), torch.zeros((), dtype=torch.int64, device=idx.device)
    )


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=-1) - x


def _root_only(lp, bonus, budget: int) -> DeviceTree:
    Bsz, dev = lp.shape[0], lp.device
    T = budget + 1
    W = num_words(T)
    tokens = torch.zeros(Bsz, T, dtype=torch.int64, device=dev)
    tokens[:, 0] = bonus
    eye = _bit_words(torch.arange(T, device=dev), W)
    return DeviceTree(
        tokens=tokens,
        parents=torch.full((Bsz, T), -1, dtype=torch.int64, device=dev),
        depths=torch.zeros(Bsz, T, dtype=torch.int64, device=dev),
        mask=eye.unsqueeze(0).expand(Bsz, T, W).clone(),
        scores=torch.cat(
            [torch.zeros(Bsz, 1, device=dev), torch.full((Bsz, T - 1), float("-inf"), device=dev)],
            dim=1,
        ),
        ranks=torch.cat(
            [
                torch.zeros(Bsz, 1, dtype=torch.int64, device=dev),
                torch.full((Bsz, T - 1), -1, dtype=torch.int64, device=dev),
            ],
            dim=1,
        ),
        n_nodes=torch.ones(Bsz, dtype=torch.int64, device=dev),
    )


def build_trees_torch(
    lp: torch.Tensor, tok: torch.Tensor, budget: int, bonus: torch.Tensor
) -> DeviceTree:
    """Vectorised torch build (any device, graph-capturable); see the module docstring."""
    check_tree_inputs(lp, tok, budget, bonus)
    Bsz, D, K = lp.shape
    N = budget
    if N == 0 or D == 0 or K == 0 or Bsz == 0:
        return _root_only(lp, bonus.to(torch.int64), budget)
    dev = lp.device
    Ke = min(K, N)  # rank r has r earlier siblings: r >= N never makes the top N
    Dm = min(D, N)  # depth d has d - 1 earlier ancestors
    lp = lp[:, :Dm, :Ke]
    tok = tok[:, :Dm, :Ke]
    T = N + 1
    W = num_words(T)
    ar_n = torch.arange(N, device=dev)
    invalid = torch.full((), _INVALID_KEY, dtype=torch.int64, device=dev)  # no H2D copy

    # --- 1. level-synchronous kept sets, each in lexicographic (parent, rank) order ---------
    scores, valids, pars, rks = [], [], [], []
    n1 = min(Ke, N)
    s1 = torch.full((Bsz, N), float("-inf"), device=dev)
    s1[:, :n1] = lp[:, 0, :n1]
    v1 = (ar_n < n1).unsqueeze(0).expand(Bsz, N)
    scores.append(s1)
    valids.append(v1)
    pars.append(torch.zeros(Bsz, N, dtype=torch.int64, device=dev))
    rks.append(torch.where(v1, ar_n.unsqueeze(0), 0).expand(Bsz, N))
    sentinel = N * Ke
    for d in range(1, Dm):
        cand = scores[-1].unsqueeze(2) + lp[:, d, :].unsqueeze(1)  # [B, N, Ke] fp32 sum
        cvalid = valids[-1].unsqueeze(2).expand(Bsz, N, Ke).reshape(Bsz, N * Ke)
        flat = torch.arange(N * Ke, device=dev).unsqueeze(0).expand(Bsz, N * Ke)
        key = torch.where(cvalid, score_key(cand.reshape(Bsz, N * Ke), flat), invalid)
        top_key, top_idx = torch.topk(key, N, dim=1, sorted=False)
        top_idx = torch.where(top_key != invalid, top_idx, sentinel)
        idx, _ = torch.sort(top_idx, dim=1)  # flat index = parent * Ke + rank: lex order
        v = idx < sentinel
        idx = torch.where(v, idx, 0)
        scores.append(torch.where(v, cand.reshape(Bsz, N * Ke).gather(1, idx), float("-inf")))
        valids.append(v)
        pars.append(idx // Ke)
        rks.append(idx % Ke)

    # --- 2. preorder numbering of U (lexicographic order of rank tuples) ---------------------
    sizes = [v.to(torch.int64) for v in valids]
    for d in range(Dm - 1, 0, -1):
        add = torch.where(valids[d], sizes[d], 0)
        sizes[d - 1] = sizes[d - 1].scatter_add(1, pars[d], add)
    pre = [1 + _exclusive_cumsum(sizes[0])]
    for d in range(1, Dm):
        g = _exclusive_cumsum(sizes[d])
        off = _exclusive_cumsum(sizes[d - 1] - valids[d - 1].to(torch.int64))
        pre.append(pre[d - 1].gather(1, pars[d]) + 1 + g - off.gather(1, pars[d]))

    # --- 3. global top-N of U, sorted = pop order ---------------------------------------------
    all_scores = torch.cat(scores, dim=1)  # [B, Dm * N]
    all_valid = torch.cat(valids, dim=1)
    all_pre = torch.cat(pre, dim=1)
    gkey = torch.where(all_valid, score_key(all_scores, all_pre), invalid)
    sel_key, sel = torch.topk(gkey, N, dim=1, sorted=True)  # [B, N] slot ids
    sel_valid = sel_key != invalid
    n_nodes = 1 + sel_valid.sum(dim=1)

    # slot -> node index (1..N); unselected slots -> -1 (dummy column Dm * N absorbs padding)
    node_of = torch.full((Bsz, Dm * N + 1), -1, dtype=torch.int64, device=dev)
    node_of.scatter_(1, torch.where(sel_valid, sel, Dm * N), torch.where(sel_valid, 1 + ar_n, -1))
    node_of = node_of[:, : Dm * N]

    # ancestor bitmask per level: anc(slot) = anc(parent slot) | bit(node index)
    ancs = []
    root_bit = _bit_words(torch.zeros(1, dtype=torch.int64, device=dev), W)  # [1, W]
    for d in range(Dm):
        own = _bit_words(node_of[:, d * N : (d + 1) * N], W)
        if d == 0:
            ancs.append(own | root_bit)
        else:
            up = ancs[d - 1].gather(1, pars[d].unsqueeze(-1).expand(Bsz, N, W))
            ancs.append(own | up)
    all_anc = torch.cat(ancs, dim=1)  # [B, Dm * N, W]

    sel_c = torch.where(sel_valid, sel, 0)
    level = sel_c // N
    par_slot = torch.cat(
        [torch.full((Bsz, N), -1, dtype=torch.int64, device=dev)]
        + [(d - 1) * N + pars[d] for d in range(1, Dm)],
        dim=1,
    )
    psel = par_slot.gather(1, sel_c)
    parent_node = torch.where(psel >= 0, node_of.gather(1, psel.clamp(min=0)), 0)
    all_rk = torch.cat(rks, dim=1).gather(1, sel_c)
    tok_flat = tok.reshape(Bsz, Dm * Ke)
    node_tok = tok_flat.gather(1, level * Ke + all_rk)

    pad_bits = _bit_words(1 + ar_n, W).unsqueeze(0)  # [1, N, W]
    node_mask = torch.where(
        sel_valid.unsqueeze(-1),
        all_anc.gather(1, sel_c.unsqueeze(-1).expand(Bsz, N, W)),
        pad_bits,
    )
    zero = torch.zeros(Bsz, 1, dtype=torch.int64, device=dev)
    return DeviceTree(
        tokens=torch.cat(
            [bonus.to(torch.int64).unsqueeze(1), torch.where(sel_valid, node_tok, 0)], dim=1
        ),
        parents=torch.cat([zero - 1, torch.where(sel_valid, parent_node, -1)], dim=1),
        depths=torch.cat([zero, torch.where(sel_valid, level + 1, 0)], dim=1),
        mask=torch.cat([root_bit.unsqueeze(0).expand(Bsz, 1, W), node_mask], dim=1),
        scores=torch.cat(
            [
                torch.zeros(Bsz, 1, device=dev),
                torch.where(sel_valid, all_scores.gather(1, sel_c), float("-inf")),
            ],
            dim=1,
        ),
        ranks=torch.cat([zero, torch.where(sel_valid, all_rk, -1)], dim=1),
        n_nodes=n_nodes,
    )


def build_trees_device(
    lp: torch.Tensor,
    tok: torch.Tensor,
    budget: int,
    bonus: torch.Tensor,
    *,
    backend: str = "auto",
) -> DeviceTree:
    """Build the heap's trees for a batch on ``lp``'s device.

    ``lp float32 [B, D, K]`` and ``tok int64 [B, D, K]`` sorted descending per depth (as from
    ``kdtree.spec.tree.draft_topk``), ``budget`` nodes besides the root, ``bonus [B]`` root
    tokens. ``backend``: ``"torch"`` (vectorised ops, any device, CUDA-graph capturable),
    ``"triton"`` (one program per request; CUDA, or the interpreter on CPU), ``"cuda"`` (the
    CUDA C++ builder, one CTA per request, shared memory throughout; sm_90 with ``nvcc``, or
    its g++ CPU stand-in on CPU tensors) or ``"auto"`` (:func:`auto_backend`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if backend == "auto":
        backend = auto_backend(lp, budget)
    if backend == "torch":
        return build_trees_torch(lp, tok, budget, bonus)
    if backend == "cuda":
        from kdtree.spec.gpu import tree_build_cuda as tbc

        return tbc.build_trees_cuda(lp, tok, budget, bonus)
    from kdtree.spec.gpu import tree_build_triton as tbt

    return tbt.build_trees_triton(lp, tok, budget, bonus)


def auto_backend(lp: torch.Tensor, budget: int, *, cuda_ok: bool | None = None) -> str:
    """The builder ``backend="auto"`` runs: torch off CUDA; on CUDA the Triton builders (heap
    replay) below budget ``CUDA_MIN_BUDGET`` (5.2 µs at budget 16, batch 1, against the CUDA
    builder's 10.2: its seed and launch are a fixed cost; session 7,
    ``tools/gpu/bench_tree_cuda.py``), the CUDA C++ builder from there where it is available
    (``cuda_ok``; default: nvcc and an sm_90 GPU) and the shape fits, else the Triton builder
    where it fits, else torch."""
    if not lp.is_cuda:
        return "torch"
    from kdtree.spec.gpu import tree_build_cuda as tbc
    from kdtree.spec.gpu import tree_build_triton as tbt

    ok = _cuda_builder_ok() if cuda_ok is None else cuda_ok
    sm90 = cuda_ok is not None or torch.cuda.get_device_capability(lp.device) == (9, 0)
    if budget >= CUDA_MIN_BUDGET and ok and sm90 and tbc.supports(lp, budget):
        return "cuda"
    if tbt.supports(lp, budget):
        return "triton"
    return "torch"


CUDA_MIN_BUDGET = 33
BACKENDS = ("auto", "torch", "triton", "cuda")
_CUDA_OK: bool | None = None


def _cuda_builder_ok() -> bool:
    """Whether ``auto`` may take the CUDA C++ builder (checked once: nvcc, an sm_90 GPU and a
    library that builds; ``KDTREE_TREE_BUILDER=triton`` opts out)."""
    global _CUDA_OK
    if _CUDA_OK is None:
        import os
        import warnings

        from kdtree.spec.gpu import tree_build_cuda as tbc

        ok = os.environ.get("KDTREE_TREE_BUILDER", "auto") != "triton" and tbc.available()
        if ok:
            try:
                tbc.build()
            except RuntimeError as exc:  # e.g. a toolkit without compute_90a: keep Triton
                warnings.warn(f"CUDA tree builder unavailable, using Triton: {exc}", stacklevel=2)
                ok = False
        _CUDA_OK = ok
    return _CUDA_OK
