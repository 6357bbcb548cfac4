"""Correctness self-check of the Triton tree-verify kernels on a GPU, in a few seconds.

``python -m kdtree.kernels.selfcheck [--tiny] [--dtype bf16|fp16|both]``: random inputs
(mixed prefix lengths, page sizes 1/16/64, random trees with padded rows), the kernel against
an fp64 truth next to the torch ``ref`` backend run in the same dtype; pass = error at most
2x the reference's + a tiny atol. Also replays a call captured in a CUDA graph. Prints a table
and ends with one JSON line; exit status 1 on any failure. ``--tiny`` runs one small case per
kernel (for compute-sanitizer memcheck / racecheck).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from kdtree.spec.bitmask import pack_bits

_ATOL = {torch.bfloat16: 2e-3, torch.float16: 2e-4, torch.float32: 1e-5}


def _random_mask(b: int, t: int, gen: torch.Generator, real: list[int]) -> torch.Tensor:
    vis = torch.zeros(b, t, t, dtype=torch.bool)
    for i in range(b):
        for j in range(t):
            vis[i, j, j] = True
            if 0 < j < real[i]:
                vis[i, j] |= vis[i, int(torch.randint(0, j, (1,), generator=gen))]
    return pack_bits(vis)


def _paged(lengths, t, page_size, gen):
    per = [math.ceil((n + t) / page_size) for n in lengths]
    total = sum(per) + 2
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    table = torch.zeros(len(lengths), max(per), dtype=torch.int32)
    at = 0
    for i, n in enumerate(per):
        table[i, :n] = perm[at : at + n]
        at += n
    return table, total


def _truth_gqa(q, k, v, table, lens, mask, scale):
    from kdtree.attention import gather_prefix, tree_visibility

    b, t, hq, _ = q.shape
    g = hq // k.shape[2]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for i in range(b):
        n = int(lens[i]) + t
        kk = gather_prefix(k, table[i], n).double().repeat_interleave(g, dim=1)
        vv = gather_prefix(v, table[i], n).double().repeat_interleave(g, dim=1)
        s = torch.einsum("thd,shd->hts", q[i].double(), kk) * scale
        vis = tree_visibility(int(lens[i]), mask[i], t)
        out[i] = torch.einsum("hts,shd->thd", s.masked_fill(~vis[None], -math.inf).softmax(-1), vv)
    return out


def _truth_mla(qn, qp, kv, table, lens, mask, scale):
    from kdtree.attention import gather_prefix, tree_visibility

    b, t, h, r = qn.shape
    out = torch.empty(qn.shape, dtype=torch.float64, device=qn.device)
    for i in range(b):
        lat = gather_prefix(kv, table[i], int(lens[i]) + t).double()
        s = torch.einsum("thr,sr->hts", qn[i].double(), lat[:, :r])
        s = (s + torch.einsum("thp,sp->hts", qp[i].double(), lat[:, r:])) * scale
        vis = tree_visibility(int(lens[i]), mask[i], t)
        p = s.masked_fill(~vis[None], -math.inf).softmax(-1)
        out[i] = torch.einsum("hts,sr->thr", p, lat[:, :r])
    return out


def _case_gqa(lens, t, hq, hkv, d, ps, dtype, dev, gen, config=None):
    from kdtree.attention import tree_attention_ref
    from kdtree.kernels import tree_attention_triton

    table, pages = _paged(lens, t, ps, gen)
    real = [max(1, t - 3 * i) for i in range(len(lens))]
    args = [
        torch.randn(len(lens), t, hq, d, generator=gen).to(dtype),
        torch.randn(pages, ps, hkv, d, generator=gen).to(dtype),
        torch.randn(pages, ps, hkv, d, generator=gen).to(dtype),
        table,
        torch.tensor(lens, dtype=torch.int32),
        _random_mask(len(lens), t, gen, real),
    ]
    args = [a.to(dev) for a in args]
    scale = d**-0.5
    out = torch.full_like(args[0], float("nan"))
    got = tree_attention_triton(*args, sm_scale=scale, out=out, config=config)
    base = tree_attention_ref(*args, sm_scale=scale)
    return got, base, _truth_gqa(*args, scale)


def _case_mla(lens, t, h, ps, dtype, dev, gen, rank=512, rope=64, config=None):
    from kdtree.attention import tree_attention_mla_ref
    from kdtree.kernels import tree_attention_mla_triton

    table, pages = _paged(lens, t, ps, gen)
    real = [max(1, t - 3 * i) for i in range(len(lens))]
    args = [
        torch.randn(len(lens), t, h, rank, generator=gen).to(dtype),
        torch.randn(len(lens), t, h, rope, generator=gen).to(dtype),
        torch.randn(pages, ps, rank + rope, generator=gen).to(dtype),
        table,
        torch.tensor(lens, dtype=torch.int32),
        _random_mask(len(lens), t, gen, real),
    ]
    args = [a.to(dev) for a in args]
    scale = (rank + rope) ** -0.5
    out = torch.full((len(lens), t, h, rank), float("nan"), dtype=dtype, device=dev)
    got = tree_attention_mla_triton(*args, sm_scale=scale, out=out, config=config)
    base = tree_attention_mla_ref(*args, sm_scale=scale)
    return got, base, _truth_mla(*args, scale)


def _graph_check(dev, dtype, gen) -> tuple[bool, str]:
    """Capture one GQA and one MLA call (with plans) in a CUDA graph; replay on new inputs."""
    from kdtree.kernels import TreeAttentionPlan, tree_attention_mla_triton, tree_attention_triton

    lens, t = [3000, 700], 17
    table, pages = _paged(lens, t, 16, gen)
    mask = _random_mask(2, t, gen, [t, t - 4]).to(dev)
    table, plen = table.to(dev), torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(2, t, 32, 128, generator=gen).to(dtype).to(dev)
    k = torch.randn(pages, 16, 8, 128, generator=gen).to(dtype).to(dev)
    v = torch.randn(pages, 16, 8, 128, generator=gen).to(dtype).to(dev)
    plan = TreeAttentionPlan.for_gqa(
        max_batch=2,
        max_tree=t,
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_prefix_len=table.shape[1] * 16,
        device=dev,
    )
    qn = torch.randn(2, t, 16, 512, generator=gen).to(dtype).to(dev)
    qp = torch.randn(2, t, 16, 64, generator=gen).to(dtype).to(dev)
    kv = torch.randn(pages, 16, 576, generator=gen).to(dtype).to(dev)
    mplan = TreeAttentionPlan.for_mla(
        max_batch=2,
        max_tree=t,
        num_heads=16,
        kv_lora_rank=512,
        rope_dim=64,
        max_prefix_len=table.shape[1] * 16,
        device=dev,
    )
    out = torch.empty_like(q)
    mout = torch.empty_like(qn)

    def step():
        tree_attention_triton(q, k, v, table, plen, mask, sm_scale=0.088, plan=plan, out=out)
        tree_attention_mla_triton(
            qn, qp, kv, table, plen, mask, sm_scale=0.04, plan=mplan, out=mout
        )

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for x in (q, k, v, qn, qp, kv):
        x.copy_(torch.randn(x.shape, generator=gen).to(dtype))
    graph.replay()
    torch.cuda.synchronize()
    want = tree_attention_triton(q, k, v, table, plen, mask, sm_scale=0.088, plan=plan)
    mwant = tree_attention_mla_triton(qn, qp, kv, table, plen, mask, sm_scale=0.04, plan=mplan)
    ok = torch.equal(out, want) and torch.equal(mout, mwant)
    return ok, "replay == eager" if ok else "replay differs from eager"


def _cases(tiny: bool):
    """``(kind, case, config)`` triples; ``config`` None: the launch's own choice. Both
    lists include the page-table prefetch variant of the prefix loop."""
    from kdtree.kernels.heuristics import TileConfig

    pf_gqa, pf_mla = TileConfig(64, 32, 4, 3, pt_prefetch=1), TileConfig(16, 32, 4, 2, 1)
    if tiny:
        return [
            ("gqa", ([300, 17], 9, 8, 2, 128, 16), None),
            ("mla", ([300, 17], 5, 8, 16), None),
            ("gqa", ([300, 17], 9, 8, 2, 128, 16), pf_gqa),
            ("mla", ([300, 17], 5, 8, 16), pf_mla),
        ]
    gqa = [
        ([4000, 1, 777], 17, 32, 8, 128, 16),
        ([4000, 1, 777], 65, 32, 8, 128, 1),
        ([9000], 1, 32, 8, 128, 64),
        ([2500, 300], 65, 8, 1, 128, 64),
        ([2500, 300], 17, 8, 1, 128, 16),
        ([1000, 3000], 9, 16, 2, 64, 16),
        ([600], 257, 8, 1, 128, 64),
    ]
    mla = [
        ([3000, 5], 17, 8, 64),
        ([3000, 5], 65, 16, 16),
        ([4000], 1, 16, 1),
        ([1500, 700], 9, 128, 64),
        ([800], 65, 8, 16),
    ]
    return (
        [("gqa", c, None) for c in gqa]
        + [("mla", c, None) for c in mla]
        + [("gqa", gqa[0], pf_gqa), ("mla", mla[0], pf_mla)]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="one small case per kernel")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "both"])
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph check")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("selfcheck: needs a CUDA GPU", file=sys.stderr)
        print(json.dumps({"ok": False, "error": "no CUDA"}))
        return 1
    dev = torch.device("cuda")
    dtypes = {
        "bf16": [torch.bfloat16],
        "fp16": [torch.float16],
        "both": [torch.bfloat16, torch.float16],
    }[args.dtype]
    gen = torch.Generator().manual_seed(0)
    rows, failures = [], 0
    t0 = time.time()
    print(f"{'kind':4} {'case':38} {'dtype':9} {'err':>9} {'ref_err':>9} {'ratio':>6}  ok")
    for dtype in dtypes:
        for kind, case, config in _cases(args.tiny):
            label = f"L={case[0]} T={case[1]} " + (
                f"{case[2]}q/{case[3]}kv d{case[4]} ps{case[5]}"
                if kind == "gqa"
                else f"h={case[2]} ps{case[3]}"
            )
            label += " prefetch" if config is not None and config.pt_prefetch else ""
            try:
                if kind == "gqa":
                    got, base, truth = _case_gqa(
                        *case, dtype=dtype, dev=dev, gen=gen, config=config
                    )
                else:
                    got, base, truth = _case_mla(
                        *case, dtype=dtype, dev=dev, gen=gen, config=config
                    )
                torch.cuda.synchronize()
                finite = bool(torch.isfinite(got).all())
                err = (got.double() - truth).abs().max().item()
                ref_err = (base.double() - truth).abs().max().item()
                ok = finite and err <= 2 * ref_err + _ATOL[dtype]
                ratio = err / max(ref_err, 1e-12)
                print(
                    f"{kind:4} {label:38} {str(dtype)[6:]:9} {err:9.2e} {ref_err:9.2e} "
                    f"{ratio:6.2f}  {'ok' if ok else 'FAIL'}"
                )
                rows.append(
                    {
                        "kind": kind,
                        "case": label,
                        "dtype": str(dtype),
                        "err": err,
                        "ref_err": ref_err,
                        "ok": ok,
                    }
                )
            except Exception as exc:  # report and keep checking the rest
                ok = False
                print(f"{kind:4} {label:38} {str(dtype)[6:]:9} ERROR {exc!r}"[:300])
                rows.append(
                    {
                        "kind": kind,
                        "case": label,
                        "dtype": str(dtype),
                        "error": repr(exc)[:300],
                        "ok": False,
                    }
                )
            failures += not ok
    graph = {"skipped": True}
    if not args.no_graph and not args.tiny:
        try:
            ok, msg = _graph_check(dev, dtypes[0], gen)
        except Exception as exc:
            ok, msg = False, f"capture failed: {exc!r}"[:300]
        print(f"cuda graph: {msg}")
        graph = {"ok": ok, "detail": msg}
        failures += not ok
    summary = {
        "ok": failures == 0,
        "failures": failures,
        "cases": len(rows),
        "seconds": round(time.time() - t0, 2),
        "graph": graph,
        "device": torch.cuda.get_device_name(0),
        "rows": rows,
    }
    print(json.dumps(summary))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
