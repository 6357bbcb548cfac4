"""A few CUDA GQA tree-verify calls for compute-sanitizer (memcheck / racecheck): TMA and
cp.async tiles (page sizes 16 / 64 and 1), forced and automatic splits, splits with no keys,
T 1..257, an idle second consumer warpgroup, batch 3, the tail warpgroup (KDTREE_GQA_TAIL=1
puts it in every case with 1-16 rows past the whole 64-row blocks), the tail split between two
CTAs (cuda_gqa.split_tail, with the tail warpgroup off: KDTREE_GQA_KEY_TAIL=0), the tail in a
warpgroup of its own beside two two-block CTAs (cuda_gqa.key_tail, the default at 257-260 rows
with splits), also for a KV head's query heads launched as several heads (cuda_gqa.q_groups:
8q/1kv at T=65, G=4 at T=257); each checked against the
torch reference (fp32 math on the fp64 inputs) with the tests' pass rule (error <= 2x the bf16
reference's + 2e-3). argv[1] keeps only N cases (racecheck is slow), from case argv[2]
(default 0; the tail warpgroup's are cases 10-12: `sanitize_gqa.py 3 10`; the sliced merge's
cases 14-15: `sanitize_gqa.py 2 14`; the dependent row-a-CTA merge scheduled at the split
CTAs' exit, case 16: `sanitize_gqa.py 1 16`). Exits 1 on a mismatch."""

from __future__ import annotations

import os
import sys

import torch

from kdtree.attention import tree_attention_ref
from kdtree.kernels import cuda_gqa

CASES = [  # prefix lengths, T, Hq, Hkv, page size, splits
    ([3000], 65, 8, 1, 16, None),  # 520 rows: two launch heads of 260 (cuda_gqa.q_groups)
    ([300, 0, 70], 17, 32, 8, 64, 3),
    ([1000], 257, 8, 2, 1, 2),  # 1028 rows: four launch heads of 257
    ([129], 1, 16, 16, 16, None),
    ([4096], 9, 12, 4, 16, 40),
    ([2000, 500], 65, 32, 8, 16, None),  # 260 rows: the tail warpgroup beside two-block CTAs
    ([800, 300], 257, 8, 2, 16, 2),  # 1028 rows: five three-block CTAs, the tail in the sixth
    # 260 / 272 rows with splits: the tail split by tile parity (cuda_gqa.split_tail)
    ([977, 1900], 65, 32, 8, 16, 3, {"KDTREE_GQA_KEY_TAIL": "0"}),
    ([2000], 65, 4, 1, 16, 40, {"KDTREE_GQA_KEY_TAIL": "0"}),  # one-tile splits: the odd half none
    ([0, 100], 17, 16, 1, 16, 4),  # an empty prefix, 16 rows in the tail
    # 257-260 rows with splits: the tail warpgroup (cuda_gqa.key_tail)
    ([977, 1900], 65, 32, 8, 16, 3),
    ([2000, 7], 65, 4, 1, 1, 40),  # page size 1 (cp.async), one-tile and empty splits
    ([1234], 257, 1, 1, 64, 5),  # 257 rows (MHA, T=257): one row past the blocks
    # 136 rows, splits of >= 32 tiles: [2 blocks + the tail warpgroup] by default (session 33)
    ([4200, 1900], 17, 8, 1, 16, 2),
    # rows of more than 64 entries: the column-sliced merge as a programmatic dependent (session
    # 40), 8 CTAs a row at T=1's 8 rows, 4 at T=9's 72
    ([9000], 1, 8, 1, 16, 128),
    ([16000], 9, 8, 1, 16, 129),
    # one CTA a split, a row a CTA: the merge a dependent that the split CTAs let be scheduled
    # at their exit (session 41, split_trigger)
    ([16000], 17, 8, 1, 16, 129),
]


def _inputs(lens, t, hq, hkv, ps, gen):
    b = len(lens)
    pages = [-(-(n + t) // ps) for n in lens]
    width = max(pages)
    perm = torch.randperm(sum(pages), generator=gen)
    table = torch.zeros(b, width, dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[at : at + n]
        at += n
    k = torch.randn(sum(pages), ps, hkv, 128, generator=gen)
    v = torch.randn(sum(pages), ps, hkv, 128, generator=gen)
    q = torch.randn(b, t, hq, 128, generator=gen)
    mask = torch.zeros(b, t, -(-t // 64), dtype=torch.int64)
    for i in range(b):
        for r in range(t):
            anc = {r, *(j for j in range(r) if torch.rand((), generator=gen) < 0.3)}
            for j in anc:
                mask[i, r, j // 64] |= 1 << (j % 64) if j % 64 < 63 else -(1 << 63)
    plen = torch.tensor(lens, dtype=torch.int32)
    return q, k, v, table, plen, mask


def main() -> int:
    gen = torch.Generator().manual_seed(5)
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    cases = CASES[first : first + int(sys.argv[1])] if len(sys.argv) > 1 else CASES
    scale = 128**-0.5
    bad = 0
    for lens, t, hq, hkv, ps, splits, *env in cases:
        saved = {name: os.environ.get(name) for name in (env[0] if env else {})}
        os.environ.update(env[0] if env else {})
        cpu = _inputs(lens, t, hq, hkv, ps, gen)
        q, k, v, pt, plen, mask = (x.cuda() for x in cpu)
        out = cuda_gqa.tree_attention_gqa_cuda(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), pt, plen, mask, sm_scale=scale,
            num_splits=splits,
        )  # fmt: skip
        truth = tree_attention_ref(q.double(), k.double(), v.double(), pt, plen, mask,
                                   sm_scale=scale).double()  # fmt: skip
        base = tree_attention_ref(q.bfloat16(), k.bfloat16(), v.bfloat16(), pt, plen, mask,
                                  sm_scale=scale)  # fmt: skip
        err = (out.double() - truth).abs().max().item()
        tol = 2 * (base.double() - truth).abs().max().item() + 2e-3
        ok = err <= tol
        bad += not ok
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        plan = cuda_gqa.plan_launch(len(lens), t, hq, hkv, pt.shape[1] * ps, sms, splits)
        split = plan.split
        print(f"L={lens} T={t} {hq}q/{hkv}kv ps={ps} splits={splits} split_tail={split}: "
              f"err {err:.2e} tol {tol:.2e} {'ok' if ok else 'FAIL'}", flush=True)  # fmt: skip
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
