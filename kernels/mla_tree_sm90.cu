// Absorbed-MLA tree-verify attention for sm_90 (H100/H200): split-KV. Three split kernels share
// the launcher and the merge: mla_split_kernel (mma.sync tensor cores, described first, below),
// mla_split_wgmma_kernel (warp-specialised wgmma) and mla_split_seesaw_kernel (wgmma over pairs
// of KV tiles, one S per consumer warpgroup, TMA; the default); each has its own comment block.
//
// Semantics (identical to kdtree.kernels.tree_attention_mla_triton):
//   q_nope [B,T,H,R=512], q_pe [B,T,H,P=64], kv_cache [num_pages, page_size, R+P] (one latent
//   head: the first R = c, used as key part AND value; the last P = rope key), page_table
//   int32 [B, max_pages], prefix_lens int32 [B], tree_mask int64 [B,T,W] (bit j%64 of word
//   j//64 of row t: tree token t sees tree token j). Tree tokens' KV sit at logical positions
//   L..L+T-1. out[b,t,h,:] = softmax(scale*(q_nope.c + q_pe.k_pe)) . c over the whole prefix
//   plus the visible tree keys. fp32 accumulation, base-2 softmax internally.
//
// Schedule
//   * Rows: the M dimension packs the H*T query rows of a request, row r -> (t = r / H,
//     h = r % H); a CTA owns BLOCK_M = 64 consecutive rows.
//   * Grid (ceil(H*T / 64), num_splits, B). Split s streams prefix positions
//     [s*chunk, min((s+1)*chunk, L)) with chunk a multiple of BLOCK_N; the LAST split also
//     streams the T tree keys (positions L + j) with the ancestor bitmask. The tree tiles are
//     simply appended to the same tile sequence, so the cp.async pipeline runs through them.
//   * 8 warps: warp w -> row group rg = w % 4 (16 rows), column group cg = w / 4.
//       S = Q K^T (16 x 32 per warp) is computed split-K: cg 0 takes dims [0, 288), cg 1 dims
//       [288, 576); the two partials are exchanged through shared memory (fragment-ordered,
//       so no index math) and added: both warps of a row group hold bit-identical scores
//       (fp32 addition is commutative), hence identical running max / sum / probabilities.
//       O += P V: cg owns output columns [256*cg, 256*cg + 256) -> 16 x 256 fp32 accumulator
//       = 128 registers per thread.
//   * KV tiles: BLOCK_N = 32 keys x 576 dims, STAGES = 3 cp.async (16-byte, zero-fill for
//       invalid keys) stages. Thread tid loads row tid/8 (one page-table lookup per thread per
//       tile, prefetched one tile ahead) chunks (tid%8) + 8*j, j < 9.
//   * Shared-memory rows are padded to 584 elements (1168 B = 16 mod 128) so ldmatrix reads
//       of 8 consecutive rows hit 8 distinct 16-byte bank groups (conflict-free).
//   * One split: the CTA writes the normalised output directly. Several: normalised fp32
//       partials [B, S, H*T, 512] + base-2 LSE [B, S, H*T], then the shared merge
//       (sm90_common.cuh merge_splits_kernel, Hkv = 1).
//
// Everything depends only on shapes and device pointers: graph-capturable.

#include <cuda.h>  // CUtensorMap (the driver entry point is fetched at run time: no -lcuda)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "sm90_common.cuh"

namespace kdtree_mla {

using namespace kdtree_sm90;

constexpr int RANK = 512;               // kv_lora_rank (value width and key part)
constexpr int ROPE = 64;                // rope key width
constexpr int DQK = RANK + ROPE;        // 576: score dot length
constexpr int BLOCK_M = 64;             // query rows per CTA
constexpr int BLOCK_N = 32;             // keys per tile
constexpr int STAGES = 3;               // cp.async pipeline depth
constexpr int NUM_WARPS = 8;
constexpr int NUM_THREADS = NUM_WARPS * 32;
constexpr int SROW = DQK + 8;           // smem row pitch (elements): 1168 bytes
constexpr int KHALF = DQK / 2;          // 288 score dims per column-group warp (split-K)
constexpr int VHALF = RANK / 2;         // 256 output columns per column-group warp
constexpr int CHUNKS = DQK * 2 / 16;    // 72 16-byte chunks per latent row
constexpr int Q_CHUNKS_NOPE = RANK * 2 / 16;  // 64
constexpr int SMEM_Q = BLOCK_M * SROW * 2;
constexpr int SMEM_KV_STAGE = BLOCK_N * SROW * 2;
constexpr int SMEM_RED = NUM_WARPS * 16 * 32 * 4;  // 16 fp32 score partials per lane per warp
constexpr int SMEM_TOTAL = SMEM_Q + STAGES * SMEM_KV_STAGE + SMEM_RED;

static_assert(NUM_THREADS == BLOCK_N * 8, "one KV row per 8 threads");
static_assert(CHUNKS % 8 == 0, "9 chunks per loading thread");
static_assert(KHALF % 16 == 0 && VHALF % 16 == 0, "warp halves are whole k16 / n16 steps");
static_assert(SMEM_TOTAL <= 227 * 1024, "shared memory above the sm_90 per-block limit");
static_assert((SROW * 2) % 128 == 16, "row pitch must be 16 mod 128 for conflict-free ldmatrix");

struct Params {
  const void* q_nope;
  const void* q_pe;
  const void* kv;
  const int32_t* page_table;
  const int32_t* prefix_lens;
  const int64_t* tree_mask;
  void* out;
  float* part;  // [B, S, rows, RANK] (num_splits > 1)
  float* lse;   // [B, S, rows]       (num_splits > 1)
  int64_t sqn_b, sqn_t, sqn_h;  // q_nope strides (elements); last dim contiguous
  int64_t sqp_b, sqp_t, sqp_h;  // q_pe strides
  int64_t s_slot;               // kv_cache elements between consecutive slots (stride(1))
  int64_t spt_b;                // page_table row stride
  int64_t sm_b, sm_t;           // tree_mask strides (words)
  int64_t so_b, so_t, so_h;     // out strides
  int T, H, rows;               // rows = H * T
  int max_pages;
  int page_shift;               // log2(page_size)
  int num_splits;
  float qk_scale;               // sm_scale * log2(e)
  uint32_t v_lbo, v_sbo;        // wgmma kernel: V descriptor byte offsets (see launch)
  int tma_rows;                 // seesaw kernel: rows of one TMA box of kv_map (0: no TMA)
  CUtensorMap kv_map;           // seesaw kernel: the KV pool as a 4-D map (64 dims, 8 keys, 9
                                // slices, key groups), boxes {64, 8, 9, tma_rows / 8}, 128-byte
                                // swizzle (encoded on the host per launch; see sw::GROUP)
  int clocks;                   // wgmma / seesaw kernels: accumulate phase clocks (KDTREE_MLA_CLOCKS=1)
  int ablate;                   // wgmma / seesaw kernels, measurement only (KDTREE_MLA_ABLATE):
                                // bit 0 no KV loads past tile 1, bit 1 no S MMAs, bit 2 no P V
                                // MMAs (wgmma only)
  int tail_n;                   // seesaw kernel: 8 or 16 when the last row block holds at most
                                // that many rows and runs as a tail CTA (sw_tail), else 0
};

// Named barrier for the two warps (64 threads) of one row group; ids 1..4 (0 = __syncthreads).
__device__ __forceinline__ void pair_barrier(int id) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory");
}

// Global address of 16-byte chunk c (0..71: the 64 of q_nope, then the 8 of q_pe) of query row
// `row` of request b; `valid` is false past H * T (the copy then reads 0 bytes from row 0).
template <typename E>
__device__ __forceinline__ const E* q_chunk(const Params& p, int b, int row, int c, bool& valid) {
  valid = row < p.rows;
  const int t = valid ? row / p.H : 0;
  const int h = valid ? row % p.H : 0;
  return c < Q_CHUNKS_NOPE
             ? static_cast<const E*>(p.q_nope) + b * p.sqn_b + t * p.sqn_t + h * p.sqn_h + c * 8
             : static_cast<const E*>(p.q_pe) + b * p.sqp_b + t * p.sqp_t + h * p.sqp_h +
                   (c - Q_CHUNKS_NOPE) * 8;
}

// ------------------------------------------------------------------ tile geometry

// Issue the cp.async copies of this thread's share of one KV tile: row tid/8, chunks
// (tid%8) + 8*j for j < 9 (8 adjacent threads read 128 contiguous bytes per instruction).
template <typename E>
__device__ __forceinline__ void load_kv_tile(uint32_t stage_base, const E* kv, int64_t slot,
                                             int64_t s_slot, int tid) {
  const int row = tid >> 3;
  const int sub = tid & 7;
  const E* src = slot >= 0 ? kv + slot * s_slot : kv;  // any valid address when zero-filling
  const int bytes = slot >= 0 ? 16 : 0;
  const uint32_t dst = stage_base + static_cast<uint32_t>(row * SROW * 2);
#pragma unroll
  for (int j = 0; j < CHUNKS / 8; ++j) {
    const int c = sub + 8 * j;
    cp_async16(dst + c * 16, src + c * 8, bytes);
  }
}

// 32 visibility bits (key k of the tile -> bit k) of query row `row` for tile `tile`.
__device__ __forceinline__ uint32_t tile_bits(const Params& p, const TileSeq& ts, int b, int tile,
                                              int row) {
  if (tile < ts.n_pre) return low_bits(ts.end - (ts.start + tile * BLOCK_N));
  if (row >= p.rows) return 0u;
  const int j0 = (tile - ts.n_pre) * BLOCK_N;  // multiple of 32: one mask word holds the tile
  const int t = row / p.H;
  const int64_t word = __ldg(p.tree_mask + b * p.sm_b + t * p.sm_t + (j0 >> 6));
  const uint32_t bits = static_cast<uint32_t>(static_cast<uint64_t>(word) >> (j0 & 63));
  return bits & low_bits(ts.T - j0);
}

// ------------------------------------------------------------------ split kernel

template <typename E>
__global__ void __launch_bounds__(NUM_THREADS, 1) mla_split_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  E* sQ = reinterpret_cast<E*>(smem);
  E* sKV = reinterpret_cast<E*>(smem + SMEM_Q);
  float* sRed = reinterpret_cast<float*>(smem + SMEM_Q + STAGES * SMEM_KV_STAGE);

  const int tid = threadIdx.x;
  griddep_launch_dependents();  // the merge may be scheduled once every CTA has started
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int rg = warp & 3;   // row group: CTA rows [16*rg, 16*rg + 16)
  const int cg = warp >> 2;  // column group: score dims [288*cg, +288), out cols [256*cg, +256)
  const int m0 = blockIdx.x * BLOCK_M;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int S = p.num_splits;

  // ---- the key range of this split
  const TileSeq ts = split_tiles<BLOCK_N>(p, split, b);
  const int32_t* pt_row = p.page_table + b * p.spt_b;
  const E* kv = static_cast<const E*>(p.kv);

  // ---- Q tile -> smem (rows beyond H*T are zero-filled); first cp.async group with tile 0.
  {
    const uint32_t q_base = smem_u32(sQ);
    for (int idx = tid; idx < BLOCK_M * CHUNKS; idx += NUM_THREADS) {
      const int r = idx / CHUNKS;
      const int c = idx % CHUNKS;
      bool valid;
      const E* src = q_chunk<E>(p, b, m0 + r, c, valid);
      cp_async16(q_base + static_cast<uint32_t>((r * SROW + c * 8) * 2), src, valid ? 16 : 0);
    }
  }

  // ---- pipeline prologue: tiles 0 .. STAGES-2 (always STAGES-1 commits)
  const uint32_t kv_base = smem_u32(sKV);
  const int load_row = tid >> 3;
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < ts.n_tiles) {
      load_kv_tile<E>(kv_base + st * SMEM_KV_STAGE, kv, key_slot<BLOCK_N>(p, pt_row, ts, st, load_row),
                      p.s_slot, tid);
    }
    cp_async_commit();
  }
  // page-table lookup of the next tile to issue (STAGES-1), one iteration ahead of its use
  int64_t next_slot = key_slot<BLOCK_N>(p, pt_row, ts, STAGES - 1, load_row);

  // ---- per-thread softmax state: rows r0 = 16*rg + lane/4 and r1 = r0 + 8 of the CTA
  const int g = lane >> 2;  // fragment row within the 8-row half
  const int q4 = lane & 3;  // fragment column pair
  const int row0 = m0 + rg * 16 + g;
  const int row1 = row0 + 8;
  float m_run0 = neg_inf(), m_run1 = neg_inf();
  float l_run0 = 0.f, l_run1 = 0.f;  // thread-local partial row sums (quad-reduced at the end)
  float o[VHALF / 8][4];
