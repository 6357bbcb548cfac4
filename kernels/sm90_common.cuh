// sm_90 building blocks shared by the tree-verify kernels (kernels/mla_tree_sm90.cu,
// kernels/gqa_tree_sm90.cu): cp.async / ldmatrix / mma.sync / wgmma / named-barrier / mbarrier /
// TMA wrappers, the 128-byte swizzle and wgmma descriptors, the split's tile sequence and key
// slots over a paged cache, the online-softmax steps on wgmma accumulator fragments, and the
// merge of split partials (in stream order, or as a programmatic dependent of the split kernel).
#pragma once

#include <cuda.h>  // CUtensorMap (the driver entry point is fetched at run time: no -lcuda)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>  // getenv, atoi (the merge's measurement knobs)

#include <type_traits>

namespace kdtree_sm90 {

// ------------------------------------------------------------------ small PTX wrappers

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename E>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  // d += a (16x16, row) * b (16x8, col); fp32 accumulate.
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  }
  static __device__ __forceinline__ float2 unpack2(uint32_t u) {  // pack's inverse
    __nv_bfloat162 v;
    *reinterpret_cast<uint32_t*>(&v) = u;
    return __bfloat1622float2(v);
  }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void store2(__half* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
  }
  static __device__ __forceinline__ float2 unpack2(uint32_t u) {
    __half2 v;
    *reinterpret_cast<uint32_t*>(&v) = u;
    return __half22float2(v);
  }
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Low `n` bits set (n clamped to [0, 32]).
__device__ __forceinline__ uint32_t low_bits(int n) {
  return n >= 32 ? 0xffffffffu : (n <= 0 ? 0u : ((1u << n) - 1u));
}

// ------------------------------------------------------------------ tile geometry

// Which keys tile `tile` of this CTA covers. Tiles [0, n_pre) are prefix tiles starting at
// `start`; tiles [n_pre, n_pre + n_tree) are tree tiles (key j at logical position L + j).
struct TileSeq {
  int L, start, end, n_pre, n_tiles, T;
};

// Physical slot of key `row` (0..TILE_N-1) of tile `tile` (tiles of TILE_N keys: BLOCK_N in the
// MLA mma kernel, wg::BN in the MLA wgmma ones, BN in the GQA kernel), or -1 when the key is not a real key (beyond the
// split's end / beyond T / beyond the page table): such rows are zero-filled.
template <int TILE_N, class P>
__device__ __forceinline__ int64_t key_slot(const P& p, const int32_t* pt_row,
                                            const TileSeq& ts, int tile, int row) {
  if (tile >= ts.n_tiles) return -1;
  int pos;
  bool valid;
  if (tile < ts.n_pre) {
    pos = ts.start + tile * TILE_N + row;
    valid = pos < ts.end;
  } else {
    const int j = (tile - ts.n_pre) * TILE_N + row;
    pos = ts.L + j;
    valid = j < ts.T;
  }
  const int page_idx = pos >> p.page_shift;
  if (!valid || page_idx >= p.max_pages) return -1;
  const int64_t page = static_cast<int64_t>(__ldg(pt_row + page_idx));
  return (page << p.page_shift) + (pos & ((1 << p.page_shift) - 1));
}


// Which keys split `split` of request b covers (kernels whose Params have num_splits, T and
// prefix_lens): BN-key prefix tiles from `start` (chunks a multiple of BN), then, on the last
// split, the tree tiles. TREE_BALANCED (the GQA kernel): the chunk is the S-th of the prefix and
// tree tiles, so the last split takes fewer prefix tiles (session 17's CTA timeline: 32q/8kv,
// T=65's last split, two tree tiles more, left 4 us after the others; balanced, 0.6-4 % faster
// from 128k down to 16k). No split streams more tiles than with the prefix's S-th alone (the
// most loaded split then streams at least the S-th of all). (Counting a tree tile twice moved
// 8q/1kv, T=65, 16k to 7-tile splits and cost it 0.4 us: call d.)
template <int BN, class P, bool TREE_BALANCED = false>
__device__ __forceinline__ TileSeq split_tiles(const P& p, int split, int b) {
  TileSeq ts;
  const int S = p.num_splits;
  ts.T = p.T;
  ts.L = max(__ldg(p.prefix_lens + b), 0);
  const int per = TREE_BALANCED ? ((ts.L + BN - 1) / BN + (ts.T + BN - 1) / BN) * BN : ts.L;
  const int chunk = ((per + S - 1) / S + BN - 1) / BN * BN;
  ts.start = min(split * chunk, ts.L);
  ts.end = min(ts.start + chunk, ts.L);
  ts.n_pre = (ts.end - ts.start + BN - 1) / BN;
  ts.n_tiles = ts.n_pre + (split == S - 1 ? (ts.T + BN - 1) / BN : 0);
  return ts;
}
// ------------------------------------------------------------------ wgmma

// Byte offset of 16-byte chunk `c` (0..7) of row `r` inside a 128B-swizzled region.
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX ISA "matrix descriptor"):
// start address, leading and stride byte offsets, all in 16-byte units.
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes (st.shared, cp.async) -> visible to wgmma's async proxy.
__device__ __forceinline__ void fence_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pin accumulator registers at this point (the compiler must not move their uses across a
// wgmma wait, which has no register operands).
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for A-fragment registers: pinned before a wgmma.fence, they are defined before the
// batch starts (ptxas serialises wgmma whose inputs are written inside a batch, C7513).
template <int N>
__device__ __forceinline__ void pin(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

template <typename E>
struct Wgmma {
  // d (64 x 8) = / += A (64 x 16, K-major smem) * B (8 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n8(float (&d)[4], uint64_t desc_a, uint64_t desc_b,
                                               int scale_d);
  // d (64 x 8) = / += A (64 x 16, MN-major smem) * B (8 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n8_ta(float (&d)[4], uint64_t desc_a, uint64_t desc_b,
                                                  int scale_d);
  // d (64 x 16) = / += A (64 x 16, K-major smem) * B (16 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n16(float (&d)[8], uint64_t desc_a, uint64_t desc_b,
                                                int scale_d);
  // d (64 x 16) = / += A (64 x 16, MN-major smem) * B (16 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n16_ta(float (&d)[8], uint64_t desc_a,
                                                   uint64_t desc_b, int scale_d);
  // d (64 x 32) = / += A (64 x 16, K-major smem) * B (32 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n32(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                int scale_d);
  // d (64 x 64) = / += A (64 x 16, K-major smem) * B (64 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                int scale_d);
  // d (64 x 128) = / += A (64 x 16, K-major smem) * B (128 x 16, K-major smem)^T
  static __device__ __forceinline__ void ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d);
  // d (64 x 128) = / += A (64 x 16, registers) * B (16 x 128, MN-major smem)
  static __device__ __forceinline__ void rs_n128_tb(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d);
  // d (64 x 256) = / += A (64 x 16, K-major smem) * B (16 x 256, MN-major smem)
  static __device__ __forceinline__ void ss_n256_tb(float (&d)[128], uint64_t desc_a,
                                                    uint64_t desc_b, int scale_d);
  // d (64 x 256) = / += A (64 x 16, registers: the mma.m16n8k16 A fragment of this warp's 16
  // rows) * B (16 x 256, MN-major smem)
  static __device__ __forceinline__ void rs_n256_tb(float (&d)[128], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d);
};

