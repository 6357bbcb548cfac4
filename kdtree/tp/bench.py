"""The tensor-parallel decode benchmark behind ``kdtree bench tp`` (one process per GPU under
torchrun; ``--tp 1,2,4,8`` runs each degree on the first ``d`` ranks of the world).

Per (TP degree, context), on a random-weight TP target with a replicated random DFlash drafter
and a synthetic prefix (``SpecEngine.synthetic_state``):

* **breakdown** pass (``timings=True``: device sync at each phase end): host wall time per
  engine phase, and the time of every collective on the compute stream (CUDA events), split by
  the phase it ran in — per rank;
* **throughput** pass (no per-phase sync): wall time per step, emitted tokens, decode
  tokens/s (at the acceptance of the random drafter — report ``step_ms`` with it);
* **verify attention per rank**: the ``tree_attention`` / ``tree_attention_mla`` entry point
  timed alone at this rank's head count, on the step's real cache, tree mask and prefix, per
  layer and times the layer count.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kdtree.bench.schema import BenchRow
from kdtree.bench.timing import time_fn
from kdtree.models.config import GQAConfig, MLAConfig, ModelConfig, dflash_config_for, get_config
from kdtree.models.dflash import DFlashDrafter
from kdtree.spec.records import PHASES
from kdtree.spec.tree import build_trees, draft_topk
from kdtree.tp.dist import CommTimer, TPGroup, new_tp_group
from kdtree.tp.engine import TPSpecEngine
from kdtree.tp.model import reset_rotary
from kdtree.tp.shard import build_tp_model

__all__ = ["PRESETS", "TPBenchConfig", "bench_config", "run_tp_bench"]

SUITE = "tp"


def _llama3_8b() -> GQAConfig:
    return GQAConfig(
        family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )  # fmt: skip


def _kimi_k2(layers: int = 3) -> MLAConfig:
    """Kimi-K2's layer shapes at all 64 heads (the ``kimi-k2-tp8`` config is one TP8 rank)."""
    return get_config("kimi-k2-tp8").replace(
        num_attention_heads=64, num_key_value_heads=64, num_hidden_layers=layers, extra={}
    )


#: Named benchmark targets (``--model``); any kdtree config name works too (CPU smoke runs).
PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "llama3-8b": _llama3_8b,  # 32 q / 8 kv heads of 128; fits one H200 at TP1 in bf16
    "kimi-k2-3l": _kimi_k2,  # 1 dense + 2 MoE layers (384 experts): ~75 GB at TP1 in bf16
}


def bench_config(model: str, layers: int | None = None) -> ModelConfig:
    """The target config for ``--model`` (a preset or a kdtree config name), with
    ``num_hidden_layers`` overridden when ``layers`` is given."""
    cfg = PRESETS[model]() if model in PRESETS else get_config(model)
    if not isinstance(cfg, GQAConfig | MLAConfig):
        raise ValueError(f"model={model!r}: expected a target (GQA or MLA) config")
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers={layers}: expected >= 1")
        cfg = cfg.replace(num_hidden_layers=layers)
    return cfg


@dataclass(frozen=True)
class TPBenchConfig:
    model: str = "llama3-8b"
    layers: int | None = None
    tps: tuple[int, ...] = (1, 2)
    contexts: tuple[int, ...] = (4096, 46000)
    batch: int = 1
    budget: int = 64
    top_k: int = 8
    block_size: int = 16
    drafter_layers: int = 1
    steps: int = 20
    warmup: int = 3
    dtype: str = "bfloat16"
    backend: str = "auto"
    seed: int = 0


