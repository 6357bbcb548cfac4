"""Step functions to trace: the engine's decode loop (eager-dense, eager, graph) or a fixed
GPU workload, and the sampler-overhead measurement on top of them.

A *step function* is a zero-argument callable that runs one decode step. Builders return
``(step_fn, info)``; ``info`` describes what was built (for provenance).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DECODE_MODES = ("eager-dense", "eager", "graph")
StepFn = Callable[[], None]


def _torch_cuda():
    import torch

    if not torch.cuda.is_available():
        from kdtree.trace.cupti import NoGpuError

        raise NoGpuError("this workload needs a CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def fixed_gpu_step(weight_mb: int = 1024, host_work_us: float = 300.0) -> tuple[StepFn, dict]:
    """A decode-shaped stand-in: a bandwidth-bound GEMV over ``weight_mb`` of bf16 weights,
    a host sync (like reading accepted tokens back), then ``host_work_us`` of Python work."""
    torch = _torch_cuda()
    cols = 8192
    rows = max(1, weight_mb * 1024 * 1024 // (2 * cols))
    w = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(cols, 1, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        y = w @ x
        _ = float(y[0, 0])  # host sync
        t_end = time.perf_counter_ns() + int(host_work_us * 1000)
        acc = 0
        while time.perf_counter_ns() < t_end:
            acc += 1

    return step, {"workload": "fixed", "weight_mb": weight_mb, "host_work_us": host_work_us}


def engine_decode_step(
    *,
    context: int,
    mode: str,
    model: str = "tiny-llama",
    drafter: str | None = None,
    batch: int = 1,
    budget: int = 64,
    top_k: int = 8,
    max_steps: int = 4096,
    seed: int = 0,
    device: str = "cuda",
) -> tuple[StepFn, dict]:
    """The engine's decode step at ``context`` tokens of synthetic prefix KV, in ``mode``:
    ``eager-dense`` (generic O(context) mask path), ``eager`` (our kernels, backend auto),
    ``graph`` (``GraphStepRunner`` replaying CUDA graphs; each replay is profiler phase
    ``graph_step``). ``model``: config name or checkpoint folder; ``drafter``: checkpoint
    folder or ``None`` for a random DFlash drafter. ``device='cpu'`` (fp32, no graphs) is
    for tests only."""
    if mode not in DECODE_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {DECODE_MODES}")
    if device == "cpu":
        import torch

        if mode == "graph":
            raise ValueError("mode='graph' needs device='cuda'")
    else:
        torch = _torch_cuda()
    from kdtree import profiler
    from kdtree.models import DFlashDrafter, build_model, dflash_config_for, load_model
    from kdtree.spec.engine import SpecEngine

    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if Path(model).is_dir():
        target = load_model(model, device=dev, dtype=dtype)
    else:
        with torch.device(dev):
            target = build_model(model)
        target = target.to(dtype).eval()
    if drafter is not None:
        draft = load_model(drafter, device=dev, dtype=dtype, target=target)
    else:
        with torch.device(dev):
            draft = DFlashDrafter(dflash_config_for(target.config), target)
        draft = draft.to(dtype).eval()
    block = int(getattr(draft, "block_size", 16))
    eng = SpecEngine(
        target, draft, mode="tree", budget=budget, top_k=top_k, device=dev,
        dense_mask=mode == "eager-dense",
        max_len=context + (max_steps + 8) * (budget + block + 1),
    )  # fmt: skip
    state = eng.synthetic_state(batch, context, torch.Generator().manual_seed(seed))
    info = {"workload": "engine", "mode": mode, "model": model, "drafter": drafter or "random",
            "context": context, "batch": batch, "budget": budget, "top_k": top_k,
            "backend": eng.backend}  # fmt: skip
    if mode == "graph":
        from kdtree.spec.gpu.runner import GraphStepRunner

        runner = GraphStepRunner(eng, state, mode="graph")

        def step() -> None:
            with profiler.phase("graph_step"):
                runner.step()
            profiler.step()  # the engine marks steps itself; the runner does not

        return step, info

    def eager_step() -> None:
        eng.step(state)

    return eager_step, info


def run_steps(step: StepFn, n: int) -> float:
    """Run ``n`` steps and return the mean wall time per step in ms (device synced)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter_ns() - t0) / 1e6 / n


def measure_overhead(
    step: StepFn,
    *,
    steps: int = 200,
    repeats: int = 5,
    warmup: int = 20,
    sampler_kwargs: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Interleaved A/B runs of ``steps`` steps without and with the DRAM sampler.

    Only the loop is timed; the sampler's start/stop/decode costs are reported separately.
    ``overhead_pct`` = median over repeats of (with / without - 1) * 100, pairing each
    sampled run with the unsampled run next to it (the order alternates to cancel drift).
    """
    from kdtree.trace.cupti import DramSampler

    run_steps(step, warmup)
    off: list[float] = []
    on: list[float] = []
    costs: list[dict[str, float]] = []
    kinds: list[str] = []
    for r in range(repeats):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for arm in order:
            if arm == "off":
                off.append(run_steps(step, steps))
            else:
                s = DramSampler(**(sampler_kwargs or {}))
                t0 = time.perf_counter()
                s.start()
                t1 = time.perf_counter()
                on.append(run_steps(step, steps))
                t2 = time.perf_counter()
                s.stop()
                t3 = time.perf_counter()
                costs.append({"start_s": t1 - t0, "stop_decode_s": t3 - t2,
                              "samples": float(s.trace.meta["n_samples"])})  # fmt: skip
                kinds = s.accepted
            log(f"repeat {r} {arm}: {(off if arm == 'off' else on)[-1]:.4f} ms/step")
    pairs = [(b / a - 1.0) * 100.0 for a, b in zip(off, on, strict=True)]
    return {
        "steps": steps,
        "repeats": repeats,
        "ms_per_step_off": off,
        "ms_per_step_on": on,
        "ms_per_step_off_median": statistics.median(off),
        "ms_per_step_on_median": statistics.median(on),
        "overhead_pct_per_repeat": pairs,
        "overhead_pct": statistics.median(pairs),
        "sampler_start_s_median": statistics.median(c["start_s"] for c in costs),
        "sampler_stop_decode_s_median": statistics.median(c["stop_decode_s"] for c in costs),
        "metrics": kinds,
    }
