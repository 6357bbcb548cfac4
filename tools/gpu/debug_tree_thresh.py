"""Debug aid: run the threshold tree kernel on one input and dump its workspaces (level starts,
the seed's counts, U's scores), so a GPU run can be compared with the interpreter's
(``TRITON_INTERPRET=1`` on the same input). Prints one JSON object."""

from __future__ import annotations

import argparse
import json

import torch
import triton

from kdtree.spec.bitmask import num_words
from kdtree.spec.gpu import tree_build_triton as tbt
from kdtree.spec.tree import build_tree_ref, draft_topk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--K", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 15, 8192, generator=gen) * 3
    lp, tok = draft_topk(logits, a.K)
    dev = torch.device(a.device)
    lp, tok = lp.to(dev), tok.to(dev)
    bonus = torch.zeros(1, dtype=torch.int64, device=dev)
    N, (B, D, K) = a.budget, lp.shape
    ke, dm = min(K, N), min(D, N)
    prm = tbt.thresh_params(N, K, D)
    nb, cap, dmp = prm["NB"], prm["CAP"], prm["DMP"]
    T, W, TP = N + 1, num_words(N + 1), triton.next_power_of_2(N + 1)
    ws_f = torch.full(((dm + 1) * nb + cap,), -7.0, device=dev)
    ws_i = torch.full((5 * cap + dmp + 1,), -7, dtype=torch.int32, device=dev)
    ws_key = torch.zeros(cap, dtype=torch.int64, device=dev)
    ws_lex = torch.empty(TP, dtype=torch.int32, device=dev)
    ws_end = torch.empty(TP, dtype=torch.int32, device=dev)
    o = [torch.empty(1, T, dtype=torch.int64, device=dev) for _ in range(3)]
    sc = torch.empty(1, T, device=dev)
    rk = torch.empty(1, T, dtype=torch.int64, device=dev)
    mk = torch.empty(1, T, W, dtype=torch.int64, device=dev)
    nn = torch.empty(1, dtype=torch.int64, device=dev)
    path = torch.full((1,), -1, dtype=torch.int32, device=dev)
    tbt._tree_build_thresh_kernel[(1,)](
        lp, tok, bonus, lp.stride(0), lp.stride(1), tok.stride(0), tok.stride(1),
        ws_lex, ws_end, ws_f, ws_i, ws_key, o[0], o[1], o[2], sc, rk, mk, nn, path,
        N=N, KE=ke, DM=dm, NP=triton.next_power_of_2(N), W=W, WP=triton.next_power_of_2(W),
        TP=TP, **prm, num_warps=a.warps, num_stages=a.stages,
    )  # fmt: skip
    ref = build_tree_ref(lp[0].cpu(), tok[0].cpu(), N, 0)
    dp = ws_f[: (dm + 1) * nb].view(dm + 1, nb).cpu()
    lvl = ws_i[5 * cap : 5 * cap + dm + 1].cpu().tolist()
    nu = lvl[-1]
    out = {
        "path": int(path.item()),
        "lvl": lvl,
        "dp_row_last": [round(float(x), 3) for x in dp[:, -1].tolist()],
        "dp_row_mid": [round(float(x), 3) for x in dp[:, nb // 2].tolist()],
        "U_scores": [round(float(x), 4) for x in ws_f[(dm + 1) * nb : (dm + 1) * nb + max(nu, 0)].cpu().tolist()][:40],
        "U_par": ws_i[: min(max(nu, 0), 40)].cpu().tolist(),
        "theta_ref": float(ref.scores[-1]),
        "parents_ok": o[1][0, : ref.size].cpu().tolist() == ref.parents.tolist(),
    }  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
