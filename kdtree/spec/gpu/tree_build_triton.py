"""One Triton program per request replays the best-first heap in registers, two pops per
reduction.

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

Timing (H200, `kdtree bench tree-build --budgets 16,64,256`, one build per CUDA-graph replay,
rows in `data/bench/tree_build.csv`; the previous single-pop kernel timed in the same device
call as ``device_triton_prev*``): batch 1 takes 9.8 / 23.5 / 100.9 µs at budget 16 / 64 / 256
against 9.9 / 27.2 / 117.0 µs for one pop per reduction — 1.16x at budget 256, as a crude
in-order latency model of the sm_90 SASS had predicted (10–25 % fewer cycles per pop, not 2x):
the loop body is 244 / 286 / 333 instructions per two pops (single-pop: 120 / 112 / 133 per
pop) with 0 / 3 / 3 barriers (0 / 2 / 2 per pop), and the top-2 combine is shuffle-based where
``tl.max`` used REDUX, so what is saved is mostly the second reduction's synchronisation.
Batch 8 and 32 take the same per build (one program per request), except batch 32 at budget 16
(16.7 µs against 10.2 µs for the single-pop kernel in the same call). ``default_num_warps`` is
still the single-pop version's tuning.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu.tree_build import DeviceTree, check_tree_inputs

__all__ = ["MAX_BUDGET", "build_trees_triton", "default_num_warps", "supports"]

MAX_BUDGET = 256  # the packed key holds end·256 − depth in 16 bits, slot and rank in 8 each
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
    DMP: tl.constexpr,  # unused (kept for the sm_90 compile check's signature)
    NP: tl.constexpr,  # slots: next_pow2(N) (node N, the last pop, needs none)
    KP: tl.constexpr,  # unused
    W: tl.constexpr,  # mask words
    WP: tl.constexpr,  # unused
    TP: tl.constexpr,  # next_pow2(N + 1)
):
    b = tl.program_id(0)
    T: tl.constexpr = N + 1
    RB: tl.constexpr = 64 if TP > 64 else TP  # mask tile (rows and columns)
    lpb = lp_ptr + b * s_lpb
    tkb = tok_ptr + b * s_tkb
    ob = b * T
    wrow = b * TP
    neg_inf = float("-inf")

    # ---- defaults: padding rows (rows 1 .. n - 1 are overwritten after the pops) ------------
    rows = tl.arange(0, TP)
    rmask = rows < T
    tl.store(out_tok + ob + rows, tl.where(rows == 0, tl.load(bonus_ptr + b), 0), mask=rmask)
    tl.store(out_par + ob + rows, tl.full([TP], -1, tl.int64), mask=rmask)
    tl.store(out_dep + ob + rows, tl.zeros([TP], tl.int64), mask=rmask)
    tl.store(out_score + ob + rows, tl.where(rows == 0, 0.0, neg_inf), mask=rmask)
    tl.store(out_rank + ob + rows, tl.where(rows == 0, 0, -1).to(tl.int64), mask=rmask)
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

    # ---- ancestor bitmask: k is an ancestor-or-self of i iff lex_k <= lex_i < end_k -----------
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


def supports(lp: torch.Tensor, budget: int) -> bool:
    """Whether the kernel handles this shape (else use the torch builder)."""
    return 1 <= budget <= MAX_BUDGET and lp.dim() == 3 and lp.shape[1] > 0 and lp.shape[2] > 0


def default_num_warps(budget: int) -> int:
    """Warps per program: the pop loop reduces over ``next_pow2(budget)`` slots."""
    np_ = triton.next_power_of_2(budget)  # single-pop version, H200 graph-timed: 1 / 4 / 8 warps
    # to 32 / 128 / 256 slots (the two-pop loop is not tuned yet)
    return 1 if np_ <= 32 else (4 if np_ <= 128 else 8)


def build_trees_triton(
    lp: torch.Tensor,
    tok: torch.Tensor,
    budget: int,
    bonus: torch.Tensor,
    *,
    num_warps: int | None = None,
) -> DeviceTree:
    """Launch one program per request; shapes as ``build_trees_torch``."""
    check_tree_inputs(lp, tok, budget, bonus)
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
    ws_lex = torch.empty(max(Bsz, 1) * TP, dtype=torch.int32, device=dev)
    ws_end = torch.empty(max(Bsz, 1) * TP, dtype=torch.int32, device=dev)
    out = DeviceTree(
        tokens=torch.empty(Bsz, T, dtype=torch.int64, device=dev),
        parents=torch.empty(Bsz, T, dtype=torch.int64, device=dev),
        depths=torch.empty(Bsz, T, dtype=torch.int64, device=dev),
        mask=torch.empty(Bsz, T, W, dtype=torch.int64, device=dev),
        scores=torch.empty(Bsz, T, dtype=torch.float32, device=dev),
        ranks=torch.empty(Bsz, T, dtype=torch.int64, device=dev),
        n_nodes=torch.empty(Bsz, dtype=torch.int64, device=dev),
    )
    if Bsz == 0:
        return out
    _tree_build_kernel[(Bsz,)](
        lp,
        tok,
        bonus,
        lp.stride(0),
        lp.stride(1),
        tok.stride(0),
        tok.stride(1),
        ws_lex,
        ws_end,
        out.tokens,
        out.parents,
        out.depths,
        out.scores,
        out.ranks,
        out.mask,
        out.n_nodes,
        N=N,
        KE=ke,
        DM=dm,
        DMP=triton.next_power_of_2(dm),
        NP=NP,
        KP=triton.next_power_of_2(ke),
        W=W,
        WP=triton.next_power_of_2(W),
        TP=TP,
        num_warps=num_warps or default_num_warps(N),
    )
    return out
