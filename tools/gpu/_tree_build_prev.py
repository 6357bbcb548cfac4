"""One Triton program per request replays the best-first heap itself, pop by pop, in registers.

Why the previous kernel was slow (H200, CUDA graph: 95 µs at budget 16, 160 µs at 64, 420 µs
at 256, the same at batch 1 and 32, so latency-bound, not throughput-bound). It built the tree
level-synchronously: for each of the ``Dm - 1`` levels (14 at ``D = 15``) it found the N-th
largest of ``NP · KP`` child scores by bisection on the int32 score image, ~31 iterations, each
a block-wide reduction (``tl.sum`` over 256 .. 8192 lanes: shuffles, shared memory, two
barriers) whose result decides the next iteration, then ran three scans over the same block and
a global-memory round trip behind a barrier; then ~15 more barrier-separated passes (subtree
sizes, preorder), a global bisection pair (~31 + ~9 iterations over ``DMP · NP`` = 4096 slots)
and ``Dm`` mask passes. That is ~14 · 31 + 40 ≈ 480 dependent block reductions plus ~60
barriers per request whatever the batch: ~0.2 µs each over 256 lanes (4 warps) and ~0.8 µs over
8192 lanes (16 warps, 16 int64 elements a thread per iteration) — 95 µs and 420 µs.

This kernel does ``budget`` dependent steps instead, each ONE reduction over ``NP =
next_pow2(budget)`` slots (a single warp up to budget 32): the heap holds, for every popped node
``j``, exactly one entry — ``j``'s next child (rank ``c_j``) — so slot ``j`` of a register
vector holds that entry and one ``tl.max`` over packed ``int64`` keys pops it. The key is the
heap's order: order-preserving int32 image of the float32 score (high half), then the rank-tuple
tie rule. Rank tuples are compared without storing them: every popped node keeps its position
``lex`` in the lexicographic (= preorder) order of the popped set and the end ``end`` of its
subtree's interval there; slot ``j``'s child would be inserted at ``P = end_j``, candidates with a
smaller ``P`` come first in rank-tuple order, and equal ``P`` means nested subtrees, where the
deeper slot's child comes first. The low half packs ``(256 - P, depth_j, j, c_j)`` (8 bits each;
``P >= 1`` and budget ≤ 256), so the popped key also yields the slot, its depth, the child's rank
and (inverting the int32 image) its exact score: no second reduction. A pop then updates the
vectors elementwise (shift ``lex``/``end`` behind ``P``, grow ancestors' ``end``: ancestors of
``j`` are the popped nodes with ``lex < P <= end`` and depth ``<= depth_j``), loads two log-probs
(next sibling, first child) and writes the node's parent, depth, rank and score. Per pop: one
reduction plus ~40 elementwise ops on ``NP / (32 · num_warps)`` slots a thread. After the loop
the ancestor bitmask comes from the same intervals (``k`` is an ancestor-or-self of ``i`` iff
``lex_k <= lex_i < end_k``), tile by tile, and the tokens by one gather.

Measured (H200, `kdtree bench tree-build --budgets 16,64,256`, one build per graph replay, rows
in `data/bench/tree_build.csv`): batch 1 takes 16 / 27 / 117 µs at budget 16 / 64 / 256 (the
previous kernel 95 / 161 / 418 µs in the first session's rows), batch 32 the same. The budget-16
figure is mostly the launch inside the graph; at 64 and 256 a pop costs ~0.4 µs whatever the
warps: the dependent reduction + decode + update chain is the floor of this formulation, so
budget 256 stays ~115 µs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu.tree_build import DeviceTree, check_tree_inputs

__all__ = ["MAX_BUDGET", "build_trees_triton", "default_num_warps", "supports"]

MAX_BUDGET = 256  # the packed pop key holds 256 - P, depth, slot and rank in 8 bits each
_INVALID = tl.constexpr(-(2**63))  # no pending child


@triton.jit
def _ordered(score):
    """float32 → int32 with the same order (``-0.0`` folded into ``+0.0``)."""
    s = tl.where(score == 0.0, 0.0, score)
    bits = s.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _pop_keys(score_c, alive, end, dep, c, slot):
    """Packed ``int64`` heap keys of the slots' pending children (larger = popped first)."""
    hi = _ordered(score_c).to(tl.int64) << 32
    lo = ((256 - end).to(tl.int64) << 24) | (dep << 16).to(tl.int64) | (slot << 8) | c
    return tl.where(alive, hi | lo, _INVALID)


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
    neg_inf = float("-inf")

    # ---- defaults: padding rows (the pops overwrite rows 1 .. n - 1) ----------------------
    rows = tl.arange(0, TP)
    rmask = rows < T
    tl.store(out_tok + ob + rows, tl.where(rows == 0, tl.load(bonus_ptr + b), 0), mask=rmask)
    tl.store(out_par + ob + rows, tl.full([TP], -1, tl.int64), mask=rmask)
    tl.store(out_dep + ob + rows, tl.zeros([TP], tl.int64), mask=rmask)
    tl.store(out_score + ob + rows, tl.where(rows == 0, 0.0, neg_inf), mask=rmask)
    tl.store(out_rank + ob + rows, tl.where(rows == 0, 0, -1).to(tl.int64), mask=rmask)
    tl.debug_barrier()

    # ---- slot vectors: slot j = node j (pop order); the root is popped ----------------------
    slot = tl.arange(0, NP)
    is_root = slot == 0
    popped = is_root
    score = tl.where(is_root, 0.0, neg_inf)  # node score
    dep = tl.zeros([NP], tl.int32)  # node depth
    c = tl.zeros([NP], tl.int32)  # rank of the pending child
    lex = tl.where(is_root, 0, -1)  # preorder position among popped nodes
    end = tl.where(is_root, 1, -1)  # lex + subtree size
    lp00 = tl.load(lpb)
    score_c = tl.where(is_root, 0.0 + lp00, neg_inf)  # pending child's score
    key = _pop_keys(score_c, is_root, end, dep, c, slot)
    n = 1
    last_p = 0
    for t in range(1, N + 1):
        m = tl.max(key, axis=0)
        valid = m != _INVALID
        lo = (m & 0xFFFFFFFF).to(tl.int32)
        p = 256 - ((lo >> 24) & 255)
        dj = (lo >> 16) & 255
        j = (lo >> 8) & 255
        cj = lo & 255
        o = (m >> 32).to(tl.int32)
        s_new = (o ^ ((o >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        # the node: parent j, depth dj + 1, rank cj
        tl.store(out_par + ob + t, j.to(tl.int64), mask=valid)
        tl.store(out_dep + ob + t, (dj + 1).to(tl.int64), mask=valid)
        tl.store(out_rank + ob + t, cj.to(tl.int64), mask=valid)
        tl.store(out_score + ob + t, s_new, mask=valid)
        lp_sib = tl.load(lpb + dj * s_lpd + cj + 1, mask=valid & (cj + 1 < KE), other=neg_inf)
        lp_kid = tl.load(lpb + (dj + 1) * s_lpd, mask=valid & (dj + 1 < DM), other=neg_inf)
        # interval bookkeeping: insert the node at preorder position p
        anc = popped & (lex < p) & (end >= p) & (dep <= dj) & valid  # ancestors-or-self of j
        shift = popped & (lex >= p) & valid
        lex = lex + shift.to(tl.int32)
        end = end + (shift | anc).to(tl.int32)
        is_t = (slot == t) & valid
        is_j = (slot == j) & valid
        lex = tl.where(is_t, p, lex)
        end = tl.where(is_t, p + 1, end)
        dep = tl.where(is_t, dj + 1, dep)
        score = tl.where(is_t, s_new, score)
        c = tl.where(is_j, cj + 1, tl.where(is_t, 0, c))
        score_c = tl.where(is_j, score + lp_sib, tl.where(is_t, s_new + lp_kid, score_c))
        popped = popped | is_t
        alive = popped & (dep < DM) & (c < KE)
        key = _pop_keys(score_c, alive, end, dep, c, slot)
        n = n + valid.to(tl.int32)
        last_p = tl.where(valid, p, last_p)
    tl.store(out_n + b, n.to(tl.int64))

    # ---- intervals of every node (node N, if popped, has no slot: it is a leaf at last_p) ----
    wrow = b * TP
    tl.store(ws_lex + wrow + rows, tl.full([TP], -1, tl.int32))
    tl.store(ws_end + wrow + rows, tl.full([TP], -1, tl.int32))
    tl.debug_barrier()
    tl.store(ws_lex + wrow + slot, lex)
    tl.store(ws_end + wrow + slot, end)
    tl.store(ws_lex + wrow + N, last_p, mask=n == N + 1)
    tl.store(ws_end + wrow + N, last_p + 1, mask=n == N + 1)
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
    """Warps per program: the pop loop is one reduction over ``next_pow2(budget)`` slots."""
    np_ = triton.next_power_of_2(budget)  # H200, graph-timed: 1 warp to 32, 4 to 128, else 8
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