#pragma unroll
  for (int i = 0; i < VHALF / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  // ldmatrix lane addresses (bytes), see the fragment layouts of mma.m16n8k16:
  //  Q (A operand, x4): matrices (rows 0-7,k 0-7) (rows 8-15,k 0-7) (rows 0-7,k 8-15)
  //    (rows 8-15,k 8-15) -> lane supplies row (lane & 15), k offset 8 * (lane >> 4).
  const uint32_t a_lane =
      smem_u32(sQ) + static_cast<uint32_t>(((rg * 16 + (lane & 15)) * SROW + (lane >> 4) * 8 +
                                            cg * KHALF) * 2);
  //  K (B operand of S = Q K^T, x4, non-trans): matrices (keys 0-7,k 0-7) (keys 0-7,k 8-15)
  //    (keys 8-15,k 0-7) (keys 8-15,k 8-15) -> key (lane & 7) + 8 * (lane >> 4),
  //    k offset 8 * ((lane >> 3) & 1). Regs {0,1}: n-tile keys 0-7, {2,3}: keys 8-15.
  const uint32_t k_lane = static_cast<uint32_t>(
      (((lane & 7) + 8 * (lane >> 4)) * SROW + 8 * ((lane >> 3) & 1) + cg * KHALF) * 2);
  //  V (B operand of O = P V, x4.trans): matrices (keys 0-7,d 0-7) (keys 8-15,d 0-7)
  //    (keys 0-7,d 8-15) (keys 8-15,d 8-15) -> key (lane & 15), d offset 8 * (lane >> 4).
  //    Regs {0,1}: n-tile dims 0-7, {2,3}: dims 8-15.
  const uint32_t v_lane =
      static_cast<uint32_t>(((lane & 15) * SROW + 8 * (lane >> 4) + cg * VHALF) * 2);

  float* red_mine = sRed + warp * 512;
  const float* red_other = sRed + (warp ^ 4) * 512;  // the other column group, same rows

  for (int tile = 0; tile < ts.n_tiles; ++tile) {
    // tile `tile` landed (at most STAGES-2 younger groups pending); the barrier also makes
    // every warp done with tile-1, whose stage is refilled just below, and with sRed.
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nt = tile + STAGES - 1;
      if (nt < ts.n_tiles) {
        load_kv_tile<E>(kv_base + (nt % STAGES) * SMEM_KV_STAGE, kv, next_slot, p.s_slot, tid);
      }
      cp_async_commit();
      next_slot = key_slot<BLOCK_N>(p, pt_row, ts, nt + 1, load_row);  // used next iteration
    }
    const uint32_t stage = kv_base + (tile % STAGES) * SMEM_KV_STAGE;

    // ---- S_partial = Q[:, half] K[:, half]^T  (16 rows x 32 keys per warp)
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KHALF / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, a_lane + ks * 32);
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {  // keys [16*nb, 16*nb + 16)
        uint32_t kb[4];
        ldmatrix_x4(kb, stage + k_lane + (nb * 16 * SROW + ks * 16) * 2);
        Mma<E>::run(s[2 * nb], a, kb[0], kb[1]);
        Mma<E>::run(s[2 * nb + 1], a, kb[2], kb[3]);
      }
    }

    // ---- split-K reduction with the partner warp (same fragment layout: index by reg, lane)
#pragma unroll
    for (int i = 0; i < 16; ++i) red_mine[i * 32 + lane] = s[i >> 2][i & 3];
    pair_barrier(1 + rg);
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i >> 2][i & 3] += red_other[i * 32 + lane];

    // ---- mask, scale (base 2), online softmax
    const uint32_t bits0 = tile_bits(p, ts, b, tile, row0);
    const uint32_t bits1 = tile_bits(p, ts, b, tile, row1);
    float mx0 = neg_inf(), mx1 = neg_inf();
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = nt * 8 + 2 * q4 + e;  // key within the tile
        s[nt][e] = ((bits0 >> col) & 1u) ? s[nt][e] * p.qk_scale : neg_inf();
        s[nt][2 + e] = ((bits1 >> col) & 1u) ? s[nt][2 + e] * p.qk_scale : neg_inf();
        mx0 = fmaxf(mx0, s[nt][e]);
        mx1 = fmaxf(mx1, s[nt][2 + e]);
      }
    }
    // the 4 lanes of a quad hold the 32 columns of the same two rows
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mnew0 = fmaxf(m_run0, mx0);
    const float mnew1 = fmaxf(m_run1, mx1);
    // rows with no visible key so far keep weight 0 instead of producing NaN (-inf - -inf)
    const float muse0 = mnew0 == neg_inf() ? 0.f : mnew0;
    const float muse1 = mnew1 == neg_inf() ? 0.f : mnew1;
    const float alpha0 = exp2f(m_run0 - muse0);  // exp2(-inf) = 0 on the first visible tile
    const float alpha1 = exp2f(m_run1 - muse1);
    m_run0 = mnew0;
    m_run1 = mnew1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - muse0);
      s[nt][1] = exp2f(s[nt][1] - muse0);
      s[nt][2] = exp2f(s[nt][2] - muse1);
      s[nt][3] = exp2f(s[nt][3] - muse1);
      sum0 += s[nt][0] + s[nt][1];
      sum1 += s[nt][2] + s[nt][3];
    }
    l_run0 = l_run0 * alpha0 + sum0;
    l_run1 = l_run1 * alpha1 + sum1;
#pragma unroll
    for (int i = 0; i < VHALF / 8; ++i) {
      o[i][0] *= alpha0;
      o[i][1] *= alpha0;
      o[i][2] *= alpha1;
      o[i][3] *= alpha1;
    }

    // ---- P (C fragments of n-tiles 2kk, 2kk+1) is the A fragment of k-step kk
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      pa[kk][0] = Mma<E>::pack(s[2 * kk][0], s[2 * kk][1]);          // row g,   keys 0-7
      pa[kk][1] = Mma<E>::pack(s[2 * kk][2], s[2 * kk][3]);          // row g+8, keys 0-7
      pa[kk][2] = Mma<E>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);  // row g,   keys 8-15
      pa[kk][3] = Mma<E>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);  // row g+8, keys 8-15
    }

    // ---- O[:, cg half] += P V   (V = the first 512 dims of the latent tile)
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int db = 0; db < VHALF / 16; ++db) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, stage + v_lane + (kk * 16 * SROW + db * 16) * 2);
        Mma<E>::run(o[2 * db], pa[kk], vb[0], vb[1]);
        Mma<E>::run(o[2 * db + 1], pa[kk], vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();  // nothing may be in flight at exit (empty splits, trailing groups)

  // ---- epilogue: full row sums, normalise, store
  l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 1);
  l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 2);
  l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 1);
  l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 2);
  const float inv0 = l_run0 > 0.f ? 1.f / l_run0 : 0.f;
  const float inv1 = l_run1 > 0.f ? 1.f / l_run1 : 0.f;
  const int col0 = cg * VHALF + 2 * q4;  // + 8 * n-tile
  const bool ok0 = row0 < p.rows;
  const bool ok1 = row1 < p.rows;

  if (S == 1) {
    E* out = static_cast<E*>(p.out) + b * p.so_b;
    if (ok0) {
      E* dst = out + (row0 / p.H) * p.so_t + (row0 % p.H) * p.so_h + col0;
#pragma unroll
      for (int i = 0; i < VHALF / 8; ++i) Mma<E>::store2(dst + 8 * i, o[i][0] * inv0, o[i][1] * inv0);
    }
    if (ok1) {
      E* dst = out + (row1 / p.H) * p.so_t + (row1 % p.H) * p.so_h + col0;
#pragma unroll
      for (int i = 0; i < VHALF / 8; ++i) Mma<E>::store2(dst + 8 * i, o[i][2] * inv1, o[i][3] * inv1);
    }
  } else {
    const int64_t base = (static_cast<int64_t>(b) * S + split) * p.rows;
    if (ok0) {
      float* dst = p.part + (base + row0) * RANK + col0;
#pragma unroll
      for (int i = 0; i < VHALF / 8; ++i)
        *reinterpret_cast<float2*>(dst + 8 * i) = make_float2(o[i][0] * inv0, o[i][1] * inv0);
    }
    if (ok1) {
      float* dst = p.part + (base + row1) * RANK + col0;
#pragma unroll
      for (int i = 0; i < VHALF / 8; ++i)
        *reinterpret_cast<float2*>(dst + 8 * i) = make_float2(o[i][2] * inv1, o[i][3] * inv1);
    }
    if (cg == 0 && q4 == 0) {
      if (ok0) p.lse[base + row0] = l_run0 > 0.f ? m_run0 + __log2f(l_run0) : neg_inf();
      if (ok1) p.lse[base + row1] = l_run1 > 0.f ? m_run1 + __log2f(l_run1) : neg_inf();
    }
  }
}

// ------------------------------------------------------------------ wgmma split kernel
//
// The same split/merge contract as mla_split_kernel, on Hopper's asynchronous warpgroup MMA
// (wgmma): no ldmatrix, no per-warp MMA issue. 384 threads, BLOCK_M = 64 query rows, KV tiles
// of wg::BN = 64 keys, three warpgroups:
//   * producer (warpgroup 2): cp.async copies of Q and of every KV tile into two stages (any
//     page size; 36 16-byte copies a thread a tile); named barriers FULL (tile landed) and
//     EMPTY (stage free) per stage. setmaxnreg: producer 40 registers, consumers 232.
//   * warpgroup 0: S_j = Q K_j^T over all 64 keys (36 x m64n64k16, both operands in shared
//     memory, two accumulation chains), the online softmax (row max, sums, alpha), P_j as
//     register A fragments for O[:, 0:256] += P_j V_j (4 x m64n256k16, A from registers), and
//     P_j + alpha_j through shared memory for warpgroup 1.
//   * warpgroup 1: O[:, 256:512] *= alpha_j; += P_j V_j (A = P from shared memory), at the
//     same time as warpgroup 0's P V.
//   Tile j + 2's copies start when both have finished P_j V_j, and tile j + 2 is needed one
//   tile later. Issuing S_{j+1} before P_j V_j (so the softmax overlaps the P V MMAs) was
//   measured in call f: with two stages it leaves the copies of tile j + 2 a few hundred
//   cycles, and the kernel got 38 % slower.
//   V is the first 512 dims of the same tile, read through a transposed (MN-major)
//   descriptor; each consumer's 64 x 256 fp32 accumulator is 128 registers a thread.
// Shared memory holds every operand in the 128-byte-swizzled K-major layout wgmma reads: a
// 64-dim slice of 64 rows is one 8 KB region, row r at r * 128 bytes with its eight 16-byte
// chunks permuted by chunk ^ (r & 7). Q: 9 regions; each KV stage: 9 regions; P: 1.
// History (session 9, tools/gpu/mla_phases.py): the first version split S by keys between
// the warpgroups (2 x m64n32k16 a k-step, Q read twice: shared-memory bound, 1.9k of 5.5k
// cycles a tile) and issued the copies from the consumers (1.2k cycles); the producer
// warpgroup alone gained 4 %, since its copies then competed with S for shared memory.
namespace wg {
constexpr int BN = 64;                   // keys per tile
constexpr int CONSUMERS = 256;           // two consumer warpgroups (the MMAs and softmax)
constexpr int THREADS = CONSUMERS + 128;  // + one producer warpgroup (the cp.async copies)
constexpr int PRODUCER_REGS = 40;        // setmaxnreg: 128 x 40 + 256 x 232 <= 64K registers (at 56 / 224
constexpr int CONSUMER_REGS = 232;       // warpgroup 0 spilled 4 bytes)
constexpr int REGION = 64 * 128;         // one swizzled 64-row x 64-dim slice (bytes)
constexpr int KBLOCKS = DQK / 64;        // 9 slices per latent row
constexpr int SMEM_Q = KBLOCKS * REGION;
constexpr int SMEM_STAGE = KBLOCKS * REGION;
constexpr int STAGES = 2;
constexpr int SMEM_P = REGION;           // P: 64 rows x 64 keys
constexpr int SMEM_MAX = 2 * 2 * BLOCK_M * 4;  // sAlpha: 64 floats (the rest is spare; an
                                               // earlier version exchanged row maxima here)
constexpr int SMEM_L = 2 * BLOCK_M * 4;        // sStat: [m | l][row], the epilogue's hand-over
constexpr int ALIGN = 1024;              // swizzle atoms need 1024-byte aligned regions
constexpr int SMEM_TOTAL = ALIGN + SMEM_Q + STAGES * SMEM_STAGE + SMEM_P + SMEM_MAX + SMEM_L;
static_assert(SMEM_TOTAL <= 227 * 1024, "wgmma kernel shared memory above the sm_90 limit");
static_assert(BLOCK_M == 64 && CONSUMERS == 4 * BLOCK_M, "two warpgroups over 64 rows");
static_assert(128 * PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= 65536, "register file");
}  // namespace wg

