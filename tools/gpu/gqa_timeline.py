"""The CUDA GQA verify call CTA by CTA: where its fixed cost goes (launch ramp, first tile,
streaming, epilogue, stragglers, the gap to the merge, the merge, the gap to the next call).

    python3 tools/gpu/gqa_timeline.py [--points gqa_8q1kv_d128:16384:17,...] [--replays 5]
        [--page-size 16] [--out DIR]

Builds the CUDA kernels with ``KDTREE_CUDA_DEFINES=KDTREE_TIMELINE`` (every CTA of the split
kernel and the merge appends a record of ``%globaltimer`` stamps when it leaves: a measurement
build, its own cache entry), captures the verify bench's graph (the point's KV rotations, back
to back) and replays it ``--replays`` times, reading the records after each replay
(:mod:`kdtree.profiling.cta_timeline`). Prints each point's median spans (µs) over the calls
with the graph-replayed p50 of this build next to them, and writes ``gqa_timeline_calls.csv``
(one row a call) and ``gqa_timeline_ctas.csv`` (the records of call 1 of the first replay, µs
from its first split entry: notebook 03 draws them).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

_defs = [d for d in os.environ.get("KDTREE_CUDA_DEFINES", "").split(",") if d.strip()]
if "KDTREE_TIMELINE" not in _defs:  # before the library is built and loaded
    os.environ["KDTREE_CUDA_DEFINES"] = ",".join([*_defs, "KDTREE_TIMELINE"])

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from kdtree.bench.schema import run_env  # noqa: E402
from kdtree.bench.timing import time_cuda  # noqa: E402
from kdtree.bench.verify_attention import (  # noqa: E402
    LAYOUTS,
    Workload,
    _cuda_gqa_fn,
    _gqa_plan,
    _graphed,
    make_tree_inputs,
)
from kdtree.kernels import cuda_common, cuda_gqa  # noqa: E402
from kdtree.profiling import cta_timeline as ctl  # noqa: E402

SPANS = ("ramp", "issue", "first_tile", "stream", "stream_max", "epilogue", "straggle", "split",
         "gap_merge", "merge", "gap_next", "call_us")  # fmt: skip
DEFAULT_POINTS = (
    "gqa_8q1kv_d128:16384:17,gqa_8q1kv_d128:65536:17,gqa_8q1kv_d128:131072:17,"
    "gqa_8q1kv_d128:32768:65,gqa_32q8kv_d128:32768:65,gqa_32q8kv_d128:65536:65"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    # the command with the kernel knobs it ran under (KDTREE_CUDA_MERGE, KDTREE_CUDA_SPLIT_PDL,
    # KDTREE_GQA_*, ...; the timeline define it sets itself left out): a row says how to redo it
    knobs = [
        f"{k}={v}"
        for k, v in sorted(os.environ.items())
        if k.startswith(("KDTREE_CUDA_", "KDTREE_GQA_")) and k != "KDTREE_CUDA_DEFINES"
    ]
    if _defs:
        knobs.append("KDTREE_CUDA_DEFINES=" + ",".join(_defs))
    env = run_env(shlex.join([*knobs, "python3", *sys.argv]))
    calls, ctas = [], []
    for spec in a.points.split(","):
        name, length, t = spec.split(":")
        lay = LAYOUTS[name]
        dev = torch.device("cuda")
        wl = Workload(lay, 1, int(length), int(t), a.page_size, torch.bfloat16, dev, seed=0)
        ti = make_tree_inputs(wl, int(t), seed=0)
        rows = int(t) * (lay.hq // lay.hkv)
        fn, splits = _cuda_gqa_fn(wl, ti)
        plan = _gqa_plan(wl, ti, splits)  # (WideTail too since session 37: two row CTAs)
        wgs, blocks, split = plan.wgs, plan.tail_blocks, plan.split
        x = 2 if split == 2 else cuda_gqa.row_ctas(plan.rows, wgs, blocks)
        split_ctas = x * splits * plan.heads
        entries = splits * (2 if split else 1)  # (the split tail's shadow rows)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        merge_ctas = (
            cuda_common.merge_ctas(
                plan.rows,
                plan.heads,
                entries,
                num_sms=sms,
                pdl=plan.merge == cuda_common.MERGE_PDL,
            )
            if splits > 1
            else 0
        )
        replay, per = _graphed(fn, wl.n_rot, dev)
        p50 = (
            time_cuda(lambda replay=replay: replay(0)).p50 / per * 1e3
        )  # µs a call, this (stamping) build
        torch.cuda.synchronize()
        cuda_gqa.timeline_records(discard=True)  # drop the warm-up and timing runs' records
        for r in range(a.replays):
            replay(0)
            torch.cuda.synchronize()
            df = ctl.assign_calls(ctl.decode(cuda_gqa.timeline_records()), split_ctas, merge_ctas,
                                  overlap=cuda_gqa.split_pdl())  # fmt: skip
            ph = ctl.call_phases(df)
            ph = ph.assign(point=spec, rows=rows, splits=splits, warpgroups=wgs,
                           tail_blocks=blocks, split_tail=split, replay=r, calls=per,
                           p50_us=p50, timer_step_ns=ctl.timer_step_ns(df))  # fmt: skip
            calls.append(ph)
            if r == 0:
                g = df[df["call"] == min(1, per - 1)]
                t0 = g.loc[g["kind"] == "split", "entry"].min()
                rel = g.assign(point=spec, **{c: ((g[c] - t0).where(g[c] > 0) * 1e-3).round(3)
                                              for c in ctl.STAMPS})  # fmt: skip
                ctas.append(rel)
        med = pd.concat([c for c in calls if (c["point"] == spec).all()])[list(SPANS)].median()
        print(f"{spec} rows={rows} splits={splits} wgs={wgs} tail_blocks={blocks} "
              f"split_tail={int(split)} p50={p50:.1f} us | "
              + " ".join(f"{k}={v:.2f}" for k, v in med.items()), flush=True)  # fmt: skip
        del wl, ti, fn, replay
        torch.cuda.empty_cache()
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        pd.concat(calls).assign(**env).to_csv(out / "gqa_timeline_calls.csv", index=False)
        pd.concat(ctas).assign(git_sha=env["git_sha"], command=env["command"]).to_csv(
            out / "gqa_timeline_ctas.csv", index=False
        )


if __name__ == "__main__":
    main()
