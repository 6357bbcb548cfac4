"""A/B/C of the draft top-K: one pass (fp32 log_softmax, torch.topk over the vocabulary), two
stages (top-K per 512-wide chunk, top-K of the survivors, minus logsumexp; measured in call N and
dropped) and the fused Triton kernel that ``kdtree.spec.tree.draft_topk`` runs on a GPU.

``python3 tools/gpu/bench_draft_topk.py [--out DIR]``: bf16 logits ``[batch, 16, V]`` with the
shipped target's vocabulary, batch 1 / 8 / 32, K 8 / 32; each variant captured in a CUDA graph
(ten calls per graph, so a replay measures the kernels, not the host launch path) and timed with
CUDA events, L2 flushed. Prints one line per point and writes ``draft_topk.csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env
from kdtree.bench.timing import graph_of, time_cuda
from kdtree.spec.gpu.topk_triton import draft_topk_triton

CHUNK = 512


def one_pass(x, k):
    logp = torch.log_softmax(x, dim=-1, dtype=torch.float32)
    return torch.topk(logp, k, dim=-1, largest=True, sorted=True)


def two_stage(x, k):
    *lead, V = x.shape
    pad = -V % CHUNK
    xp = torch.nn.functional.pad(x, (0, pad), value=float("-inf")) if pad else x
    nc = (V + pad) // CHUNK
    v1, i1 = torch.topk(xp.reshape(*lead, nc, CHUNK), k, dim=-1, sorted=False)
    cand = (i1 + torch.arange(nc, device=x.device).mul_(CHUNK).unsqueeze(-1)).reshape(*lead, -1)
    v2, i2 = torch.topk(v1.reshape(*lead, nc * k), k, dim=-1, largest=True, sorted=True)
    return v2.float() - torch.logsumexp(x.float(), dim=-1, keepdim=True), cand.gather(-1, i2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))  # device, versions, sha, time, command
    V = json.loads(Path("data/models/target/config.json").read_text())["vocab_size"]
    rows = []
    for b in (1, 8, 32):
        for k in (8, 32):
            x = torch.randn(b, 16, V, device="cuda").to(torch.bfloat16)
            res = {}
            variants = (("one_pass", one_pass), ("two_stage", two_stage),
                        ("fused", draft_topk_triton))  # fmt: skip
            for name, f in variants:
                g, out = graph_of(lambda f=f, x=x, k=k: f(x, k))
                t = time_cuda(g.replay)
                res[name] = (t.p50 / 10 * 1e3, out)
            ref = res["one_pass"][1]
            for name, (us, out) in res.items():
                same = torch.equal(x.gather(-1, out[1]), x.gather(-1, ref[1]))
                rows.append(dict(batch=b, D=16, V=V, K=k, variant=name, p50_us=round(us, 2),
                                 same_values=same, **env))  # fmt: skip
            print(f"B={b:2} K={k:2} V={V}: " + ", ".join(
                f"{n} {us:7.2f} us" for n, (us, _) in res.items()))  # fmt: skip
    with open(Path(a.out) / "draft_topk.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
