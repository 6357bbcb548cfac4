"""What the end of a split-KV call costs with the partials added by vector atomics into one fp32
accumulator and normalised by the last CTA to arrive (no merge kernel), against the partials
written and merged by kdtree's own merge kernel — before building that into the GQA kernel.

    python3 tools/gpu/atomic_merge_probe.py [--out DIR]

Compiles ``tools/gpu/atomic_merge_probe.cu`` (a standalone probe; its header says what each mode
does) with nvcc and, for each shape (8q/1kv's split grids: T=17, 129 one-CTA splits of 136 rows;
T=65, 33 splits of four 132-row CTAs), times graph-captured back-to-back calls in every mode
with the emulated stream (``--spin`` cycles and up to ``--jitter`` more a CTA) and with none.
Each mode's cost (``cost_us``) is its time less mode ``none``'s at the same spin; ``merge_only``
and ``empty_merge_grid`` launch no split grid (``cost_us`` NaN): their ``us`` is the merge kernel
alone on written partials and an empty kernel of its grid; ``merge_wide_only`` and
``merge_colsN_only`` the library's other merge kernels alone (``--modes`` picks; ``none`` always
runs). Checks first that the atomic modes' and the other merges' output match the merge
kernel's. Writes ``atomic_merge_probe.csv`` with the run's provenance.
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import sys
from pathlib import Path

import pandas as pd

from kdtree.bench.schema import run_env
from kdtree.kernels.cuda_build import build_probe

HERE = Path(__file__).resolve().parent
SHAPES = {"t17_129x1x136": (129, 1, 136), "t65_33x4x132": (33, 4, 132)}
MODES = {"none": (0, 0), "partials+merge": (1, 0), "partials+merge_pdl": (1, 1),
         "atomic": (2, 0), "atomic_fixed_ref": (3, 0), "atomic_scalar": (4, 0),
         "merge_only": (5, 0), "partials_only": (6, 0), "empty_merge_grid": (7, 0),
         "merge_wide_only": (8, 0), "merge_cols2_only": (9, 0), "merge_cols4_only": (10, 0),
         "merge_cols8_only": (11, 0), "merge_cols16_only": (12, 0)}  # fmt: skip
NO_SPLIT_GRID = (5, 7, 8, 9, 10, 11, 12)  # modes that launch no split grid: their cost_us is NaN
WIDE_MAX_SPLITS = 72  # merge_splits_wide_kernel's entries a row (MERGE_WIDE_ENTRIES)


def build() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_probe(HERE / "atomic_merge_probe.cu")))
    lib.probe_run.restype = ctypes.c_float
    lib.probe_run.argtypes = [ctypes.c_int] * 5 + [ctypes.c_longlong] + [ctypes.c_int] * 4
    lib.probe_check.restype = ctypes.c_float
    lib.probe_check.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_float)]
    return lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--spins", default="0,20000", help="cycles of emulated stream")
    ap.add_argument("--jitter", type=int, default=2000, help="cycles, the most a CTA adds")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--modes", default=",".join(MODES), help="which modes to time (names)")
    a = ap.parse_args()
    env = run_env(shlex.join(["python3", *sys.argv]))
    lib = build()
    for shape, (s, c, r) in SHAPES.items():
        for mode in (2, 4, 8, 9, 10, 11, 12) if s <= WIDE_MAX_SPLITS else (2, 4, 9, 10, 11, 12):
            mx = ctypes.c_float(0.0)
            err = lib.probe_check(s, c, r, mode, ctypes.byref(mx))
            print(f"check {shape} mode {mode}: max |its out - the merge kernel's| {err:.3g} "
                  f"(|out| <= {mx.value:.3g})", flush=True)  # fmt: skip
            if err < 0 or err > 0.02 * max(mx.value, 1e-6):
                raise SystemExit(f"{shape} mode {mode}: its output does not match ({err})")
    rows = []
    for shape, (s, c, r) in SHAPES.items():
        for spin in [int(x) for x in a.spins.split(",")]:
            base = None
            for name, (mode, pdl) in MODES.items():
                if name not in a.modes.split(",") and name != "none":
                    continue
                if mode == 8 and s > WIDE_MAX_SPLITS:
                    continue  # (more splits than the wide merge takes)
                us = lib.probe_run(s, c, r, mode, pdl, spin, a.jitter, a.calls, a.reps, a.rounds)
                if us < 0:
                    raise SystemExit(f"{shape} {name}: cudaError {-us:.0f}")
                base = us if name == "none" else base
                cost = us - base if mode not in NO_SPLIT_GRID else float("nan")
                rows.append({"shape": shape, "splits": s, "row_ctas": c, "rows_a_cta": r,
                             "mode": name, "spin_cycles": spin, "jitter_cycles": a.jitter,
                             "us": us, "cost_us": cost})  # fmt: skip
                print(f"{shape:14s} spin={spin:6d} {name:20s} {us:8.3f} us  (+{cost:6.3f})",
                      flush=True)  # fmt: skip
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).assign(**env).to_csv(out / "atomic_merge_probe.csv", index=False)


if __name__ == "__main__":
    main()