// BEGIN GENERATED WGMMA (tools/gen_wgmma.py)
#define KDTREE_WGMMA_D128_REGS \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define KDTREE_WGMMA_D128_CONS \
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define KDTREE_WGMMA_WRAPPERS(CTYPE, PTX) \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n8(float (&d)[4], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n8k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3}, " \
      "%4, %5, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n8_ta(float (&d)[4], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n8k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3}, " \
      "%4, %5, p, 1, 1, 1, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n16(float (&d)[8], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7}, " \
      "%8, %9, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n16_ta(float (&d)[8], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7}, " \
      "%8, %9, p, 1, 1, 1, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n32(float (&d)[16], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
      "%16, %17, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n64(float (&d)[32], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
      "%32, %33, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n128(float (&d)[64], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
      "%64, %65, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::rs_n128_tb(float (&d)[64], const uint32_t (&a)[4], \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::ss_n256_tb(float (&d)[128], uint64_t desc_a, \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX "." PTX " {" \
      KDTREE_WGMMA_D128_REGS "}, " \
      "%128, %129, p, 1, 1, 0, 1;\n}\n" \
      : KDTREE_WGMMA_D128_CONS \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
 \
template <> \
__device__ __forceinline__ void Wgmma<CTYPE>::rs_n256_tb(float (&d)[128], const uint32_t (&a)[4], \
                                                       uint64_t desc_b, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX "." PTX " {" \
      KDTREE_WGMMA_D128_REGS "}, " \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
      : KDTREE_WGMMA_D128_CONS \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)); \
}

KDTREE_WGMMA_WRAPPERS(__nv_bfloat16, "bf16")
KDTREE_WGMMA_WRAPPERS(__half, "f16")
#undef KDTREE_WGMMA_WRAPPERS
#undef KDTREE_WGMMA_D128_REGS
#undef KDTREE_WGMMA_D128_CONS
// END GENERATED WGMMA

// Named barriers of the warp-specialised kernel. The non-.aligned forms: the producer and
// warpgroup 0 meet at FULL / EMPTY from different code (bar.sync is barrier.sync.aligned, which
// PTX defines only when every participating thread executes the same instruction).
__device__ __forceinline__ void named_sync(int id, int n) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// mbarrier and TMA (cp.async.bulk.tensor) wrappers of the seesaw producer.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Phase clocks of one thread (KDTREE_MLA_CLOCKS=1 / KDTREE_GQA_CLOCKS=1): 32-bit clock() and
// sums (a CTA's phase sums stay far below 2^32 cycles; unsigned differences are right across a
// wrap), half the registers of 64-bit ones; flushed into a kernel's global clock row once a CTA:
// [0..7] cycles by phase, [8] tiles, [9] CTAs.
struct PhaseClocks {
  bool on;
  unsigned t;
  unsigned ck[8];
  __device__ __forceinline__ explicit PhaseClocks(bool enabled) : on(enabled), t(0u) {
#pragma unroll
    for (int i = 0; i < 8; ++i) ck[i] = 0u;
    if (on) t = clock();
  }
  __device__ __forceinline__ void stamp(int i) {
    if (on) {
      const unsigned now = clock();
      ck[i] += now - t;
      t = now;
    }
  }
  __device__ __forceinline__ void flush(unsigned long long* row, int tiles) const {
    if (!on) return;
#pragma unroll
    for (int i = 0; i < 8; ++i) atomicAdd(row + i, static_cast<unsigned long long>(ck[i]));
    atomicAdd(row + 8, static_cast<unsigned long long>(tiles));
    atomicAdd(row + 9, 1ull);
  }
};

// A 16-bit tensor map of `rank` dims (dims[0] contiguous; strides in bytes for dims 1..),
// boxes `box`, 128-byte swizzle (the layout of the kernels' wgmma operands), for TMA.
// cuTensorMapEncodeTiled is a host-only driver call (capture-safe), fetched through the runtime
// so the libraries need no -lcuda. dtype 0: bf16, 1: fp16. Returns 0 or 1 (no driver entry
// point, or the driver rejected the map).
static inline int encode_swizzled_map(CUtensorMap* map, const void* base, int dtype, int rank,
                                      const cuuint64_t* dims, const cuuint64_t* strides,
                                      const cuuint32_t* box) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == nullptr)
      return 1;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint32_t estr[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(
      map, dtype == 0 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box, estr,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : 1;
}

// An L2 cache policy that evicts the lines it tags first (createpolicy: a 64-bit value made in a
// register, no memory access). The KV prefix (GQA) and the latent cache (MLA) are read once a
// call, so the kernels' TMA tile copies carry it and leave L2 to what a call reads again: the
// page table, Q, the partials the merge reads back. KDTREE_TMA_EVICT_NORMAL (a measurement build)
// issues them as before session 27. Session 27 (tools/gpu/stages_s27c.txt, stages_s27d.txt,
// alternating builds, time with the policy / without): GQA at batch 1 from 16k to 128k
// 0.92-1.01x (0.95-1.00x at T = 17 / 65), at 256k 0.99-1.00x at 32q/8kv and 1.02-1.03x at
// 8q/1kv; batch 8 0.93-1.00x, batch 32 (64k) 0.99-1.01x but 1.035x at 8q/1kv, T = 1. MLA at
// batch 1 0.96-0.98x, batch 8 0.96-0.99x but 1.00-1.02x at T = 65 from 64k.
// Half the lines evict-first (session 28, call b: a measurement build against this one and the
// old copies at the points where the policy had lost) was never faster: 1.00-1.05x this policy's
// time at 8q/1kv, batch 1 / 32, 64k / 256k; removed. (In that call this policy beat the old
// copies at 8q/1kv, 256k, 0.96-0.99x: session 27's 1.02-1.03x there was run-to-run spread.)
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint32_t bar) {
#ifdef KDTREE_TMA_EVICT_NORMAL
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#else
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
      "l"(l2_evict_first_policy())
      : "memory");
#endif
}

__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, int c4, uint32_t bar) {
#ifdef KDTREE_TMA_EVICT_NORMAL
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
#else
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar),
      "l"(l2_evict_first_policy())
      : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// ------------------------------------------------------------------ online softmax on wgmma fragments

// Masks the invisible keys of rows r0 (bits0) and r1 (bits1) to -inf; returns the quad-reduced
// raw row maxima of rows r0, r1. `s` is an m64nK accumulator of K = N / 2 keys: N / 4 8-key
// blocks of 4 values (rows r0, r0, r1, r1); bits: one word per 64 keys.
template <int N>
__device__ __forceinline__ float2 wg_mask_max(float (&s)[N], bool full,
                                              const uint64_t (&bits0)[N / 32],
                                              const uint64_t (&bits1)[N / 32], int q4) {
  constexpr int J = N / 4;
  if (!full) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * (j & 7) + 2 * q4 + e;
        if (!((bits0[j >> 3] >> col) & 1u)) s[4 * j + e] = neg_inf();
        if (!((bits1[j >> 3] >> col) & 1u)) s[4 * j + 2 + e] = neg_inf();
      }
    }
  }
  float a[J], c[J];  // pairwise trees: log2(J) dependent steps instead of 2 J
#pragma unroll
  for (int j = 0; j < J; ++j) {
    a[j] = fmaxf(s[4 * j + 0], s[4 * j + 1]);
    c[j] = fmaxf(s[4 * j + 2], s[4 * j + 3]);
  }
  // (constant trip counts in both loops, so the arrays stay in registers at every J)
#pragma unroll
  for (int w2 = J / 2; w2 >= 1; w2 >>= 1)
#pragma unroll
    for (int j = 0; j < J / 2; ++j) {
      if (j < w2) {
        a[j] = fmaxf(a[j], a[j + w2]);
        c[j] = fmaxf(c[j], c[j + w2]);
      }
    }
  float mx0 = a[0], mx1 = c[0];
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  return make_float2(mx0, mx1);
}
// The 64-key form with one mask word a row.
__device__ __forceinline__ float2 wg_mask_max(float (&s)[32], bool full, uint64_t bits0,
                                              uint64_t bits1, int q4) {
  const uint64_t w0[1] = {bits0}, w1[1] = {bits1};
  return wg_mask_max<32>(s, full, w0, w1, q4);
}

// A row max that may still be -inf (no visible key yet) as the exponent's offset: 0 then, so
// exp2(-inf - offset) = 0 instead of NaN.
__device__ __forceinline__ float wg_offset(float m) { return m == neg_inf() ? 0.f : m; }

