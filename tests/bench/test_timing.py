"""Shared timers: quantile bookkeeping, host timers, and the CUDA timer's guard on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from kdtree.bench.timing import Timing, fmt_ms, time_cpu, time_cuda, time_fn, time_per_call_ns


def test_timing_from_samples_quantiles():
    t = Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.p20, t.p50, t.p80) == (1.8, 3.0, 4.2)
    assert t.mean == 3.0 and t.n == 5 and t.unit == "ms"
    s = t.scaled(1e3, "us")
    assert s.p50 == 3000.0 and s.unit == "us" and s.n == 5
    assert t.as_dict()["p80"] == 4.2
    with pytest.raises(ValueError, match="non-empty"):
        Timing.from_samples([])
    with pytest.raises(ValueError, match="finite"):
        Timing.from_samples([1.0, math.nan])


def test_time_cpu_measures_real_work():
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    calls = []

    def fn():
        calls.append(1)
        return x @ x

    t = time_cpu(fn, min_run_time=0.05)
    assert t.unit == "ms" and t.p20 <= t.p50 <= t.p80 and t.p50 > 0
    assert len(calls) > t.n  # warm-up plus every timed call
    assert time_fn(fn, "cpu", min_run_time=0.02).p50 > 0
    with pytest.raises(TypeError, match="callable"):
        time_cpu(3)


def test_time_per_call_ns():
    t = time_per_call_ns("f()", {"f": lambda: None}, number=500, repeat=3)
    assert t.unit == "ns" and t.n == 3 and t.p50 > 0
    with pytest.raises(ValueError, match="number"):
        time_per_call_ns("pass", {}, number=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_time_cuda_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        time_cuda(lambda: None)


@pytest.mark.gpu
def test_time_cuda_on_gpu():
    x = torch.randn(2048, 2048, device="cuda")
    t = time_cuda(lambda: x @ x, rep_ms=20)
    assert t.p50 > 0 and t.p20 <= t.p50 <= t.p80 and t.n >= 1


def test_fmt_ms():
    assert fmt_ms(math.nan) == "nan" and fmt_ms(0.123456) == "0.1235"


def test_write_dicts_writes_lf_csv_in_first_row_order(tmp_path):
    from kdtree.bench.schema import write_dicts

    path = write_dicts(tmp_path / "sub" / "rows.csv", [{"b": 1, "a": "x"}, {"b": 2, "a": "y"}])
    assert path.read_bytes() == b"b,a\n1,x\n2,y\n"
