"""Compile the issue-5 Triton kernels for sm_90 without a GPU (run as a script, in a process
where ``TRITON_INTERPRET`` is unset: under the interpreter Triton builds interpreter objects).

Usage: ``python tests/spec/gpu_compile_sm90.py`` — prints one ``OK <kernel>`` line per kernel,
exits non-zero on the first compile error.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("gpu_compile_sm90: unset TRITON_INTERPRET first")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kdtree.spec.gpu import commit_triton as ct  # noqa: E402
from kdtree.spec.gpu import tree_build_triton as tbt  # noqa: E402
from kdtree.spec.gpu import verify_inputs_triton as vt  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def _compile(name: str, fn, sig: dict, consts: dict, num_warps: int = 4) -> None:
    triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=consts),
        target=TARGET,
        options={"num_warps": num_warps},
    )
    print(f"OK {name}", flush=True)


def tree_build(N: int, K: int, D: int = 15, algo: str = "threshold") -> None:
    fn = tbt._tree_build_thresh_kernel if algo == "threshold" else tbt._tree_build_kernel
    f32 = {"lp_ptr", "ws_f", "out_score"}
    i64 = {"tok_ptr", "bonus_ptr", "ws_key"}
    sig = {}
    for n in fn.arg_names:
        if n in f32:
            sig[n] = "*fp32"
        elif n in i64 or (n.startswith("out_") and n != "out_path"):
            sig[n] = "*i64"
        elif n.startswith("ws_") or n == "out_path":
            sig[n] = "*i32"
        elif n.startswith("s_"):
            sig[n] = "i32"
        else:
            sig[n] = "constexpr"
    ke, dm = min(K, N), min(D, N)
    W = (N + 64) // 64
    consts = dict(
        N=N,
        KE=ke,
        DM=dm,
        NP=triton.next_power_of_2(N),
        W=W,
        WP=triton.next_power_of_2(W),
        TP=triton.next_power_of_2(N + 1),
    )
    if algo == "threshold":
        consts.update(tbt.thresh_params(N, K, D))
        consts["CAPP"] = triton.next_power_of_2(consts["CAP"])
        warps = tbt.thresh_warps(N)
    else:
        warps = tbt.default_num_warps(N)
    _compile(f"tree_build[{algo}] N={N} K={K}", fn, sig, consts, warps)


def commit_and_fill() -> None:
    sig = {
        "ptrs": "*i64",
        "row_elems": "*i64",
        "page_table": "*i32",
        "pt_stride": "i32",
        "prefix": "*i32",
        "path": "*i64",
        "count": "*i64",
        "P": "i32",
        "page_size": "i32",
        "DTYPE": "constexpr",
        "P_PAD": "constexpr",
        "BLOCK_C": "constexpr",
    }
    _compile(
        "commit_path", ct._commit_path_kernel, sig, dict(DTYPE=tl.bfloat16, P_PAD=16, BLOCK_C=256)
    )
    sig = {
        "ptrs": "*i64",
        "row_elems": "*i64",
        "src": "*i64",
        "dst": "*i64",
        "P": "i32",
        "DTYPE": "constexpr",
        "P_PAD": "constexpr",
        "BLOCK_C": "constexpr",
    }
    _compile(
        "commit_kv", ct._commit_kv_kernel, sig, dict(DTYPE=tl.bfloat16, P_PAD=16, BLOCK_C=256)
    )
    sig = {
        "tok": "*i64",
        "dep": "*i64",
        "mask": "*i64",
        "prefix": "*i32",
        "page_table": "*i32",
        "pt_stride": "i32",
        "ids_out": "*i64",
        "pos_out": "*i64",
        "mask_out": "*i64",
        "slot_out": "*i64",
        "T": "i32",
        "W": "i32",
        "page_size": "i32",
        "BLOCK_T": "constexpr",
        "WP": "constexpr",
    }
    _compile("fill", vt._fill_kernel, sig, dict(BLOCK_T=64, WP=4))


if __name__ == "__main__":
    for n, k in ((16, 16), (64, 32), (255, 7), (256, 32)):
        tree_build(n, k)
    for n, k in ((16, 8), (64, 32), (256, 32)):
        tree_build(n, k, algo="heap")
    commit_and_fill()
