"""Tree-build benchmark: the host heap path vs the device builder, per decode step.

The heap path is everything the host builder needs each step: top-K of the draft log-probs on
the device, the device→host copy (a sync), one ``heapq`` build per request with its ancestor
mask, padding, and the host→device copy of tokens/depths/mask. The device path is
``build_trees_device`` on the same top-K (timed alone, and with the top-K), eager and — on
CUDA — replayed from a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from kdtree.bench.schema import BenchRow
from kdtree.bench.timing import Timing, graph_of, time_cpu, time_cuda
from kdtree.spec.gpu.tree_build import build_trees_device
from kdtree.spec.tree import build_trees, draft_topk

SUITE = "tree_build"

__all__ = ["SUITE", "TreeBuildCase", "heap_step", "run_tree_build"]


@dataclass(frozen=True)
class TreeBuildCase:
    batch: int
    budget: int
    depth: int
    top_k: int
    vocab: int

    @property
    def config(self) -> dict:
        return {
            "batch": self.batch,
            "budget": self.budget,
            "depth": self.depth,
            "top_k": self.top_k,
            "vocab": self.vocab,
        }


def heap_step(logits: torch.Tensor, K: int, budget: int, bonus: torch.Tensor):
    """One step of the host path, returning device tensors the verify forward would use."""
    lp, tok = draft_topk(logits, K)
    trees = build_trees(lp, tok, budget, bonus.cpu())  # .cpu() inside: the sync
    dev = logits.device
    return (
        trees.tokens.to(dev, non_blocking=True),
        trees.depths.to(dev, non_blocking=True),
        trees.mask.to(dev, non_blocking=True),
        trees.parents.to(dev, non_blocking=True),
    )


def _topk_then_build(logits, K: int, budget: int, bonus, algo: str):
    if algo == "cuda":
        from kdtree.spec.gpu import tree_build_cuda as tbc

        return tbc.build_trees_cuda(*draft_topk(logits, K), budget, bonus)
    from kdtree.spec.gpu import tree_build_triton as tbt

    return tbt.build_trees_triton(*draft_topk(logits, K), budget, bonus, algo=algo)


def _graphed(fn: Callable[[], object], reps: int = 1) -> Callable[[], object]:
    """Capture ``reps`` calls of ``fn`` (static inputs closed over) in one CUDA graph; return its
    replay."""
    graph, _ = graph_of(fn, reps=reps)
    return graph.replay


# ``_graph_x10`` providers: ten builds back to back in one graph, timed per build. One replay of
# a one-build graph also pays the graph launch (~4-5 us on the H200), which a decode step's graph
# pays once for all its kernels; ten in a row give the builder's own GPU time per step.
GRAPH_REPS = 10


def _timer(device: torch.device, fast: bool):
    if device.type == "cuda":
        return lambda fn: time_cuda(
            fn, warmup_ms=10 if fast else 25, rep_ms=30 if fast else 100, flush_l2=False
        )
    return lambda fn: time_cpu(fn, min_run_time=0.05 if fast else 0.2)


def run_tree_build(
    batches: Sequence[int],
    budgets: Sequence[int],
    *,
    depth: int = 15,
    top_k: int = 32,
    vocab: int = 32768,
    device: torch.device | str = "cpu",
    providers: Sequence[str] = (
        "heap",
        "device_torch",
        "device_torch_graph",
        "device_triton",
        "device_triton_thresh",
        "device_triton_heap",
        "device_cuda",
    ),
    fast: bool = False,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Time every provider on every (batch, budget); K = min(budget, top_k) (>= 1).

    Providers that cannot run here (graphs and Triton without CUDA; Triton outside
    ``tree_build_triton.supports``) are skipped. ``device_triton`` is the Triton builder the
    engine runs (``algo="auto"``), ``device_triton_thresh`` the threshold builder and
    ``device_triton_heap`` the two-pop heap replay, ``device_cuda`` the CUDA C++ builder (sm_90
    with nvcc only); each is also timed from a CUDA graph
    (``_graph``) and, graphed, with the fused top-K in front (``+topk_graph``); the CUDA builder
    and the engine's Triton builder also as ten builds in one graph, per build (``_graph_x10``:
    the builder's GPU time without the one-kernel graph's launch). Rows: time per step (ms), and
    ``speedup`` (heap / provider) for every device provider.
    """
    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    timer = _timer(dev, fast)
    rows: list[BenchRow] = []
    for batch in batches:
        for budget in budgets:
            K = max(1, min(budget, top_k, vocab))
            case = TreeBuildCase(batch, budget, depth, K, vocab)
            logits = torch.randn(batch, depth, vocab, device=dev, generator=gen) * 3
            bonus = torch.randint(0, vocab, (batch,), device=dev, generator=gen)
            lp, tok = draft_topk(logits, K)
            fns: dict[str, Callable[[], object]] = {}
            if "heap" in providers:
                fns["heap"] = lambda logits=logits, K=K, budget=budget, bonus=bonus: heap_step(
                    logits, K, budget, bonus
                )
            if "device_torch" in providers:
                fns["device_torch"] = lambda lp=lp, tok=tok, budget=budget, bonus=bonus: (
                    build_trees_device(lp, tok, budget, bonus, backend="torch")
                )
                fns["device_torch+topk"] = lambda logits=logits, K=K, budget=budget, bonus=bonus: (
                    build_trees_device(*draft_topk(logits, K), budget, bonus, backend="torch")
                )
            if "device_torch_graph" in providers and dev.type == "cuda":
                fns["device_torch_graph"] = _graphed(
                    lambda lp=lp, tok=tok, budget=budget, bonus=bonus: build_trees_device(
                        lp, tok, budget, bonus, backend="torch"
                    )
                )
            for prov, algo in (
                ("device_triton", "auto"),
                ("device_triton_thresh", "threshold"),
                ("device_triton_heap", "heap"),
            ):
                if prov not in providers or dev.type != "cuda":
                    continue
                from kdtree.spec.gpu import tree_build_triton as tbt

                if not tbt.supports(lp, budget):
                    continue
                build = partial(tbt.build_trees_triton, lp, tok, budget, bonus, algo=algo)
                fns[prov] = build
                fns[f"{prov}_graph"] = _graphed(build)
                if algo == "auto":
                    fns[f"{prov}_graph_x{GRAPH_REPS}"] = _graphed(build, GRAPH_REPS)
                fns[f"{prov}+topk_graph"] = _graphed(
                    partial(_topk_then_build, logits, K, budget, bonus, algo)
                )
            if "device_cuda" in providers and dev.type == "cuda":
                from kdtree.spec.gpu import tree_build_cuda as tbc

                if tbc.available() and tbc.supports(lp, budget):
                    build = partial(tbc.build_trees_cuda, lp, tok, budget, bonus)
                    fns["device_cuda"] = build
                    fns["device_cuda_graph"] = _graphed(build)
                    fns[f"device_cuda_graph_x{GRAPH_REPS}"] = _graphed(build, GRAPH_REPS)
                    fns["device_cuda+topk_graph"] = _graphed(
                        partial(_topk_then_build, logits, K, budget, bonus, "cuda")
                    )
            times: dict[str, Timing] = {}
            for name, fn in fns.items():
                t = timer(fn)
                if name.endswith(f"_x{GRAPH_REPS}"):  # per build
                    t = Timing(*(x / GRAPH_REPS for x in (t.p50, t.p20, t.p80, t.mean)), t.n,
                               unit=t.unit)  # fmt: skip
                times[name] = t
                rows.append(_row(name, "time", "ms", times[name], case, dev))
                if log:
                    log(f"batch={batch} B={budget} {name}: {times[name].p50:.4g} ms")
            if "heap" in times:
                for name, t in times.items():
                    if name == "heap" or name.endswith(f"_x{GRAPH_REPS}"):
                        continue  # an x10 time leaves the launch out: no per-step speed-up
                    h = times["heap"]
                    speed = Timing(
                        h.p50 / t.p50,
                        h.p20 / t.p80,
                        h.p80 / t.p20,
                        h.mean / t.mean,
                        min(h.n, t.n),
                        unit="x",
                    )
                    rows.append(_row(name, "speedup_vs_heap", "x", speed, case, dev))
    return rows


def _row(
    provider: str, metric: str, unit: str, t: Timing, case: TreeBuildCase, dev: torch.device
) -> BenchRow:
    mode = "gpu" if dev.type == "cuda" else "CPU"
    return BenchRow(
        suite=SUITE,
        name=f"tree_build_b{case.batch}",
        provider=provider,
        metric=metric,
        unit=unit,
        p50=t.p50,
        p20=t.p20,
        p80=t.p80,
        mode=mode,
        x_name="budget",
        x_value=case.budget,
        config=case.config,
    )