// Phase clocks of the wgmma and seesaw kernels, summed over CTAs by thread 0 of each consumer
// warpgroup: [warpgroup][0..7] cycles by phase, [8] tiles, [9] CTAs. The wgmma kernel: wait for
// the tile, S MMAs, softmax (those three warpgroup 0 only), wait at P_FREE, P hand-over + wait
// at P_READY, O rescale, P V MMAs, stage release. The seesaw kernel: slots 0-5, per warpgroup
// (kdtree.kernels.cuda_mla.SEESAW_PHASES).
__device__ unsigned long long g_wg_clocks[2][10];

// Named barriers of the wgmma kernel (0 is __syncthreads, unused there).
constexpr int BAR_CONSUMERS = 1;  // the two consumer warpgroups (256 threads)
constexpr int BAR_FULL = 2;       // + stage: the producer arrives when the tile landed, warpgroup 0 syncs (256)
constexpr int BAR_EMPTY = 4;      // + stage: the consumers arrive when the stage is free (384)
constexpr int BAR_P_READY = 6;    // warpgroup 0 wrote P_j and alpha_j for warpgroup 1 (256)
constexpr int BAR_P_FREE = 7;     // warpgroup 1 is done reading P_{j-1} (256)

// The producer warpgroup's share of one KV tile: rows (pt >> 3) + 16 k (k < 4), slice i, chunk
// pt & 7 (8 adjacent threads read one row's 128 contiguous bytes of a slice).
template <typename E>
__device__ __forceinline__ void wg_produce_tile(uint32_t stage, const E* kv, const Params& p,
                                                const int32_t* pt_row, const TileSeq& ts,
                                                int tile, int pt) {
  const int sub = pt & 7;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = (pt >> 3) + 16 * k;
    const int64_t slot = key_slot<wg::BN>(p, pt_row, ts, tile, r);
    const E* src = slot >= 0 ? kv + slot * p.s_slot : kv;
    const int bytes = slot >= 0 ? 16 : 0;
    const uint32_t dst = stage + swz(r, sub);
#pragma unroll
    for (int i = 0; i < wg::KBLOCKS; ++i) cp_async16(dst + i * wg::REGION, src + (sub + 8 * i) * 8, bytes);
  }
}

// Visibility bits of the 64 keys of tile `tile` for query row `row`.
__device__ __forceinline__ uint64_t wg_bits64(const Params& p, const TileSeq& ts, int b, int tile,
                                              int row) {
  const auto low64 = [](int k) {
    return k >= 64 ? ~0ull : (k <= 0 ? 0ull : ((1ull << k) - 1ull));
  };
  if (tile < ts.n_pre) return low64(ts.end - (ts.start + tile * wg::BN));
  if (row >= p.rows) return 0ull;
  const int j0 = (tile - ts.n_pre) * wg::BN;  // multiple of 64: one mask word per tile
  const int t = row / p.H;
  const uint64_t word = static_cast<uint64_t>(__ldg(p.tree_mask + b * p.sm_b + t * p.sm_t + (j0 >> 6)));
  return word & low64(ts.T - j0);
}

// S (64 x 64) = Q K^T from the swizzled slices: 36 m64n64k16 as two accumulation chains. Q's
// 64-dim slices are wg::REGION apart; K's are KSLICE apart (wg::REGION in the wgmma kernel's
// stages, sw::SLICE in the seesaw kernel's key-group-interleaved ones; dk carries the matching
// stride between groups of 8 keys).
template <typename E, int KSLICE = wg::REGION>
__device__ __forceinline__ void wg_scores(float (&s)[32], float (&s_odd)[32], uint64_t dq,
                                          uint64_t dk, int ablate) {
  if (ablate & 2) {
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.f;
    return;
  }
  wg_fence();
#pragma unroll
  for (int ks = 0; ks < DQK / 16; ++ks) {
    const uint64_t oq = static_cast<uint64_t>((ks >> 2) * (wg::REGION >> 4) + (ks & 3) * 2);
    const uint64_t ok = static_cast<uint64_t>((ks >> 2) * (KSLICE >> 4) + (ks & 3) * 2);
    if (ks & 1)
      Wgmma<E>::ss_n64(s_odd, dq + oq, dk + ok, ks > 1);
    else
      Wgmma<E>::ss_n64(s, dq + oq, dk + ok, ks > 0);
  }
  wg_commit();
  wg_wait<0>();
  pin(s);
  pin(s_odd);
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] += s_odd[i];
}

// P fragments -> a 128B-swizzled K-major 64 x 64 slice (as wgmma reads it as the A operand),
// its atoms of 8 rows GROUP bytes apart (1024: contiguous; sw::GROUP: the seesaw kernel's rope
// slice inside a key-group-interleaved stage).
template <int GROUP = 1024>
__device__ __forceinline__ void wg_store_p(unsigned char* slice, const uint32_t (&pc)[4][4],
                                           int r0, int r1, int q4) {
  const auto at = [](int r, int c) { return (r >> 3) * GROUP + swz(r & 7, c); };
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    *reinterpret_cast<uint32_t*>(slice + at(r0, 2 * kk) + 4 * q4) = pc[kk][0];
    *reinterpret_cast<uint32_t*>(slice + at(r1, 2 * kk) + 4 * q4) = pc[kk][1];
    *reinterpret_cast<uint32_t*>(slice + at(r0, 2 * kk + 1) + 4 * q4) = pc[kk][2];
    *reinterpret_cast<uint32_t*>(slice + at(r1, 2 * kk + 1) + 4 * q4) = pc[kk][3];
  }
}
// O (this warpgroup's 64 x 256 half) *= a0 (row r0), a1 (row r1); skipped when no row of the
// warp changes (the running max rarely moves once settled).
__device__ __forceinline__ void wg_rescale(float (&o)[128], float a0, float a1) {
  if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 0] *= a0;
      o[4 * j + 1] *= a0;
      o[4 * j + 2] *= a1;
      o[4 * j + 3] *= a1;
    }
  }
}

// Which keys this CTA's split covers: 64-key prefix tiles from `start`, then (last split) the
// tree tiles.
__device__ __forceinline__ TileSeq wg_tiles(const Params& p, int split, int b) {
  return split_tiles<wg::BN>(p, split, b);
}

// The cp.async copies of this CTA's 64 query rows (q_nope | q_pe, 72 16-byte chunks a row) into
// the nine swizzled Q slices by THREADS threads (thread pt); rows past `rows` are zero-filled.
// (A tail CTA copies only its first `nrows`: the N of its swapped-operand MMAs.)
template <typename E, int THREADS = 128>
__device__ __forceinline__ void wg_copy_q(uint32_t sQ, const Params& p, int b, int m0, int pt,
                                          int nrows = BLOCK_M) {
  for (int idx = pt; idx < nrows * CHUNKS; idx += THREADS) {
    const int r = idx / CHUNKS;
    const int c = idx % CHUNKS;
    bool valid;
    const E* src = q_chunk<E>(p, b, m0 + r, c, valid);
    cp_async16(sQ + (c >> 3) * wg::REGION + swz(r, c & 7), src, valid ? 16 : 0);
  }
}


