"""A few CUDA MLA tree-verify calls for compute-sanitizer (memcheck / racecheck): both split
kernels (mma, wgmma, seesaw; or those named in argv[1], comma-separated; argv[2] keeps only the
first N cases, racecheck being slow; argv[2] = "tail": only shapes whose every CTA is the seesaw
kernel's tail CTA, h * T <= 16), forced and automatic splits, page sizes 1 / 16 / 64, T 1..257,
an empty prefix, batch 3; each checked against the fp64 dense reference (the pass rule of
``kdtree.kernels.cuda_mla_check``). Exits 1 on a mismatch."""

from __future__ import annotations

import sys

import torch

from kdtree.kernels import cuda_mla
from kdtree.kernels.cuda_mla_check import ATOL, SCALE, _dense, _inputs

CASES = [  # prefix lengths, T, H, page size, splits
    ([100], 17, 8, 16, 1),
    ([300, 0, 70], 65, 16, 64, 3),
    ([1000], 257, 8, 1, 2),
    ([129], 1, 16, 16, None),
]
TAIL_ONLY = [([129], 1, 16, 16, None), ([300, 40], 2, 8, 16, 2), ([200], 3, 5, 1, 3)]


def main() -> int:
    gen = torch.Generator().manual_seed(5)
    bad = 0
    kernels = sys.argv[1].split(",") if len(sys.argv) > 1 else list(cuda_mla.KERNELS)
    if len(sys.argv) > 2 and sys.argv[2] == "tail":
        cases = TAIL_ONLY
    else:
        cases = CASES[: int(sys.argv[2])] if len(sys.argv) > 2 else CASES
    for kernel in kernels:
        for lens, t, h, ps, splits in cases:
            qn, qp, kv, (pt,), plen, mask = _inputs(lens, t, h, ps, torch.bfloat16, gen)
            out = cuda_mla.tree_attention_mla_cuda(
                qn, qp, kv, pt, plen, mask, sm_scale=SCALE, num_splits=splits, kernel=kernel
            )
            truth = _dense(qn, qp, kv, pt, lens, mask, torch.float64)
            base = _dense(qn, qp, kv, pt, lens, mask, torch.bfloat16).to(torch.bfloat16)
            err = (out.double() - truth).abs().max().item()
            tol = 2 * (base.double() - truth).abs().max().item() + ATOL[torch.bfloat16]
            ok = err <= tol
            bad += not ok
            print(f"{kernel:<6} L={lens} T={t} H={h} ps={ps} splits={splits}: err {err:.2e} "
                  f"tol {tol:.2e} {'ok' if ok else 'FAIL'}", flush=True)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
