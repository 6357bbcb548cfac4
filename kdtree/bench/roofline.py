"""Ceilings measured in the same run, and the physical floor of a verify-attention call.

Floor = max(bytes / copy bandwidth, FLOPs / matrix rate). The copy bandwidth counts read +
write of a large device-to-device copy (what a streaming kernel can reach); the matrix rate is
a large bf16 matmul on random data (never zeros: data-dependent power throttles the clock).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

__all__ = [
    "Ceilings",
    "floor_ms",
    "gqa_cost",
    "measure_ceilings",
    "measure_copy_bandwidth",
    "measure_matmul_rate",
    "mla_cost",
]


@dataclass(frozen=True)
class Ceilings:
    copy_TBps: float  # noqa: N815 - unit in the name
    matmul_TFLOPs: float  # noqa: N815
    matmul_dtype: str = "bfloat16"

    def as_dict(self) -> dict:
        return asdict(self)


def _median_event_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure_copy_bandwidth(device=None, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy rate in TB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    ms = _median_event_ms(lambda: dst.copy_(src), reps)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def measure_matmul_rate(
    device=None, n: int = 8192, reps: int = 10, dtype: torch.dtype = torch.bfloat16
) -> float:
    """Dense matmul rate in TFLOP/s on random ``n x n`` operands."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    ms = _median_event_ms(lambda: torch.matmul(a, b, out=out), reps)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def measure_ceilings(device=None) -> Ceilings:
    """Both ceilings, measured now on ``device`` (CUDA only)."""
    if not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings: needs a CUDA device")
    return Ceilings(measure_copy_bandwidth(device), measure_matmul_rate(device))


def gqa_cost(
    batch: int, prefix: int, tree: int, hq: int, hkv: int, d: int, elem_bytes: int = 2
) -> tuple[float, float]:
    """(bytes, FLOPs) of one GQA verify call: every key and value of ``prefix + tree``
    tokens read once; QKᵀ and PV over them for ``tree`` queries per head."""
    keys = prefix + tree
    nbytes = batch * keys * hkv * d * 2 * elem_bytes + 2 * batch * tree * hq * d * elem_bytes
    flops = 4.0 * batch * tree * keys * d * hq
    return float(nbytes), flops


def mla_cost(
    batch: int,
    prefix: int,
    tree: int,
    h: int,
    rank: int = 512,
    rope: int = 64,
    elem_bytes: int = 2,
) -> tuple[float, float]:
    """(bytes, FLOPs) of one absorbed-MLA verify call: the latent read once; the score dot is
    ``rank + rope`` wide and the value dot ``rank`` wide."""
    keys = prefix + tree
    nbytes = (
        batch * keys * (rank + rope) * elem_bytes
        + batch * tree * h * (2 * rank + rope) * elem_bytes
    )
    flops = 2.0 * batch * h * tree * keys * (rank + rope + rank)
    return float(nbytes), flops


def floor_ms(nbytes: float, flops: float, ceilings: Ceilings) -> float:
    """max(bytes / copy bandwidth, FLOPs / matrix rate) in milliseconds."""
    t_bw = nbytes / (ceilings.copy_TBps * 1e12)
    t_fl = flops / (ceilings.matmul_TFLOPs * 1e12)
    return max(t_bw, t_fl) * 1e3