// Writes this consumer warpgroup's O columns [256 w, 256 w + 256) of rows r0, r1 (normalised by
// the row sums l0, l1), and with splits the log-sum-exp (base 2: m + log2 l) from warpgroup 0.
template <typename E>
__device__ __forceinline__ void wg_store_out(const Params& p, const float (&o)[128], int b,
                                             int split, int m0, int r0, int r1, int q4, int w,
                                             float m_run0, float m_run1, float l_run0,
                                             float l_run1) {
  const int S = p.num_splits;
  const float inv0 = l_run0 > 0.f ? 1.f / l_run0 : 0.f;
  const float inv1 = l_run1 > 0.f ? 1.f / l_run1 : 0.f;
  const int row0 = m0 + r0;
  const int row1 = m0 + r1;
  const bool ok0 = row0 < p.rows;
  const bool ok1 = row1 < p.rows;
  const int col0 = 256 * w + 2 * q4;  // + 8 j
  if (S == 1) {
    E* out = static_cast<E*>(p.out) + b * p.so_b;
    if (ok0) {
      E* dst = out + (row0 / p.H) * p.so_t + (row0 % p.H) * p.so_h + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j) Mma<E>::store2(dst + 8 * j, o[4 * j] * inv0, o[4 * j + 1] * inv0);
    }
    if (ok1) {
      E* dst = out + (row1 / p.H) * p.so_t + (row1 % p.H) * p.so_h + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        Mma<E>::store2(dst + 8 * j, o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
  } else {
    const int64_t rbase = (static_cast<int64_t>(b) * S + split) * p.rows;
    if (ok0) {
      float* dst = p.part + (rbase + row0) * RANK + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j] * inv0, o[4 * j + 1] * inv0);
    }
    if (ok1) {
      float* dst = p.part + (rbase + row1) * RANK + col0;
#pragma unroll
      for (int j = 0; j < 32; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    if (w == 0 && q4 == 0) {
      if (ok0) p.lse[rbase + row0] = l_run0 > 0.f ? m_run0 + __log2f(l_run0) : neg_inf();
      if (ok1) p.lse[rbase + row1] = l_run1 > 0.f ? m_run1 + __log2f(l_run1) : neg_inf();
    }
  }
}

template <typename E>
__global__ void __launch_bounds__(wg::THREADS, 1) mla_split_wgmma_kernel(const Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + wg::ALIGN - 1) & ~static_cast<uint32_t>(wg::ALIGN - 1);
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sQ = base;
  const uint32_t sKV = sQ + wg::SMEM_Q;
  const uint32_t sP = sKV + wg::STAGES * wg::SMEM_STAGE;
  float* sMax = reinterpret_cast<float*>(smem + (sP - base) + wg::SMEM_P);
  float* sL = sMax + 2 * 2 * BLOCK_M;

  const int tid = threadIdx.x;
  griddep_launch_dependents();  // the merge may be scheduled once every CTA has started
  const int m0 = blockIdx.x * BLOCK_M;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const TileSeq ts = wg_tiles(p, split, b);
  const int32_t* pt_row = p.page_table + b * p.spt_b;
  const E* kv = static_cast<const E*>(p.kv);

  if (tid >= wg::CONSUMERS) {
    // ================= producer warpgroup: cp.async copies of Q and every KV tile =========
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(wg::PRODUCER_REGS));
    const int pt = tid - wg::CONSUMERS;
    wg_copy_q<E>(sQ, p, b, m0, pt);
    // one cp.async group per tile, empty ones included, so "all but the newest" is tile t
    if (ts.n_tiles > 0) wg_produce_tile<E>(sKV, kv, p, pt_row, ts, 0, pt);
    cp_async_commit();
    if (ts.n_tiles > 1) wg_produce_tile<E>(sKV + wg::SMEM_STAGE, kv, p, pt_row, ts, 1, pt);
    cp_async_commit();
    for (int tile = 0; tile < ts.n_tiles; ++tile) {
      const int st = tile & 1;
      cp_async_wait<1>();
      fence_async_smem();
      named_arrive(BAR_FULL + st, 256);  // tile `tile` is in stage st (warpgroup 0 waits)
      if (tile + 2 < ts.n_tiles) {
        named_sync(BAR_EMPTY + st, wg::THREADS);  // both consumers are done with tile `tile`
        if (!(p.ablate & 1)) wg_produce_tile<E>(sKV + st * wg::SMEM_STAGE, kv, p, pt_row, ts, tile + 2, pt);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();
    return;
  }

  // ================= consumer warpgroups =================================================
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(wg::CONSUMER_REGS));
  const int lane = tid & 31;
  const int w = tid >> 7;            // 0: S, softmax and O[:, 0:256]; 1: O[:, 256:512]
  const int wi = (tid >> 5) & 3;     // warp within the warpgroup: rows [16 wi, 16 wi + 16)
  const int g = lane >> 2;
  const int q4 = lane & 3;
  const int r0 = wi * 16 + g;        // CTA rows of this thread's accumulator fragments
  const int r1 = r0 + 8;
  unsigned char* pbase = smem + (sP - base);
  float* sAlpha = sMax;              // [64]: tile j's rescale factor per row, handed over with P_j

  float m_run0 = neg_inf(), m_run1 = neg_inf();
  float l_run0 = 0.f, l_run1 = 0.f;  // warpgroup 0: this thread's 16 keys a row (quad-reduced at the end)
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  // descriptors: Q slice 0; K slice 0 of stage 0 (all 64 keys); P; V slice 4w of stage 0
  const uint64_t dq = wg_desc(sQ, 16, 1024);
  const uint64_t dk = wg_desc(sKV, 16, 1024);
  const uint64_t dp = wg_desc(sP, 16, 1024);
  const uint64_t dv = wg_desc(sKV + 4 * w * wg::REGION, p.v_lbo, p.v_sbo);
  constexpr uint64_t STAGE_STEP = wg::SMEM_STAGE >> 4;  // descriptor start-address units
  const int n = ts.n_tiles;

  PhaseClocks clk(p.clocks && (tid & 127) == 0);

  // One loop for both consumer warpgroups: the barriers they share (P_FREE, P_READY, the
  // epilogue's) are the same instructions in both. (Session 9 made it so to test whether
  // racecheck's reports on the hand-over came from two call sites; they stayed, and the
  // two-branch form of call h was 5 % faster: docs/kernels_notes.md.)
  // Warpgroup 0: S_j = Q K_j^T (64 x 64) as two independent accumulation chains (even and odd
  // k-steps: one chain of dependent m64n64k16 ran at ~80 cycles an instruction, session 9
  // call f), the online softmax, P_j as register A fragments for O[:, 0:256] += P_j V_j and
  // through shared memory (with alpha_j) for warpgroup 1's O[:, 256:512] += P_j V_j.
  float s[32], s_odd[32];
  uint32_t pc[4][4];                 // warpgroup 0: P_j fragments, k-step kk = keys [16 kk, +16)
  float alpha0 = 1.f, alpha1 = 1.f;  // tile j's rescale factors of rows r0, r1
  for (int tile = 0; tile < n; ++tile) {
    const int st = tile & 1;
    if (w == 0) {
      const uint64_t bits0 = wg_bits64(p, ts, b, tile, m0 + r0);
      const uint64_t bits1 = wg_bits64(p, ts, b, tile, m0 + r1);
      named_sync(BAR_FULL + st, 256);  // tile `tile` landed
      clk.stamp(0);
      wg_scores<E>(s, s_odd, dq, dk + static_cast<uint64_t>(st) * STAGE_STEP, p.ablate);
      clk.stamp(1);

      // ---- mask (partial tiles only), online softmax in base 2 with the scale folded into
      // the exponent's multiply-add: p = 2^(s * scale - m), m the running max of s * scale
      const bool full = tile < ts.n_pre && ts.end - (ts.start + tile * wg::BN) >= wg::BN;
      const float2 mx = wg_mask_max(s, full, bits0, bits1, q4);
      const float mnew0 = lazy_max(m_run0, mx.x * p.qk_scale);  // qk_scale > 0: order kept
      const float mnew1 = lazy_max(m_run1, mx.y * p.qk_scale);
      const float muse0 = wg_offset(mnew0), muse1 = wg_offset(mnew1);
      alpha0 = exp2f(m_run0 - muse0);
      alpha1 = exp2f(m_run1 - muse1);
      m_run0 = mnew0;
      m_run1 = mnew1;
      const float2 sum = wg_exp_pack<E>(s, pc, p.qk_scale, muse0, muse1);
      l_run0 = l_run0 * alpha0 + sum.x;
      l_run1 = l_run1 * alpha1 + sum.y;
      clk.stamp(2);
    }
    // ---- P_{j-1} and alpha_{j-1} are no longer read (warpgroup 1 waited for its P V)
    named_sync(BAR_P_FREE, wg::CONSUMERS);
    clk.stamp(3);
    if (w == 0) {
      // P_j (128B-swizzled K-major, as wgmma reads it) and alpha_j for warpgroup 1
      wg_store_p(pbase, pc, r0, r1, q4);
      if (q4 == 0) {
        sAlpha[r0] = alpha0;
        sAlpha[r1] = alpha1;
      }
      fence_async_smem();
    }
    named_sync(BAR_P_READY, wg::CONSUMERS);
    clk.stamp(4);
    if (w == 1) {
      alpha0 = sAlpha[r0];
      alpha1 = sAlpha[r1];
    }
    // ---- O[:, 256w : 256w + 256] *= alpha_j
    wg_rescale(o, alpha0, alpha1);
    clk.stamp(5);
    // ---- += P_j V_j: A from registers (warpgroup 0) or from shared memory (warpgroup 1)
    // (each branch holds its whole fence / MMA / commit / wait sequence: with the MMAs alone in
    // divergent branches ptxas serialises them, warning C7520)
    const uint64_t v = dv + st * STAGE_STEP;
    if (p.ablate & 4) {
    } else if (w == 0) {
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < wg::BN / 16; ++kk)
        Wgmma<E>::rs_n256_tb(o, pc[kk], v + kk * (16 * 128 >> 4), 1);
      wg_commit();
      wg_wait<0>();
    } else {
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < wg::BN / 16; ++kk)
        Wgmma<E>::ss_n256_tb(o, dp + kk * 2, v + kk * (16 * 128 >> 4), 1);
      wg_commit();
      wg_wait<0>();
    }
    pin(o);
    clk.stamp(6);
    if (tile + 2 < n) named_arrive(BAR_EMPTY + st, wg::THREADS);  // done with stage st
    clk.stamp(7);
  }
  clk.flush(g_wg_clocks[w], n);

  // ---- epilogue: warpgroup 0 holds the row statistics; full row sums over the quad
  float* sStat = sL;  // [0][row] = m, [1][row] = l
  if (w == 0) {
    l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 1);
    l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 2);
    l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 1);
    l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 2);
    if (q4 == 0) {
      sStat[r0] = m_run0;
      sStat[r1] = m_run1;
      sStat[BLOCK_M + r0] = l_run0;
      sStat[BLOCK_M + r1] = l_run1;
    }
  }
  named_sync(BAR_CONSUMERS, wg::CONSUMERS);
  if (w == 1) {
    m_run0 = sStat[r0];
    m_run1 = sStat[r1];
    l_run0 = sStat[BLOCK_M + r0];
    l_run1 = sStat[BLOCK_M + r1];
  }
  wg_store_out<E>(p, o, b, split, m0, r0, r1, q4, w, m_run0, m_run1, l_run0, l_run1);
}

// ------------------------------------------------------------------ seesaw split kernel
//
// The wgmma kernel above gives warpgroup 0 all of S = Q K^T and the softmax, so warpgroup 1
// idles ~3300 cycles a tile (session 9's phase clocks) and the tensor cores idle during the
// softmax. The seesaw kernel (the schedule FlashMLA describes for its sm_90 kernel, written
// here from that description) takes KV tiles in pairs (2i, 2i + 1) and gives each consumer
// warpgroup one S of the pair, so both do the same MMA work and one's softmax overlaps the
// other's MMAs. With m the running row max at the start of the pair (both warpgroups hold it):
//   warpgroup 0: S_a = Q K_a^T; m_a = max(m, rowmax S_a); P_a = exp(S_a - m_a) -> shared
//                memory (into the rope slice of its own stage: the rope keys are dead once S_a
//                is done) with m_a; O_L = O_L exp(m - m_a) + P_a V_a[:, :256];
//                then (P_b, m_b from warpgroup 1) O_L = O_L exp(m_a - m_b) + P_b V_b[:, :256]
//   warpgroup 1: S_b = Q K_b^T; (P_a, m_a from warpgroup 0) O_R = O_R exp(m - m_a) +
//                P_a V_a[:, 256:] (issued before its softmax, so it runs beside it);
//                m_b = max(m_a, rowmax S_b); P_b = exp(S_b - m_b) -> shared memory with m_b;
//                O_R = O_R exp(m_a - m_b) + P_b V_b[:, 256:]
//   (each rescale is skipped when no row of the warp moved, the usual case once the max settled)
// Each warpgroup keeps the row sums of its own P tiles, scaled along with its O half; the
// epilogue adds the two. Tile 2i is always in stage 0, tile 2i + 1 in stage 1. The producer
// warpgroup is split in two: warps 8-9 own stage 0, warps 10-11 stage 1, so a stage is
// refilled as soon as its tile is released, independent of the other stage.
// Named barriers (one-way: the writer arrives, the reader syncs):
//   FULL + s   (192): producer half s arrives when its tile landed; the warpgroup that
//                     computes S from stage s syncs. The other warpgroup reads stage s only
//                     after the M_A / P_B hand-over, which orders it after that sync.
//   EMPTY + s  (320): both consumers arrive when done with stage s; producer half s syncs.
//   M_A        (256): warpgroup 0 wrote P_a and m_a; warpgroup 1 syncs.
//   P_B        (256): warpgroup 1 wrote P_b and m_b; warpgroup 0 syncs.
//   PRODUCER   (128): the mbarriers are initialised (and, in the -DKDTREE_MLA_PRODUCER_Q
//                     measurement build, the two producer halves' shares of Q have landed).
//   CONSUMERS  (256): the two consumer warpgroups' copies of Q have landed (session 14: the
//                     consumers copy Q while the producer starts on the tiles; 4-8 us less a
//                     call at 16k and 128k than the producer's copies before its first tiles).
// A one-way barrier must not see the writer's next arrival before the reader's sync: warpgroup
// 0 arrives at M_A for pair i + 1 only after stage 0 was refilled, i.e. after warpgroup 1
// released tile 2i (behind its M_A sync of pair i); warpgroup 1 arrives at P_B for pair i + 1
// only after M_A of pair i + 1, i.e. after warpgroup 0's P_B sync of pair i.
namespace sw {
constexpr int SMEM_STATS = 4 * BLOCK_M * 4 + 16;  // m_a [64], m_b [64], row sums [2][64],
                                                  // one TMA mbarrier a stage
constexpr int SMEM_TOTAL = wg::ALIGN + wg::SMEM_Q + wg::STAGES * wg::SMEM_STAGE + SMEM_STATS;
static_assert(SMEM_TOTAL <= 227 * 1024, "seesaw kernel shared memory above the sm_90 limit");
// A stage holds 64 keys in 8 groups of 8; a group holds the keys' 9 64-dim slices side by side,
// each a 128B-swizzled 1 KB atom: [keys 0-7: dims 0-63 | 64-127 | ... | 512-575][keys 8-15: ...].
// One TMA box then brings a whole page run (a 4-D map: 64 dims, 8 keys, 9 slices, key groups),
// one box a run instead of nine; the wgmma descriptors step GROUP bytes a group of 8 keys (SBO)
// and SLICE from one slice to the next (K: the k-step's start address; V: LBO).
constexpr int SLICE = 1024;
constexpr int GROUP = wg::KBLOCKS * SLICE;  // 9216
static_assert(wg::BN / 8 * GROUP == wg::SMEM_STAGE, "a stage is 8 key groups");
constexpr int ROPE_SLICE = (DQK / 64 - 1) * SLICE;  // byte offset of a stage's rope slice
constexpr uint64_t KSTEP_V = (2 * GROUP) >> 4;      // 16 keys of V (descriptor units)
constexpr int BAR_M_A = 6;
constexpr int BAR_P_B = 7;
constexpr int BAR_PRODUCER = 8;
constexpr int FULL_COUNT = 64 + 128;
constexpr int EMPTY_COUNT = 256 + 64;
}  // namespace sw

// Whether tile `tile` goes through TMA: a whole prefix tile inside the page table (the partial
// and tree tiles keep the zero-filling cp.async path: a TMA box would bring whatever the unused
// slots of a page hold, and P = 0 times a NaN there is NaN).
__device__ __forceinline__ bool sw_tma_tile(const Params& p, const TileSeq& ts, int tile) {
  if (p.tma_rows == 0 || tile >= ts.n_pre) return false;
  const int pos = ts.start + tile * wg::BN;
  return ts.end - pos >= wg::BN && ((pos + wg::BN - 1) >> p.page_shift) < p.max_pages;
}

// A TMA tile's first slot of page run `lt` (lanes lt < 64 / tma_rows; one box per run),
// looked up before the producer waits for the stage so the page-table read overlaps
// that wait instead of delaying the copies.
__device__ __forceinline__ int sw_run_slot(const Params& p, const int32_t* pt_row,
                                           const TileSeq& ts, int tile, int lt) {
  if (lt * p.tma_rows >= wg::BN) return 0;
  const int pos = ts.start + tile * wg::BN + lt * p.tma_rows;
  return (__ldg(pt_row + (pos >> p.page_shift)) << p.page_shift) + (pos & ((1 << p.page_shift) - 1));
}

