"""Experiment (issue 4): Triton's automatic warp specialisation on the verify kernels' main KV
loop. The split kernels' ``for i in range(n_full)`` becomes ``tl.range(n_full,
warp_specialize=True)`` in a patched copy of ``kdtree/kernels/gqa.py`` / ``mla.py`` (written to a
temp file: Triton reads a kernel's source from its file), bound into ``tree_attention`` in place
of the committed kernels. Per point, in one process: the committed kernel's CUDA-graph p50 and
output, then the patched kernel's p50 and its largest difference from that output (the
launch cache cleared between). A compile failure is reported as such.

    python3 tools/gpu/exp_warp_specialize.py --points gqa_32q8kv_d128:131072:65,...
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import traceback
from pathlib import Path

import torch

from kdtree.bench.timing import graph_of, time_cuda
from kdtree.bench.verify_attention import LAYOUTS, Workload, _ours_fn, make_tree_inputs
from kdtree.kernels import tree_attention as ta

LOOP = "    for i in range(n_full):\n"
LOOP_WS = "    for i in tl.range(n_full, warp_specialize=True):\n"


def patched(name: str):
    src = (Path(ta.__file__).parent / f"{name}.py").read_text()
    if src.count(LOOP) != 1:
        raise RuntimeError(f"{name}.py: the main loop line is not where this experiment expects")
    path = Path(tempfile.mkdtemp()) / f"{name}_ws.py"
    path.write_text(src.replace(LOOP, LOOP_WS))
    spec = importlib.util.spec_from_file_location(f"kdtree.kernels.{name}_ws", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_point(layout: str, length: int, tree: int):
    """Time one point with whichever split kernels ``tree_attention`` has bound now."""
    lay = LAYOUTS[layout]
    wl = Workload(lay, 1, length, tree, 16, torch.bfloat16, torch.device("cuda"), seed=0)
    ti = make_tree_inputs(wl, tree, seed=0)
    fn, _ = _ours_fn(wl, ti)
    out = fn(0)
    out = (out[0] if isinstance(out, tuple) else out).clone()
    cfg = next(reversed(ta._LAUNCHES.values())).cfg
    g, _ = graph_of(lambda: fn(0))
    return time_cuda(g.replay).p50 * 1e3, out, cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="gqa_32q8kv_d128:131072:65,gqa_8q1kv_d128:131072:17,"
                    "gqa_8q1kv_d128:131072:65,mla_h16:131072:65")  # fmt: skip
    a = ap.parse_args()
    points = [(p.split(":")[0], int(p.split(":")[1]), int(p.split(":")[2])) for p in
              a.points.split(",")]  # fmt: skip
    base = {}
    for pt in points:
        base[pt] = run_point(*pt)
        print(f"{pt}: committed {base[pt][0]:.1f} us, {base[pt][2]}", flush=True)
    try:
        ta._gqa_split_kernel = patched("gqa")._gqa_split_kernel
        ta._mla_split_kernel = patched("mla")._mla_split_kernel
    except Exception:  # noqa: BLE001 - report, do not hide
        traceback.print_exc()
        return
    ta.clear_caches()
    for pt in points:
        try:
            us, out, cfg = run_point(*pt)
        except Exception as e:  # noqa: BLE001 - a compile failure is a result here
            print(f"{pt}: warp_specialize FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        diff = (out.float() - base[pt][1].float()).abs().max().item()
        print(f"{pt}: warp_specialize {us:.1f} us ({base[pt][0] / us:.3f}x), max |diff| "
              f"{diff:.3g}, {cfg}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
