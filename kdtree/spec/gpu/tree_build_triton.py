"""Two exact Triton tree builders, one program per request: the heap replay (two pops per
block reduction) and the threshold builder; ``algo="auto"`` runs the one measured faster.

The threshold builder (``_tree_build_thresh_kernel``). The heap pops the global top-``N``
nodes in the total order (score, rank tuple) (``tree_build.py``), so with ``theta`` any score
that at least ``N`` real nodes reach, the set ``U`` of nodes scoring ``>= theta`` contains the
tree, and the tree is the ``N`` best of ``U``. Four phases, ~3 * depth dependent steps instead
of ``N / 2`` reductions:

1. seed (``_seed``): count nodes per depth by their rounded-up deviation from the rank-0 chain
   (a shift-and-add per rank over 256 bins, rows in global scratch) and take the highest grid
   threshold with ``>= N`` nodes — an estimate: 1.1–1.6 N nodes on average, up to 2.7 N, on
   draft-like top-K in numpy (``thresh_params``), and only speed rests on it;
2. expand (``_expand``): every node ``>= theta`` level by level (parents in order, a parent's
   kept children are a prefix of its ranks, one prefix sum per chunk of 64 parents); if ``U``
   outgrows ``CAP = next_pow2(2 N + 32)``, or holds fewer than ``N`` nodes while ``theta >
   -inf``, the program runs the heap replay instead (exact either way; ``path_out`` says
   which ran);
3. order (``_order_and_emit``): a node's preorder position in ``U`` = its ancestors' level
   indices + 1 (carried down the expansion) + its level index + the deeper nodes under earlier
   nodes of its level (first-child indices chained down); the int64 key (score image, then
   ``2^32 - 1 - pre``) is ranked against all of ``U`` (all pairs), rank ``r < N`` is row
   ``r + 1``;
4. emit: tokens, parents' rows, and the ancestor bitmask collected up the parent chain.

Timing (H200, batch 1, depth 15, ten builds per CUDA-graph replay,
``tools/gpu/bench_tree_phases.py``, call Y, rows in ``data/bench/logs/tree_phases_session5.csv.gz``):
threshold 14.6 / 15.8 / 45.4 µs at budget 16 / 64 / 256 for K 8 and 24.9 / 35.4 / 59.1 µs for
K 32, against 5.5 / 21.3 / 99.4 and 5.7 / 21.6 / 99.9 µs for the heap replay; of the 59 µs at
K 32, budget 256, the seed takes 25 and the expansion 10. What did not work on the H200's
Triton 3.6: ``tl.gather`` for the seed's shifts and the ordering's chases (10x slower than
global-memory rows, call W); a ``[ranks, bins]`` tile summed over ranks per level (~2 µs per
level, call X); the interval-tile mask at budget 256 (~3 µs a tile, call X); a ``range``
starting at a loop-carried value (it ran from 0, call U — the loop now counts from 0).

The heap replay (``_tree_build_kernel``, and the threshold builder's fallback) follows.

Before the heap replay (H200, CUDA graph: 95 µs at budget 16, 160 µs at 64, 420 µs at 256, the
same at batch 1 and 32) the kernel built the tree level-synchronously: for each of the ``Dm - 1``
levels it found the N-th largest child score by ~31 bisection steps, each a block-wide
reduction, plus ~15 barrier-separated passes: ~480 dependent block reductions and ~60 barriers
per request whatever the batch.

Slots. Slot ``j`` of a register vector is popped node ``j`` (pop order). The heap holds, for
every popped node, exactly one entry — its pending child (rank ``c_j``) — so slot ``j`` holds
that entry as a packed ``int64`` key, larger = popped first: high half the order-preserving
int32 image of the child's float32 score, low half ``tie · 2^16 | j · 2^8 | c_j``. The tie rule
(smaller rank tuple first) needs no stored tuples: every popped node keeps its position ``lex``
in the preorder (= rank-tuple) order of the popped set and the end ``end`` of its subtree's
interval there; slot ``j``'s child would be inserted at ``P = end_j``; a smaller ``P`` comes
first, an equal ``P`` means nested subtrees, where the deeper slot's child comes first. So
``tie = 65536 − q_j`` with ``q_j = end_j · 256 − depth_j`` (one int32 per slot, distinct per
node; budget ≤ 256 keeps it in 16 bits), and a key also yields its slot, rank, ``q`` (hence
``P`` and the depth) and, inverting the int32 image, the exact score.

Two pops per reduction. Each slot also holds a successor key: the better of its pending
child's two successors — that child's first child and its next sibling (the first child on a
score tie: it is the smaller tuple) — at the slot's own tie position, rank field 0 (the child)
or ``c_j + 1`` (the sibling). One ``tl.reduce`` with a top-2 combine over the per-slot pairs
(key, successor) gives ``m1``, ``m2``. ``m1`` is the heap's next pop (child ``c1`` of slot
``j1``, node ``t``). ``m2`` is the pop after it: the heap then holds the other slots' pending
children and ``j1``'s two new entries. Every other slot's successor is below its own key, so
the second-best of all pairs is the best of those entries — compared at the tie positions of
the state before pop 1, which is exact: pop 1 moves the ``P`` of other slots only in an
order-preserving way (``q' = q + 256`` where ``q >= q1``: ``j1``'s ancestors and the nodes after
it), and ``j1``'s two new entries sit exactly where ``j1``'s old entry sat in rank-tuple order
(the child's subtree, then the sibling). The combine only compares entries of different slots
(partials over disjoint slot sets; a slot's pair enters ordered), so a successor's packed fields
need no order against its own slot's key. ``m2`` decodes to another slot's pending child (its
``q`` moved by pop 1 as above), ``j1``'s next sibling (slot ``j1``, rank ``c1 + 1 >= 1``) or
node ``t``'s first child (rank field 0: slot ``t``, depth + 1). Both pops then update the slot
vectors elementwise (``q``/``lex`` shifts, the popped slots' ranks and scores, four log-prob
loads per pop for the new entries' scores). Per tree: ``ceil(budget / 2)`` dependent
reductions (the single-pop loop did ``budget``). After the loop the ancestor bitmask comes from
the intervals (``k`` is an ancestor-or-self of ``i`` iff ``lex_k <= lex_i < end_k``), tile by
tile, and the tokens by one gather.

Timing (H200, session 3 call K, `kdtree bench tree-build --budgets 16,64,256`, one build per
CUDA-graph replay, rows now in `data/bench/logs/tree_build_session3_callK.csv.gz`; the previous
single-pop kernel timed in the same device call as ``device_triton_prev*``): batch 1 takes
9.8 / 23.5 / 100.9 µs at budget 16 / 64 / 256
against 9.9 / 27.2 / 117.0 µs for one pop per reduction — 1.16x at budget 256, as a crude
in-order latency model of the sm_90 SASS had predicted (10–25 % fewer cycles per pop, not 2x):
the loop body is 244 / 286 / 333 instructions per two pops (single-pop: 120 / 112 / 133 per
pop) with 0 / 3 / 3 barriers (0 / 2 / 2 per pop), and the top-2 combine is shuffle-based where
``tl.max`` used REDUX, so what is saved is mostly the second reduction's synchronisation.
Batch 8 and 32 take the same per build (one program per request), except batch 32 at budget 16
(16.7 µs against 10.2 µs for the single-pop kernel in the same call). ``default_num_warps`` came
from the single-pop version; at budget 64 its 4 warps were also the best of 1-16 for the two-pop
loop (session 4, call T).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu.tree_build import DeviceTree, check_out_buffer, check_tree_inputs

__all__ = [
    "ALGOS",
    "MAX_BUDGET",
    "MAX_CAP",
    "auto_algo",
    "build_trees_triton",
    "default_num_warps",
    "supports",
    "thresh_params",
    "thresh_warps",
]

MAX_BUDGET = 256  # the packed key holds end·256 − depth in 16 bits, slot and rank in 8 each
MAX_CAP = 2048  # the threshold builder's node cap: its ordering holds [cap, words] mask tiles
_INVALID = tl.constexpr(-(2**63))  # no pending child
_FAR = tl.constexpr(1 << 30)  # a preorder position / q past every node


@triton.jit
def _ordered(score):
    """float32 → int32 with the same order. No score is ``-0.0`` (the root's is ``+0.0`` and
    ``x + lp`` is ``-0.0`` only when both are), so ``±0`` need no folding."""
    bits = score.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _pack(score, ok, lo):
    """The ``int64`` key: the order-preserving image of ``score`` high, ``lo``'s bits low."""
    key = (_ordered(score).to(tl.int64) << 32) | lo.to(tl.uint32, bitcast=True).to(tl.int64)
    return tl.where(ok, key, _INVALID)