// Issue one tile's copies into `stage` and wait until they landed. TMA: lane 0 sets the
// stage mbarrier's byte count, lanes < 64 / tma_rows each issue their run's box, all 64
// threads wait for the phase. cp.async (partial and tree tiles, pages of < 8 slots): rows
// (lt >> 3) + 8 k, k < 8, chunk lt & 7 of the nine slices, zero-filled past the keys (one row
// at a time: the 40-register producer spills when the eight rows' slots are held at once).
template <typename E>
__device__ __forceinline__ void sw_fill(uint32_t stage, int run_slot, bool tma, const E* kv,
                                        const Params& p, const int32_t* pt_row,
                                        const TileSeq& ts, int tile, int lt, uint32_t bar,
                                        uint32_t& parity) {
  if (tma) {
    if (lt < 32) {
      if (lt == 0) mbar_expect_tx(bar, wg::KBLOCKS * wg::REGION);
      __syncwarp();
      if (lt * p.tma_rows < wg::BN)
        tma_load_4d(stage + (lt * p.tma_rows >> 3) * sw::GROUP, &p.kv_map, 0, 0, 0, run_slot >> 3,
                    bar);
    }
    mbar_wait(bar, parity);
    parity ^= 1u;
  } else {
    const int sub = lt & 7;
#pragma unroll 1
    for (int k = 0; k < 8; ++k) {
      const int r = (lt >> 3) + 8 * k;
      const int64_t slot = key_slot<wg::BN>(p, pt_row, ts, tile, r);
      const E* src = slot >= 0 ? kv + slot * p.s_slot : kv;
      const int bytes = slot >= 0 ? 16 : 0;
      const uint32_t dst = stage + (r >> 3) * sw::GROUP + swz(r & 7, sub);
#pragma unroll
      for (int i = 0; i < wg::KBLOCKS; ++i)
        cp_async16(dst + i * sw::SLICE, src + (sub + 8 * i) * 8, bytes);
    }
    cp_async_commit();
    cp_async_wait<0>();
  }
}

// One consumer warpgroup's S of tile `tile` from stage `stage`: its visibility bits, whether it
// is a whole prefix tile (no mask), the wait for the tile, the MMAs (phase clocks 0 and 1).
template <typename E>
__device__ __forceinline__ void sw_tile_scores(float (&s)[32], float (&s_odd)[32], bool& full,
                                               uint64_t& bits0, uint64_t& bits1, const Params& p,
                                               const TileSeq& ts, int b, int tile, int row0,
                                               int row1, int stage, uint64_t dq, uint64_t dk,
                                               PhaseClocks& clk) {
  bits0 = wg_bits64(p, ts, b, tile, row0);
  bits1 = wg_bits64(p, ts, b, tile, row1);
  full = tile < ts.n_pre && ts.end - (ts.start + tile * wg::BN) >= wg::BN;
  named_sync(BAR_FULL + stage, sw::FULL_COUNT);
  clk.stamp(0);
  wg_scores<E, sw::SLICE>(s, s_odd, dq, dk, p.ablate);
  clk.stamp(1);
}

// The softmax of one S tile against the running max `from` (warpgroup 0: its m; warpgroup 1:
// m_a): m_new = max(from, rowmax S * scale), P = exp2(S * scale - m_new) packed into `pc` and
// stored into `slice` with m_new into `sm`, made visible to the other warpgroup's wgmma, and
// announced at barrier `bar`. Returns m_new (rows r0, r1) in `mn` and this thread's partial
// row sums.
template <typename E>
__device__ __forceinline__ float2 sw_softmax_out(float (&s)[32], uint32_t (&pc)[4][4], bool full,
                                                 uint64_t bits0, uint64_t bits1, float2 from,
                                                 float scale, unsigned char* slice, float* sm,
                                                 int r0, int r1, int q4, int bar, float2& mn) {
  const float2 mx = wg_mask_max(s, full, bits0, bits1, q4);
  mn.x = lazy_max(from.x, mx.x * scale);  // scale > 0: order kept
  mn.y = lazy_max(from.y, mx.y * scale);
  const float2 sum = wg_exp_pack<E>(s, pc, scale, wg_offset(mn.x), wg_offset(mn.y));
  wg_store_p<sw::GROUP>(slice, pc, r0, r1, q4);
  if (q4 == 0) {
    sm[r0] = mn.x;
    sm[r1] = mn.y;
  }
  fence_async_smem();  // P is read by the other warpgroup's wgmma (the async proxy)
  named_arrive(bar, 256);
  return sum;
}

// Warpgroup 1's share of tile a: wait for P_a and m_a, move O_R and the row sums to m_a, issue
// O_R += P_a V_a[:, 256:] (A = P_a in shared memory; committed, not waited; phase clock 2 after
// the wait). Returns m_a.
template <typename E>
__device__ __forceinline__ float2 sw_pv_a_right(float (&o)[128], float& l0, float& l1,
                                                float2 m_run, const float* sMa, int r0, int r1,
                                                uint64_t dpa, uint64_t dv0, PhaseClocks& clk) {
  named_sync(sw::BAR_M_A, 256);  // P_a and m_a written (tile a landed: warpgroup 0 saw it)
  clk.stamp(2);
  const float2 ma = make_float2(sMa[r0], sMa[r1]);
  const float a0 = exp2f(m_run.x - wg_offset(ma.x)), a1 = exp2f(m_run.y - wg_offset(ma.y));
  l0 *= a0;
  l1 *= a1;
  wg_rescale(o, a0, a1);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) Wgmma<E>::ss_n256_tb(o, dpa + kk * 2, dv0 + kk * sw::KSTEP_V, 1);
  wg_commit();
  return ma;
}

// Warpgroup 0's tile a: S_a, its softmax against m_run (P_a and m_a out, barrier M_A), O_L and
// the row sums moved to m_a, O_L += P_a V_a[:, :256] issued (A = P_a from registers; committed,
// not waited; phase clocks 0-2). Returns m_a.
template <typename E>
__device__ __forceinline__ float2 sw_left_a(float (&o)[128], float (&s)[32], float (&s_odd)[32],
                                            uint32_t (&pc)[4][4], float& l0, float& l1,
                                            float2 m_run, const Params& p, const TileSeq& ts,
                                            int b, int ta, int m0, int r0, int r1, int q4,
                                            uint64_t dq, uint64_t dk, uint64_t dv0,
                                            unsigned char* rope0, float* sMa, PhaseClocks& clk) {
  bool full;
  uint64_t bits0, bits1;
  sw_tile_scores<E>(s, s_odd, full, bits0, bits1, p, ts, b, ta, m0 + r0, m0 + r1, 0, dq, dk, clk);
  float2 ma;
  const float2 sum = sw_softmax_out<E>(s, pc, full, bits0, bits1, m_run, p.qk_scale, rope0, sMa,
                                       r0, r1, q4, sw::BAR_M_A, ma);
  const float a0 = exp2f(m_run.x - wg_offset(ma.x)), a1 = exp2f(m_run.y - wg_offset(ma.y));
  l0 = l0 * a0 + sum.x;
  l1 = l1 * a1 + sum.y;
  clk.stamp(2);
  wg_rescale(o, a0, a1);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) Wgmma<E>::rs_n256_tb(o, pc[kk], dv0 + kk * sw::KSTEP_V, 1);
  wg_commit();
  return ma;
}

// ------------------------------------------------------------------ the tail CTA (session 28)
//
// A last row block of at most 16 rows (h = 8 / 16 at T = 1, h = 8 at T = 2, or h = 8 / 16 at
// T = 9 / 17 / 65 past whole 64-row blocks) pays a whole CTA's MMAs in the seesaw layout: 64
// padded rows. A tail CTA instead swaps the operands, with the rows as the N of the MMAs (GQA's
// tail_rows, session 14):
// S^T (64 keys x N) = K Q^T (A = the stage's K, B = Q^T: 36 m64nNk16), the online softmax down
// the columns (the four warps' maxima meet in shared memory), P^T (N x 64 keys, K-major) into
// the stage's rope slice (dead once S^T is done, as the seesaw kernel's P), and O^T (512 dims x
// N) += V^T P^T (A = V^T, MN-major, eight 64-dim slices of 4 k-steps). Warpgroup w takes the
// tiles of stage w (w, w + 2, ...) with its own running max, sums and O^T, and the two are
// combined at the end; the producer is the seesaw kernel's, unchanged. What it saves is shared
// memory traffic: a seesaw CTA reads Q, K, V and P from shared memory for every tile (~216 KB,
// the bound of its pace), a tail CTA K and V once and N-column Q^T and P^T (~150 KB). Measured
// (session 28, call b): 0.85-1.01x the 64-row block's time where it is the whole row dimension
// (T = 1), but 1.03-1.22x beside whole blocks (h = 8 / 16 at T = 9 / 17): each warpgroup owns
// one of the two stages, so its next tile is copied only after its own MMAs released the stage
// and the copy's latency is not hidden; a seesaw CTA is slower per tile and hides it. So the
// launcher takes it by default only for rows <= 16 (KDTREE_MLA_TAIL). It keeps no phase clocks
// (KDTREE_MLA_CLOCKS) and ignores KDTREE_MLA_ABLATE, and the -DKDTREE_MLA_PRODUCER_Q measurement
// build never takes it (there the Q region is the producer's until the first tile lands, which a
// split without tiles never waits for, and the tail's epilogue writes that region).
namespace sw {
constexpr int TAIL_BAR = BAR_M_A;  // + warpgroup: a tail warpgroup's own barrier (128 threads)
}

// The query row (column) of a thread's value i (0 .. N / 4 - 1) in the m64nN fragments:
// 8 (i / 2) + 2 q4 + i % 2; fragment register 4 (i / 2) + 2 h + i % 2 holds it for key (or dim)
// kr + 8 h.
__device__ __forceinline__ int sw_tail_col(int i, int q4) { return 8 * (i >> 1) + 2 * q4 + (i & 1); }

template <typename E, int N>
__device__ __forceinline__ void sw_tail_mma_s(float (&d)[N / 2], uint64_t a, uint64_t b, int acc) {
  if constexpr (N == 8)
    Wgmma<E>::ss_n8(d, a, b, acc);
  else
    Wgmma<E>::ss_n16(d, a, b, acc);
}

// S^T = K Q^T over the 576 dims (dk: the stage's K, dq: Q^T), two accumulation chains, waited.
template <typename E, int N>
__device__ __forceinline__ void sw_tail_scores(float (&s)[N / 2], float (&s_odd)[N / 2],
                                               uint64_t dk, uint64_t dq) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s[i] = s_odd[i] = 0.f;
  pin(s);  // (written here, before the batch: else ptxas serialises every wgmma, C7511)
  pin(s_odd);
  wg_fence();
#pragma unroll
  for (int ks = 0; ks < DQK / 16; ++ks) {
    const uint64_t ok = static_cast<uint64_t>((ks >> 2) * (sw::SLICE >> 4) + (ks & 3) * 2);
    const uint64_t oq = static_cast<uint64_t>((ks >> 2) * (wg::REGION >> 4) + (ks & 3) * 2);
    if (ks & 1)
      sw_tail_mma_s<E, N>(s_odd, dk + ok, dq + oq, ks > 1);
    else
      sw_tail_mma_s<E, N>(s, dk + ok, dq + oq, ks > 0);
  }
  wg_commit();
  wg_wait<0>();
  pin(s);
  pin(s_odd);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s[i] += s_odd[i];
}

// O^T += V^T P^T: the eight 64-dim slices of V (A, MN-major), 4 k-steps of 16 keys each
// (dp: P^T, K-major, its 8-column atoms sw::GROUP apart), waited.
template <typename E, int N>
__device__ __forceinline__ void sw_tail_pv(float (&o)[8][N / 2], uint64_t dv, uint64_t dp) {
#pragma unroll
  for (int mb = 0; mb < 8; ++mb) pin(o[mb]);
  wg_fence();
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t a = dv + static_cast<uint64_t>(mb * (sw::SLICE >> 4)) + kk * sw::KSTEP_V;
      if constexpr (N == 8)
        Wgmma<E>::ss_n8_ta(o[mb], a, dp + kk * 2, 1);
      else
        Wgmma<E>::ss_n16_ta(o[mb], a, dp + kk * 2, 1);
    }
  wg_commit();
  wg_wait<0>();
#pragma unroll
  for (int mb = 0; mb < 8; ++mb) pin(o[mb]);
}

// The online softmax of S^T down its columns: masks, each column's max across the warpgroup
// (scratch `red`: [4 warps][16], one barrier), P^T as E into `pt` (generic pointer to the rope
// slice of the tile's stage), the running max and sums, and alpha per column.
template <typename E, int N>
__device__ __forceinline__ void sw_tail_softmax(float (&s)[N / 2], float (&m_run)[N / 4],
                                                float (&l_run)[N / 4], float (&alpha)[N / 4],
                                                bool full, const uint64_t (&bits)[N / 4],
                                                float scale, int kr, int q4, int lane, int wi,
                                                float* red, unsigned char* pt, int bar) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    float mx = neg_inf();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float& v = s[4 * (i >> 1) + 2 * h + (i & 1)];
      if (!full && !((bits[i] >> (kr + 8 * h)) & 1ull)) v = neg_inf();
      mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane < 4) red[wi * 16 + sw_tail_col(i, q4)] = mx;
  }
  named_sync(bar, 128);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const int col = sw_tail_col(i, q4);
    float m = red[col];
