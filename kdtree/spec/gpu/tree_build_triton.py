"""One Triton program per request builds the heap's tree (same algorithm as the torch version).

Per level ``d``: the ``N · Ke`` children of the kept set are scored in registers; the ``N``-th
largest score is found by bisection on the order-preserving int32 image of the float32 score;
ties at that score are kept in lexicographic (flat ``parent · KP + rank``) order with a prefix
sum, and the kept nodes are compacted, in lexicographic order, into a per-request workspace.
Then subtree sizes (atomics, bottom-up) and preorder numbers (prefix sums, top-down); the global
top-``N`` by ``(score, preorder)`` (bisection again, ties by a second bisection on preorder);
pop order by pairwise ranks; tokens, parents and the ancestor bitmask (level by level) are
written straight into the outputs. ``tl.debug_barrier`` orders the workspace traffic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu.tree_build import DeviceTree, check_tree_inputs

__all__ = ["MAX_BUDGET", "build_trees_triton", "supports"]

MAX_BUDGET = 256  # pairwise pop-order ranks are [N, N]
MAX_CANDIDATES = 8192  # N_pad · K_pad candidate keys held in registers per level


@triton.jit
def _ordered(score):
    """float32 → int32 with the same order (``-0.0`` folded into ``+0.0``)."""
    s = tl.where(score == 0.0, 0.0, score)
    bits = s.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _kth_largest(o, valid, n_keep):
    """Largest ``t`` with ``#{valid & o >= t} >= n_keep`` (the min valid value if none)."""
    o64 = o.to(tl.int64)
    lo = tl.min(tl.where(valid, o64, 2147483647))
    hi = tl.max(tl.where(valid, o64, -2147483648))
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        cnt = tl.sum((valid & (o64 >= mid)).to(tl.int32))
        ok = cnt >= n_keep
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _tree_build_kernel(
    lp_ptr,
    tok_ptr,
    bonus_ptr,  # [B, D, K] f32, [B, D, K] i64, [B] i64
    s_lpb,
    s_lpd,
    s_tkb,
    s_tkd,  # strides (last dim contiguous)
    ws_score,
    ws_valid,
    ws_par,
    ws_rank,
    ws_size,
    ws_pre,
    ws_node,
    ws_off,  # [B, DM*NP]
    ws_key,
    ws_slot,  # [B, NP]
    ws_anc,  # [B, DM*NP, WP] i64
    out_tok,
    out_par,
    out_dep,
    out_score,
    out_rank,
    out_mask,
    out_n,
    N: tl.constexpr,
    KE: tl.constexpr,
    DM: tl.constexpr,
    DMP: tl.constexpr,
    NP: tl.constexpr,
    KP: tl.constexpr,
    W: tl.constexpr,
    WP: tl.constexpr,
    TP: tl.constexpr,
):
    b = tl.program_id(0)
    T: tl.constexpr = N + 1
    LV: tl.constexpr = DM * NP
    i_np = tl.arange(0, NP)
    r_kp = tl.arange(0, KP)
    words = tl.arange(0, WP)
    wb = b * LV  # workspace row base
    lpb = lp_ptr + b * s_lpb
    tkb = tok_ptr + b * s_tkb

    # ---- defaults: every level slot invalid, outputs = padding rows ----------------------
    for d in range(DM):
        tl.store(ws_valid + wb + d * NP + i_np, tl.zeros([NP], tl.int32))
        tl.store(ws_size + wb + d * NP + i_np, tl.zeros([NP], tl.int32))
        tl.store(ws_par + wb + d * NP + i_np, tl.zeros([NP], tl.int32))
        tl.store(ws_rank + wb + d * NP + i_np, tl.zeros([NP], tl.int32))
        tl.store(ws_node + wb + d * NP + i_np, tl.full([NP], -1, tl.int32))
        tl.store(ws_score + wb + d * NP + i_np, tl.full([NP], float("-inf"), tl.float32))
    rows = tl.arange(0, TP)
    rmask = rows < T
    ob = b * T
    tl.store(out_tok + ob + rows, tl.zeros([TP], tl.int64), mask=rmask)
    tl.store(out_par + ob + rows, tl.full([TP], -1, tl.int64), mask=rmask)
    tl.store(out_dep + ob + rows, tl.zeros([TP], tl.int64), mask=rmask)
    tl.store(out_score + ob + rows, tl.full([TP], float("-inf"), tl.float32), mask=rmask)
    tl.store(out_rank + ob + rows, tl.full([TP], -1, tl.int64), mask=rmask)
    one64 = tl.full([TP, WP], 1, tl.int64)
    self_bits = tl.where(
        (rows // 64)[:, None] == words[None, :], one64 << (rows % 64).to(tl.int64)[:, None], 0
    )
    tl.store(
        out_mask + (ob + rows)[:, None] * W + words[None, :],
        self_bits,
        mask=rmask[:, None] & (words < W)[None, :],
    )
    tl.debug_barrier()

    # ---- level 0 (depth 1): the top-Ke ranks ----------------------------------------------
    v0 = i_np < KE
    s0 = tl.load(lpb + i_np, mask=v0, other=float("-inf"))
    tl.store(ws_score + wb + i_np, s0)
    tl.store(ws_valid + wb + i_np, v0.to(tl.int32))
    tl.store(ws_par + wb + i_np, tl.zeros([NP], tl.int32))
    tl.store(ws_rank + wb + i_np, i_np)
    tl.debug_barrier()

    # ---- levels 1 .. DM-1: top-N children of the kept set, compacted in lex order ---------
    flat = i_np[:, None] * KP + r_kp[None, :]
    for d in range(1, DM):
        ps = tl.load(ws_score + wb + (d - 1) * NP + i_np)
        pv = tl.load(ws_valid + wb + (d - 1) * NP + i_np) != 0
        lpd = tl.load(lpb + d * s_lpd + r_kp, mask=r_kp < KE, other=float("-inf"))
        cand = ps[:, None] + lpd[None, :]
        cval = pv[:, None] & (r_kp < KE)[None, :]
        o = _ordered(cand)
        tau = _kth_largest(o, cval, N)
        o64 = o.to(tl.int64)
        gt = cval & (o64 > tau)
        tie = cval & (o64 == tau)
        need = N - tl.sum(gt.to(tl.int32))
        tie_f = tl.reshape(tie.to(tl.int32), [NP * KP])
        tie_rank = tl.cumsum(tie_f, 0) - tie_f
        kept = tl.reshape(gt, [NP * KP]) | ((tie_f != 0) & (tie_rank < need))
        kept_i = kept.to(tl.int32)
        pos = tl.cumsum(kept_i, 0) - kept_i
        fl = tl.reshape(flat, [NP * KP])
        dst = wb + d * NP + pos
        tl.store(ws_score + dst, tl.reshape(cand, [NP * KP]), mask=kept)
        tl.store(ws_valid + dst, tl.full([NP * KP], 1, tl.int32), mask=kept)
        tl.store(ws_par + dst, fl // KP, mask=kept)
        tl.store(ws_rank + dst, fl % KP, mask=kept)
        tl.debug_barrier()

    # ---- subtree sizes, bottom-up ------------------------------------------------------------
    for d in range(DM):
        v = tl.load(ws_valid + wb + d * NP + i_np)
        tl.atomic_add(ws_size + wb + d * NP + i_np, v)
    tl.debug_barrier()
    for dd in range(1, DM):
        d = DM - dd
        v = tl.load(ws_valid + wb + d * NP + i_np) != 0
        sz = tl.load(ws_size + wb + d * NP + i_np)
        par = tl.load(ws_par + wb + d * NP + i_np)
        tl.atomic_add(ws_size + wb + (d - 1) * NP + par, sz, mask=v)
        tl.debug_barrier()

    # ---- preorder numbers, top-down ------------------------------------------------------------
    sz = tl.load(ws_size + wb + i_np)
    v = tl.load(ws_valid + wb + i_np)
    tl.store(ws_pre + wb + i_np, 1 + tl.cumsum(sz, 0) - sz)
    tl.store(ws_off + wb + i_np, tl.cumsum(sz - v, 0) - (sz - v))
    tl.debug_barrier()
    for d in range(1, DM):
        sz = tl.load(ws_size + wb + d * NP + i_np)
        v = tl.load(ws_valid + wb + d * NP + i_np)
        par = tl.load(ws_par + wb + d * NP + i_np)
        g = tl.cumsum(sz, 0) - sz
        ppre = tl.load(ws_pre + wb + (d - 1) * NP + par)
        poff = tl.load(ws_off + wb + (d - 1) * NP + par)
        tl.store(ws_pre + wb + d * NP + i_np, ppre + 1 + g - poff)
        tl.store(ws_off + wb + d * NP + i_np, tl.cumsum(sz - v, 0) - (sz - v))
        tl.debug_barrier()

    # ---- global top-N by (score, preorder) ------------------------------------------------
    lv = tl.arange(0, NP)[None, :] + (tl.arange(0, DMP)[:, None] * NP)  # [DMP, NP] slots
    lvm = lv < LV
    gs = tl.load(ws_score + wb + lv, mask=lvm, other=float("-inf"))
    gv = tl.load(ws_valid + wb + lv, mask=lvm, other=0) != 0
    gpre = tl.load(ws_pre + wb + lv, mask=lvm, other=0)
    go = _ordered(gs)
    gtau = _kth_largest(go, gv, N)
    go64 = go.to(tl.int64)
    ggt = gv & (go64 > gtau)
    gtie = gv & (go64 == gtau)
    gneed = N - tl.sum(ggt.to(tl.int32))
    # among ties keep the gneed smallest preorder numbers: bisection on the preorder
    plo = tl.min(tl.where(gtie, gpre, 2147483647)).to(tl.int64)
    phi = tl.max(tl.where(gtie, gpre, 0)).to(tl.int64)
    while plo < phi:
        mid = plo + (phi - plo) // 2
        cnt = tl.sum((gtie & (gpre.to(tl.int64) <= mid)).to(tl.int32))
        ok = cnt >= gneed
        phi = tl.where(ok, mid, phi)
        plo = tl.where(ok, plo, mid + 1)
    sel = ggt | (gtie & (gpre.to(tl.int64) <= plo))
    sel_f = tl.reshape(sel.to(tl.int32), [DMP * NP])
    n_sel = tl.sum(sel_f)
    cpos = tl.cumsum(sel_f, 0) - sel_f
    key = (go64 << 32) + (4294967295 - gpre.to(tl.int64))
    tl.store(ws_key + b * NP + cpos, tl.reshape(key, [DMP * NP]), mask=sel_f != 0)
    tl.store(ws_slot + b * NP + cpos, tl.reshape(lv, [DMP * NP]), mask=sel_f != 0)
    tl.store(out_n + b, (1 + n_sel).to(tl.int64))
    tl.debug_barrier()

    # ---- pop order: rank of each selected key ----------------------------------------------
    cv = i_np < n_sel
    ki = tl.load(ws_key + b * NP + i_np, mask=cv, other=-9223372036854775807 - 1)
    kj = tl.load(ws_key + b * NP + i_np, mask=cv, other=-9223372036854775807 - 1)
    rank = tl.sum((kj[None, :] > ki[:, None]).to(tl.int32), axis=1)
    node = 1 + rank
    slot = tl.load(ws_slot + b * NP + i_np, mask=cv, other=0)
    tl.store(ws_node + wb + slot, node, mask=cv)
    tl.debug_barrier()

    # ---- outputs: tokens, parents, depths, scores, ranks ----------------------------------
    d_of = slot // NP
    par_i = tl.load(ws_par + wb + slot, mask=cv, other=0)
    pnode = tl.load(ws_node + wb + (d_of - 1) * NP + par_i, mask=cv & (d_of > 0), other=0)
    rk = tl.load(ws_rank + wb + slot, mask=cv, other=0)
    tokv = tl.load(tkb + d_of * s_tkd + rk, mask=cv, other=0)
    on = ob + node
    tl.store(out_tok + on, tokv, mask=cv)
    tl.store(out_par + on, pnode.to(tl.int64), mask=cv)
    tl.store(out_dep + on, (d_of + 1).to(tl.int64), mask=cv)
    tl.store(out_score + on, tl.load(ws_score + wb + slot, mask=cv, other=0.0), mask=cv)
    tl.store(out_rank + on, rk.to(tl.int64), mask=cv)
    tl.store(out_tok + ob, tl.load(bonus_ptr + b))
    tl.store(out_par + ob, -1)
    tl.store(out_score + ob, 0.0)
    tl.store(out_rank + ob, 0)

    # ---- ancestor bitmask, level by level ----------------------------------------------------
    wmask = (words < W)[None, :]
    one = tl.full([NP, WP], 1, tl.int64)
    for d in range(DM):
        nd = tl.load(ws_node + wb + d * NP + i_np)
        own = tl.where(
            ((nd // 64)[:, None] == words[None, :]) & (nd >= 0)[:, None],
            one << (tl.maximum(nd, 0) % 64).to(tl.int64)[:, None],
            0,
        )
        if d == 0:
            up = tl.where(words[None, :] == 0, one, 0)  # the root's bit
        else:
            par = tl.load(ws_par + wb + d * NP + i_np)
            up = tl.load(ws_anc + (wb + (d - 1) * NP + par)[:, None] * WP + words[None, :])
        anc = own | up
        tl.store(ws_anc + (wb + d * NP + i_np)[:, None] * WP + words[None, :], anc)
        tl.store(
            out_mask + (ob + nd)[:, None] * W + words[None, :],
            anc,
            mask=(nd >= 0)[:, None] & wmask,
        )
        tl.debug_barrier()


def supports(lp: torch.Tensor, budget: int) -> bool:
    """Whether the kernel handles this shape (else use the torch builder)."""
    if budget < 1 or budget > MAX_BUDGET or lp.dim() != 3 or lp.shape[1] == 0:
        return False
    ke = min(lp.shape[2], budget)
    return triton.next_power_of_2(budget) * triton.next_power_of_2(ke) <= MAX_CANDIDATES


def build_trees_triton(
    lp: torch.Tensor, tok: torch.Tensor, budget: int, bonus: torch.Tensor
) -> DeviceTree:
    """Launch one program per request; shapes as ``build_trees_torch``."""
    check_tree_inputs(lp, tok, budget, bonus)
    if not supports(lp, budget):
        raise ValueError(
            f"budget={budget}, lp {tuple(lp.shape)}: outside the kernel's range (budget in "
            f"[1, {MAX_BUDGET}], N_pad * K_pad <= {MAX_CANDIDATES}); use backend='torch'"
        )
    Bsz, D, K = lp.shape
    N = budget
    ke, dm = min(K, N), min(D, N)
    NP, KP = triton.next_power_of_2(N), triton.next_power_of_2(ke)
    T, W = N + 1, num_words(N + 1)
    WP = triton.next_power_of_2(W)
    dev = lp.device
    lp = lp if lp.stride(-1) == 1 else lp.contiguous()
    tok = tok if tok.stride(-1) == 1 else tok.contiguous()
    bonus = bonus.to(torch.int64).contiguous()
    lv = max(Bsz, 1) * dm * NP
    i32 = dict(dtype=torch.int32, device=dev)
    ws = [torch.empty(lv, dtype=torch.float32, device=dev)] + [
        torch.empty(lv, **i32) for _ in range(7)
    ]
    ws_key = torch.empty(max(Bsz, 1) * NP, dtype=torch.int64, device=dev)
    ws_slot = torch.empty(max(Bsz, 1) * NP, **i32)
    ws_anc = torch.empty(lv * WP, dtype=torch.int64, device=dev)
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
        *ws,
        ws_key,
        ws_slot,
        ws_anc,
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
        KP=KP,
        W=W,
        WP=WP,
        TP=triton.next_power_of_2(T),
        num_warps=16 if NP * KP >= 4096 else (8 if NP * KP >= 1024 else 4),
    )
    return out
