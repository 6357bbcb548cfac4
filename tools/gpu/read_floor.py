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

    python3 tools/gpu/read_floor.py --points gqa_32q8kv:8:65536,... [--orders ...] [--out DIR]

reads instead the bench's KV bytes at T = 1 (batch B, ``L + 1`` tokens, K and V) of each point
``layout:B:L`` in each order (session 30): ``contiguous`` (the stream above: SDPA's gathered
copy), ``random`` (through a page table, runs of one bench page of one pool, 16 tokens x Hkv x
128 dims, at random places of a pool of every rotation's pages, as the bench's fragmented cache)
and ``sequential`` (the same table in order: the indirection alone).
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch

from kdtree.bench.roofline import gqa_cost, measure_copy_bandwidth
from kdtree.bench.schema import run_env
from kdtree.bench.timing import time_cuda
from kdtree.kernels.cuda_build import build_probe

HERE = Path(__file__).resolve().parent
L2_ROTATE_BYTES = 3 * 2**30 // 8  # rotate over >= 384 MiB: every call reads from DRAM


def build() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_probe(HERE / "read_floor.cu")))
    lib.read_floor_launch.restype = ctypes.c_int
    lib.read_floor_launch.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_int, ctypes.c_size_t]  # fmt: skip
    lib.paged_read_launch.restype = ctypes.c_int
    lib.paged_read_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_size_t]  # fmt: skip
    return lib


def period_us(lib, bufs, nbytes: int, sink, blocks: int, threads: int, paged=None) -> float:
    """µs a call: the calls over all rotations captured in one graph, replays timed the bench's
    way (:func:`kdtree.bench.timing.time_cuda`: L2 flushed before each), p50 over the calls.
    ``paged`` ``(pool, tables, page_shift)``: each call reads through its rotation's table
    (``bufs`` unused)."""

    def calls():
        stream = torch.cuda.current_stream().cuda_stream
        if paged is not None:
            pool, tables, shift = paged
            for t in tables:
                rc = lib.paged_read_launch(pool.data_ptr(), t.data_ptr(), nbytes, shift,
                                           sink.data_ptr(), blocks, threads, stream)  # fmt: skip
                if rc:
                    raise RuntimeError(f"paged_read_launch: cudaError {rc}")
            return
        for b in bufs:
            rc = lib.read_floor_launch(b.data_ptr(), nbytes, sink.data_ptr(), blocks, threads,
                                       stream)  # fmt: skip
            if rc:
                raise RuntimeError(f"read_floor_launch: cudaError {rc}")

    calls()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls()
    return time_cuda(g.replay).p50 / (len(paged[1]) if paged is not None else len(bufs)) * 1e3


#: Each point's (query heads, KV heads) for ``--points``.
HEADS = {"gqa_8q1kv": (8, 1), "gqa_32q8kv": (32, 8)}
ORDERS = ("contiguous", "random", "sequential")
PAGE_TOKENS = 16  # the verify bench's default page


def best_us(run) -> tuple[float, int]:
    """The fastest ``run(blocks)`` over the grid shapes the size sweep tries."""
    sms = torch.cuda.get_device_properties(torch.device("cuda")).multi_processor_count
    best = None
    for waves in (1, 2, 4, 8):
        for per_sm in (1, 2, 4):
            blocks = sms * per_sm * waves
            us = run(blocks)
            if best is None or us < best[0]:
                best = (us, blocks)
    return best


def decode_points(spec: str, orders: list[str], lib, sink, copy_tbps: float) -> list[dict]:
    """``--points``: each point's T = 1 KV bytes in each order (the module's docstring)."""
    dev = torch.device("cuda")
    rows = []
    for item in spec.split(","):
        layout, batch, length = item.split(":")
        hq, hkv = HEADS[layout]
        batch, length = int(batch), int(length)
        kv = int(gqa_cost(batch, length, 1, hq, hkv, 128)[0]) - 2 * batch * hq * 128 * 2
        page_bytes = PAGE_TOKENS * hkv * 128 * 2  # one pool's page
        shift = (page_bytes // 16).bit_length() - 1
        pages = -(-kv // page_bytes)
        nbytes = pages * page_bytes
        n_rot = max(2, -(-L2_ROTATE_BYTES // nbytes))
        floor_us = nbytes / (copy_tbps * 1e12) * 1e6
        for order in orders:
            if order == "contiguous":
                bufs = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(n_rot)]
                for b in bufs:
                    b.random_(0, 255)
                us, blocks = best_us(
                    lambda n, bf=bufs, nb=nbytes: period_us(lib, bf, nb, sink, n, 512)
                )
                del bufs
            else:
                pool = torch.empty(n_rot * nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
                gen = torch.Generator(device=dev).manual_seed(0)
                perm = (torch.randperm(n_rot * pages, generator=gen, device=dev)
                        if order == "random" else torch.arange(n_rot * pages, device=dev))  # fmt: skip
                tables = list(perm.to(torch.int32).view(n_rot, pages).contiguous())
                paged = (pool, tables, shift)
                us, blocks = best_us(
                    lambda n, pg=paged, nb=nbytes: period_us(lib, None, nb, sink, n, 512, pg)
                )
                del pool, tables, paged
            torch.cuda.empty_cache()
            rows.append({"layout": layout, "B": batch, "L": length, "T": 1, "order": order,
                         "bytes": nbytes, "page_bytes": page_bytes, "read_us": us,
                         "blocks": blocks, "threads": 512, "floor_us": floor_us,
                         "read_frac_of_floor": floor_us / us, "copy_TBps": copy_tbps,
                         "rotations": n_rot})  # fmt: skip
            print(f"{layout:10s} B={batch:2d} L={length:7d} {order:10s} {nbytes / 2**20:8.1f} MiB "
                  f"read={us:8.2f} us floor={floor_us:8.2f} us frac={floor_us / us:.3f} "
                  f"blocks={blocks}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--points", default=None, help="layout:B:L,... (T = 1 KV bytes)")
    ap.add_argument("--orders", default=",".join(ORDERS))
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy_tbps = measure_copy_bandwidth(dev)
    lib = build()
    sink = torch.zeros(1 << 20, dtype=torch.int32, device=dev)
    if a.points:
        orders = [o.strip() for o in a.orders.split(",") if o.strip()]
        bad = [o for o in orders if o not in ORDERS]
        if bad:
            raise SystemExit(f"--orders: unknown {bad}; expected {ORDERS}")
        rows = decode_points(a.points, orders, lib, sink, copy_tbps)
        if a.out:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).assign(**env).to_csv(out / "read_floor_decode.csv", index=False)
        return
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
