"""Decode-step benchmark: verify-input cost vs context, and the whole step in three modes.

* ``verify_inputs``: ``DeviceVerifyBuffers.fill`` (device, in place, O(B·T)) vs the generic
  ``prepare_for_verify(dense=True)`` (host O(context) mask + copy) at each context length —
  the device cost must be flat in context.
* ``step``: one decode step of a tree-mode engine on a synthetic prefix of ``L`` tokens —
  ``graph`` (``GraphStepRunner`` replaying a CUDA graph), ``eager`` (the same device step
  without a graph) and ``generic`` (``SpecEngine`` with ``dense_mask``, the host heap and
  per-layer copies). Per-phase breakdown from the phase profiler (eager, generic) and the GPU
  idle fraction between kernels from a ``torch.profiler`` kernel timeline (CUDA).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from kdtree.bench.schema import BenchRow
from kdtree.bench.timing import Timing, time_fn

SUITE = "step"

__all__ = [
    "SUITE",
    "idle_from_spans",
    "kernel_idle_fraction",
    "run_step_bench",
    "time_verify_inputs",
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _engine(
    model: str,
    budget: int,
    top_k: int,
    device: torch.device,
    dense: bool,
    block_size: int = 16,
    num_layers: int | None = None,
):
    from kdtree.models import DFlashDrafter, build_model, dflash_config_for, get_config
    from kdtree.spec.engine import SpecEngine

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = get_config(model)
    if num_layers is not None:
        config = config.replace(num_hidden_layers=num_layers)
    target = build_model(config).to(device=device, dtype=dtype).eval()
    cfg = dflash_config_for(target.config, block_size=block_size)
    drafter = DFlashDrafter(cfg, target).to(device=device, dtype=dtype).eval()
    return SpecEngine(
        target,
        drafter,
        mode="tree",
        budget=budget,
        top_k=top_k,
        device=device,
        dense_mask=dense,
        page_size=16,
    )


def time_verify_inputs(eng, batch: int, context: int, device: torch.device) -> dict[str, Timing]:
    """Device in-place fill (fused kernel on CUDA; torch ops) vs the generic dense-mask
    preparation at one context length."""
    from kdtree.spec.gpu.tree_build import build_trees_device
    from kdtree.spec.gpu.verify_inputs import DeviceVerifyBuffers
    from kdtree.spec.tree import build_trees
    from kdtree.spec.verify import prepare_for_verify

    st = eng.synthetic_state(batch, context)
    cache = st.cache
    gen = torch.Generator(device=device).manual_seed(1)
    D, K = eng.block_size - 1, eng.top_k
    lp = torch.log_softmax(torch.randn(batch, D, 64, generator=gen, device=device), -1)
    lp, tok = lp.topk(K, dim=-1)
    bonus = torch.as_tensor(st.bonus, device=device)
    tree = build_trees_device(lp.float(), tok, eng.budget, bonus, backend="torch")
    buf = DeviceVerifyBuffers(batch, eng.budget, device)
    cache.reserve(st.reqs, eng.budget + 1)
    prefix = torch.tensor(st.context_lens, dtype=torch.int32, device=device)
    pt = cache.batch_page_table(st.reqs)
    host_trees = build_trees(lp.float().cpu(), tok.cpu(), eng.budget, bonus.cpu())
    out = {
        "device_inplace": time_fn(lambda: buf.fill(tree, prefix, pt, cache.page_size), device),
        "device_inplace_torch": time_fn(
            lambda: buf.fill(tree, prefix, pt, cache.page_size, backend="torch"), device
        ),
        "generic_dense": time_fn(
            lambda: prepare_for_verify(cache, st.reqs, host_trees, dense=True), device
        ),
    }
    if device.type == "cuda":
        # the device cost itself: a ~5 µs fill timed eagerly measures the host launch path
        # (event pairs bracket the GPU waiting for the launch); in the graph runner the fill
        # is replayed from a graph, so time it that way too
        n = 20
        for name, fn in (
            ("device_inplace_graph", lambda: buf.fill(tree, prefix, pt, cache.page_size)),
            (
                "device_inplace_torch_graph",
                lambda: buf.fill(tree, prefix, pt, cache.page_size, backend="torch"),
            ),
        ):
            out[name] = time_fn(_graph_of(fn, n), device).scaled(1.0 / n, "ms")
    return out


def _graph_of(fn: Callable[[], object], n: int) -> Callable[[], object]:
    """``n`` calls of ``fn`` captured in one CUDA graph (warmed on a side stream first)."""
    fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    return graph.replay


def kernel_idle_fraction(fn: Callable[[], object], device: torch.device) -> dict[str, float]:
    """Run ``fn`` under ``torch.profiler`` and measure the GPU timeline of its kernels:
    ``busy_us`` (union of kernel intervals), ``span_us`` (first start → last end),
    ``idle_fraction`` = 1 - busy / span, ``kernels`` (count)."""
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    spans = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "kernel" and "ts" in e
    ]
    return idle_from_spans(spans)


def idle_from_spans(spans: Sequence[tuple[float, float]]) -> dict[str, float]:
    """GPU idle between kernels from ``(start, end)`` intervals (any unit, here µs):
    ``busy`` = length of their union, ``span`` = first start → last end."""
    spans = sorted(spans)
    if not spans:
        nan = float("nan")
        return {"busy_us": nan, "span_us": nan, "idle_fraction": nan, "kernels": 0}
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    last = cur_e
    for s, e in spans[1:]:
        last = max(last, e)
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = last - spans[0][0]
    return {
        "busy_us": busy,
        "span_us": span,
        "idle_fraction": 1.0 - busy / span if span > 0 else 0.0,
        "kernels": len(spans),
    }


def _time_steps(step: Callable[[], object], steps: int, device: torch.device) -> Timing:
    samples = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing.from_samples(samples)


def _phase_rows(report, base: dict) -> list[BenchRow]:
    rows = []
    for _, r in report.iterrows():
        if r["phase"] == "step" or r["depth"] != 0:
            continue
        val = r["gpu_mean_ms"] if r["gpu_mean_ms"] == r["gpu_mean_ms"] else r["mean_ms"]
        rows.append(BenchRow(metric=f"phase_{r['phase']}", unit="ms", p50=float(val), **base))
    return rows


def run_step_bench(
    contexts: Sequence[int],
    *,
    model: str = "tiny-llama",
    batch: int = 1,
    budget: int = 64,
    top_k: int = 8,
    steps: int = 20,
    device: torch.device | str = "cpu",
    modes: Sequence[str] = ("graph", "eager", "generic"),
    profile_kernels: bool = True,
    num_layers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[BenchRow], dict]:
    """All rows of the step suite plus a summary dict (flatness, idle fractions)."""
    from kdtree import profiler
    from kdtree.spec.gpu.runner import GraphStepRunner

    dev = torch.device(device)
    mode_tag = "gpu" if dev.type == "cuda" else "CPU"
    rows: list[BenchRow] = []
    summary: dict = {"verify_inputs_ms": {}, "idle_fraction": {}, "step_ms": {}}
    eng_fast = _engine(model, budget, top_k, dev, dense=False, num_layers=num_layers)
    eng_generic = _engine(model, budget, top_k, dev, dense=True, num_layers=num_layers)
    cfg = {
        "model": model,
        "batch": batch,
        "budget": budget,
        "top_k": top_k,
        "num_layers": eng_fast.target.config.num_hidden_layers,
    }
    for L in contexts:
        vt = time_verify_inputs(eng_fast, batch, L, dev)
        for prov, t in vt.items():
            rows.append(
                BenchRow(
                    suite=SUITE,
                    name="verify_inputs",
                    provider=prov,
                    metric="time",
                    unit="ms",
                    p50=t.p50,
                    p20=t.p20,
                    p80=t.p80,
                    mode=mode_tag,
                    x_name="context",
                    x_value=L,
                    config=cfg,
                )
            )
            summary["verify_inputs_ms"].setdefault(prov, {})[L] = t.p50
        if log:
            log(f"L={L} verify inputs: " + ", ".join(f"{k} {v.p50:.4g} ms" for k, v in vt.items()))
        for mode in modes:
            if mode == "graph" and dev.type != "cuda":
                continue
            eng = eng_generic if mode == "generic" else eng_fast
            st = eng.synthetic_state(batch, L)
            if mode == "generic":

                def one(eng=eng, st=st):
                    eng.step(st)
            else:
                runner = GraphStepRunner(eng, st, mode=mode, sync_every=1)

                def one(runner=runner):
                    runner.step()

            for _ in range(3):  # warm-up (graph: capture happens here)
                one()
            t = _time_steps(one, steps, dev)
            base = dict(
                suite=SUITE,
                name="decode_step",
                provider=mode,
                mode=mode_tag,
                x_name="context",
                x_value=L,
                config=cfg,
            )
            rows.append(
                BenchRow(metric="time", unit="ms", p50=t.p50, p20=t.p20, p80=t.p80, **base)
            )
            summary["step_ms"].setdefault(mode, {})[L] = t.p50
            if mode != "graph":
                profiler.reset()
                profiler.enable(gpu=True)
                try:
                    for _ in range(min(steps, 10)):
                        one()
                    rows.extend(_phase_rows(profiler.report(), base))
                finally:
                    profiler.disable()
                    profiler.reset()
            if profile_kernels and dev.type == "cuda":
                if mode == "generic":

                    def many(one=one):
                        for _ in range(5):
                            one()
                else:
                    runner5 = GraphStepRunner(
                        eng, eng.synthetic_state(batch, L), mode=mode, sync_every=5
                    )
                    for _ in range(5):
                        runner5.step()

                    def many(runner5=runner5):
                        for _ in range(5):
                            runner5.step()

                idle = kernel_idle_fraction(many, dev)
                rows.append(
                    BenchRow(
                        metric="gpu_idle_fraction",
                        unit="fraction",
                        p50=idle["idle_fraction"],
                        **base,
                    )
                )
                rows.append(
                    BenchRow(
                        metric="kernels_per_step", unit="count", p50=idle["kernels"] / 5, **base
                    )
                )
                summary["idle_fraction"].setdefault(mode, {})[L] = idle["idle_fraction"]
            if log:
                log(f"L={L} {mode}: {t.p50:.4g} ms/step")
    flat_prov = (
        "device_inplace_graph" if "device_inplace_graph" in summary["verify_inputs_ms"] else
        "device_inplace"
    )  # fmt: skip
    vi = summary["verify_inputs_ms"].get(flat_prov, {})
    if len(vi) >= 2:
        lo, hi = min(vi), max(vi)
        summary["verify_inputs_flatness"] = vi[hi] / vi[lo]
        rows.append(
            BenchRow(
                suite=SUITE,
                name="verify_inputs",
                provider=flat_prov,
                metric="ratio_max_vs_min_context",
                unit="x",
                p50=vi[hi] / vi[lo],
                mode=mode_tag,
                x_name="context",
                x_value=f"{hi}/{lo}",
                config=cfg,
            )
        )
    return rows, summary
