"""The read floor at each bench size: how fast one kernel that only streams the same bytes runs
under the verify bench's conditions (a CUDA graph of back-to-back calls over KV buffers rotated
beyond L2, batch 1), next to the floor bytes / copy bandwidth. At small sizes the launch, the
ramp and the drain of a single kernel are a large part of the call, so this is the fraction of
the floor that *any* kernel reading those bytes can reach there.

    python3 tools/gpu/read_floor.py [--out DIR]

Compiles ``tools/gpu/read_floor.cu`` with nvcc (a standalone probe, not part of kdtree's
kernels), sweeps the grid (CTAs a wave x waves, 512 threads) at each size and keeps the fastest.
The sizes are the verify bench's bytes at T = 17 (``kdtree.bench.roofline.gqa_cost``: the KV of
L + T tokens, Q and the output) for the GQA layouts 8q/1kv and 32q/8kv at L = 16k .. 256k; size 0
is an empty kernel (the launch alone).
Writes ``read_floor.csv`` with the run's provenance.
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from kdtree.bench.roofline import gqa_cost, measure_copy_bandwidth
from kdtree.bench.schema import run_env
from kdtree.bench.timing import time_cuda

HERE = Path(__file__).resolve().parent
L2_ROTATE_BYTES = 3 * 2**30 // 8  # rotate over >= 384 MiB: every call reads from DRAM


def build() -> ctypes.CDLL:
    out = Path(tempfile.mkdtemp()) / "libread_floor.so"
    subprocess.run(
        ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xcompiler", "-fPIC",
         "-shared", "-o", str(out), str(HERE / "read_floor.cu")],
        check=True,
    )  # fmt: skip
    lib = ctypes.CDLL(str(out))
    lib.read_floor_launch.restype = ctypes.c_int
    lib.read_floor_launch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_size_t]  # fmt: skip
    return lib


def period_us(lib, bufs, nbytes: int, sink, blocks: int, threads: int) -> float:
    """µs a call: the calls over all rotations captured in one graph, replays timed the bench's
    way (:func:`kdtree.bench.timing.time_cuda`: L2 flushed before each), p50 over the calls."""

    def calls():
        for b in bufs:
            rc = lib.read_floor_launch(b.data_ptr(), nbytes, sink.data_ptr(), blocks, threads,
                                       torch.cuda.current_stream().cuda_stream)  # fmt: skip
            if rc:
                raise RuntimeError(f"read_floor_launch: cudaError {rc}")

    calls()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls()
    return time_cuda(g.replay).p50 / len(bufs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy_tbps = measure_copy_bandwidth(dev)
    lib = build()
    sink = torch.zeros(1 << 20, dtype=torch.int32, device=dev)
    sizes = {("empty", 0): 0}
    for name, hq, hkv in (("gqa_8q1kv", 8, 1), ("gqa_32q8kv", 32, 8)):
        for k in (16, 32, 64, 128, 256):  # the bench's bytes at T = 17 (KV of L + T, Q, out)
            sizes[(name, k * 1024)] = int(gqa_cost(1, k * 1024, 17, hq, hkv, 128)[0]) // 16 * 16
    rows = []
    for (layout, length), nbytes in sizes.items():
        n_rot = max(2, -(-L2_ROTATE_BYTES // max(nbytes, 1))) if nbytes else 8
        bufs = [torch.empty(max(nbytes, 16), dtype=torch.uint8, device=dev) for _ in range(n_rot)]
        for b in bufs:
            b.random_(0, 255)
        best = None
        for waves in (1, 2, 4, 8):
            for per_sm in (1, 2, 4):
                blocks = sms * per_sm * waves
                us = period_us(lib, bufs, nbytes, sink, blocks, 512)
                if best is None or us < best[0]:
                    best = (us, blocks)
        floor_us = nbytes / (copy_tbps * 1e12) * 1e6
        rows.append({"layout": layout, "L": length, "bytes": nbytes, "read_us": best[0],
                     "blocks": best[1], "threads": 512, "floor_us": floor_us,
                     "read_frac_of_floor": floor_us / best[0] if nbytes else float("nan"),
                     "copy_TBps": copy_tbps, "rotations": n_rot})  # fmt: skip
        print(f"{layout:10s} L={length:7d} {nbytes / 2**20:8.1f} MiB read={best[0]:7.2f} us "
              f"floor={floor_us:7.2f} us frac={rows[-1]['read_frac_of_floor']:.2f} "
              f"blocks={best[1]}", flush=True)  # fmt: skip
        del bufs
        torch.cuda.empty_cache()
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).assign(**env).to_csv(out / "read_floor.csv", index=False)


if __name__ == "__main__":
    main()