@triton.jit
def _top2(a1, a2, b1, b2):
    """The best two of two (best, second) partials over disjoint sets of slots."""
    a_wins = a1 > b1
    return tl.where(a_wins, a1, b1), tl.maximum(tl.where(a_wins, b1, a1), tl.where(a_wins, a2, b2))


@triton.jit
def _keys(st, slot, KE: tl.constexpr, DM: tl.constexpr):
    """Per slot: the key of its pending child, and the key of the better of that child's two
    successors (its first child; its next sibling; the child on a score tie), both at the
    slot's tie position, with rank field 0 (child) or ``c + 1`` (sibling)."""
    lex, ed, dep, c, score, sc, sc_sib, sc_kid, par, rk = st
    alive = (dep < DM) & (c < KE)  # a slot not yet popped holds c = KE
    kid_ok = alive & (dep + 1 < DM)
    sib_ok = alive & (c + 1 < KE)
    use_kid = kid_ok & ((sc_kid >= sc_sib) | ~sib_ok)
    tie = ((65536 - ed) << 16) | (slot << 8)
    key = _pack(sc, alive, tie | c)
    nxt = tl.where(use_kid, sc_kid, sc_sib)
    return key, _pack(nxt, kid_ok | sib_ok, tie | tl.where(use_kid, 0, c + 1))