// The running max after a tile whose (scaled) row max is `mt`, FlashAttention-4's lazy rescale
// (session 24): the offset m of a row moves only when a score rises more than
// KDTREE_RESCALE_SLACK (base 2) above it, so P = 2^(s - m) <= 2^SLACK (256 by default: bf16 and
// fp16 hold it to the same relative precision as any P <= 1; O and the row sums are fp32, and
// the LSE m + log2(l) is exact for any m). Once a row's max has settled, O's rescale (the
// consumers skip it when no row of the warp moved) then runs on almost no tile instead of on
// every tile where some row of the warp saw a new max. KDTREE_RESCALE_SLACK=0 (a measurement
// build) is the exact running max of the kernels before session 24.
#ifndef KDTREE_RESCALE_SLACK
#define KDTREE_RESCALE_SLACK 8
#endif
__device__ __forceinline__ float lazy_max(float m_run, float mt) {
  // (-inf + SLACK is -inf: a row's first visible tile always moves it; -inf > -inf is false)
  return mt > m_run + static_cast<float>(KDTREE_RESCALE_SLACK) ? mt : m_run;
}

// s := exp2(s * scale - off) per row (r0: off0, r1: off1), packed into the A fragments of the
// P V k-steps (N / 8 of 16 keys); returns this thread's partial row sums (its N / 4 keys of each
// row).
// KEEP: s is left as it was (the P values go to `pc` only, each pair packed as soon as it is
// computed), so a caller can still fall back to the exact path over the same scores (the GQA
// consumers' max-free path, session 24).
template <typename E, int N, bool KEEP = false>
__device__ __forceinline__ float2 wg_exp_pack(float (&s)[N], uint32_t (&pc)[N / 8][4], float scale,
                                              float off0, float off1) {
  constexpr int J = N / 4;
  // the row sums' partials: a pairwise tree over all J (KEEP: four running sums a row, so they
  // and the kept scores fit the registers beside P)
  constexpr int A = KEEP ? 4 : J;
  float a[A], c[A];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const float e0 = exp2f(fmaf(s[4 * j + 0], scale, -off0));
    const float e1 = exp2f(fmaf(s[4 * j + 1], scale, -off0));
    const float e2 = exp2f(fmaf(s[4 * j + 2], scale, -off1));
    const float e3 = exp2f(fmaf(s[4 * j + 3], scale, -off1));
    if (KEEP && j >= A) {
      a[j % A] += e0 + e1;
      c[j % A] += e2 + e3;
    } else {
      a[j % A] = e0 + e1;
      c[j % A] = e2 + e3;
    }
    if constexpr (KEEP) {
      // C fragments of n-blocks 2kk, 2kk + 1 are the A fragment of k-step kk (as below)
      pc[j / 2][2 * (j & 1)] = Mma<E>::pack(e0, e1);      // row r0
      pc[j / 2][2 * (j & 1) + 1] = Mma<E>::pack(e2, e3);  // row r1
    } else {
      s[4 * j + 0] = e0;
      s[4 * j + 1] = e1;
      s[4 * j + 2] = e2;
      s[4 * j + 3] = e3;
    }
  }
#pragma unroll
  for (int w2 = A / 2; w2 >= 1; w2 >>= 1)
#pragma unroll
    for (int j = 0; j < A / 2; ++j) {
      if (j < w2) {
        a[j] += a[j + w2];
        c[j] += c[j + w2];
      }
    }
  if constexpr (!KEEP) {
    // C fragments of n-blocks 2kk, 2kk + 1 are the A fragment of k-step kk
#pragma unroll
    for (int kk = 0; kk < N / 8; ++kk) {
      pc[kk][0] = Mma<E>::pack(s[8 * kk + 0], s[8 * kk + 1]);  // row r0, keys 16kk + 2q4
      pc[kk][1] = Mma<E>::pack(s[8 * kk + 2], s[8 * kk + 3]);  // row r1
      pc[kk][2] = Mma<E>::pack(s[8 * kk + 4], s[8 * kk + 5]);  // row r0, keys 16kk + 8 + 2q4
      pc[kk][3] = Mma<E>::pack(s[8 * kk + 6], s[8 * kk + 7]);  // row r1
    }
  }
  return make_float2(a[0], c[0]);
}

