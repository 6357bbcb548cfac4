"""Print the inline-PTX wgmma wrappers of ``kernels/mla_tree_sm90.cu`` (between its
``BEGIN GENERATED WGMMA`` / ``END GENERATED WGMMA`` markers).

An m64nNk16 fp32 accumulator is N/2 registers a thread, each one asm operand, so the wrappers
are written out rather than typed: ``python3 tools/gen_wgmma.py > /tmp/w.h`` and paste.
"""

from __future__ import annotations

TYPES = {"bf16": ("__nv_bfloat16", "bf16"), "f16": ("__half", "f16")}


def wrapper(n: int, tnsp_b: int, ctype: str, ptx: str) -> str:
    regs = n // 2
    outs = '"\n      "'.join(
        ", ".join(f"%{i}" for i in range(j, min(j + 16, regs))) + (", " if j + 16 < regs else "")
        for j in range(0, regs, 16)
    )
    da, db, sc = regs, regs + 1, regs + 2
    cons = ",\n        ".join(
        ", ".join(f'"+f"(d[{i}])' for i in range(j, min(j + 8, regs))) for j in range(0, regs, 8)
    )
    return f"""template <>
__device__ __forceinline__ void Wgmma<{ctype}>::ss_n{n}{"_tb" if tnsp_b else ""}(float (&d)[{regs}], uint64_t desc_a,
                                                       uint64_t desc_b, int scale_d) {{
  asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sc}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{"
      "{outs}}}, "
      "%{da}, %{db}, p, 1, 1, 0, {tnsp_b};\\n}}\\n"
      : {cons}
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}}
"""


def wrapper_rs(n: int, tnsp_b: int, ctype: str, ptx: str) -> str:
    """A from registers (4 x 32-bit fragment registers a thread), B from shared memory."""
    regs = n // 2
    outs = '"\n      "'.join(
        ", ".join(f"%{i}" for i in range(j, min(j + 16, regs))) + (", " if j + 16 < regs else "")
        for j in range(0, regs, 16)
    )
    a = ", ".join(f"%{regs + i}" for i in range(4))
    db, sc = regs + 4, regs + 5
    cons = ",\n        ".join(
        ", ".join(f'"+f"(d[{i}])' for i in range(j, min(j + 8, regs))) for j in range(0, regs, 8)
    )
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
    print("// BEGIN GENERATED WGMMA (tools/gen_wgmma.py)")
    for ctype, ptx in TYPES.values():
        print(wrapper(32, 0, ctype, ptx))
        print(wrapper(64, 0, ctype, ptx))
        print(wrapper(256, 1, ctype, ptx))
        print(wrapper_rs(256, 1, ctype, ptx))
    print("// END GENERATED WGMMA")


if __name__ == "__main__":
    main()
