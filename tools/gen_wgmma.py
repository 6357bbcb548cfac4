"""Print the inline-PTX wgmma wrappers of ``kernels/sm90_common.cuh`` (between its
``BEGIN GENERATED WGMMA`` / ``END GENERATED WGMMA`` markers).

An m64nNk16 fp32 accumulator is N/2 registers a thread, each one asm operand, so the wrappers
are written out rather than typed, once, as a macro instantiated per element type:
``python3 tools/gen_wgmma.py > /tmp/w.h`` and paste.
"""

from __future__ import annotations

TYPES = {"bf16": ("__nv_bfloat16", "bf16"), "f16": ("__half", "f16")}


# Accumulators of this many registers get their operand list and constraints from a macro (the
# m64n256 wrappers, S x V and P x V, share them).
SHARED_REGS = 128


def _acc_list(regs: int) -> str:
    return '"\n      "'.join(
        ", ".join(f"%{i}" for i in range(j, min(j + 16, regs))) + (", " if j + 16 < regs else "")
        for j in range(0, regs, 16)
    )


def _acc_cons_list(regs: int) -> str:
    return ",\n        ".join(
        ", ".join(f'"+f"(d[{i}])' for i in range(j, min(j + 8, regs))) for j in range(0, regs, 8)
    )


def _acc_operands(regs: int) -> str:
    """The accumulator's "%0, ..., %{regs-1}" in the asm string (a macro for SHARED_REGS)."""
    return f'" KDTREE_WGMMA_D{regs}_REGS "' if regs == SHARED_REGS else _acc_list(regs)


def _acc_constraints(regs: int) -> str:
    """The accumulator's "+f" output constraints (a macro for SHARED_REGS)."""
    return f"KDTREE_WGMMA_D{regs}_CONS" if regs == SHARED_REGS else _acc_cons_list(regs)


def wrapper(n: int, tnsp_b: int, ctype: str, ptx: str, tnsp_a: int = 0) -> str:
    """A and B from shared memory; ``tnsp_a`` / ``tnsp_b``: MN-major A / B (suffix _ta / _tb)."""
    regs = n // 2
    suffix = ("_ta" if tnsp_a else "") + ("_tb" if tnsp_b else "")
    outs = _acc_operands(regs)
    da, db, sc = regs, regs + 1, regs + 2
    cons = _acc_constraints(regs)
    return f"""template <>
__device__ __forceinline__ void Wgmma<{ctype}>::ss_n{n}{suffix}(float (&d)[{regs}], uint64_t desc_a,
                                                       uint64_t desc_b, int scale_d) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{"
      "{outs}}}, "
      "%{da}, %{db}, p, 1, 1, {tnsp_a}, {tnsp_b};\\n}}\\n"
      : {cons}
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}}
"""


def wrapper_rs(n: int, tnsp_b: int, ctype: str, ptx: str) -> str:
    """A from registers (4 x 32-bit fragment registers a thread), B from shared memory."""
    regs = n // 2
    outs = _acc_operands(regs)
    a = ", ".join(f"%{regs + i}" for i in range(4))
    db, sc = regs + 4, regs + 5
    cons = _acc_constraints(regs)
    return f"""template <>
__device__ __forceinline__ void Wgmma<{ctype}>::rs_n{n}{"_tb" if tnsp_b else ""}(float (&d)[{regs}], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int scale_d) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{"
      "{outs}}}, "
      "{{{a}}}, %{db}, p, 1, 1, {tnsp_b};\\n}}\\n"
      : {cons}
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}}
"""


def main() -> None:
    # one macro body for every element type: the PTX type is the only difference, and a PTX
    # string cannot be built from a template parameter (adjacent literals around the macro's
    # PTX argument can)
    body = (
        "\n".join(
            w(n, tnsp, "CTYPE", '" PTX "', *extra)
            for w, n, tnsp, *extra in (
                (wrapper, 8, 0),
                (wrapper, 8, 0, 1),
                (wrapper, 16, 0),
                (wrapper, 16, 0, 1),
                (wrapper, 32, 0),
                (wrapper, 64, 0),
                (wrapper, 128, 0),
                (wrapper_rs, 128, 1),
                (wrapper, 256, 1),
                (wrapper_rs, 256, 1),
            )
        )
        .rstrip("\n")
        .replace('"" KDTREE_', "KDTREE_")
    )
    print("// BEGIN GENERATED WGMMA (tools/gen_wgmma.py)")
    regs_lines = ('      "' + _acc_list(SHARED_REGS) + '"').split("\n")
    print(f"#define KDTREE_WGMMA_D{SHARED_REGS}_REGS \\")
    print(" \\\n".join(regs_lines))
    print(f"#define KDTREE_WGMMA_D{SHARED_REGS}_CONS \\")
    print(" \\\n".join(("        " + _acc_cons_list(SHARED_REGS)).split("\n")))
    print("#define KDTREE_WGMMA_WRAPPERS(CTYPE, PTX) \\")
    print(" \\\n".join(body.split("\n")))
    print()
    for ctype, ptx in TYPES.values():
        print(f'KDTREE_WGMMA_WRAPPERS({ctype}, "{ptx}")')
    print("#undef KDTREE_WGMMA_WRAPPERS")
    print(f"#undef KDTREE_WGMMA_D{SHARED_REGS}_REGS")
    print(f"#undef KDTREE_WGMMA_D{SHARED_REGS}_CONS")
    print("// END GENERATED WGMMA")


if __name__ == "__main__":
    main()