#pragma unroll
    for (int w = 1; w < 4; ++w) m = fmaxf(m, red[w * 16 + col]);
    const float mnew = fmaxf(m_run[i], m * scale);  // scale > 0: order kept
    const float off = wg_offset(mnew);
    alpha[i] = exp2f(m_run[i] - off);  // 0 while the column has seen no key (-inf - off)
    m_run[i] = mnew;
    float sum = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float e = exp2f(fmaf(s[4 * (i >> 1) + 2 * h + (i & 1)], scale, -off));
      sum += e;
      const int key = kr + 8 * h;
      *reinterpret_cast<uint16_t*>(pt + (col >> 3) * sw::GROUP + swz(col & 7, key >> 3) +
                                   (key & 7) * 2) = static_cast<uint16_t>(Mma<E>::pack(e, 0.f));
    }
    l_run[i] = l_run[i] * alpha[i] + sum;
  }
}

// A tail CTA's consumer warpgroups (tid < 256): warpgroup w takes the tiles of stage w; the last
// row block's first N rows (m0 ..), written as the output (one split) or as partials and LSE.
// Stage releases: each warpgroup arrives at its own stage's EMPTY after its tile, and at the
// other stage's for tile j - 1 once its own tile j has landed (the seesaw kernel's consumers both
// arrive at both stages; the producer refilled stage 1 - w for j + 1 only after both arrivals
// for j - 1, so an arrival for j - 1 cannot count towards a later use of that stage).
template <typename E, int N>
__device__ __forceinline__ void sw_tail(const Params& p, const TileSeq& ts, int b, int split,
                                        int m0, uint32_t sQ, uint32_t sKV, unsigned char* smem,
                                        float* red2, int tid) {
  static_assert(N == 8 || N == 16, "m64n8 or m64n16");
  constexpr uint64_t STAGE_STEP = wg::SMEM_STAGE >> 4;
  const int n = ts.n_tiles;
  const int w = tid >> 7, t = tid & 127, lane = t & 31, wi = t >> 5, q4 = lane & 3;
  const int kr = wi * 16 + (lane >> 2);  // this thread's keys (or dims) kr, kr + 8 of each 64
  uint64_t dq = wg_desc(sQ, 16, 1024);
  uint64_t dk = wg_desc(sKV, 16, sw::GROUP) + w * STAGE_STEP;
  uint64_t dv = wg_desc(sKV, sw::SLICE, sw::GROUP) + w * STAGE_STEP;
  uint64_t dp = wg_desc(sKV + sw::ROPE_SLICE, 16, sw::GROUP) + w * STAGE_STEP;
  unsigned char* pt = smem + wg::SMEM_Q + w * wg::SMEM_STAGE + sw::ROPE_SLICE;
  float* red = red2 + w * 64;
  const int bar = sw::TAIL_BAR + w;
  const float scale = p.qk_scale;
  float o[8][N / 2];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) o[mb][i] = 0.f;
  float m_run[N / 4], l_run[N / 4];
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    m_run[i] = neg_inf();
    l_run[i] = 0.f;
  }
  float s[N / 2], s_odd[N / 2];
#pragma unroll 1
  for (int tile = w; tile < n; tile += 2) {
    // (the descriptors made opaque each tile: hoisted out of the loop, the 36 + 32 k-steps'
    // 64-bit operand descriptors would be held in registers across it and spill)
    asm volatile("" : "+l"(dq), "+l"(dk), "+l"(dv), "+l"(dp));
    const bool full = tile < ts.n_pre && ts.end - (ts.start + tile * wg::BN) >= wg::BN;
    uint64_t bits[N / 4];
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      bits[i] = full ? ~0ull : wg_bits64(p, ts, b, tile, m0 + sw_tail_col(i, q4));
    named_sync(BAR_FULL + w, sw::FULL_COUNT);  // tile landed in stage w
    if (tile >= 1 && tile + 1 < n) named_arrive(BAR_EMPTY + 1 - w, sw::EMPTY_COUNT);  // tile - 1
    sw_tail_scores<E, N>(s, s_odd, dk, dq);
    float alpha[N / 4];
    sw_tail_softmax<E, N>(s, m_run, l_run, alpha, full, bits, scale, kr, q4, lane, wi, red, pt,
                          bar);
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < N / 4; ++i) {
        o[mb][4 * (i >> 1) + (i & 1)] *= alpha[i];
        o[mb][4 * (i >> 1) + 2 + (i & 1)] *= alpha[i];
      }
    fence_async_smem();  // P^T (generic stores) -> this warpgroup's wgmma, after all its stores
    named_sync(bar, 128);
    sw_tail_pv<E, N>(o, dv, dp);
    if (tile + 2 < n) named_arrive(BAR_EMPTY + w, sw::EMPTY_COUNT);  // S^T, V^T, P^T read
  }

  // ---- the two warpgroups' states combined: each finishes its own half of the 512 dims
  // (slices 4 w .. 4 w + 3) with the other's O^T for that half, through the Q region (free once
  // both have passed their last MMAs)
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], off);
  // o[0..3]: this warpgroup's own half of the dims, o[4..7] the other's (a swap in warpgroup 1,
  // by selects: indices stay constant, so the fragments stay in registers)
#pragma unroll
  for (int ms = 0; ms < 4; ++ms)
#pragma unroll
    for (int r = 0; r < N / 2; ++r) {
      const float lo = o[ms][r], hi = o[4 + ms][r];
      o[ms][r] = w == 0 ? lo : hi;
      o[4 + ms][r] = w == 0 ? hi : lo;
    }
  named_sync(BAR_CONSUMERS, wg::CONSUMERS);
  float* xo = reinterpret_cast<float*>(smem);  // [writer][4 slices][64 dims][N]
  float* xl = xo + 2 * 4 * 64 * N;             // [warpgroup][4 warps][N] column sums
  float* xm = xl + 2 * 4 * N;                  // [warpgroup][N] column maxima
#pragma unroll
  for (int ms = 0; ms < 4; ++ms)
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        xo[((w * 4 + ms) * 64 + kr + 8 * h) * N + sw_tail_col(i, q4)] =
            o[4 + ms][4 * (i >> 1) + 2 * h + (i & 1)];
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      xl[(w * 4 + wi) * N + sw_tail_col(i, q4)] = l_run[i];
      if (wi == 0) xm[w * N + sw_tail_col(i, q4)] = m_run[i];
    }
  }
  named_sync(BAR_CONSUMERS, wg::CONSUMERS);
  const float* xo_other = xo + (1 - w) * 4 * 64 * N;
  float a_me[N / 4], a_ot[N / 4];  // the two warpgroups' weights of a column, over its sum
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const int col = sw_tail_col(i, q4);
    float l_me = 0.f, l_ot = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      l_me += xl[(w * 4 + k) * N + col];
      l_ot += xl[((1 - w) * 4 + k) * N + col];
    }
    const float m_me = m_run[i], m_ot = xm[(1 - w) * N + col];
    const float off = wg_offset(fmaxf(m_me, m_ot));
    // (a warpgroup whose column saw no key holds l = 0, O = 0, m = -inf: weight 0, never inf)
    const float am = m_me == neg_inf() ? 0.f : exp2f(wg_offset(m_me) - off);
    const float ao = m_ot == neg_inf() ? 0.f : exp2f(wg_offset(m_ot) - off);
    const float l = l_me * am + l_ot * ao;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    a_me[i] = am * inv;
    a_ot[i] = ao * inv;
    m_run[i] = l > 0.f ? off + __log2f(l) : neg_inf();  // (now the column's LSE)
  }
  const int S = p.num_splits;
  const int64_t rbase = (static_cast<int64_t>(b) * S + split) * p.rows;
  // O (this warpgroup's half of the dims) of column i, dim 64 (4 w + ms) + kr + 8 h
  const auto value = [&](int ms, int i, int h) {
    const int r = 4 * (i >> 1) + 2 * h + (i & 1);
    return o[ms][r] * a_me[i] + xo_other[(ms * 64 + kr + 8 * h) * N + sw_tail_col(i, q4)] * a_ot[i];
  };
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const int row = m0 + sw_tail_col(i, q4);
    if (row >= p.rows) continue;
    if (S == 1) {
      E* dst = static_cast<E*>(p.out) + b * p.so_b + (row / p.H) * p.so_t + (row % p.H) * p.so_h +
               256 * w + kr;
#pragma unroll
      for (int ms = 0; ms < 4; ++ms)
#pragma unroll
        for (int h = 0; h < 2; ++h) dst[64 * ms + 8 * h] = E(value(ms, i, h));
    } else {
      float* dst = p.part + (rbase + row) * RANK + 256 * w + kr;
#pragma unroll
      for (int ms = 0; ms < 4; ++ms)
#pragma unroll
        for (int h = 0; h < 2; ++h) dst[64 * ms + 8 * h] = value(ms, i, h);
      if (w == 0 && t < 4) p.lse[rbase + row] = m_run[i];
    }
  }
}

template <typename E>
__global__ void __launch_bounds__(wg::THREADS, 1) mla_split_seesaw_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + wg::ALIGN - 1) & ~static_cast<uint32_t>(wg::ALIGN - 1);
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sQ = base;
  const uint32_t sKV = sQ + wg::SMEM_Q;
  float* sMa = reinterpret_cast<float*>(smem + wg::SMEM_Q + wg::STAGES * wg::SMEM_STAGE);
  float* sMb = sMa + BLOCK_M;
  float* sSum = sMb + BLOCK_M;  // [warpgroup][row]: the epilogue's row sums
  const uint32_t sBar = smem_u32(sSum + 2 * BLOCK_M);  // TMA mbarriers, one a stage

  const int tid = threadIdx.x;
  griddep_launch_dependents();  // the merge may be scheduled once every CTA has started
  const int m0 = blockIdx.x * BLOCK_M;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const TileSeq ts = wg_tiles(p, split, b);
  const int32_t* pt_row = p.page_table + b * p.spt_b;
  const E* kv = static_cast<const E*>(p.kv);
  const int n = ts.n_tiles;

  if (tid >= wg::CONSUMERS) {
    // ================= producer: half s (64 threads) fills stage s with tiles s, s + 2, ... ==
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(wg::PRODUCER_REGS));
    const int pt = tid - wg::CONSUMERS;
    const int half = pt >> 6;
    const int lt = pt & 63;
    const uint32_t stage = sKV + half * wg::SMEM_STAGE;
#ifdef KDTREE_MLA_PRODUCER_Q  // (a measurement build: the producer copies Q, as in session 13)
    griddep_wait();  // (Q: the kernel before may have written it)
    wg_copy_q<E>(sQ, p, b, m0, pt);
#endif
    const uint32_t bar = sBar + 8 * half;
    if (pt == 0) {
      mbar_init(sBar, 1);
      mbar_init(sBar + 8, 1);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    named_sync(sw::BAR_PRODUCER, 128);  // the mbarriers are initialised
    uint32_t parity = 0;
    // A programmatic dependent launch (split_pdl) starts while the kernel before runs: the prefix
    // tiles (and the page table, the prefix lengths) are read before it has finished, the tree
    // tokens' keys and values (which it may have written) after
    if (half < n) {
      if (half >= ts.n_pre) griddep_wait();
      const bool tma = sw_tma_tile(p, ts, half);
      const int run = tma ? sw_run_slot(p, pt_row, ts, half, lt) : 0;
      sw_fill<E>(stage, run, tma, kv, p, pt_row, ts, half, lt, bar, parity);
    }
#ifdef KDTREE_MLA_PRODUCER_Q
    cp_async_commit();
    cp_async_wait<0>();  // this half's share of Q
    fence_async_smem();
    named_sync(sw::BAR_PRODUCER, 128);  // both halves' shares of Q landed
#else
    fence_async_smem();
#endif
    if (half < n) named_arrive(BAR_FULL + half, sw::FULL_COUNT);
    for (int tile = half + 2; tile < n; tile += 2) {
      if (tile >= ts.n_pre) griddep_wait();
      const bool tma = sw_tma_tile(p, ts, tile);
      const int run = tma ? sw_run_slot(p, pt_row, ts, tile, lt) : 0;
      named_sync(BAR_EMPTY + half, sw::EMPTY_COUNT);  // tile - 2 released by both consumers
      if (!(p.ablate & 1)) sw_fill<E>(stage, run, tma, kv, p, pt_row, ts, tile, lt, bar, parity);
      fence_async_smem();
      named_arrive(BAR_FULL + half, sw::FULL_COUNT);
    }
    return;
  }

  // ================= consumer warpgroups =================================================
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(wg::CONSUMER_REGS));
  griddep_wait();  // Q, the tree mask, the workspace and out: after the kernel before completes
