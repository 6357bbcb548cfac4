"""GPU check of the CUDA (sm_90) MLA tree-verify kernel: build, correctness, timing.

Run on an H100/H200: ``python -m kdtree.kernels.cuda_mla_check [--kernels wgmma,mma]``. It

1. builds the shared object with nvcc (cached under ``~/.cache/kdtree/cuda``) and prints the
   ptxas register / spill report;
1b. runs the wgmma operand-layout probe (``cuda_mla.wgmma_probe``) with both assignments of
   the V descriptor's byte offsets against ``torch`` matmuls;
2. compares, for every split kernel named by ``--kernels``, bf16 and fp16 outputs with an fp64 reference on shapes from H 8/16/128, T 1..257,
   L 0..128k, page sizes 1/16/64, batch 1..3, forced and automatic split counts; the pass rule
   is ``error <= 2 x (error of the same math in the input dtype) + atol``;
3. times CUDA-graph replays of those CUDA kernels and ``tree_attention_mla_triton`` at
   L in {16k, 64k, 128k}, T in {17, 65}, H in {8, 16}, B = 1, page size 16, rotating through
   several KV pools so each call streams from HBM, not L2;

prints tables, then one JSON line; exits 1 on any correctness failure.
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch

from kdtree.attention import gather_prefix, tree_visibility
from kdtree.kernels import cuda_mla
from kdtree.spec.bitmask import pack_bits

SCALE = 576**-0.5
RANK, ROPE = 512, 64
ATOL = {torch.float16: 2e-4, torch.bfloat16: 2e-3}
DEADLINE_S = 80.0  # skip the remaining timings past this (the whole run must stay < 90 s)

# (prefix lengths, T, H, page size, forced splits or None, dtypes)
BOTH = (torch.bfloat16, torch.float16)
BF16 = (torch.bfloat16,)
CASES = [
    ([1], 1, 8, 1, None, BOTH),
    ([97], 17, 16, 16, None, BOTH),
    ([257, 1, 40], 17, 8, 64, 3, BOTH),
    ([5000], 65, 16, 16, None, BOTH),
    ([5000], 65, 16, 16, 1, BOTH),
    ([2000, 9], 17, 128, 64, None, BOTH),
    ([1234, 4000], 65, 8, 1, 7, BOTH),
    ([300], 1, 128, 16, 2, BOTH),
    ([33, 700, 64], 65, 16, 64, 5, BOTH),
    ([0, 100], 17, 8, 16, 4, BOTH),
    ([64], 257, 8, 16, 3, BOTH),
    ([3000, 1, 517], 65, 128, 16, None, BF16),
    ([65536], 65, 16, 16, None, BF16),
    ([131072], 17, 8, 16, None, BF16),
]
TIMING = [(L, t, h) for L in (16384, 65536, 131072) for t in (17, 65) for h in (8, 16)]


def _tree_mask(batch: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """int64 [B, T, W] ancestor bitmasks of random trees (parent index < child index)."""
    masks = []
    for _ in range(batch):
        vis = torch.eye(t, dtype=torch.bool)
        for i in range(1, t):
            parent = int(torch.randint(0, i, (1,), generator=gen))
            vis[i] |= vis[parent]
        masks.append(vis)
    return pack_bits(torch.stack(masks))


def _inputs(lens, t, h, ps, dtype, gen, pools: int = 1):
    """q_nope, q_pe, kv_cache, [page_table per pool], prefix_lens, tree_mask on the GPU: pages
    shuffled over ``pools`` disjoint sets of pages (one page table per set)."""
    b = len(lens)
    per_req = [math.ceil((n + t) / ps) for n in lens]
    max_pages = max(per_req) + 1
    total = pools * sum(per_req) + 3
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    tables, at = [], 0
    for _ in range(pools):
        table = torch.zeros(b, max_pages, dtype=torch.int32)
        for i, n in enumerate(per_req):
            table[i, :n] = perm[at : at + n]
            at += n
        tables.append(table.cuda())
    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    qn = torch.randn(b, t, h, RANK, generator=g, device=dev).to(dtype)
    qp = torch.randn(b, t, h, ROPE, generator=g, device=dev).to(dtype)
    kv = torch.randn(total, ps, RANK + ROPE, generator=g, device=dev, dtype=dtype)
    plen = torch.tensor(lens, dtype=torch.int32, device=dev)
    return qn, qp, kv, tables, plen, _tree_mask(b, t, gen).cuda()


def _dense(qn, qp, kv, pt, lens, mask, dtype):
    """The attention with every tensor in ``dtype`` (fp64: the truth), on the GPU."""
    b, t, h, _ = qn.shape
    out = torch.empty(b, t, h, RANK, dtype=torch.float64, device=qn.device)
    for i in range(b):
        lat = gather_prefix(kv, pt[i], lens[i] + t).to(dtype)
        c, kp = lat[:, :RANK], lat[:, RANK:]
        s = torch.einsum("thr,sr->hts", qn[i].to(dtype), c)
        s = (s + torch.einsum("thp,sp->hts", qp[i].to(dtype), kp)) * SCALE
        vis = tree_visibility(lens[i], mask[i], t)
        p = s.masked_fill(~vis[None], float("-inf")).softmax(-1)
        out[i] = torch.einsum("hts,sr->thr", p, c).double()
    return out


def check_probe() -> tuple[list[dict], bool]:
    """The wgmma layout probe in bf16 and fp16 with both assignments of the V descriptor's
    byte offsets ("wgmma", the kernel's: leading = 8192, stride = 1024; "swapped": the other).
    The S product must match in every run; the P V product tells which assignment the
    hardware reads (session 9: the kernel's; the swapped one is off by ~50)."""
    rows, ok = [], True
    g = torch.Generator(device="cuda")
    g.manual_seed(7)
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.randn(64, 64, generator=g, device="cuda").to(dtype)
        bk = torch.randn(32, 64, generator=g, device="cuda").to(dtype)
        v = torch.randn(64, 256, generator=g, device="cuda").to(dtype)
        want1 = a.double() @ bk.double().T
        want2 = a.double() @ v.double()
        for name, offs in (("wgmma", (8192, 1024)), ("swapped", (1024, 8192))):
            d1, d2 = cuda_mla.wgmma_probe(a, bk, v, v_offsets=offs)
            torch.cuda.synchronize()
            e1 = (d1.double() - want1).abs().max().item()
            e2 = (d2.double() - want2).abs().max().item()
            rec = {"dtype": str(dtype)[6:], "kernel": name, "v_offsets": offs, "err_s": e1,
                   "err_pv": e2, "s_ok": e1 < 1e-2, "pv_ok": e2 < 1e-2}  # fmt: skip
            # every S must match; the P V product must match for the kernel's own assignment
            ok &= rec["s_ok"] and (name != "wgmma" or rec["pv_ok"])
            print(f"probe {rec['dtype']:<9} {name:<10} S err {e1:9.2e}  PV err {e2:9.2e}")
            rows.append(rec)
    return rows, ok


def check_correctness(gen, kernel: str = cuda_mla.DEFAULT_KERNEL) -> tuple[list[dict], bool]:
    rows, ok_all = [], True
    print(f"\nsplit kernel: {kernel}")
    print(f"{'case':<44} {'dtype':<9} {'splits':>6} {'err':>9} {'base':>9} {'tol':>9}  ok")
    for lens, t, h, ps, splits, dtypes in CASES:
        for dtype in dtypes:
            name = f"L={lens} T={t} H={h} ps={ps}"
            rec = {"lens": lens, "T": t, "H": h, "page_size": ps, "dtype": str(dtype)[6:],
                   "kernel": kernel}  # fmt: skip
            try:
                qn, qp, kv, (pt,), plen, mask = _inputs(lens, t, h, ps, dtype, gen)
                s = splits or cuda_mla.choose_splits(
                    len(lens),
                    h * t,
                    pt.shape[1] * ps,
                    torch.cuda.get_device_properties(0).multi_processor_count,
                )
                out = torch.full((len(lens), t, h, RANK), float("nan"), dtype=dtype, device="cuda")
                cuda_mla.tree_attention_mla_cuda(
                    qn, qp, kv, pt, plen, mask, sm_scale=SCALE, out=out, num_splits=s,
                    kernel=kernel,
                )  # fmt: skip
                torch.cuda.synchronize()
                truth = _dense(qn, qp, kv, pt, lens, mask, torch.float64)
                base = _dense(qn, qp, kv, pt, lens, mask, dtype).to(dtype)
                finite = bool(torch.isfinite(out).all())
                err = (out.double() - truth).abs().max().item()
                berr = (base.double() - truth).abs().max().item()
                tol = 2 * berr + ATOL[dtype]
                ok = finite and err <= tol
                rec.update(splits=s, err=err, base_err=berr, tol=tol, finite=finite, ok=ok)
                print(
                    f"{name:<44} {rec['dtype']:<9} {s:>6} {err:9.2e} {berr:9.2e} {tol:9.2e}  "
                    f"{'ok' if ok else 'FAIL'}{'' if finite else ' (non-finite)'}"
                )
                del qn, qp, kv, pt, plen, mask, out, truth, base
            except Exception as exc:  # a crash is a failure, reported, and the run goes on
                ok = False
                rec.update(ok=False, error=repr(exc))
                print(f"{name:<44} {rec['dtype']:<9} ERROR {exc!r}")
            ok_all &= ok
            rows.append(rec)
    torch.cuda.empty_cache()
    return rows, ok_all


def _graph_ms(fn, calls: int, reps: int = 5) -> float:
    """ms per call of ``fn`` (which makes ``calls`` launches) replayed from a CUDA graph."""
    fn()  # warm (compiles Triton, builds launch caches)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(2):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (reps * calls)


def _time_one(
    L: int, t: int, h: int, gen, num_sms: int, l2: int, kernels=(cuda_mla.DEFAULT_KERNEL,)
) -> dict:
    """Graph-replay timings of the CUDA split kernels ``kernels`` and the Triton kernel at one
    shape (bf16, B = 1, page size 16); keys ``cuda_ms`` (the first kernel), ``<kernel>_ms``."""
    from kdtree.kernels import tree_attention_mla_triton

    pools = max(1, min(16, math.ceil(4 * l2 / (L * (RANK + ROPE) * 2))))
    qn, qp, kv, tables, plen, mask = _inputs([L], t, h, 16, torch.bfloat16, gen, pools)
    splits = cuda_mla.choose_splits(1, h * t, tables[0].shape[1] * 16, num_sms)
    ws = torch.empty(
        max(1, cuda_mla.workspace_numel(1, t, h, splits)), dtype=torch.float32, device="cuda"
    )
    out_c = torch.empty(1, t, h, RANK, dtype=torch.bfloat16, device="cuda")
    out_t = torch.empty_like(out_c)
    outs = {k: torch.empty_like(out_c) for k in kernels}
    flops = 2.0 * h * t * L * (RANK + ROPE + RANK)
    rec = {"L": L, "T": t, "H": h, "pools": pools, "splits": splits}

    def run_cuda(kernel):
        for pt in tables:
            cuda_mla.tree_attention_mla_cuda(
                qn, qp, kv, pt, plen, mask, sm_scale=SCALE, out=outs[kernel],
                num_splits=splits, workspace=ws, kernel=kernel,
            )  # fmt: skip

    def run_triton():
        for pt in tables:
            tree_attention_mla_triton(qn, qp, kv, pt, plen, mask, sm_scale=SCALE, out=out_t)

    runs = [(k, lambda k=k: run_cuda(k)) for k in kernels] + [("triton", run_triton)]
    for key, fn in runs:
        try:
            ms = _graph_ms(fn, pools)
            rec[f"{key}_ms"] = ms
            rec[f"{key}_tflops"] = flops / (ms * 1e-3) / 1e12
        except Exception as exc:
            rec[f"{key}_error"] = repr(exc)
    first = kernels[0]
    for k in ("ms", "tflops", "error"):
        if f"{first}_{k}" in rec:
            rec[f"cuda_{k}"] = rec[f"{first}_{k}"]
    out_c.copy_(outs[first])
    if "cuda_ms" in rec and "triton_ms" in rec:
        rec["max_abs_diff"] = (out_c.float() - out_t.float()).abs().max().item()
        rec["speedup"] = rec["triton_ms"] / rec["cuda_ms"]
    for k in kernels[1:]:
        if f"{k}_ms" in rec:
            rec[f"{k}_max_abs_diff"] = (outs[k].float() - out_t.float()).abs().max().item()
    return rec


def time_kernels(
    gen, t_start: float, kernels=(cuda_mla.DEFAULT_KERNEL,), deadline_s=DEADLINE_S
) -> list[dict]:
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    results = []
    print(
        f"\n{'L':>7} {'T':>3} {'H':>3} {'pools':>5} {'splits':>6} {'cuda ms':>9} {'TF/s':>7} "
        f"{'triton ms':>10} {'TF/s':>7} {'speedup':>8} {'max|diff|':>10}"
    )
    for L, t, h in TIMING:
        if time.monotonic() - t_start > deadline_s:
            results.append({"L": L, "T": t, "H": h, "skipped": "deadline"})
            print(f"{L:>7} {t:>3} {h:>3}  skipped (time budget)")
            continue
        rec = _time_one(L, t, h, gen, props.multi_processor_count, l2, kernels)
        torch.cuda.empty_cache()

        def f(k, fmt, rec=rec):
            return format(rec[k], fmt) if k in rec else "err"

        print(
            f"{L:>7} {t:>3} {h:>3} {rec['pools']:>5} {rec['splits']:>6} "
            f"{f('cuda_ms', '9.4f'):>9} {f('cuda_tflops', '7.1f'):>7} "
            f"{f('triton_ms', '10.4f'):>10} {f('triton_tflops', '7.1f'):>7} "
            f"{f('speedup', '8.2f'):>8} {f('max_abs_diff', '10.2e'):>10}"
        )
        for k in kernels[1:]:
            print(
                f"{'':>21} {k:<10} {f(k + '_ms', '9.4f'):>9} {f(k + '_tflops', '7.1f'):>7} "
                f"max|diff| vs triton {f(k + '_max_abs_diff', '9.2e')}"
            )
        for k in ("cuda_error", "triton_error", *(f"{k}_error" for k in kernels[1:])):
            if k in rec:
                print(f"    {k}: {rec[k][:300]}")
        results.append(rec)
    return results


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="seesaw,wgmma,mma", help="split kernels, comma-separated: "
                    + ",".join(cuda_mla.KERNELS))  # fmt: skip
    ap.add_argument("--no-timing", action="store_true", help="correctness only")
    ap.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                    help="skip the timings left after this many seconds")  # fmt: skip
    args = ap.parse_args(argv)
    kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    bad = [k for k in kernels if k not in cuda_mla.KERNELS]
    if bad or not kernels:
        ap.error(f"--kernels: unknown {bad}; expected names from {list(cuda_mla.KERNELS)}")
    t0 = time.monotonic()
    summary: dict = {"ok": False}
    if not torch.cuda.is_available():
        print("no CUDA device")
        summary["error"] = "no CUDA device"
        print(json.dumps(summary))
        return 1
    print(f"device: {torch.cuda.get_device_name(0)}, nvcc: {cuda_mla.find_nvcc()}")
    if not cuda_mla.available():
        summary["error"] = "cuda_mla.available() is False (nvcc or sm_90 GPU missing)"
        print(summary["error"])
        print(json.dumps(summary))
        return 1
    tb = time.monotonic()
    res = cuda_mla.build()
    summary["build_s"] = round(time.monotonic() - tb, 2)
    summary["build_cached"] = res.cached
    ptxas = cuda_mla.parse_ptxas(res.log)
    summary["ptxas"] = ptxas
    print(f"built {res.path} in {summary['build_s']} s (cached: {res.cached})")
    for name, info in ptxas.items():
        print(f"  {name}: {info}")

    gen = torch.Generator()
    gen.manual_seed(1234)
    print()
    ok = True
    if any(k in ("wgmma", "seesaw") for k in kernels):
        summary["probe"], probe_ok = check_probe()
        ok &= probe_ok
    summary["correct"] = []
    for kernel in kernels:
        rows, k_ok = check_correctness(gen, kernel)
        summary["correct"] += rows
        ok &= k_ok
    summary["correct_ok"] = ok
    summary["timing"] = [] if args.no_timing else time_kernels(gen, t0, kernels, args.deadline_s)
    summary["ok"] = ok
    summary["total_s"] = round(time.monotonic() - t0, 1)
    print(f"\ncorrectness: {'PASS' if ok else 'FAIL'}; total {summary['total_s']} s")
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