// ------------------------------------------------------------------ CTA timeline (measurement)
//
// A measurement build only (KDTREE_CUDA_DEFINES=KDTREE_TIMELINE; tools/gpu/gqa_timeline.py,
// kdtree.profiling.cta_timeline): every CTA of the split and merge kernels appends one record of
// TL_WORDS words to a device ring when its last warpgroup leaves, taken at the end so no stamp
// waits on a global atomic. Stamps are %globaltimer (ns, one clock for all SMs):
//   [0] kind (TL_SPLIT, TL_MERGE) | smid << 8 | tiles << 32   [1] blockIdx x | y << 24 | z << 44
//   [2] entry   [3] first KV tile landed (consumer warpgroup 0) / the merge's weights ready
//   (two-pass), partials summed (one-pass) or its entry (row a warp)
//   [4] producer's first tile issued   [5] warpgroup 0's last MMA retired
//   [6] the last warpgroup's exit   [7] clock64 cycles entry -> exit (thread 0's SM clock)
// The default build has none of it (the stamp macros are empty).
constexpr int TL_SPLIT = 0, TL_MERGE = 1, TL_WORDS = 8, TL_CAP = 1 << 16;
#ifdef KDTREE_TIMELINE
__device__ unsigned long long g_tl[TL_CAP][TL_WORDS];
__device__ unsigned int g_tl_count;
__device__ __forceinline__ unsigned long long tl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned int tl_smid() {
  unsigned int r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
// Append a record (words[0..7]); a full ring counts the record but drops it.
__device__ __forceinline__ void tl_append(const unsigned long long (&w)[TL_WORDS]) {
  const unsigned int i = atomicAdd(&g_tl_count, 1u);
  if (i >= TL_CAP) return;
#pragma unroll
  for (int k = 0; k < TL_WORDS; ++k) g_tl[i][k] = w[k];
}
__device__ __forceinline__ unsigned long long tl_block_id() {
  return static_cast<unsigned long long>(blockIdx.x) |
         static_cast<unsigned long long>(blockIdx.y) << 24 |
         static_cast<unsigned long long>(blockIdx.z) << 44;
}
#endif

// ------------------------------------------------------------------ programmatic dependent launch
//
// The split kernels execute griddep_launch_dependents() once their CTA has started: when every
// CTA of the grid has (so the last wave is resident), a dependent launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (the merge) is scheduled onto the SMs the
// split frees, instead of after the grid has drained and the launch has gone through the front
// end. (The GQA split kernel may instead let it be scheduled only at its CTAs' exit, where free
// SMs would crowd with the merge's CTAs: split_trigger_of in gqa_tree_sm90.cu, session 41.)
// griddep_wait() blocks until the preceding grid has completed and its writes are visible;
// without the attribute both are no-ops. The merges trigger too, at their start: the GQA split
// kernel of the next call (a programmatic dependent unless KDTREE_CUDA_SPLIT_PDL=0) then takes
// each SM a merge CTA leaves, and prefetches its prefix KV before it waits.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// ------------------------------------------------------------------ split merge
//
// part [B, Hkv, S, rows, D] normalised partials (P: fp32 from the MLA kernels, the input dtype
// from the GQA kernel) and fp32 lse [B, Hkv, S, rows] (base 2, -inf
// for a split without keys) -> out row r of KV head h of request b: token r / G, query head
// h * G + r % G, weighted by 2^(lse_s - max lse). Four kernels (launch_merge_splits picks):
// merge_splits_warp_kernel, a row a warp, where a row's entries fit a warp's registers (at most
// 16, D = 128: session 17 measured the row-a-CTA kernel at 7.6-9.3 us for 32q/8kv's 2080 rows
// of 16 entries, the row-a-warp one at 2.8-3.0); merge_splits_wide_kernel, a row a CTA of 128
// threads with 16-byte loads, for 16-bit partials of at most 72 entries on grids of at least
// three CTAs an SM (session 38); else a row a CTA of MERGE_THREADS threads, merge_splits_kernel
// (one pass, 16-bit partials: the GQA kernel's) or merge_splits_twopass_kernel (fp32 partials:
// the MLA kernels'). The MLA kernels are the Hkv = 1 case.
// A shared row block (the GQA kernel's `half_row`, session 16): rows half_row .. half_row + 63
// were computed by two warpgroups over alternate tiles, the second's partials in shadow rows
// rows .. rows + 63 of each split (the workspace's row stride is then ws_rows = rows + 64); those
// rows merge 2 S partials.
struct MergeParams {
  const void* part;  // P elements (merge kernels' P: float, or the GQA kernel's input dtype)
  const float* lse;
  void* out;
  int64_t so_b, so_t, so_h;  // out strides (elements)
  int Hkv, G, rows, num_splits;
  int ws_rows;   // the workspace's rows a split (rows, or rows + 64 with a shared block)
  int half_row;  // the shared block's first row, -1 none
};
constexpr int MERGE_THREADS = 256;
// Who merges the partials (the launchers' `merge` argument): the caller (the Triton merge),
// this kernel launched in stream order (the default), or this kernel as a programmatic
// dependent (measured no faster: session 12, calls b-d; mixed: session 23, call f).
constexpr int MERGE_BY_CALLER = 0, MERGE_PLAIN = 1, MERGE_PDL = 2;
constexpr int MERGE_MAX_SPLITS = 2048;  // the two-pass merge's weights array (8 KB)

// Every merge kernel's start: wait for the split kernel's partials, then let the next call's
// split kernel start on the SMs this grid frees; the timeline build also stamps the entry
// (tl_entry, tl_clock).
#ifdef KDTREE_TIMELINE
#define KDTREE_MERGE_ENTRY()                    \
  griddep_wait();                               \
  griddep_launch_dependents();                  \
  const unsigned long long tl_entry = tl_now(); \
  const long long tl_clock = clock64()
#else
#define KDTREE_MERGE_ENTRY() \
  griddep_wait();            \
  griddep_launch_dependents()
#endif

template <int N>
__device__ __forceinline__ float block_reduce(float v, float* scratch, bool is_max) {
  // every thread gets the reduction of v over the block (N threads, N / 32 warps)
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = scratch[0];
#pragma unroll
  for (int w = 1; w < N / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

// The entries of one output row: split s's partial is entry s; a row of the shared block also
// has split s's shadow row, entry S + s.
struct MergeRow {
  int64_t own, shadow, stride;  // workspace rows: own + s * stride, shadow + s * stride
  int S, NE;
  __device__ __forceinline__ MergeRow(const MergeParams& p, int hb, int row) {
    S = p.num_splits;
    stride = p.ws_rows;
    own = static_cast<int64_t>(hb) * S * stride + row;
    shadow = own - row + p.rows + row - p.half_row;
    NE = p.half_row >= 0 && row >= p.half_row && row < p.half_row + 64 ? 2 * S : S;
  }
  __device__ __forceinline__ int64_t at(int e) const {
    return e < S ? own + e * stride : shadow + (e - S) * stride;
  }
};

template <typename E>
__device__ __forceinline__ void merge_store(const MergeParams& p, int hb, int row, int c,
                                            float4 acc, float sum) {
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const int b = hb / p.Hkv, kvh = hb % p.Hkv;
  E* dst = static_cast<E*>(p.out) + b * p.so_b + (row / p.G) * p.so_t +
           (static_cast<int64_t>(kvh) * p.G + row % p.G) * p.so_h + 4 * c;
  Mma<E>::store2(dst, acc.x * inv, acc.y * inv);
  Mma<E>::store2(dst + 2, acc.z * inv, acc.w * inv);
}

// An online merge's state scaled by s (a new running max).
__device__ __forceinline__ void merge_rescale(float4& acc, float& sum, float s) {
  acc.x *= s;
  acc.y *= s;
  acc.z *= s;
  acc.w *= s;
  sum *= s;
}

__device__ __forceinline__ void merge_fma(float4& acc, float w, const float4& v) {
  const bool use = w > 0.f;  // an empty split's partial is never read into the sum
  acc.x += use ? w * v.x : 0.f;
  acc.y += use ? w * v.y : 0.f;
  acc.z += use ? w * v.z : 0.f;
  acc.w += use ? w * v.w : 0.f;
}

#ifdef KDTREE_TIMELINE
__device__ __forceinline__ void merge_record(unsigned long long entry, unsigned long long ready,
                                             long long clock0, int ne) {
  const unsigned long long w[TL_WORDS] = {
      TL_MERGE | tl_smid() << 8 | static_cast<unsigned long long>(ne) << 32,
      tl_block_id(), entry, ready, 0ull, 0ull, tl_now(),
      static_cast<unsigned long long>(clock64() - clock0)};
  tl_append(w);
}
#endif

// Four consecutive partial elements (element offset i, a multiple of 4), read through L2 as
// they are stored (`Raw`: fp32 partials, the MLA kernels; or 16-bit ones in the input dtype, the
// GQA kernel since session 22) and made fp32 by to4 -- apart, so a merge issues every load
// before it converts any (a conversion right after its load serialised the row-a-warp merge's
// loads: session 22, call d).
template <typename P>
struct PartLoad {  // 16-bit partials: four in 8 bytes
  using Raw = uint2;
  static __device__ __forceinline__ Raw load(const void* part, int64_t i) {
    return __ldcg(reinterpret_cast<const uint2*>(static_cast<const P*>(part) + i));
  }
  // The load under a predicate, without a branch (zeros when `on` is false): a branch around a
  // load let the compiler put the conversion inside it, right after the load. (Volatile: the
  // compiler neither sinks it past a branch nor next to its use, so a batch goes out at once.)
  static __device__ __forceinline__ Raw load_if(const void* part, int64_t i, bool on) {
    uint2 u = make_uint2(0u, 0u);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n"
        " @p ld.global.cg.v2.u32 {%0, %1}, [%2];\n}\n"
        : "+r"(u.x), "+r"(u.y)
        : "l"(static_cast<const P*>(part) + i), "r"(static_cast<int>(on)));
    return u;
  }
  static __device__ __forceinline__ float4 to4(Raw u) {
    const float2 a = Mma<P>::unpack2(u.x), b = Mma<P>::unpack2(u.y);
    return make_float4(a.x, a.y, b.x, b.y);
  }
};
template <>
struct PartLoad<float> {
  using Raw = float4;
  static __device__ __forceinline__ Raw load(const void* part, int64_t i) {
    return __ldcg(reinterpret_cast<const float4*>(static_cast<const float*>(part) + i));
  }
  static __device__ __forceinline__ Raw load_if(const void* part, int64_t i, bool on) {
    return on ? load(part, i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  static __device__ __forceinline__ float4 to4(Raw v) { return v; }
};

// An LSE load as PartLoad::load_if (-inf when `on` is false).
__device__ __forceinline__ float load_lse_if(const float* lse, int64_t i, bool on) {
  float l = neg_inf();
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p ld.global.cg.f32 %0, [%1];\n}\n"
      : "+f"(l)
      : "l"(lse + i), "r"(static_cast<int>(on)));
  return l;
}

// The two-pass row-a-CTA merge, for fp32 partials (the MLA kernels'; session 23, call c: the
// one-pass merge below was up to 2.8 % slower at MLA's h=8 points, whose 512 columns leave two
// groups of 128 threads, 15-22 entries a thread): the weights 2^(lse_s - max lse) go to shared memory, thread
// (g, c) sums float4 column c over splits s = g (mod GROUPS) -- GROUPS independent loads in
// flight a column -- and the groups are added in shared memory. (Session 17, call b: loading
// the first partials before the weights, in batches of 6, was 0.4-0.7 us slower at 43-129
// splits; this is the measured form. Its sum written through merge_fma compiles to different
// SASS, untested, so it stays spelled out here; through merge_store its SASS is the same.)
template <typename E, int D, typename P>
__global__ void __launch_bounds__(MERGE_THREADS) merge_splits_twopass_kernel(const MergeParams p) {
  static_assert(D % 4 == 0 && MERGE_THREADS % (D / 4) == 0, "float4 columns tile the block");
  constexpr int COLS = D / 4;
  constexpr int GROUPS = MERGE_THREADS / COLS;
  __shared__ float w_s[MERGE_MAX_SPLITS];
  __shared__ float scratch[MERGE_THREADS / 32];
  __shared__ float4 red[GROUPS > 1 ? GROUPS - 1 : 1][COLS];
  KDTREE_MERGE_ENTRY();
  const int tid = threadIdx.x;
#ifdef KDTREE_TIMELINE
  unsigned long long tl_ready = 0;
#endif
  const int row = blockIdx.x;
  const int hb = blockIdx.y;  // b * Hkv + kvh
  const int S = p.num_splits;
  // split s's partial of this row is entry s; a shared block's row also has split s's shadow
  // row, entry S + s. The shadow entries get loops of their own, so a row without them (all
  // but <= 64 rows of a shared-block launch) indexes as before the shadow rows (session 16).
  const bool shared = p.half_row >= 0 && row >= p.half_row && row < p.half_row + 64;
  const int64_t stride = p.ws_rows;  // a split's rows
  const int64_t own = static_cast<int64_t>(hb) * S * stride + row;  // + s * stride
  const int64_t shadow = own - row + p.rows + row - p.half_row;     // (shared rows only)
  float mx = neg_inf();
  for (int s = tid; s < S; s += MERGE_THREADS) {
    const float l = p.lse[own + s * stride];
    w_s[s] = l;
    mx = fmaxf(mx, l);
  }
  if (shared)
    for (int s = tid; s < S; s += MERGE_THREADS) {
      const float l = p.lse[shadow + s * stride];
      w_s[S + s] = l;
      mx = fmaxf(mx, l);
    }
  mx = block_reduce<MERGE_THREADS>(mx, scratch, true);
  const float muse = mx == neg_inf() ? 0.f : mx;
  const int NE = shared ? 2 * S : S;
  float sum = 0.f;
  for (int e = tid; e < NE; e += MERGE_THREADS) {
    const float w = exp2f(w_s[e] - muse);  // 0 for a split without keys
    w_s[e] = w;
    sum += w;
  }
  sum = block_reduce<MERGE_THREADS>(sum, scratch, false);  // its barrier publishes w_s
#ifdef KDTREE_TIMELINE
  if (tid == 0) tl_ready = tl_now();
#endif
  const int c = tid % COLS, g = tid / COLS;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const auto add = [&](int64_t src, const float* w_of) {  // (src: an element offset)
#pragma unroll 4
    for (int s = g; s < S; s += GROUPS) {
      const float4 v = PartLoad<P>::to4(PartLoad<P>::load(p.part, src + s * stride * D));
      const float w = w_of[s];
      const bool use = w > 0.f;  // an empty split's partial is never read into the sum
      acc.x += use ? w * v.x : 0.f;
      acc.y += use ? w * v.y : 0.f;
      acc.z += use ? w * v.z : 0.f;
      acc.w += use ? w * v.w : 0.f;
    }
  };
  add(own * D + 4 * c, w_s);
  if (shared) add(shadow * D + 4 * c, w_s + S);
  if (g > 0) red[g - 1][c] = acc;
  __syncthreads();
  if (g != 0) return;
#pragma unroll
  for (int k = 0; k < GROUPS - 1; ++k) {
    const float4 v = red[k][c];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  merge_store<E>(p, hb, row, c, acc, sum);
#ifdef KDTREE_TIMELINE
  if (tid == 0) merge_record(tl_entry, tl_ready, tl_clock, NE);
#endif
}

// The one-pass row-a-CTA merge, for 16-bit partials (the GQA kernel's), in one round trip to L2
// for up to 8 entries a thread: thread (g, c) takes float4 column c of entries e = g (mod
// GROUPS), issuing a batch's LSE and partial loads (MERGE_BATCH entries, those past the last
// predicated off) before using any, and keeps an online max / sum / weighted sum over its
// entries; the GROUPS states are combined once, through shared memory. Four CTAs an SM (one wave
// at 520 rows). (Until session 23 the two-pass kernel above: two round trips and four block
// barriers. Session 23, call b: 16 entries a batch at two CTAs an SM was never faster, and
// 5.5-5.9 us slower where its 520 CTAs took two waves.)
constexpr int MERGE_BATCH = 8;
template <typename E, int D, typename P>
__global__ void __launch_bounds__(MERGE_THREADS, 4) merge_splits_kernel(const MergeParams p) {
  constexpr int BATCH = MERGE_BATCH;
  static_assert(D % 4 == 0 && MERGE_THREADS % (D / 4) == 0, "float4 columns tile the block");
  constexpr int COLS = D / 4;
  constexpr int GROUPS = MERGE_THREADS / COLS;
  __shared__ float4 red[GROUPS > 1 ? GROUPS - 1 : 1][COLS];
  __shared__ float2 red_ms[GROUPS];  // each group's (max, sum)
  KDTREE_MERGE_ENTRY();
  const int tid = threadIdx.x;
  const int row = blockIdx.x;
  const int hb = blockIdx.y;  // b * Hkv + kvh
  const MergeRow mr(p, hb, row);
  const int NE = mr.NE;
  const int c = tid % COLS, g = tid / COLS;
  // mx: the largest LSE so far (-inf: no split with keys yet); acc and sum are scaled by 2^-mx
  float mx = neg_inf(), sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int e0 = g; e0 < NE; e0 += BATCH * GROUPS) {
    typename PartLoad<P>::Raw v[BATCH];
    float l[BATCH];
#pragma unroll
    for (int k = 0; k < BATCH; ++k) {  // every load of the batch before any use
      const int e = e0 + k * GROUPS;
      const int64_t at = mr.at(min(e, NE - 1));  // (an address either way)
      l[k] = load_lse_if(p.lse, at, e < NE);  // -inf past the last entry
      v[k] = PartLoad<P>::load_if(p.part, at * D + 4 * c, e < NE);
    }
    float bm = mx;
#pragma unroll
    for (int k = 0; k < BATCH; ++k) bm = fmaxf(bm, l[k]);
    merge_rescale(acc, sum, mx == neg_inf() ? 0.f : exp2f(mx - bm));  // (-inf - -inf is NaN)
    mx = bm;
    if (bm == neg_inf()) bm = 0.f;  // no keys so far: every weight below is 0
#pragma unroll
    for (int k = 0; k < BATCH; ++k) {
      const float w = exp2f(l[k] - bm);  // 0 for a split without keys: never read into the sum
      merge_fma(acc, w, PartLoad<P>::to4(v[k]));
      sum += w;
    }
  }
  if (g > 0) red[g - 1][c] = acc;
  if (c == 0) red_ms[g] = make_float2(mx, sum);
  __syncthreads();
  if (g != 0) return;
  float m_all = mx;
#pragma unroll
  for (int k = 1; k < GROUPS; ++k) m_all = fmaxf(m_all, red_ms[k].x);
  if (m_all == neg_inf()) m_all = 0.f;  // no keys in any split: sum 0, out 0
  merge_rescale(acc, sum, exp2f(mx - m_all));
#pragma unroll
  for (int k = 1; k < GROUPS; ++k) {
    const float2 ms = red_ms[k];
    const float w = exp2f(ms.x - m_all);  // 0 for a group without keys
    merge_fma(acc, w, red[k - 1][c]);
    sum += w * ms.y;
  }
  merge_store<E>(p, hb, row, c, acc, sum);
#ifdef KDTREE_TIMELINE
  if (tid == 0) merge_record(tl_entry, tl_now(), tl_clock, NE);
#endif
}


// A row a warp (at most MERGE_WARP_ENTRIES entries, 128 columns: lane c holds float4 column c):
// every partial is loaded before the weights, the weights and their sum are warp shuffles, so
// a row costs one round trip to L2 and no block barrier. MERGE_THREADS / 32 rows a CTA.
constexpr int MERGE_WARP_ENTRIES = 16;
template <typename E, typename P>
__global__ void __launch_bounds__(MERGE_THREADS) merge_splits_warp_kernel(const MergeParams p) {
  KDTREE_MERGE_ENTRY();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (MERGE_THREADS / 32) + (threadIdx.x >> 5);
  const int hb = blockIdx.y;
  if (row < p.rows) {
    const MergeRow mr(p, hb, row);
    const int NE = mr.NE;
    typename PartLoad<P>::Raw v[MERGE_WARP_ENTRIES];  // (every load before any conversion)
#pragma unroll
    for (int e = 0; e < MERGE_WARP_ENTRIES; ++e)
      v[e] = PartLoad<P>::load_if(p.part, mr.at(e) * 128 + 4 * lane, e < NE);
    const float l = lane < NE ? p.lse[mr.at(lane)] : neg_inf();
    float mx = l;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float muse = mx == neg_inf() ? 0.f : mx;
    const float w = lane < NE ? exp2f(l - muse) : 0.f;  // 0 for a split without keys
    float sum = w;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int e = 0; e < MERGE_WARP_ENTRIES; ++e) {
      const float we = __shfl_sync(0xffffffffu, w, e);
      if (e < NE) merge_fma(acc, we, PartLoad<P>::to4(v[e]));
    }
    merge_store<E>(p, hb, row, lane, acc, sum);
  }
#ifdef KDTREE_TIMELINE
  __syncthreads();
  if (threadIdx.x == 0) merge_record(tl_entry, tl_entry, tl_clock, p.num_splits);
#endif
}

// One group's state over a row's entries e = g + k * groups (k < K) of 16-bit partials, the
// eight columns at `chunk` (the partial's element offset of the thread's 16 bytes) of each:
// every LSE and 16-byte partial load issued before any is used; mx the largest LSE (-inf: no
// entry with keys), acc and sum weighted by 2^(lse - mx). The wide and the column-sliced merge's
// first step.
template <typename P, int K>
__device__ __forceinline__ void merge_group16(const MergeParams& p, const MergeRow& mr,
                                              const P* chunk, int g, int groups, float& mx,
                                              float& sum, float (&acc)[8]) {
  const int NE = mr.NE;
  uint4 v[K];
  float l[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {  // every load before any use
    const int e = g + k * groups;
    const int64_t at = mr.at(min(e, NE - 1));  // (an address either way)
    l[k] = load_lse_if(p.lse, at, e < NE);     // -inf past the last entry
    v[k] = make_uint4(0u, 0u, 0u, 0u);
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n"
        " @p ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "+r"(v[k].x), "+r"(v[k].y), "+r"(v[k].z), "+r"(v[k].w)
        : "l"(chunk + at * 128), "r"(static_cast<int>(e < NE)));
  }
  mx = neg_inf();
#pragma unroll
  for (int k = 0; k < K; ++k) mx = fmaxf(mx, l[k]);
  const float muse = mx == neg_inf() ? 0.f : mx;  // no keys in this group: every weight is 0
  sum = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float w = exp2f(l[k] - muse);  // 0 for a split without keys: never read into the sum
    const uint32_t u[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = Mma<P>::unpack2(u[j]);
      acc[2 * j] += w > 0.f ? w * f.x : 0.f;
      acc[2 * j + 1] += w > 0.f ? w * f.y : 0.f;
    }
    sum += w;
  }
}