def _build_drafter(cfg: ModelConfig, target, block_size: int, layers: int, seed: int):
    dcfg = dflash_config_for(cfg, num_layers=layers, block_size=block_size)
    with torch.device("meta"):
        drafter = DFlashDrafter(dcfg, target)
    drafter = drafter.to(target.dtype).to_empty(device=target.device)
    reset_rotary(drafter, dcfg)
    gen = torch.Generator(device=target.device).manual_seed(seed + 17)  # same on every rank
    drafter.init_weights(gen)
    return drafter.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _attention_fn(target, state, budget: int, top_k: int, block_size: int, backend: str):
    """A closure running one layer's verify attention at this rank's heads on ``state``."""
    from kdtree.attention import tree_attention, tree_attention_mla

    cfg, cache, dev = target.config, state.cache, target.device
    b, t = state.batch, budget + 1
    gen = torch.Generator().manual_seed(0)
    lp, tok = draft_topk(torch.randn(b, block_size - 1, 64, generator=gen), min(top_k, 64))
    mask = build_trees(lp, tok, budget, state.bonus).mask.to(dev)
    page_table = cache.batch_page_table(state.reqs)
    prefix = torch.tensor(state.context_lens, dtype=torch.int32, device=dev)
    g = torch.Generator(device=dev).manual_seed(1)
    sm_scale = target.model.layers[0].self_attn.sm_scale
    if cache.kind == "gqa":
        q = torch.randn(b, t, cfg.num_attention_heads, cfg.head_dim, generator=g, device=dev)
        q = q.to(target.dtype)
        return lambda: tree_attention(
            q, cache.k[0], cache.v[0], page_table, prefix, mask, sm_scale=sm_scale,
            backend=backend,
        )  # fmt: skip
    h = cfg.num_attention_heads
    q_nope = torch.randn(b, t, h, cfg.kv_lora_rank, generator=g, device=dev).to(target.dtype)
    q_pe = torch.randn(b, t, h, cfg.qk_rope_head_dim, generator=g, device=dev).to(target.dtype)
    return lambda: tree_attention_mla(
        q_nope, q_pe, cache.kv[0], page_table, prefix, mask, sm_scale=sm_scale, backend=backend
    )