#ifdef KDTREE_MLA_PRODUCER_Q
  constexpr bool tail_cta = false;  // (see sw_tail: its epilogue reuses the Q region)
#else
  const bool tail_cta = p.tail_n > 0 && blockIdx.x == gridDim.x - 1;
#endif
#ifndef KDTREE_MLA_PRODUCER_Q
  // Both consumer warpgroups copy Q (18 copies a thread) while the producer starts on the first
  // tiles at once (the GQA kernel's session-14 change: there the producer's Q copies delayed its
  // first tile by several us).
  wg_copy_q<E, wg::CONSUMERS>(sQ, p, b, m0, tid, tail_cta ? p.tail_n : BLOCK_M);
  cp_async_commit();  // (wait_group waits for committed groups only)
  cp_async_wait<0>();
  fence_async_smem();
  named_sync(BAR_CONSUMERS, wg::CONSUMERS);
  fence_async_smem();  // the other threads' copies -> this thread's wgmma operand reads
#endif
  if (tail_cta) {  // the last row block's <= 16 rows as the N of swapped-operand MMAs
    if (p.tail_n == 8)
      sw_tail<E, 8>(p, ts, b, split, m0, sQ, sKV, smem, sMa, tid);
    else
      sw_tail<E, 16>(p, ts, b, split, m0, sQ, sKV, smem, sMa, tid);
    return;
  }
  const int lane = tid & 31;
  const int w = tid >> 7;            // 0: tiles 2i, O[:, 0:256]; 1: tiles 2i + 1, O[:, 256:512]
  const int wi = (tid >> 5) & 3;     // warp within the warpgroup: rows [16 wi, 16 wi + 16)
  const int g = lane >> 2;
  const int q4 = lane & 3;
  const int r0 = wi * 16 + g;        // CTA rows of this thread's accumulator fragments
  const int r1 = r0 + 8;
  unsigned char* rope0 = smem + wg::SMEM_Q + sw::ROPE_SLICE;  // P_a lives here (stage 0)
  unsigned char* rope1 = rope0 + wg::SMEM_STAGE;               // P_b (stage 1)

  float l_run0 = 0.f, l_run1 = 0.f;  // this thread's 16 keys a row of this warpgroup's P tiles
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  constexpr uint64_t STAGE_STEP = wg::SMEM_STAGE >> 4;  // descriptor start-address units
  constexpr uint64_t KSTEP_V = sw::KSTEP_V;              // 16 keys of V
  const uint64_t dq = wg_desc(sQ, 16, 1024);
  const uint64_t dk = wg_desc(sKV, 16, sw::GROUP) + w * STAGE_STEP;  // own stage's K
  // this warpgroup's V half (dims [256 w, 256 w + 256): slices 4w..4w+3), stage 0 / 1
  const uint64_t dv0 = wg_desc(sKV + 4 * w * sw::SLICE, sw::SLICE, sw::GROUP);
  const uint64_t dv1 = dv0 + STAGE_STEP;
  const uint64_t dpa = wg_desc(sKV + sw::ROPE_SLICE, 16, sw::GROUP);                   // P_a
  const uint64_t dpb = wg_desc(sKV + wg::SMEM_STAGE + sw::ROPE_SLICE, 16, sw::GROUP);  // P_b

  PhaseClocks clk(p.clocks && (tid & 127) == 0);

  float s[32], s_odd[32];
  uint32_t pc[4][4];
  const float scale = p.qk_scale;
  // Each role holds its whole MMA sequences in its own branch (ptxas serialises wgmma in
  // divergent code otherwise, warning C7520), and the pairs loop has no per-pair condition
  // around them: the last tile of an odd count is a tail after the loop.
  // (Session 10 also tried making the two S of a pair take turns, since two at once saturate
  // shared memory: 2.5 % slower than letting both issue S as soon as they can, call f.)
  float2 m_run = make_float2(neg_inf(), neg_inf());
  if (w == 0) {
    int ta = 0;
    for (; ta + 1 < n; ta += 2) {
      const int tb = ta + 1;
      const float2 ma = sw_left_a<E>(o, s, s_odd, pc, l_run0, l_run1, m_run, p, ts, b, ta, m0, r0,
                                     r1, q4, dq, dk, dv0, rope0, sMa, clk);
      clk.stamp(3);
      named_sync(sw::BAR_P_B, 256);  // P_b and m_b written (tile tb landed: warpgroup 1 saw it)
      clk.stamp(4);
      const float2 mb = make_float2(sMb[r0], sMb[r1]);
      const float b0 = exp2f(ma.x - wg_offset(mb.x)), b1 = exp2f(ma.y - wg_offset(mb.y));
      l_run0 *= b0;
      l_run1 *= b1;
      wg_wait<0>();
      pin(o);
      if (ta + 2 < n) named_arrive(BAR_EMPTY + 0, sw::EMPTY_COUNT);  // S_a, V_a[:, :256] read
      wg_rescale(o, b0, b1);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) Wgmma<E>::ss_n256_tb(o, dpb + kk * 2, dv1 + kk * KSTEP_V, 1);
      wg_commit();
      wg_wait<0>();
      pin(o);
      if (tb + 2 < n) named_arrive(BAR_EMPTY + 1, sw::EMPTY_COUNT);  // P_b, V_b[:, :256] read
      m_run = mb;
      clk.stamp(5);
    }
    if (ta < n) {  // the last tile of an odd count (warpgroup 1 adds P_a V_a[:, 256:] only)
      m_run = sw_left_a<E>(o, s, s_odd, pc, l_run0, l_run1, m_run, p, ts, b, ta, m0, r0, r1, q4, dq,
                           dk, dv0, rope0, sMa, clk);
      wg_wait<0>();
      pin(o);
    }
  } else {
    int ta = 0;
    for (; ta + 1 < n; ta += 2) {
      const int tb = ta + 1;
      bool full;
      uint64_t bits0, bits1;
      sw_tile_scores<E>(s, s_odd, full, bits0, bits1, p, ts, b, tb, m0 + r0, m0 + r1, 1, dq, dk, clk);
      // P_a V_a[:, 256:] runs beside this warpgroup's softmax: P_a is relative to m_a, so O_R
      // and this warpgroup's row sums move to m_a first (and to m_b after the softmax)
      const float2 ma = sw_pv_a_right<E>(o, l_run0, l_run1, m_run, sMa, r0, r1, dpa, dv0, clk);
      clk.stamp(3);
      float2 mb;
      const float2 sum = sw_softmax_out<E>(s, pc, full, bits0, bits1, ma, scale, rope1, sMb, r0, r1,
                                           q4, sw::BAR_P_B, mb);
      const float c0 = exp2f(ma.x - wg_offset(mb.x)), c1 = exp2f(ma.y - wg_offset(mb.y));
      l_run0 = l_run0 * c0 + sum.x;
      l_run1 = l_run1 * c1 + sum.y;
      clk.stamp(4);
      wg_wait<0>();  // P_a V_a[:, 256:]
      pin(o);
      if (ta + 2 < n) named_arrive(BAR_EMPTY + 0, sw::EMPTY_COUNT);  // P_a, V_a[:, 256:] read
      wg_rescale(o, c0, c1);
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) Wgmma<E>::rs_n256_tb(o, pc[kk], dv1 + kk * KSTEP_V, 1);
      wg_commit();
      wg_wait<0>();
      pin(o);
      if (tb + 2 < n) named_arrive(BAR_EMPTY + 1, sw::EMPTY_COUNT);  // S_b, V_b[:, 256:] read
      m_run = mb;
      clk.stamp(5);
    }
    if (ta < n) {  // the last tile of an odd count: m_b = m_a
      m_run = sw_pv_a_right<E>(o, l_run0, l_run1, m_run, sMa, r0, r1, dpa, dv0, clk);
      wg_wait<0>();
      pin(o);
    }
  }
  clk.flush(g_wg_clocks[w], n);

  // ---- epilogue: the row sums of both warpgroups' P tiles (both hold the same running max)
  l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 1);
  l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 2);
  l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 1);
  l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 2);
  if (q4 == 0) {
    sSum[w * BLOCK_M + r0] = l_run0;
    sSum[w * BLOCK_M + r1] = l_run1;
  }
  named_sync(BAR_CONSUMERS, wg::CONSUMERS);
  l_run0 = sSum[r0] + sSum[BLOCK_M + r0];
  l_run1 = sSum[r1] + sSum[BLOCK_M + r1];
  wg_store_out<E>(p, o, b, split, m0, r0, r1, q4, w, m_run.x, m_run.y, l_run0, l_run1);
}

// One warpgroup checks the operand layouts of the wgmma kernel on given data (S with m64n32: the
// kernel's m64n64 reads the same K-major layout over twice the rows):
//   d1 (64 x 32)  = a (64 x 64) * bk (32 x 64)^T   (both K-major, as Q and K)
//   d2 (64 x 256) = a (64 x 64) * v (64 x 256)     (v read as the V slices of a KV tile)
// a, bk, v row-major E in global memory; d1, d2 fp32 row-major.
template <typename E>
__global__ void __launch_bounds__(128) mla_wgmma_probe_kernel(const E* a, const E* bk,
                                                              const E* v, float* d1, float* d2,
                                                              int v_lbo, int v_sbo) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const int tid = threadIdx.x;
  // a: one region; bk: 32 rows of a region; v: 4 regions (dims 64 i .. 64 i + 63), 64 key rows
  unsigned char* sa = smem;
  unsigned char* sb = smem + wg::REGION;
  unsigned char* sv = smem + 2 * wg::REGION;
  for (int idx = tid; idx < 64 * 8; idx += 128) {
    const int r = idx >> 3, c = idx & 7;
    *reinterpret_cast<uint4*>(sa + swz(r, c)) = *reinterpret_cast<const uint4*>(a + r * 64 + c * 8);
    if (r < 32)
      *reinterpret_cast<uint4*>(sb + swz(r, c)) = *reinterpret_cast<const uint4*>(bk + r * 64 + c * 8);
  }
  for (int idx = tid; idx < 64 * 32; idx += 128) {
    const int r = idx >> 5, c = idx & 31;  // key r, 16-byte chunk c of 256 dims
    *reinterpret_cast<uint4*>(sv + (c >> 3) * wg::REGION + swz(r, c & 7)) =
        *reinterpret_cast<const uint4*>(v + r * 256 + c * 8);
  }
  fence_async_smem();
  __syncthreads();
  float s[16];
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const uint64_t da = wg_desc(base, 16, 1024);
  const uint64_t db = wg_desc(base + wg::REGION, 16, 1024);
  const uint64_t dv = wg_desc(base + 2 * wg::REGION, v_lbo, v_sbo);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) Wgmma<E>::ss_n32(s, da + kk * 2, db + kk * 2, kk > 0);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) Wgmma<E>::ss_n256_tb(o, da + kk * 2, dv + kk * (16 * 128 >> 4), 1);
  wg_commit();
  wg_wait<0>();
  pin(s);
  pin(o);
  const int lane = tid & 31, wi = tid >> 5;
  const int r0 = wi * 16 + (lane >> 2), c0 = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    d1[r0 * 32 + 8 * j + c0] = s[4 * j];
    d1[r0 * 32 + 8 * j + c0 + 1] = s[4 * j + 1];
    d1[(r0 + 8) * 32 + 8 * j + c0] = s[4 * j + 2];
    d1[(r0 + 8) * 32 + 8 * j + c0 + 1] = s[4 * j + 3];
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    d2[r0 * 256 + 8 * j + c0] = o[4 * j];
    d2[r0 * 256 + 8 * j + c0 + 1] = o[4 * j + 1];
    d2[(r0 + 8) * 256 + 8 * j + c0] = o[4 * j + 2];
    d2[(r0 + 8) * 256 + 8 * j + c0 + 1] = o[4 * j + 3];
  }
}

// The seesaw split kernel is a programmatic dependent of the kernel before it (cudaLaunch-
// AttributeProgrammaticStreamSerialization; KDTREE_CUDA_SPLIT_PDL=0 launches it plainly), as the
// GQA split kernel since session 18: it starts on the SMs that kernel frees and its producer
// reads the page table, the prefix lengths and the prefix's latent cache before that kernel has
// finished. The caller's contract: the kernel launched right before writes none of those (Q, the
// tree tokens' cache entries, the tree mask, the workspace and the output are touched only after
// it has completed). The mma and wgmma kernels launch plainly. (split_pdl, launch_kernel:
// sm90_common.cuh)