// The one-pass row-a-CTA merge with 16-byte loads, for 16-bit partials of 128 columns whose
// entries fit one batch (at most MERGE_WIDE_ENTRIES): thread (g, c) of 128 takes columns 8c ..
// 8c + 7 of entries e = g (mod 8), every LSE and partial load of the row issued before any is
// used, then the eight groups' states are added through shared memory. Session 38 (a standalone
// probe, tools/gpu/atomic_merge_probe.cu): on L2-resident partials of 528 rows x 33 entries it
// took 3.30 us a call where merge_splits_kernel took 4.18 (an empty kernel of the grid 0.86);
// where the rows are few (136 rows x 129 entries) it lost (4.80 against 4.21: 128 threads a CTA
// leave an SM too few loads in flight), so the launcher takes it only for grids of at least three
// CTAs an SM (8q/1kv, T=65: 520 rows, the shared rows' 66 entries within the batch's 72).
constexpr int MERGE_WIDE_THREADS = 128, MERGE_WIDE_ENTRIES = 72;  // (9 a thread)
constexpr int MERGE_WIDE_PDL_SMEM = 42 * 1024;  // (+ its 4.6 KB static: <= 48 KB, > a fifth of the SM)
template <typename E, typename P>
__global__ void __launch_bounds__(MERGE_WIDE_THREADS) merge_splits_wide_kernel(const MergeParams p) {
  static_assert(sizeof(P) == 2, "16-bit partials");
  constexpr int COLS = 128 / 8, GROUPS = MERGE_WIDE_THREADS / COLS;
  constexpr int BATCH = MERGE_WIDE_ENTRIES / GROUPS;
  __shared__ float red[GROUPS][COLS][9];  // eight sums a thread (+1: spreads the banks)
  __shared__ float2 red_ms[GROUPS];       // each group's (max, sum)
  KDTREE_MERGE_ENTRY();
  const int tid = threadIdx.x, row = blockIdx.x, hb = blockIdx.y;
  const int c = tid % COLS, g = tid / COLS;
  const MergeRow mr(p, hb, row);
  float mx, sum, acc[8];
  merge_group16<P, BATCH>(p, mr, static_cast<const P*>(p.part) + 8 * c, g, GROUPS, mx, sum, acc);
#pragma unroll
  for (int j = 0; j < 8; ++j) red[g][c][j] = acc[j];
  if (c == 0) red_ms[g] = make_float2(mx, sum);
  __syncthreads();
  if (g == 0) {
    float m_all = neg_inf();
#pragma unroll
    for (int k = 0; k < GROUPS; ++k) m_all = fmaxf(m_all, red_ms[k].x);
    if (m_all == neg_inf()) m_all = 0.f;  // no keys in any split: sum 0, out 0
    float out[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, total = 0.f;
#pragma unroll
    for (int k = 0; k < GROUPS; ++k) {
      const float w = exp2f(red_ms[k].x - m_all);  // 0 for a group without keys
      total += w * red_ms[k].y;
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] += w * red[k][c][j];
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const int b = hb / p.Hkv, kvh = hb % p.Hkv;
    E* dst = static_cast<E*>(p.out) + b * p.so_b + (row / p.G) * p.so_t +
             (static_cast<int64_t>(kvh) * p.G + row % p.G) * p.so_h + 8 * c;
#pragma unroll
    for (int j = 0; j < 4; ++j) Mma<E>::store2(dst + 2 * j, out[2 * j] * inv, out[2 * j + 1] * inv);
  }
#ifdef KDTREE_TIMELINE
  if (tid == 0) merge_record(tl_entry, tl_now(), tl_clock, mr.NE);
#endif
}

// A row's merge over CS CTAs, each taking 128 / CS of its columns (16-bit partials, 128
// columns): CTA (row, slice) of 128 threads, thread (g, c) the 16-byte chunk c of the slice
// (CHUNKS = 16 / CS a slice) of entries e = g (mod 8 CS), at most K a thread, every LSE and
// partial load issued before any is used; each group keeps (max, sum, weighted sum) over its
// entries, and after one barrier thread (j, q) adds a column pair over the groups q (mod 2 CS),
// the 2 CS parts by shuffles. For merges of few rows, whose row CTAs leave most SMs idle
// (merge_cols_of: session 39 in stream order, session 40 as a programmatic dependent).
template <typename E, typename P, int CS, int K>
__global__ void __launch_bounds__(128) merge_splits_cols_kernel(const MergeParams p) {
  static_assert(sizeof(P) == 2 && CS >= 1 && CS <= 16 && 16 % CS == 0, "16-bit, CS | 16");
  constexpr int CHUNKS = 16 / CS, GROUPS = 128 / CHUNKS, COLS = 128 / CS;
  __shared__ float red[GROUPS][CHUNKS][9];  // eight sums a thread (+1: spreads the banks)
  __shared__ float2 red_ms[GROUPS];         // each group's (max, sum)
  KDTREE_MERGE_ENTRY();
  const int tid = threadIdx.x, row = blockIdx.x / CS, slice = blockIdx.x % CS, hb = blockIdx.y;
  const int c = tid % CHUNKS, g = tid / CHUNKS;
  const MergeRow mr(p, hb, row);
  float mx, sum, acc[8];
  const P* chunk = static_cast<const P*>(p.part) + slice * COLS + 8 * c;
  merge_group16<P, K>(p, mr, chunk, g, GROUPS, mx, sum, acc);
#pragma unroll
  for (int j = 0; j < 8; ++j) red[g][c][j] = acc[j];
  if (c == 0) red_ms[g] = make_float2(mx, sum);
  __syncthreads();
  // thread (j, q): columns 2j, 2j + 1 of the slice over groups q, q + PARTS, ... (4 of them);
  // the PARTS lanes of a column pair are adjacent, added by shuffles
  constexpr int PARTS = 2 * CS;
  const int j = 2 * (tid / PARTS), q = tid % PARTS;
  float m_all = neg_inf();
#pragma unroll
  for (int i = 0; i < GROUPS / PARTS; ++i) m_all = fmaxf(m_all, red_ms[q + i * PARTS].x);
#pragma unroll
  for (int o = 1; o < PARTS; o <<= 1) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, o));
  if (m_all == neg_inf()) m_all = 0.f;  // no keys in any split: sum 0, out 0
  float o0 = 0.f, o1 = 0.f, total = 0.f;