def _run_point(tp: TPGroup, cfg: ModelConfig, bc: TPBenchConfig, context: int, device) -> dict:
    """One (degree, context) on this rank: a dict of per-rank measurements."""
    dtype = getattr(torch, bc.dtype)
    target = build_tp_model(cfg, tp, device=device, dtype=dtype, seed=bc.seed)
    drafter = _build_drafter(cfg, target, bc.block_size, bc.drafter_layers, bc.seed)
    t = bc.budget + 1
    room = (bc.steps * 2 + bc.warmup * 2 + 8) * (t + bc.block_size)
    eng = TPSpecEngine(
        target, drafter, mode="tree", budget=bc.budget, top_k=bc.top_k, backend=bc.backend,
        timings=True, max_len=context + room,
    )  # fmt: skip
    state = eng.synthetic_state(bc.batch, context, torch.Generator().manual_seed(bc.seed))
    for _ in range(bc.warmup):
        eng.step(state)
    # breakdown pass: per-phase host time (synchronised) + collectives by phase
    tp.timer = CommTimer(device)
    tp.timer.collect()
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    comm: dict[str, list[float]] = {}
    comm_calls: dict[str, int] = {}
    for i in range(bc.steps):
        rec = eng.step(state)
        for p, ms in rec.phase_ms.items():
            phases.setdefault(p, []).append(ms)
        ms, counts = tp.timer.collect()
        for name in set(ms) | set(comm):
            comm.setdefault(name, [0.0] * i).append(ms.get(name, 0.0))
        for name, n in counts.items():
            comm_calls[name] = comm_calls.get(name, 0) + n
    tp.timer = None
    # throughput pass: one sync per step
    eng.timings = False
    step_ms, emitted = [], 0
    for _ in range(bc.steps):
        _sync(device)
        t0 = time.perf_counter()
        rec = eng.step(state)
        _sync(device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        emitted += sum(rec.emitted)
    attn = time_fn(
        _attention_fn(target, state, bc.budget, bc.top_k, bc.block_size, bc.backend), device
    )
    out = {
        "rank": tp.rank,
        "phases": phases,
        "comm": comm,
        "comm_calls_per_step": {k: v / bc.steps for k, v in comm_calls.items()},
        "step_ms": step_ms,
        "emitted": emitted,
        "attn_layer_ms": (attn.p50, attn.p20, attn.p80),
        "layers": cfg.num_hidden_layers,
        "local_heads": target.config.num_attention_heads,
        "local_kv_heads": target.config.num_key_value_heads,
    }
    del eng, state, drafter, target
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def _q(values: Sequence[float]) -> tuple[float, float, float]:
    vals = sorted(values)
    if not vals:
        return float("nan"), float("nan"), float("nan")
    qs = statistics.quantiles(vals, n=10, method="inclusive") if len(vals) > 1 else vals * 9
    return statistics.median(vals), qs[1], qs[7]


def _rows(model: str, d: int, context: int, results: list[dict], bc: TPBenchConfig) -> list:
    rows: list[BenchRow] = []
    base_cfg = {"batch": bc.batch, "budget": bc.budget, "top_k": bc.top_k, "dtype": bc.dtype,
                "block_size": bc.block_size, "layers": results[0]["layers"],
                "backend": bc.backend, "steps": bc.steps}  # fmt: skip

    def row(metric, unit, p50, p20=None, p80=None, rank=None, **extra):
        cfg = {**base_cfg, **extra, **({"rank": rank} if rank is not None else {})}
        name = model if rank is None else f"{model}/rank{rank}"
        rows.append(BenchRow(SUITE, name, f"tp{d}", metric, unit, p50, p20, p80, mode="tree",
                             x_name="context", x_value=context, config=cfg))  # fmt: skip

    r0 = results[0]
    p50, p20, p80 = _q(r0["step_ms"])
    row("step_ms", "ms", p50, p20, p80)
    total_s = sum(r0["step_ms"]) / 1e3
    row("tokens_per_s", "tok/s", r0["emitted"] / total_s if total_s > 0 else float("nan"))
    row("accept_len", "tokens", r0["emitted"] / (bc.steps * bc.batch))
    for res in results:
        rank = res["rank"]
        for phase, vals in res["phases"].items():
            if vals:
                row(f"phase_{phase}_ms", "ms", *_q(vals), rank=rank)
        comm_total = [sum(v) for v in zip(*res["comm"].values(), strict=True)] or [0.0]
        row("comm_ms_per_step", "ms", *_q(comm_total), rank=rank)
        for name, vals in sorted(res["comm"].items()):
            calls = res["comm_calls_per_step"].get(name, 0.0)
            row(f"comm_{name}_ms", "ms", *_q(vals), rank=rank, calls_per_step=calls)
        a50, a20, a80 = res["attn_layer_ms"]
        heads = {"local_heads": res["local_heads"], "local_kv_heads": res["local_kv_heads"]}
        row("verify_attention_layer_ms", "ms", a50, a20, a80, rank=rank, **heads)
        n = res["layers"]
        row("verify_attention_step_ms", "ms", a50 * n, a20 * n, a80 * n, rank=rank, **heads)
    return rows


def _gather_to_world0(obj: dict | None) -> list | None:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def run_tp_bench(
    world: TPGroup,
    bc: TPBenchConfig,
    device: torch.device,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[BenchRow], dict]:
    """Run every (degree, context) of ``bc``; world rank 0 gets the rows and a summary, the
    other ranks ``([], {})``. Every process of the world must call it."""
    cfg = bench_config(bc.model, bc.layers)
    bad = [d for d in bc.tps if d < 1 or d > world.size]
    if bad:
        raise ValueError(f"tps={bc.tps}: degrees {bad} outside [1, world size {world.size}]")
    rows: list[BenchRow] = []
    summary: dict = {"tokens_per_s": {}, "step_ms": {}, "comm_ms_per_step": {}}
    for d in bc.tps:
        group = new_tp_group(list(range(d)))
        for context in bc.contexts:
            if world.is_first:
                log(f"tp{d} context {context}: {bc.model}")
            res = _run_point(group, cfg, bc, context, device) if group is not None else None
            gathered = _gather_to_world0(res)
            if world.is_first:
                results = [r for r in gathered if r is not None]
                point = _rows(bc.model, d, context, results, bc)
                rows.extend(point)
                key = f"tp{d}_ctx{context}"
                for r in point:
                    if r.metric in ("tokens_per_s", "step_ms") and "/rank" not in r.name:
                        summary[r.metric][key] = round(r.p50, 4)
                    if r.metric == "comm_ms_per_step" and r.name.endswith("/rank0"):
                        summary["comm_ms_per_step"][key] = round(r.p50, 4)
            world.barrier()
    return rows, summary
