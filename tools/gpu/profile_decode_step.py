"""Kernel breakdown of one CUDA-graph decode step of the shipped pair, per mode.

``python3 tools/gpu/profile_decode_step.py [--ctx 1024] [--steps 20] [--out DIR]``: prefill a
stdlib + HumanEval prompt of ``ctx`` tokens, capture the ``GraphStepRunner`` step of ``ar``,
``chain`` and ``tree`` (B=64), step it ``steps`` times (graph replays, a host sync every 4) under ``torch.profiler`` and print, per
mode, the kernels per step, GPU busy µs per step, wall µs per step and the kernels that take the
most time (grouped by name). Writes ``profile_decode_step.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kdtree.bench.decode import DecodePoint, load_pair, make_engine
from kdtree.spec.gpu.runner import GraphStepRunner
from kdtree.train.prompts import ContextBuilder, load_humaneval


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    dev = torch.device("cuda")
    target, drafter, tok = load_pair("data/models", dev)
    prompt = load_humaneval()[0].prompt
    ids = ContextBuilder(tok).build(a.ctx, prompt)
    report = {}
    for mode in ("ar", "chain", "tree"):
        gen = 16 * (2 * a.steps + 8) + 64  # room for every step to accept a whole block
        eng = make_engine(target, drafter, DecodePoint(mode, a.ctx, gen))
        st = eng.prefill([ids], max_new_tokens=gen)
        r = GraphStepRunner(eng, st, mode="graph", sync_every=4)
        for _ in range(r.warmup + 2):
            r.step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            r.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.steps * 1e6
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                r.step()
            torch.cuda.synchronize()
        kern = [e for e in prof.events() if e.device_type.name == "CUDA"]
        by = collections.defaultdict(lambda: [0, 0.0])
        for e in kern:
            by[e.name][0] += 1
            by[e.name][1] += e.device_time
        busy = sum(v[1] for v in by.values()) / a.steps
        top = sorted(by.items(), key=lambda kv: -kv[1][1])[:25]
        report[mode] = {
            "kernels_per_step": len(kern) / a.steps,
            "gpu_busy_us_per_step": busy,
            "wall_us_per_step": wall,
            "top": [
                {"name": k[:110], "per_step": v[0] / a.steps, "us_per_step": v[1] / a.steps}
                for k, v in top
            ],
        }
        print(
            f"== {mode}: {len(kern) / a.steps:.0f} kernels/step, GPU busy {busy:.0f} us/step, "
            f"wall {wall:.0f} us/step"
        )
        for t in report[mode]["top"]:
            print(f"   {t['us_per_step']:8.1f} us  x{t['per_step']:5.1f}  {t['name']}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "profile_decode_step.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