#pragma unroll
  for (int i = 0; i < GROUPS / PARTS; ++i) {
    const int gg = q + i * PARTS;
    const float2 ms = red_ms[gg];
    const float w = exp2f(ms.x - m_all);  // 0 for a group without keys
    total += w * ms.y;
    o0 += w * red[gg][j / 8][j % 8];
    o1 += w * red[gg][j / 8][j % 8 + 1];
  }
#pragma unroll
  for (int o = 1; o < PARTS; o <<= 1) {
    o0 += __shfl_xor_sync(0xffffffffu, o0, o);
    o1 += __shfl_xor_sync(0xffffffffu, o1, o);
    total += __shfl_xor_sync(0xffffffffu, total, o);
  }
  if (q == 0) {
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const int b = hb / p.Hkv, kvh = hb % p.Hkv;
    E* dst = static_cast<E*>(p.out) + b * p.so_b + (row / p.G) * p.so_t +
             (static_cast<int64_t>(kvh) * p.G + row % p.G) * p.so_h + slice * COLS + j;
    Mma<E>::store2(dst, o0 * inv, o1 * inv);
  }
#ifdef KDTREE_TIMELINE
  if (tid == 0) merge_record(tl_entry, tl_now(), tl_clock, mr.NE);
#endif
}

// KDTREE_CUDA_MERGE_WIDE=0 keeps the rows the wide merge would take on merge_splits_kernel (a
// measurement knob: its A/B, session 38).
static inline bool merge_wide_allowed() {
  const char* env = getenv("KDTREE_CUDA_MERGE_WIDE");
  return env == nullptr || env[0] != '0';
}