template <typename E>
int launch(const Params& p, int B, int kernel, int merge, cudaStream_t stream) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return static_cast<int>(err);
  // raise the dynamic shared-memory limits once per device (host-side only: capture-safe)
  static bool raised[128] = {};
  if (dev < 0 || dev >= 128) return -9;
  if (!raised[dev]) {
    err = cudaFuncSetAttribute(mla_split_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               SMEM_TOTAL);
    if (err != cudaSuccess) return static_cast<int>(err);
    err = cudaFuncSetAttribute(mla_split_wgmma_kernel<E>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, wg::SMEM_TOTAL);
    if (err != cudaSuccess) return static_cast<int>(err);
    err = cudaFuncSetAttribute(mla_split_seesaw_kernel<E>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, sw::SMEM_TOTAL);
    if (err != cudaSuccess) return static_cast<int>(err);
    raised[dev] = true;
  }
  const dim3 grid((p.rows + BLOCK_M - 1) / BLOCK_M, p.num_splits, B);
  if (kernel == 0) {
    mla_split_kernel<E><<<grid, NUM_THREADS, SMEM_TOTAL, stream>>>(p);
  } else if (kernel == 1) {
    mla_split_wgmma_kernel<E><<<grid, wg::THREADS, wg::SMEM_TOTAL, stream>>>(p);
  } else {
    const int rc = launch_kernel(mla_split_seesaw_kernel<E>, grid, dim3(wg::THREADS),
                                 sw::SMEM_TOTAL, stream, split_pdl(), p);
    if (rc != 0) return rc;
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return static_cast<int>(err);
  if (p.num_splits > 1 && merge != MERGE_BY_CALLER) {
    const int rc =
        launch_merge_splits<E, RANK>(merge_params_of(p, 1, p.H), B, stream, merge == MERGE_PDL);
    if (rc != 0) return rc;
  }
  return 0;
}

}  // namespace kdtree_mla

// The seesaw kernel's KV tensor map over the pool (row pitch s_slot elements), 4-D: 64 dims
// (contiguous), 8 keys (a slot apart), the 9 64-dim slices (128 bytes apart), groups of 8 keys;
// one box = a page run of `rows` keys, all slices, landing in the stage layout of sw::GROUP
// (128-byte swizzle, as its wgmma operands read it). Returns 0 or -12.
static int encode_kv_map(CUtensorMap* map, const void* kv, int dtype, int64_t num_slots,
                         int64_t s_slot, int rows) {
  const cuuint64_t dims[4] = {64, 8, static_cast<cuuint64_t>(kdtree_mla::DQK / 64),
                              static_cast<cuuint64_t>(num_slots / 8)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(s_slot) * 2, 128,
                                 static_cast<cuuint64_t>(s_slot) * 16};
  const cuuint32_t box[4] = {64, 8, static_cast<cuuint32_t>(kdtree_mla::DQK / 64),
                             static_cast<cuuint32_t>(rows / 8)};
  return kdtree_sm90::encode_swizzled_map(map, kv, dtype, 4, dims, strides, box) ? -12 : 0;
}

// ------------------------------------------------------------------ C ABI

extern "C" {

// Shared memory (bytes) of one split CTA.
int kdtree_mla_smem_bytes() { return kdtree_mla::SMEM_TOTAL; }

// Query rows per CTA (the M tile).
int kdtree_mla_block_m() { return kdtree_mla::BLOCK_M; }

// Copy the wgmma kernel's phase clocks (20 values, see g_wg_clocks) to `host` and zero them.
int kdtree_mla_wgmma_clocks(unsigned long long* host) {
  cudaError_t err = cudaMemcpyFromSymbol(host, kdtree_mla::g_wg_clocks, 20 * 8);
  if (err != cudaSuccess) return static_cast<int>(err);
  static const unsigned long long zero[20] = {};
  return static_cast<int>(cudaMemcpyToSymbol(kdtree_mla::g_wg_clocks, zero, 20 * 8));
}

// Shared memory (bytes) of one wgmma split CTA.
int kdtree_mla_wgmma_smem_bytes() { return kdtree_mla::wg::SMEM_TOTAL; }

// Run the wgmma operand-layout probe (one warpgroup, see mla_wgmma_probe_kernel) on `stream`.
int kdtree_mla_wgmma_probe(int dtype, const void* a, const void* bk, const void* v, float* d1,
                           float* d2, int v_lbo, int v_sbo, uintptr_t stream) {
  using namespace kdtree_mla;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const int smem = 1024 + 6 * wg::REGION;
  cudaError_t err;
  if (dtype == 0) {
    err = cudaFuncSetAttribute(mla_wgmma_probe_kernel<__nv_bfloat16>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return static_cast<int>(err);
    mla_wgmma_probe_kernel<__nv_bfloat16><<<1, 128, smem, s>>>(
        static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(bk),
        static_cast<const __nv_bfloat16*>(v), d1, d2, v_lbo, v_sbo);
  } else if (dtype == 1) {
    err = cudaFuncSetAttribute(mla_wgmma_probe_kernel<__half>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return static_cast<int>(err);
    mla_wgmma_probe_kernel<__half><<<1, 128, smem, s>>>(
        static_cast<const __half*>(a), static_cast<const __half*>(bk),
        static_cast<const __half*>(v), d1, d2, v_lbo, v_sbo);
  } else {
    return -1;
  }
  return static_cast<int>(cudaGetLastError());
}

// Human-readable text of a launcher return code.
const char* kdtree_mla_error_string(int code) {
  switch (code) {
    case 0: return "success";
    case -1: return "unsupported dtype code (expected 0 = bf16, 1 = fp16)";
    case -2: return "unsupported head dims (expected kv_lora_rank 512, rope 64)";
    case -3: return "page_size must be a power of two";
    case -4: return "expected B >= 1, T >= 1, H >= 1, max_pages >= 1";
    case -5: return "num_splits must be >= 1";
    case -6: return "num_splits > 1 needs the partial and LSE workspace pointers";
    case -7: return "pointer or stride not 16-byte aligned";
    case -8: return "grid dimension too large";
    case -9: return "device ordinal out of range";
    case -10: return "unknown kernel code (expected 0 = mma.sync, 1 = wgmma, 2 = seesaw)";
    case -11: return "KDTREE_MLA_ABLATE bit 2 (no P V MMAs) is not implemented by the seesaw kernel";
    case -12: return "encoding the KV tensor map for TMA failed (cuTensorMapEncodeTiled)";
    case -13: return "the seesaw kernel needs 1 <= num_pages * page_size <= 2^31 - 1";
    case -14: return "merge: expected 0 (the caller merges), 1 or 2 (the CUDA merge in stream order "
                     "or as a programmatic dependent launch, at most 2048 splits)";
    default:
      return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
  }
}

// Launch the split kernel (+ merge when num_splits > 1) on `stream`. Strides are in elements.
// `merge`: 0 leaves the partials to the caller, 1 launches the shared merge in stream order, 2
// as a programmatic dependent of the split kernel (MERGE_BY_CALLER / MERGE_PLAIN / MERGE_PDL).
// Returns 0, a negative argument error (kdtree_mla_error_string) or a cudaError_t value.
int kdtree_mla_tree_launch(int dtype, const void* q_nope, const void* q_pe, const void* kv,
                           const int32_t* page_table, const int32_t* prefix_lens,
                           const int64_t* tree_mask, void* out, float* part, float* lse,
                           int64_t sqn_b, int64_t sqn_t, int64_t sqn_h, int64_t sqp_b,
                           int64_t sqp_t, int64_t sqp_h, int64_t s_slot, int64_t spt_b,
                           int64_t sm_b, int64_t sm_t, int64_t so_b, int64_t so_t, int64_t so_h,
                           int B, int T, int H, int rank, int rope, int page_size, int max_pages,
                           int num_splits, float sm_scale, int kernel, int64_t num_slots,
                           int merge, uintptr_t stream) {
  using namespace kdtree_mla;
  if (dtype != 0 && dtype != 1) return -1;
  if (merge < MERGE_BY_CALLER || merge > MERGE_PDL ||
      (merge != MERGE_BY_CALLER && num_splits > MERGE_MAX_SPLITS))
    return -14;
  if (kernel < 0 || kernel > 2) return -10;
  if (rank != RANK || rope != ROPE) return -2;
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) return -3;
  if (B < 1 || T < 1 || H < 1 || max_pages < 1) return -4;
  if (num_splits < 1) return -5;
  if (num_splits > 1 && (part == nullptr || lse == nullptr)) return -6;
  const auto mis16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) != 0; };
  if (mis16(q_nope) || mis16(q_pe) || mis16(kv) || mis16(part) || (sqn_b | sqn_t | sqn_h) & 7 ||
      (sqp_b | sqp_t | sqp_h) & 7 || (s_slot & 7) || (reinterpret_cast<uintptr_t>(out) & 3) ||
      (so_b | so_t | so_h) & 1)
    return -7;
  if (B > 65535 || num_splits > 65535 || static_cast<int64_t>(H) * T > (1 << 30)) return -8;
  int shift = 0;
  while ((1 << shift) < page_size) ++shift;
  Params p;
  p.q_nope = q_nope;
  p.q_pe = q_pe;
  p.kv = kv;
  p.page_table = page_table;
  p.prefix_lens = prefix_lens;
  p.tree_mask = tree_mask;
  p.out = out;
  p.part = part;
  p.lse = lse;
  p.sqn_b = sqn_b;
  p.sqn_t = sqn_t;
  p.sqn_h = sqn_h;
  p.sqp_b = sqp_b;
  p.sqp_t = sqp_t;
  p.sqp_h = sqp_h;
  p.s_slot = s_slot;
  p.spt_b = spt_b;
  p.sm_b = sm_b;
  p.sm_t = sm_t;
  p.so_b = so_b;
  p.so_t = so_t;
  p.so_h = so_h;
  p.T = T;
  p.H = H;
  p.rows = H * T;
  p.max_pages = max_pages;
  p.page_shift = shift;
  p.num_splits = num_splits;
  p.qk_scale = sm_scale * 1.4426950408889634f;
  // V operand of the wgmma kernel (MN-major, 128B swizzle): the leading byte offset steps
  // between 64-dim slices (8 KB apart), the stride byte offset between 8-key groups (1 KB).
  // The other assignment gives wrong products (kdtree.kernels.cuda_mla.wgmma_probe, session 9).
  p.v_lbo = static_cast<uint32_t>(wg::REGION);
  p.v_sbo = 1024u;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const char* env_clocks = getenv("KDTREE_MLA_CLOCKS");
  const char* env_ablate = getenv("KDTREE_MLA_ABLATE");
  p.clocks = env_clocks != nullptr && env_clocks[0] == '1';
  p.ablate = env_ablate != nullptr ? atoi(env_ablate) : 0;
  if (kernel == 2 && (p.ablate & 4)) return -11;  // the seesaw kernel has no P V ablation
  if (kernel == 2 && (num_slots < 1 || num_slots > INT32_MAX)) return -13;  // TMA row coordinates
  // The seesaw kernel's whole prefix tiles go through TMA when a page holds >= 8 slots: a box's
  // key groups of 8 (sw::GROUP) must not cross a page, so smaller pages keep the cp.async path;
  // KDTREE_MLA_TMA=0 keeps every tile on cp.async.
  p.tma_rows = 0;
  const char* env_tma = getenv("KDTREE_MLA_TMA");
  // The tail CTA (sw_tail): a last row block of 1-16 rows through swapped-operand MMAs. By
  // default only where it is the whole row dimension (rows <= 16: T = 1 at h = 8 / 16, T = 2 at
  // h = 8), where it was faster (session 28, call b: 0.85-1.01x at T = 1); beside whole blocks
  // (T = 9 / 17 at h = 8 / 16) it was slower, up to 1.22x (each warpgroup holds one of the two
  // stages, so its next tile's copy cannot overlap its MMAs). KDTREE_MLA_TAIL=0 keeps the
  // 64-row block everywhere, =1 takes the tail CTA for every last block of <= 16 rows.
  const char* env_tail = getenv("KDTREE_MLA_TAIL");
  const int tail_rows = p.rows % BLOCK_M;
  const bool tail_any = env_tail != nullptr && env_tail[0] == '1';
  const bool tail_off = env_tail != nullptr && env_tail[0] == '0';
  p.tail_n = kernel == 2 && !tail_off && tail_rows > 0 && tail_rows <= 16 &&
                     (tail_any || p.rows <= 16)
                 ? (tail_rows <= 8 ? 8 : 16)
                 : 0;
  if (kernel == 2 && page_size >= 8 && !(env_tma != nullptr && env_tma[0] == '0')) {
    p.tma_rows = page_size < wg::BN ? page_size : wg::BN;
    const int rc = encode_kv_map(&p.kv_map, kv, dtype, num_slots, s_slot, p.tma_rows);
    if (rc != 0) return rc;
  }
  return dtype == 0 ? launch<__nv_bfloat16>(p, B, kernel, merge, s)
                    : launch<__half>(p, B, kernel, merge, s);
}

}  // extern "C"