@triton.jit
def _decode(m):
    """A key → (``q`` = end·256 − depth of its slot, slot, child rank, child score)."""
    lo = (m & 0xFFFFFFFF).to(tl.int32)
    o = (m >> 32).to(tl.int32)
    s_new = (o ^ ((o >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    return 65536 - ((lo >> 16) & 0xFFFF), (lo >> 8) & 255, lo & 255, s_new


@triton.jit
def _pop(st, slot, t, q, j, cj, s_new, valid, lpb, s_lpd, KE: tl.constexpr, DM: tl.constexpr):
    """The slot vectors ``st`` after popping node ``t`` = child ``cj`` of slot ``j`` (``q`` =
    j's end·256 − depth) with score ``s_new``: the node is inserted at preorder position
    ``p`` = j's end; j and its ancestors (q' >= q) end one later, nodes from ``p`` on move."""
    lex, ed, dep, c, score, sc, sc_sib, sc_kid, par, rk = st
    p = (q + 255) >> 8
    dj = (p << 8) - q
    # log-probs the new entries need (clamped rows/ranks are loaded but never read)
    row = lpb + tl.minimum(dj, DM - 1) * s_lpd
    kids = lpb + tl.minimum(dj + 1, DM - 1) * s_lpd
    lp_sib2 = tl.load(row + tl.minimum(cj + 2, KE - 1), mask=valid)  # j's sibling after next
    lp_k0 = tl.load(kids, mask=valid)  # t's first child
    lp_k1 = tl.load(kids + min(1, KE - 1), mask=valid)  # t's second child
    lp_kk = tl.load(lpb + tl.minimum(dj + 2, DM - 1) * s_lpd, mask=valid)  # its first child's
    ed = ed + tl.where(ed >= tl.where(valid, q, _FAR), 256, 0)
    lex = lex + (lex >= tl.where(valid, p, _FAR)).to(tl.int32)
    is_t = (slot == t) & valid
    is_j = (slot == j) & valid
    ed = tl.where(is_t, q + 255, ed)  # (p + 1)·256 − (dj + 1)
    lex = tl.where(is_t, p, lex)
    dep = tl.where(is_t, dj + 1, dep)
    score = tl.where(is_t, s_new, score)
    par = tl.where(is_t, j, par)
    rk = tl.where(is_t, cj, rk)
    c = tl.where(is_j, c + 1, tl.where(is_t, 0, c))
    # j's pending child becomes its next sibling; t's is its first child
    sc = tl.where(is_j, sc_sib, tl.where(is_t, s_new + lp_k0, sc))
    sc_sib = tl.where(is_j, score + lp_sib2, tl.where(is_t, s_new + lp_k1, sc_sib))
    sc_kid = tl.where(is_j | is_t, sc + tl.where(is_j, lp_k0, lp_kk), sc_kid)
    return lex, ed, dep, c, score, sc, sc_sib, sc_kid, par, rk


@triton.jit
def _store_last(outs, ws, q, j, cj, s_new, valid):
    """Node N when it has no slot (N = NP): its row, and its interval (a leaf at p)."""
    out_par, out_dep, out_rank, out_score = outs
    p = (q + 255) >> 8
    tl.store(out_par, j.to(tl.int64), mask=valid)
    tl.store(out_dep, ((p << 8) - q + 1).to(tl.int64), mask=valid)
    tl.store(out_rank, cj.to(tl.int64), mask=valid)
    tl.store(out_score, s_new, mask=valid)
    tl.store(ws[0], p, mask=valid)
    tl.store(ws[1], p + 1, mask=valid)


@triton.jit
def _write_defaults(bonus_ptr, b, ob, out_tok, out_par, out_dep, out_score, out_rank, out_mask,
                    T: tl.constexpr, TP: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
                    MASK: tl.constexpr):  # fmt: skip
    """Padding rows everywhere (the builders overwrite rows 1 .. n - 1); row 0 is the root.
    ``MASK``: also the self-only mask rows (the heap replay writes every mask row itself)."""
    rows = tl.arange(0, TP)
    rmask = rows < T
    tl.store(out_tok + ob + rows, tl.where(rows == 0, tl.load(bonus_ptr + b), 0), mask=rmask)
    tl.store(out_par + ob + rows, tl.full([TP], -1, tl.int64), mask=rmask)
    tl.store(out_dep + ob + rows, tl.zeros([TP], tl.int64), mask=rmask)
    tl.store(out_score + ob + rows, tl.where(rows == 0, 0.0, float("-inf")), mask=rmask)
    tl.store(out_rank + ob + rows, tl.where(rows == 0, 0, -1).to(tl.int64), mask=rmask)
    if MASK:
        wc = tl.arange(0, WP)
        self_bit = tl.where(
            wc[None, :] == (rows // 64)[:, None],
            tl.full([TP, WP], 1, tl.int64) << (rows % 64).to(tl.int64)[:, None],
            0,
        )
        mptr = out_mask + (ob + rows)[:, None] * W + wc[None, :]
        tl.store(mptr, self_bit, mask=rmask[:, None] & (wc[None, :] < W))


@triton.jit
def _mask_from_intervals(ws_lex, ws_end, wrow, out_mask, ob, T: tl.constexpr, W: tl.constexpr,
                         TP: tl.constexpr):  # fmt: skip
    """Row ``i``'s ancestor bitmask from preorder intervals: ``k`` is an ancestor-or-self of
    ``i`` iff ``lex_k <= lex_i < end_k``; a row with ``lex < 0`` sees only itself."""
    RB: tl.constexpr = 64 if TP > 64 else TP  # mask tile (rows and columns)
    ar = tl.arange(0, RB)
    one = tl.full([RB, RB], 1, tl.int64)
    for rc in tl.static_range(W):
        ri = rc * 64 + ar
        lex_i = tl.load(ws_lex + wrow + ri, mask=ri < TP, other=-1)
        real_i = lex_i >= 0
        for w in tl.static_range(W):
            ck = w * 64 + ar
            if w <= rc:
                lex_k = tl.load(ws_lex + wrow + ck, mask=ck < TP, other=-1)
                end_k = tl.load(ws_end + wrow + ck, mask=ck < TP, other=-1)
                hit = (lex_k[None, :] <= lex_i[:, None]) & (lex_i[:, None] < end_k[None, :])
                word = tl.sum(tl.where(hit, one << ar.to(tl.int64)[None, :], 0), axis=1)
            else:
                word = tl.zeros([RB], tl.int64)
            self_bit = tl.where(
                ri // 64 == w, tl.full([RB], 1, tl.int64) << (ri % 64).to(tl.int64), 0
            )
            word = tl.where(real_i, word, self_bit)
            tl.store(out_mask + (ob + ri) * W + w, word, mask=ri < T)


@triton.jit
def _heap_replay(lpb, tkb, s_lpd, s_tkd, ws_lex, ws_end, wrow, out_tok, out_par, out_dep,
                 out_score, out_rank, out_mask, out_n, b, ob, N: tl.constexpr, KE: tl.constexpr,
                 DM: tl.constexpr, NP: tl.constexpr, W: tl.constexpr, TP: tl.constexpr):  # fmt: skip
    """The two-pop heap replay (module docstring): every row and the mask of one request."""
    T: tl.constexpr = N + 1
    neg_inf = float("-inf")
    rows = tl.arange(0, TP)
    tl.store(ws_lex + wrow + rows, tl.full([TP], -1, tl.int32))
    tl.store(ws_end + wrow + rows, tl.full([TP], -1, tl.int32))
    tl.debug_barrier()

    # ---- slot vectors: slot j = node j (pop order); the root is popped ----------------------
    slot = tl.arange(0, NP)
    is_root = slot == 0
    sc0 = 0.0 + tl.load(lpb)
    st = (
        tl.where(is_root, 0, -1),  # lex: preorder position among the popped nodes
        tl.where(is_root, 256, -_FAR),  # ed: end·256 − depth (end = lex + subtree size)
        tl.zeros([NP], tl.int32),  # dep: depth
        tl.where(is_root, 0, KE),  # c: rank of the pending child (KE: none)
        tl.where(is_root, 0.0, neg_inf),  # score
        tl.where(is_root, sc0, neg_inf),  # sc: the pending child's score
        tl.where(is_root, 0.0 + tl.load(lpb + min(1, KE - 1)), neg_inf),  # sc_sib: its sibling's
        tl.where(is_root, sc0 + tl.load(lpb + min(1, DM - 1) * s_lpd), neg_inf),  # sc_kid: child's
        tl.full([NP], -1, tl.int32),  # par: parent
        tl.zeros([NP], tl.int32),  # rk: rank
    )
    n = 1
    for t in range(1, N + 1, 2):  # pops t and t + 1 from one reduction
        key, succ = _keys(st, slot, KE, DM)
        m1, m2 = tl.reduce((key, succ), 0, _top2)
        # pop 1: the best pending child, child c1 of slot j1
        v1 = m1 != _INVALID
        q1, j1, c1, s1 = _decode(m1)
        # pop 2: the best of the other slots' pending children and pop 1's two successors
        v2 = v1 & (m2 != _INVALID) & (t < N)
        q2, j2, c2, s2 = _decode(m2)
        kid = (j2 == j1) & (c2 == 0)  # node t's first child (a sibling has rank >= 1)
        q2 = q2 + tl.where(q2 >= q1, 256, 0) - kid.to(tl.int32)  # its q after pop 1
        j2 = tl.where(kid, t, j2)
        st = _pop(st, slot, t, q1, j1, c1, s1, v1, lpb, s_lpd, KE, DM)
        st = _pop(st, slot, t + 1, q2, j2, c2, s2, v2, lpb, s_lpd, KE, DM)
        if NP == N:  # node N has no slot: write its row and interval as it pops
            outs = (out_par + ob + N, out_dep + ob + N, out_rank + ob + N, out_score + ob + N)
            ws = (ws_lex + wrow + N, ws_end + wrow + N)
            if N % 2 == 1:
                _store_last(outs, ws, q1, j1, c1, s1, v1 & (t == N))
            else:
                _store_last(outs, ws, q2, j2, c2, s2, v2 & (t + 1 == N))
        n = n + v1.to(tl.int32) + v2.to(tl.int32)
    tl.store(out_n + b, n.to(tl.int64))

    # ---- the popped slots' rows and intervals ------------------------------------------------
    lex, ed, dep, _, score, _, _, _, par, rk = st
    real = (lex >= 0) & (slot >= 1)
    tl.store(out_par + ob + slot, par.to(tl.int64), mask=real)
    tl.store(out_dep + ob + slot, dep.to(tl.int64), mask=real)
    tl.store(out_rank + ob + slot, rk.to(tl.int64), mask=real)
    tl.store(out_score + ob + slot, score, mask=real)
    tl.store(ws_lex + wrow + slot, lex, mask=lex >= 0)
    tl.store(ws_end + wrow + slot, (ed + 255) >> 8, mask=lex >= 0)
    tl.debug_barrier()

    # ---- tokens: one gather ------------------------------------------------------------------
    real = (rows >= 1) & (rows < n)
    d_r = tl.load(out_dep + ob + rows, mask=real, other=1)
    r_r = tl.load(out_rank + ob + rows, mask=real, other=0)
    tl.store(out_tok + ob + rows, tl.load(tkb + (d_r - 1) * s_tkd + r_r, mask=real), mask=real)

    # ---- ancestor bitmask from the intervals --------------------------------------------------
    _mask_from_intervals(ws_lex, ws_end, wrow, out_mask, ob, T, W, TP)


@triton.jit
def _tree_build_kernel(
    lp_ptr,
    tok_ptr,
    bonus_ptr,  # [B, D, K] f32, [B, D, K] i64, [B] i64
    s_lpb,
    s_lpd,
    s_tkb,
    s_tkd,  # strides (last dim contiguous)
    ws_lex,
    ws_end,  # [B, TP] i32: preorder interval of every node, for the mask
    out_tok,
    out_par,
    out_dep,
    out_score,
    out_rank,
    out_mask,
    out_n,
    N: tl.constexpr,  # budget (pops)
    KE: tl.constexpr,  # min(K, N): higher ranks never pop
    DM: tl.constexpr,  # min(D, N): deeper nodes never pop
    NP: tl.constexpr,  # slots: next_pow2(N) (node N, the last pop, needs none)
    W: tl.constexpr,  # mask words
    WP: tl.constexpr,  # next_pow2(W)
    TP: tl.constexpr,  # next_pow2(N + 1)
):
    """The heap replay alone (``algo="heap"``)."""
    b = tl.program_id(0)
    ob = b * (N + 1)
    _write_defaults(bonus_ptr, b, ob, out_tok, out_par, out_dep, out_score, out_rank, out_mask,
                    N + 1, TP, W, WP, False)  # fmt: skip
    _heap_replay(lp_ptr + b * s_lpb, tok_ptr + b * s_tkb, s_lpd, s_tkd, ws_lex, ws_end, b * TP,
                 out_tok, out_par, out_dep, out_score, out_rank, out_mask, out_n, b, ob, N, KE,
                 DM, NP, W, TP)  # fmt: skip


# ---- the threshold builder ------------------------------------------------------------------


@triton.jit
def _shifted(row, j, l0, w, prev, c, NB: tl.constexpr):
    """``C_{d-1}[c - u_j]`` (0 below 0): rank ``j``'s deviation ``u_j`` in bins, rounded up."""
    x = (l0 - tl.load(row + j)) / w
    u = tl.where(x < NB, tl.maximum(tl.ceil(x), 0.0), NB).to(tl.int32)  # NaN / inf: out
    src = c - u
    return tl.load(prev + src, mask=src >= 0, other=0.0)


@triton.jit
def _seed(lpb, s_lpd, ws_dp, N: tl.constexpr, KE: tl.constexpr, DM: tl.constexpr,
          DMP: tl.constexpr, KEP: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """A threshold ``theta`` with (usually) a little more than ``N`` nodes at or above it.

    Counts nodes by their deviation from the rank-0 chain, ``dev = sum_d (lp[d, 0] - lp[d,
    r_d])``, in ``NB`` bins of width ``w`` with every deviation rounded up: ``C_d[c]`` = nodes
    of depth ``d`` whose rounded deviation is at most ``c`` bins, by ``C_d[c] = sum_j C_{d-1}[c
    - u_dj]`` (a shift-and-add per rank, cumulative counts throughout, rows in ``ws_dp``). A
    node of
    depth ``d`` scores ``z_d - dev`` (``z_d`` the chain's score), so ``count(-t w) = sum_d
    C_d[z_d / w + t]`` for every grid threshold at once; ``theta`` is the highest with a count
    ``>= N`` (``-inf`` when none, or when the range is not finite). Only speed rests on this
    estimate: the expansion counts the real nodes and the kernel falls back to the heap replay
    when there are too few or too many.
    """
    dd = tl.arange(0, DMP)
    kk = tl.arange(0, KEP)
    dmask = dd < DM
    tile = tl.load(lpb + dd[:, None] * s_lpd + kk[None, :], mask=dmask[:, None] & (kk < KE)[None, :],
                   other=float("-inf"))  # fmt: skip
    fin = tile > float("-inf")
    lp0 = tl.load(lpb + dd * s_lpd, mask=dmask, other=0.0)
    last = tl.min(tl.where(fin, tile, float("inf")), 1)  # the last finite log-prob per depth
    chain = (tl.cumsum(tl.where(lp0 > float("-inf"), 0, 1), 0) == 0) & dmask  # finite chain
    zprev = tl.cumsum(tl.where(chain, lp0, 0.0), 0) - tl.where(chain, lp0, 0.0)
    n_sib = tl.sum(tl.where(chain, tl.sum(fin.to(tl.int32), 1), 0), 0)
    # the chain and its finite siblings, if N of them: theta* >= their minimum; else the
    # deepest node of the last finite ranks bounds every finite node
    low = tl.where(
        n_sib >= N,
        tl.min(tl.where(chain, zprev + last, float("inf")), 0),
        tl.sum(tl.where(dmask & (last < float("inf")), last, 0.0), 0),
    )
    rng = -low
    finite = rng < 3.0e38  # false for inf and NaN
    rng = tl.where(finite, tl.maximum(rng, 1e-30), 1.0)
    w = rng / (NB - 1)
    c = tl.arange(0, NB)
    t = c.to(tl.float32)
    tl.store(ws_dp + c, tl.full([NB], 1.0, tl.float32))  # C_0: the root, deviation 0
    tl.debug_barrier()
    cnt = tl.zeros([NB], tl.float32)
    z = tl.zeros([NB], tl.float32)
    for d in range(DM):
        row = lpb + d * s_lpd
        l0 = tl.load(row)
        prev = ws_dp + d * NB
        acc = tl.zeros([NB], tl.float32)
        # one shift per rank: independent 1-D loads, no cross-thread reduction (a [ranks, NB]
        # tile summed over ranks cost ~2 µs per level in call X)
        if KE <= 64:
            for j in tl.static_range(KE):
                acc += _shifted(row, j, l0, w, prev, c, NB)
        else:
            for j in range(KE):
                acc += _shifted(row, j, l0, w, prev, c, NB)
        tl.store(ws_dp + (d + 1) * NB + c, acc)
        tl.debug_barrier()
        z = z + l0
        f = z / w + t
        ok = f >= 0  # false for NaN and -inf
        idx = tl.where(ok, tl.minimum(f, NB - 1), 0.0).to(tl.int32)
        cnt += tl.load(ws_dp + (d + 1) * NB + idx, mask=ok, other=0.0)
    tstar = tl.min(tl.where(cnt >= N, c, NB), 0)
    return tl.where(finite & (tstar < NB), -tstar.to(tl.float32) * w, float("-inf"))


@triton.jit
def _expand(lpb, s_lpd, theta, ws_s, ws_par, ws_rk, ws_dep, ws_cst, ws_a, ws_lvl,
            KE: tl.constexpr, DM: tl.constexpr, KEP: tl.constexpr, CAP: tl.constexpr,
            PC: tl.constexpr):  # fmt: skip
    """Every node scoring ``>= theta`` (within rank < KE, depth <= DM), level by level.

    A child never outscores its parent, so this set ``U`` is prefix-closed and a parent's
    kept children are a prefix of its ranks. Level ``l`` occupies ``[lvl[l-1], lvl[l])`` of the
    ``ws_*`` arrays in rank-tuple (lexicographic) order: parents are visited in order and
    children by rank. ``ws_cst`` holds each parent's first child as an index into the next
    level; ``ws_a`` the number of nodes of ``U`` before the node in rank-tuple order at smaller
    depths (per ancestor level: the ancestor's level index + 1). Returns ``|U|`` and whether
    it outgrew ``CAP`` (then ``U`` is incomplete).
    """
    kk = tl.arange(0, KEP)
    kin = kk < KE
    s1 = 0.0 + tl.load(lpb + kk, mask=kin, other=float("-inf"))
    keep = kin & (s1 >= theta)
    n1 = tl.sum(keep.to(tl.int32), 0)
    over = n1 > CAP
    keep = keep & (kk < CAP)
    n1 = tl.minimum(n1, CAP)
    tl.store(ws_s + kk, s1, mask=keep)
    tl.store(ws_par + kk, tl.full([KEP], -1, tl.int32), mask=keep)
    tl.store(ws_rk + kk, kk, mask=keep)
    tl.store(ws_dep + kk, tl.full([KEP], 1, tl.int32), mask=keep)
    tl.store(ws_a + kk, tl.zeros([KEP], tl.int32), mask=keep)
    tl.store(ws_lvl, 0)
    tl.store(ws_lvl + 1, n1)
    tl.debug_barrier()
    pp = tl.arange(0, PC)
    start = tl.where(over, n1, 0)  # after an overflow: no more work
    end = n1
    for d in range(1, DM):  # parents at depth d, children at depth d + 1
        lrow = tl.load(lpb + d * s_lpd + kk, mask=kin, other=float("-inf"))
        base = end
        for c0 in range(0, end - start, PC):  # (a loop from `start` ran from 0 on sm_90)
            pidx = start + c0 + pp
            pm = pidx < end
            sp = tl.load(ws_s + pidx, mask=pm, other=float("-inf"))
            ap = tl.load(ws_a + pidx, mask=pm, other=0) + (c0 + pp) + 1
            cs = sp[:, None] + lrow[None, :]  # the heap's float32 sum, parent first
            ok = pm[:, None] & kin[None, :] & (cs >= theta)
            cnt = tl.sum(ok.to(tl.int32), 1)
            off = base + tl.cumsum(cnt, 0) - cnt
            tl.store(ws_cst + pidx, off - end, mask=pm)
            dst = off[:, None] + kk[None, :]
            wm = ok & (dst < CAP)
            tl.store(ws_s + dst, cs, mask=wm)
            tl.store(ws_par + dst, pidx[:, None] + kk[None, :] * 0, mask=wm)
            tl.store(ws_rk + dst, pidx[:, None] * 0 + kk[None, :], mask=wm)
            tl.store(ws_dep + dst, tl.full([PC, KEP], d + 1, tl.int32), mask=wm)
            tl.store(ws_a + dst, ap[:, None] + kk[None, :] * 0, mask=wm)
            base = base + tl.sum(cnt, 0)
        over = over | (base > CAP)
        base = tl.minimum(base, CAP)
        tl.store(ws_lvl + d + 1, base)
        start = tl.where(over, base, end)  # after an overflow: no more work
        end = base
        tl.debug_barrier()
    return end, over


@triton.jit
def _order_and_emit(tkb, s_tkd, ws_s, ws_par, ws_rk, ws_dep, ws_cst, ws_a, ws_lvl, ws_key,
                    ws_rank, nU, out_tok, out_par, out_dep, out_score, out_rank, out_mask, ob,
                    N: tl.constexpr, DM: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
                    CAPP: tl.constexpr, CU: tl.constexpr, CV: tl.constexpr):  # fmt: skip
    """Order ``U`` as the heap pops it and write the ``N`` best.

    A node's position ``pre`` in the rank-tuple order of ``U`` is ``ws_a`` (its ancestors'
    levels) + its level index ``i`` + the nodes of deeper levels under level-``d`` nodes
    before it (first-child indices chained down from ``i``). The key (score's
    order-preserving image high, ``2^32 - 1 - pre`` low) is ranked against all of ``U`` (all
    pairs); rank ``r < N`` is row ``r + 1``, and the ancestor bitmask collects the rows up the
    parent chain.
    """
    xs = tl.arange(0, CAPP)
    xm = xs < nU
    par = tl.load(ws_par + xs, mask=xm, other=-1)
    dep = tl.load(ws_dep + xs, mask=xm, other=1)
    i = xs - tl.load(ws_lvl + dep - 1, mask=xm, other=0)
    cur = i
    lv = dep
    g = tl.zeros([CAPP], tl.int32)
    for _ in range(DM - 1):  # levels d + 1 .. DM
        go = xm & (lv < DM)
        st_l = tl.load(ws_lvl + lv - 1, mask=go, other=0)
        st_n = tl.load(ws_lvl + lv, mask=go, other=0)
        n_l = st_n - st_l
        n_n = tl.load(ws_lvl + lv + 1, mask=go, other=0) - st_n
        at = tl.load(ws_cst + st_l + cur, mask=go & (cur < n_l), other=0)
        nxt = tl.where(cur < n_l, at, n_n)
        g += tl.where(go, nxt, 0)
        cur = tl.where(go, nxt, cur)
        lv = tl.where(go, lv + 1, lv)
    pre = tl.load(ws_a + xs, mask=xm, other=0) + i + g
    score = tl.load(ws_s + xs, mask=xm, other=0.0)
    tl.store(ws_key + xs, _pack(score, xm, ~pre), mask=xm)  # low half 2^32 - 1 - pre
    tl.debug_barrier()
    for x0 in range(0, nU, CU):  # rank = how many keys of U are larger
        x = x0 + tl.arange(0, CU)
        kx = tl.load(ws_key + x, mask=x < nU, other=_INVALID)
        gt = tl.zeros([CU, CV], tl.int32)
        for y0 in range(0, nU, CV):  # elementwise counts; one reduction per row chunk
            yv = y0 + tl.arange(0, CV)
            ky = tl.load(ws_key + yv, mask=yv < nU, other=_INVALID)
            gt += (ky[None, :] > kx[:, None]).to(tl.int32)
        r = tl.sum(gt, 1)
        tl.store(ws_rank + x, r, mask=x < nU)
    tl.debug_barrier()
    r = tl.load(ws_rank + xs, mask=xm, other=N)
    sel = xm & (r < N)
    row = r + 1
    prow = tl.where(par >= 0, tl.load(ws_rank + par, mask=sel & (par >= 0), other=-1) + 1, 0)
    j = tl.load(ws_rk + xs, mask=sel, other=0)
    tl.store(out_tok + ob + row, tl.load(tkb + (dep - 1) * s_tkd + j, mask=sel), mask=sel)
    tl.store(out_par + ob + row, prow.to(tl.int64), mask=sel)
    tl.store(out_dep + ob + row, dep.to(tl.int64), mask=sel)
    tl.store(out_rank + ob + row, j.to(tl.int64), mask=sel)
    tl.store(out_score + ob + row, score, mask=sel)
    # the ancestor bitmask: self, the root, then the parents' rows up the chain
    wc = tl.arange(0, WP)
    one = tl.full([CAPP, WP], 1, tl.int64)
    words = tl.where(
        wc[None, :] == (row // 64)[:, None], one << (row % 64).to(tl.int64)[:, None], 0
    )
    words = words | tl.where(wc[None, :] == 0, one, 0)
    y = par
    for _ in range(DM - 1):
        a = sel & (y >= 0)
        ra = tl.load(ws_rank + y, mask=a, other=-1) + 1
        hit = a[:, None] & (wc[None, :] == (ra // 64)[:, None])
        words = words | tl.where(hit, one << (ra % 64).to(tl.int64)[:, None], 0)
        y = tl.load(ws_par + y, mask=a, other=-1)
    mptr = out_mask + (ob + row)[:, None] * W + wc[None, :]
    tl.store(mptr, words, mask=sel[:, None] & (wc[None, :] < W))


@triton.jit
def _tree_build_thresh_kernel(
    lp_ptr,
    tok_ptr,
    bonus_ptr,  # [B, D, K] f32, [B, D, K] i64, [B] i64
    s_lpb,
    s_lpd,
    s_tkb,
    s_tkd,  # strides (last dim contiguous)
    ws_lex,
    ws_end,  # [B, TP] i32: the heap fallback's preorder intervals
    ws_f,  # [B, (DM + 1) * NB + CAP] f32: the seed's counts, then U's scores
    ws_i,  # [B, 6 * CAP + LVP] i32: U's parents, ranks, depths, first children, ancestor
    #        terms, key ranks; level starts
    ws_key,  # [B, CAP] i64
    out_tok,
    out_par,
    out_dep,
    out_score,
    out_rank,
    out_mask,
    out_n,
    out_path,  # [B] i32: 1 = threshold path, 0 = heap fallback
    N: tl.constexpr,
    KE: tl.constexpr,
    DM: tl.constexpr,
    DMP: tl.constexpr,  # next_pow2(DM)
    NP: tl.constexpr,
    KEP: tl.constexpr,  # next_pow2(KE)
    W: tl.constexpr,
    WP: tl.constexpr,
    TP: tl.constexpr,
    NB: tl.constexpr,  # seed bins
    CAP: tl.constexpr,  # most nodes U may hold
    CAPP: tl.constexpr,  # next_pow2(CAP)
    LVP: tl.constexpr,  # next_pow2(DM + 2)
    PC: tl.constexpr,  # parents per expansion chunk
    CU: tl.constexpr,  # rows per rank chunk
    CV: tl.constexpr,  # columns per rank chunk
    STOP: tl.constexpr = 0,  # profiling only: 1 = stop after the seed, 2 = after the expansion
):
    """Seed a threshold, expand every node above it, order them by rank: ~3·DM dependent
    steps instead of ``N / 2`` reductions; the heap replay when the seed misses."""
    b = tl.program_id(0)
    ob = b * (N + 1)
    lpb = lp_ptr + b * s_lpb
    tkb = tok_ptr + b * s_tkb
    _write_defaults(bonus_ptr, b, ob, out_tok, out_par, out_dep, out_score, out_rank, out_mask,
                    N + 1, TP, W, WP, True)  # fmt: skip
    ws_dp = ws_f + b * ((DM + 1) * NB + CAP)
    ws_s = ws_dp + (DM + 1) * NB
    ib = ws_i + b * (6 * CAP + LVP)
    ws_par = ib
    ws_rk = ib + CAP
    ws_dep = ib + 2 * CAP
    ws_cst = ib + 3 * CAP
    ws_a = ib + 4 * CAP
    ws_rank = ib + 5 * CAP
    ws_lvl = ib + 6 * CAP
    theta = _seed(lpb, s_lpd, ws_dp, N, KE, DM, DMP, KEP, NB)
    if STOP == 1:
        tl.store(out_path + b, (theta > float("-inf")).to(tl.int32))
        return
    nU, over = _expand(lpb, s_lpd, theta, ws_s, ws_par, ws_rk, ws_dep, ws_cst, ws_a, ws_lvl, KE,
                       DM, KEP, CAP, PC)  # fmt: skip
    fast = (~over) & ((nU >= N) | (theta == float("-inf")))
    tl.store(out_path + b, fast.to(tl.int32))
    if STOP == 2:
        return
    if fast:
        _order_and_emit(tkb, s_tkd, ws_s, ws_par, ws_rk, ws_dep, ws_cst, ws_a, ws_lvl,
                        ws_key + b * CAP, ws_rank, nU, out_tok, out_par, out_dep, out_score,
                        out_rank, out_mask, ob, N, DM, W, WP, CAPP, CU, CV)  # fmt: skip
        tl.store(out_n + b, (1 + tl.minimum(nU, N)).to(tl.int64))
    else:
        _heap_replay(lpb, tkb, s_lpd, s_tkd, ws_lex, ws_end, b * TP, out_tok, out_par, out_dep,
                     out_score, out_rank, out_mask, out_n, b, ob, N, KE, DM, NP, W, TP)  # fmt: skip


def supports(lp: torch.Tensor, budget: int) -> bool:
    """Whether the kernel handles this shape (else use the torch builder)."""
    return 1 <= budget <= MAX_BUDGET and lp.dim() == 3 and lp.shape[1] > 0 and lp.shape[2] > 0


def default_num_warps(budget: int) -> int:
    """Warps per program for the heap replay: it reduces over ``next_pow2(budget)`` slots."""
    np_ = triton.next_power_of_2(budget)  # single-pop version, H200 graph-timed: 1 / 4 / 8 warps
    # to 32 / 128 / 256 slots; the two-pop loop measured best at 4 warps for 64 (call T)
    return 1 if np_ <= 32 else (4 if np_ <= 128 else 8)


def thresh_warps(budget: int) -> int:
    """Warps per program for the threshold builder: 8 beat 4 at every measured point (batch 1,
    K 8 / 32, budget 16 / 64 / 256; call Y, ``tools/gpu/bench_tree_phases.py``)."""
    return 8


def auto_algo(budget: int, K: int) -> str:
    """The faster builder for a shape, from call Y (batch 1, depth 15, CUDA graph): the heap
    replay at budget 16 (5.5 µs against 15-25) and at budget 64 with K 32 (21.6 against 35.4);
    the threshold builder at budget 64 with K 8 (15.8 against 21.3) and at budget 256 (45 / 59
    against 99 / 100)."""
    ke = min(K, budget)
    return "threshold" if budget > 64 or (budget > 32 and ke <= 8) else "heap"


def thresh_params(budget: int, K: int, D: int) -> dict[str, int]:
    """The threshold builder's static sizes for a shape (``KE``, ``DM`` clipped to the budget)."""
    N = budget
    ke, dm = min(K, N), min(D, N)
    return dict(
        NB=256,
        # |U| above the seed's threshold, numpy over draft-like top-K with 256 bins: 1.1-1.6 N
        # on average, up to 2.7 N (budget 256, K 8, one token per depth far ahead); the cap is
        # the power of two the ordering's [CAPP] tiles have anyway (2 N + 32 rounded up)
        CAP=triton.next_power_of_2(2 * N + 32),
        PC=64,
        CU=128 if N > 64 else 64,
        CV=64,
        KEP=triton.next_power_of_2(ke),
        DMP=triton.next_power_of_2(dm),
        LVP=triton.next_power_of_2(dm + 2),
    )


ALGOS = ("auto", "threshold", "heap")


def build_trees_triton(
    lp: torch.Tensor,
    tok: torch.Tensor,
    budget: int,
    bonus: torch.Tensor,
    *,
    num_warps: int | None = None,
    algo: str = "auto",
    path_out: torch.Tensor | None = None,
    cap: int | None = None,
    _stop: int = 0,
) -> DeviceTree:
    """Launch one program per request; shapes as ``build_trees_torch``.

    ``algo="threshold"``: seed a score threshold, expand every node above it level by level,
    order them (the heap replay runs instead when the seed leaves too few or too many nodes);
    ``"heap"``: the two-pop heap replay alone; ``"auto"`` (default): whichever ``auto_algo``
    says is faster for the shape. ``path_out`` (``int32 [B]``, threshold only) receives 1
    where the threshold path built the tree and 0 where the heap replay did; ``cap``
    overrides the node capacity of the threshold path (tests force the fallback with it);
    ``_stop`` (profiling only: the outputs are then incomplete) ends the threshold kernel after
    its seed (1) or its expansion (2).
    """
    check_tree_inputs(lp, tok, budget, bonus)
    if algo not in ALGOS:
        raise ValueError(f"algo={algo!r}: expected one of {ALGOS}")
    if algo == "auto":  # the threshold-only options pick the threshold builder
        threshold_only = path_out is not None or cap is not None or bool(_stop)
        algo = "threshold" if threshold_only else auto_algo(budget, lp.shape[2])
    if not supports(lp, budget):
        raise ValueError(
            f"budget={budget}, lp {tuple(lp.shape)}: outside the kernel's range (budget in "
            f"[1, {MAX_BUDGET}], D >= 1, K >= 1); use backend='torch'"
        )
    Bsz, D, K = lp.shape
    N = budget
    ke, dm = min(K, N), min(D, N)
    NP, TP = triton.next_power_of_2(N), triton.next_power_of_2(N + 1)
    T, W = N + 1, num_words(N + 1)
    dev = lp.device
    lp = lp if lp.stride(-1) == 1 else lp.contiguous()
    tok = tok if tok.stride(-1) == 1 else tok.contiguous()
    bonus = bonus.to(torch.int64).contiguous()
    nb = max(Bsz, 1)
    ws_lex = torch.empty(nb * TP, dtype=torch.int32, device=dev)
    ws_end = torch.empty(nb * TP, dtype=torch.int32, device=dev)
    out = DeviceTree.empty(Bsz, T, W, dev)
    if algo == "heap" and (path_out is not None or cap is not None or _stop):
        raise ValueError("path_out, cap and _stop are options of algo='threshold', not 'heap'")
    check_out_buffer("path_out", path_out, (Bsz,), torch.int32, dev)
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CAP
    ):
        raise ValueError(f"cap={cap!r}: expected an integer in [1, {MAX_CAP}]")
    if _stop not in (0, 1, 2):
        raise ValueError(f"_stop={_stop!r}: expected 0, 1 or 2")
    if Bsz == 0:
        return out
    common = (lp, tok, bonus, lp.stride(0), lp.stride(1), tok.stride(0), tok.stride(1))
    outs = (out.tokens, out.parents, out.depths, out.scores, out.ranks, out.mask, out.n_nodes)
    if algo == "heap":
        _tree_build_kernel[(Bsz,)](
            *common, ws_lex, ws_end, *outs,
            N=N, KE=ke, DM=dm, NP=NP, W=W, WP=triton.next_power_of_2(W), TP=TP,
            num_warps=num_warps or default_num_warps(N),
        )  # fmt: skip
        return out
    prm = thresh_params(N, K, D)
    if cap is not None:
        prm["CAP"] = cap
    prm["CAPP"] = triton.next_power_of_2(prm["CAP"])
    cap_, lvp = prm["CAP"], prm["LVP"]
    ws_f = torch.empty(nb * ((dm + 1) * prm["NB"] + cap_), dtype=torch.float32, device=dev)
    ws_i = torch.empty(nb * (6 * cap_ + lvp), dtype=torch.int32, device=dev)
    ws_key = torch.empty(nb * cap_, dtype=torch.int64, device=dev)
    if path_out is None:
        path_out = torch.empty(Bsz, dtype=torch.int32, device=dev)
    _tree_build_thresh_kernel[(Bsz,)](
        *common, ws_lex, ws_end, ws_f, ws_i, ws_key, *outs, path_out,
        N=N, KE=ke, DM=dm, NP=NP, W=W, WP=triton.next_power_of_2(W), TP=TP, **prm, STOP=_stop,
        num_warps=num_warps or thresh_warps(N),
    )  # fmt: skip
    return out