// merge_splits_cols_kernel's entries a thread at cs CTAs a row (0: no such count), and the most
// entries a row it holds, 8 cs groups of them: up to 144 entries (8q/1kv, T=17's 129; T=1 / 9's
// 128) in one batch at every count (16 / 9, 32 / 5, 64 / 3, 128 / 2 groups / entries a thread).
constexpr int merge_cols_k(int cs) {
  return cs == 2 ? 9 : cs == 4 ? 5 : cs == 8 ? 3 : cs == 16 ? 2 : 0;
}
constexpr int merge_cols_entries(int cs) { return 8 * cs * merge_cols_k(cs); }
// (as a programmatic dependent, unused dynamic shared memory holds it to four CTAs an SM, as the
// wide merge: <= 7 KB static + 40 KB, under the 48 KB a launch takes without opting in)
constexpr int MERGE_COLS_PDL_SMEM = 40 * 1024;

// Launch merge_splits_cols_kernel with `cs` (2, 4, 8 or 16) CTAs a row; cudaErrorInvalidValue
// for another cs or more entries a row than it holds (merge_cols_entries).
template <typename E, typename P>
static inline int launch_merge_cols(const MergeParams& p, int B, cudaStream_t stream, bool pdl,
                                    int cs) {
  const int entries = (p.half_row >= 0 ? 2 : 1) * p.num_splits;
  if (entries > merge_cols_entries(cs)) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(p.rows * cs), static_cast<unsigned>(B * p.Hkv));
  const size_t smem = pdl ? MERGE_COLS_PDL_SMEM : 0;
  const auto run = [&](auto kernel) {
    return launch_kernel(kernel, grid, dim3(128), smem, stream, pdl, p);
  };
  switch (cs) {
    case 2: return run(merge_splits_cols_kernel<E, P, 2, merge_cols_k(2)>);
    case 4: return run(merge_splits_cols_kernel<E, P, 4, merge_cols_k(4)>);
    case 8: return run(merge_splits_cols_kernel<E, P, 8, merge_cols_k(8)>);
    case 16: return run(merge_splits_cols_kernel<E, P, 16, merge_cols_k(16)>);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

// How many CTAs share a row of the merge (merge_splits_cols_kernel; 0: none, merge_splits_kernel)
// for rows neither the row-a-warp nor the wide merge takes, on a device of `sms` SMs, launched
// as a programmatic dependent or not (`pdl`): where a row has more than 64 entries, 8 where the
// merge has at most 16 row CTAs (8q/1kv, T 1-2, batch 1 from 8k: 8-16 rows of 65-129 entries), 4
// as a dependent where it has at most `sms` (8q/1kv, T 3-16 at batch 1 from 8k: 24-128 rows; at
// most 528 CTAs, four an SM, in one residency wave), else none.
// Session 39, calls b-c (three rounds each against merge_splits_kernel, 8q/1kv, batch 1): T=1
// at 8 CTAs a row 0.90 / 0.96 / 0.97 / 0.99 / 0.985x at 16k / 32k / 64k / 128k / 256k (call c),
// but 1.02x at 4k's 32 entries (one batch of merge_splits_kernel); in stream order the sliced
// merge gained nothing where the rows are many (T=17's 136 rows of 129 entries: 0.98-1.02x at 2
// CTAs a row, 0.99-1.05 at 4; T=9's 72 rows 0.99-1.07x at 2-4, 1.02-1.24 at 8-16): the next
// call's split grid starts that much later after its extra CTAs (call d's timeline).
// Session 40, calls a-b (three alternating rounds in b against the default, stream-order
// merge_splits_kernel; data/bench/logs/pdl_merge_ab_session40.csv.gz): as a programmatic
// dependent, whose CTAs wait on the SMs the split grid frees, 4 CTAs a row took 0.92 / 0.95 /
// 0.93 / 0.96 / 0.99x at T=5, 0.94 / 0.94 / 0.96 / 0.98 / 1.00x at T=9 and 0.95 / 0.97 / 0.97 /
// 0.98 / 1.005x at T=13 (16k-256k); 2 a row gained at most 1.6 % anywhere and lost up to 7 %,
// 8 a row lost 3-17 % at T 9-17 (576-1088 CTAs, past one wave) and 10 % at T=5, 16k; T=17's
// 136 row CTAs at 2 a row 0.985-1.016x (not taken: `sms` bounds the rows). Call c, against
// stream order at 8k-256k: 1.019x at T=13, 8k (65 entries: half the SMs free), else 0.92-1.01x.
// KDTREE_CUDA_MERGE_COLS=0|2|4|8|16 forces the count (a measurement knob).
// kdtree.kernels.cuda_common.merge_cols mirrors it.
constexpr int MERGE_COLS_MAX_ROW_CTAS = 16, MERGE_COLS_DEFAULT = 8, MERGE_COLS_MIN_ENTRIES = 64;
constexpr int MERGE_COLS_PDL = 4;
static inline int merge_cols_of(int64_t row_ctas, int entries, bool pdl, int sms) {
  const char* env = getenv("KDTREE_CUDA_MERGE_COLS");
  if (env != nullptr && env[0] != '\0') return atoi(env);
  if (entries <= MERGE_COLS_MIN_ENTRIES) return 0;
  if (row_ctas <= MERGE_COLS_MAX_ROW_CTAS) return MERGE_COLS_DEFAULT;
  return pdl && row_ctas <= sms ? MERGE_COLS_PDL : 0;
}

// The merge of a split kernel's launch parameters `p` (fields part, lse, out, so_b / so_t / so_h,
// rows, num_splits), for Hkv KV heads of G packed query heads each.
template <class P>
static inline MergeParams merge_params_of(const P& p, int Hkv, int G) {
  MergeParams mp;
  mp.part = p.part;
  mp.lse = p.lse;
  mp.out = p.out;
  mp.so_b = p.so_b;
  mp.so_t = p.so_t;
  mp.so_h = p.so_h;
  mp.Hkv = Hkv;
  mp.G = G;
  mp.rows = p.rows;
  mp.num_splits = p.num_splits;
  mp.ws_rows = p.rows;
  mp.half_row = -1;
  return mp;
}

// KDTREE_CUDA_MERGE_WARP=0 keeps every row on a CTA of its own (a measurement knob: the
// per-warp merge's A/B, session 17).
static inline bool merge_by_warp_allowed() {
  const char* env = getenv("KDTREE_CUDA_MERGE_WARP");
  return env == nullptr || env[0] != '0';
}

// Whether the split kernels (GQA; the seesaw MLA kernel since session 28) launch as programmatic
// dependents of the kernel before them: unless KDTREE_CUDA_SPLIT_PDL=0 (read at every launch; a
// CUDA graph keeps what it captured). The launchers' comments give the caller's contract.
static inline bool split_pdl() {
  const char* env = getenv("KDTREE_CUDA_SPLIT_PDL");
  return env == nullptr || env[0] != '0';
}

// Launch `kernel` (grid, block, dynamic shared memory) on `stream`; `pdl`: as a programmatic
// dependent of the kernel before it (cudaLaunchAttributeProgrammaticStreamSerialization). 0 or a
// cudaError_t.
template <typename... K, typename... A>
static inline int launch_kernel(void (*kernel)(K...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, bool pdl, const A&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return static_cast<int>(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// Which merge kernel launch_merge_splits takes for `p` (B requests; `pdl`: as a programmatic
// dependent): a row a warp where its entries fit the warp's registers (D = 128: a float4 column a
// lane), the wide merge (16-bit partials of at most MERGE_WIDE_ENTRIES entries on grids of at
// least three CTAs an SM), a row over several CTAs (merge_cols_of; `cols` gets the count), else a
// row a CTA. The wide and the sliced merge hold four CTAs an SM as dependents (unused dynamic
// shared memory); a row a CTA or a warp is held by nothing but registers and threads.
enum MergeForm { MERGE_FORM_WARP, MERGE_FORM_WIDE, MERGE_FORM_COLS, MERGE_FORM_CTA };
template <int D, typename P>
static inline MergeForm merge_form_of(const MergeParams& p, int B, bool pdl, int* cols) {
  const int entries = (p.half_row >= 0 ? 2 : 1) * p.num_splits;
  *cols = 0;
  if (D == 128 && entries <= MERGE_WARP_ENTRIES && merge_by_warp_allowed()) return MERGE_FORM_WARP;
  if constexpr (D == 128 && sizeof(P) == 2) {  // 16-bit partials: the wide or the sliced merge
    int dev = 0, sms = 0;  // (0 where unknown: neither the wide nor the dependent sliced merge)
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      sms = 0;
    const int64_t row_ctas = static_cast<int64_t>(p.rows) * B * p.Hkv;
    if (entries <= MERGE_WIDE_ENTRIES && merge_wide_allowed() && sms > 0 &&
        row_ctas >= 3 * static_cast<int64_t>(sms))
      return MERGE_FORM_WIDE;
    const int cs = merge_cols_of(row_ctas, entries, pdl, sms);
    if (cs > 0 && entries <= merge_cols_entries(cs)) {
      *cols = cs;
      return MERGE_FORM_COLS;
    }
  }
  return MERGE_FORM_CTA;
}

// Launch the merge on `stream` (grid (rows / 8 rounded up or rows, B * Hkv)); `pdl`: as a
// programmatic dependent of the kernel before it (the split kernel, which lets it be scheduled
// at its CTAs' start, or at their exit: gqa_tree_sm90.cu's split_trigger_of). 0 or a
// cudaError_t.
template <typename E, int D, typename P = float>
static inline int launch_merge_splits(const MergeParams& p, int B, cudaStream_t stream, bool pdl) {
  const int entries = (p.half_row >= 0 ? 2 : 1) * p.num_splits;
  if (entries > MERGE_MAX_SPLITS) return static_cast<int>(cudaErrorInvalidValue);
  int cs = 0;
  const MergeForm form = merge_form_of<D, P>(p, B, pdl, &cs);
  if constexpr (D == 128 && sizeof(P) == 2) {
    if (form == MERGE_FORM_WIDE)
      // (as a programmatic dependent, 42 KB of unused dynamic shared memory hold it to four
      // CTAs an SM, as merge_splits_kernel: its CTAs land on the SMs the split grid frees first,
      // and 16 to an SM crowded a few SMs while the others idled -- call f, session 38)
      return launch_kernel(merge_splits_wide_kernel<E, P>,
                           dim3(static_cast<unsigned>(p.rows), static_cast<unsigned>(B * p.Hkv)),
                           dim3(MERGE_WIDE_THREADS), pdl ? MERGE_WIDE_PDL_SMEM : 0, stream, pdl, p);
    if (form == MERGE_FORM_COLS) return launch_merge_cols<E, P>(p, B, stream, pdl, cs);
  }
  const bool by_warp = form == MERGE_FORM_WARP;
  constexpr int ROWS_A_CTA = MERGE_THREADS / 32;
  const dim3 grid(static_cast<unsigned>(by_warp ? (p.rows + ROWS_A_CTA - 1) / ROWS_A_CTA : p.rows),
                  static_cast<unsigned>(B * p.Hkv));
  const dim3 block(MERGE_THREADS);
  if (by_warp) return launch_kernel(merge_splits_warp_kernel<E, P>, grid, block, 0, stream, pdl, p);
  if constexpr (std::is_same<P, float>::value) {  // fp32 partials (MLA): the two-pass merge
    return launch_kernel(merge_splits_twopass_kernel<E, D, P>, grid, block, 0, stream, pdl, p);
  } else {  // 16-bit partials (GQA): the one-pass merge
    return launch_kernel(merge_splits_kernel<E, D, P>, grid, block, 0, stream, pdl, p);
  }
}

}  // namespace kdtree_sm90
