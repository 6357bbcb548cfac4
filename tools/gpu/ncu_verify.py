"""One verify-attention point, built like ``kdtree bench verify-attention`` builds it, for a
profiler to look at: warm-up calls first (JIT, config ladder), then ``--calls`` more, each
preceded by ``torch.cuda.nvtx`` range ``prof`` so ``ncu --nvtx --nvtx-include prof/`` (or
``--launch-skip``) can pick them out. Prints the config and split count the launch chose and,
when no profiler is attached, the CUDA-graph p50 of the call. Under ncu (which sets
``CUDA_INJECTION64_PATH``) the timing is skipped: ncu serialises and replays every kernel, so
a p50 taken under it is milliseconds, not the kernel's time (session 6's reports of calls a
and b carry such a line).

    ncu --clock-control none --section SpeedOfLight ... python3 tools/gpu/ncu_verify.py \
        --layout gqa_8q1kv_d128 --length 131072 --tree 17
"""

from __future__ import annotations

import argparse
import os

import torch

from kdtree.bench.timing import graph_of, time_cuda
from kdtree.bench.verify_attention import (
    LAYOUTS,
    Workload,
    _head_tensors,
    _ours_fn,
    make_tree_inputs,
)
from kdtree.kernels.heuristics import TileConfig


def parse_config(text: str) -> TileConfig:
    """``64x64w4s3``, ``64x64w4s3p`` (page-table prefetch), ``64x64w4s3pt`` (and the small
    last tile) -> TileConfig, as the ``--tune`` labels spell them."""
    tail = text.endswith("t")
    body = text[:-1] if tail else text
    pre = body.endswith("p")
    body = body[:-1] if pre else body
    mn, rest = body.split("w")
    m, n = mn.split("x")
    w, s = rest.split("s")
    return TileConfig(int(m), int(n), int(w), int(s), int(pre), int(tail))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="gqa_8q1kv_d128")
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--tree", type=int, default=17)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--config", default=None, help="e.g. 64x64w4s3p; default: the heuristic")
    ap.add_argument("--splits", type=int, default=None)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--no-time", action="store_true", help="skip the graph timing")
    ap.add_argument(
        "--cuda-kernel",
        default=None,
        help="profile a CUDA C++ kernel instead of Triton: MLA mma, wgmma or seesaw; GQA gqa "
        "(kernels/gqa_tree_sm90.cu, its default shape; KDTREE_GQA_WARPGROUPS forces one)",
    )
    a = ap.parse_args()
    lay = LAYOUTS[a.layout]
    dev = torch.device("cuda")
    wl = Workload(lay, a.batch, a.length, a.tree, 16, torch.bfloat16, dev, seed=0)
    ti = make_tree_inputs(wl, a.tree, seed=0)
    if a.cuda_kernel == "gqa":
        from kdtree.bench.verify_attention import _cuda_gqa_fn

        fn, splits = _cuda_gqa_fn(wl, ti)

        def describe():
            return f"CUDA GQA kernel, splits={splits}"
    elif a.cuda_kernel:
        from kdtree.bench.verify_attention import _cuda_mla_fn

        fn, splits = _cuda_mla_fn(wl, ti, kernel=a.cuda_kernel)

        def describe():
            return f"CUDA kernel {a.cuda_kernel}, splits={splits}"
    else:
        fn, plan = _ours_fn(wl, ti)
        if a.config or a.splits:
            from kdtree.kernels import tree_attention_mla_triton, tree_attention_triton

            cfg = parse_config(a.config) if a.config else None
            attend = tree_attention_triton if lay.kind == "gqa" else tree_attention_mla_triton
            head = _head_tensors(wl, ti)
            out = torch.empty_like(head[0])

            def fn(r):  # noqa: F811 - the forced variant of the same call
                return attend(
                    *head, wl.tables[r], wl.prefix_lens, ti.tree_mask, sm_scale=ti.scale,
                    plan=plan, out=out, num_splits=a.splits, config=cfg, check_values=False,
                )  # fmt: skip

        def describe():
            from kdtree.kernels import tree_attention as ta

            launch = next(reversed(ta._LAUNCHES.values()))
            return f"cfg={launch.cfg} splits={launch.num_splits} grid={launch.grid}"

    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    print(f"point {a.layout} L={a.length} T={a.tree} batch={a.batch}: {describe()}", flush=True)
    if "CUDA_INJECTION64_PATH" in os.environ:
        print("graph p50 not taken: a profiler is attached", flush=True)
    elif not a.no_time:
        g, _ = graph_of(lambda: fn(0))
        print(f"graph p50 {time_cuda(g.replay).p50 * 1e3:.1f} us", flush=True)
    for i in range(a.calls):
        torch.cuda.nvtx.range_push("prof")
        fn(i % wl.n_rot)
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
