"""Time the CUDA GQA split kernel's row layouts at verify bench points: the rows past the last
whole 64-row block padded to a block (``KDTREE_GQA_TAIL=0``) or taken by the tail warpgroup
(swapped-operand m64n16 MMAs), in every (consumer warpgroups, whole blocks a CTA) layout, with
and without turns. Each variant's output is compared with the padded layout's (max abs diff).

    python3 tools/gpu/gqa_layouts.py [--points gqa_32q8kv_d128:131072:65,...] [--ab]
        [--variants "TAIL=0;BLOCKS=2,TAIL=1;..."] [--repeat N] [--out DIR]

Graph-replayed p50 per call (KV rotated beyond L2, as in ``kdtree bench verify-attention``);
the split count is ``choose_splits`` of each layout. ``--ab`` times only the padded layout
against the tail in the last CTA of three-block CTAs (``KDTREE_GQA_BLOCKS=3``) and after
two-block two-warpgroup CTAs; ``--repeat N``
times every variant N times in turn (ABAB..., so clock drift under a long compute-bound run
falls on all of them) and reports each one's median. ``--variants`` gives the variants
instead: ``;``-separated sets of ``,``-separated ``NAME=VALUE`` knobs (``KDTREE_GQA_NAME``; the
first set is the reference of the diff column; ``SPLITS=S`` forces the split count; names
starting ``CUDA_`` are ``KDTREE_CUDA_...``, e.g. ``CUDA_MERGE_WARP=0``). Rows go to
``gqa_layouts.csv``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from pathlib import Path

import torch

from kdtree.bench.schema import run_env, write_dicts
from kdtree.bench.timing import time_cuda
from kdtree.bench.verify_attention import (
    LAYOUTS,
    Workload,
    _cuda_gqa_fn,
    _gqa_plan,
    _graphed,
    make_tree_inputs,
)
from kdtree.kernels import cuda_gqa

KNOBS = (
    "KDTREE_GQA_TAIL",
    "KDTREE_GQA_WARPGROUPS",
    "KDTREE_GQA_BLOCKS",
    "KDTREE_GQA_PINGPONG",
    "KDTREE_GQA_SPLIT_TAIL",
    "KDTREE_GQA_KEY_TAIL",
    "KDTREE_GQA_QGROUPS",
    "KDTREE_GQA_SPLITS",  # this tool's own: the split count (else choose_splits)
    "KDTREE_CUDA_MERGE_WARP",
)


def parse_variants(spec: str) -> list[dict[str, str]]:
    """``"TAIL=0;PAIR=1,BLOCKS=3"`` -> ``[{"KDTREE_GQA_TAIL": "0"}, {...}]`` (``default``: {})."""
    out = []
    for group in spec.split(";"):
        var = {}
        for item in filter(None, (x.strip() for x in group.split(","))):
            if item == "default":
                continue
            name, _, value = item.partition("=")
            name = name.strip().upper()
            key = "KDTREE_" + name if name.startswith("CUDA_") else "KDTREE_GQA_" + name
            if key not in KNOBS or not value:
                raise SystemExit(f"--variants: {item!r}: expected NAME=VALUE, NAME one of "
                                 f"{[k.removeprefix('KDTREE_GQA_') for k in KNOBS]}")  # fmt: skip
            var[key] = value.strip()
        out.append(var)
    return out


def variants(rows: int, ab: bool = False) -> list[dict[str, str]]:
    """The padded layout first (the reference), the default, the padded ones of both shapes,
    every tail layout, and turns forced on three warpgroups."""
    if ab:
        return [
            {"KDTREE_GQA_TAIL": "0"},
            {"KDTREE_GQA_TAIL": "1", "KDTREE_GQA_BLOCKS": "3"},
            {"KDTREE_GQA_TAIL": "1", "KDTREE_GQA_WARPGROUPS": "2", "KDTREE_GQA_BLOCKS": "2"},
        ]
    out = [{"KDTREE_GQA_TAIL": "0"}, {}]
    out += [{"KDTREE_GQA_TAIL": "0", "KDTREE_GQA_WARPGROUPS": w} for w in ("2", "3")]
    n_full, rest = divmod(rows, 64)
    if n_full >= 1 and 1 <= rest <= cuda_gqa.TAIL_ROWS:
        for w in ("2", "3"):
            for k in ("1", "2", "3")[: int(w)]:
                out.append({"KDTREE_GQA_WARPGROUPS": w, "KDTREE_GQA_BLOCKS": k})
        out.append({"KDTREE_GQA_PINGPONG": "2"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--points",
        default="gqa_32q8kv_d128:131072:65,gqa_8q1kv_d128:131072:65,"
        "gqa_8q1kv_d128:131072:17,gqa_32q8kv_d128:131072:17",
    )
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--ab", action="store_true")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    records = []
    for spec in a.points.split(","):
        name, length, t = spec.split(":")
        lay = LAYOUTS[name]
        wl = Workload(lay, 1, int(length), int(t), a.page_size, torch.bfloat16,
                      torch.device("cuda"), seed=0)  # fmt: skip
        ti = make_tree_inputs(wl, int(t), seed=0)
        rows = int(t) * (lay.hq // lay.hkv)
        ref = None
        setups = []
        chosen = parse_variants(a.variants) if a.variants else variants(rows, a.ab)
        for var in chosen:
            for k in KNOBS:
                os.environ.pop(k, None)
            os.environ.update({k: v for k, v in var.items() if k != "KDTREE_GQA_SPLITS"})
            forced = var.get("KDTREE_GQA_SPLITS")
            fn, splits = _cuda_gqa_fn(wl, ti, int(forced) if forced else None)
            plan = _gqa_plan(wl, ti, splits)
            wgs, blocks, split = plan.wgs, plan.tail_blocks, plan.split
            ctas = cuda_gqa.row_ctas(plan.rows, wgs, blocks) * plan.q_groups  # a KV head's
            got = fn(0).float().clone()
            if ref is None and (a.variants or var.get("KDTREE_GQA_TAIL") == "0"):
                ref = got
            diff = float((got - ref).abs().max()) if ref is not None else float("nan")
            replay, per = _graphed(fn, wl.n_rot, wl.device)  # captured with this variant's plan
            # (fn holds the workspace the graph writes: it must live as long as the graph)
            setups.append((var, wgs, blocks, split, ctas, splits, diff, (fn, replay), per, []))
        for _ in range(a.repeat):
            for *_, (_, replay), per, times in setups:
                times.append(time_cuda(lambda replay=replay: replay(0)).p50 / per)
        for var, wgs, blocks, split, ctas, splits, diff, _, _, times in setups:
            ms = statistics.median(times)
            label = " ".join(f"{k.removeprefix('KDTREE_GQA_')}={v}" for k, v in var.items())
            print(f"{spec} rows={rows} [{label or 'default'}] wgs={wgs} blocks={blocks} "
                  f"split_tail={int(split)} ctas={ctas} splits={splits}: "
                  f"{ms * 1e3:7.1f} us (of {len(times)}: {min(times) * 1e3:.1f}-"
                  f"{max(times) * 1e3:.1f})  (max |diff| vs {'the first' if a.variants else 'padded'} {diff:.2e})", flush=True)  # fmt: skip
            records.append({"point": spec, "rows": rows, "variant": label or "default",
                            "warpgroups": wgs, "tail_blocks": blocks, "split_tail": split,
                            "row_ctas": ctas, "splits": splits,
                            "ms": ms, "ms_min": min(times), "ms_max": max(times),
                            "repeats": len(times), "max_abs_diff_vs_padded": diff, **env})  # fmt: skip
        for k in KNOBS:
            os.environ.pop(k, None)
        del wl, ti
        torch.cuda.empty_cache()
    if a.out:
        write_dicts(Path(a.out) / "gqa_layouts.csv", records)


if __name__ == "__main__":
    main()
