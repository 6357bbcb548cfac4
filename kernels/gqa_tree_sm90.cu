// GQA / MHA tree-verify attention for sm_90 (H100/H200), head dim 128: split-KV, warp-specialised
// wgmma. Semantics identical to kdtree.kernels.tree_attention_triton (kind "gqa"):
//   q [B,T,Hq,D], k_cache / v_cache [num_pages, page_size, Hkv, D], page_table int32
//   [B, max_pages], prefix_lens int32 [B], tree_mask int64 [B,T,W] (bit j%64 of word j//64 of row
//   t: tree token t sees tree token j). Tree tokens' KV sit at logical positions L..L+T-1.
//   out[b,t,h,:] = softmax(scale * q.k) . v over the whole prefix plus the visible tree keys,
//   query head h reading KV head h / G (G = Hq / Hkv). fp32 accumulation, base-2 softmax.
//
// Schedule
//   * Rows: the M dimension packs the G*T query rows of one (request, KV head), row r ->
//     (t = r / G, h = kvh * G + r % G), so each KV tile is read once for all of them. A CTA's
//     consumer warpgroup w takes 64-row block blockIdx.x * blocks + w (`blocks` = the
//     warpgroups, the last block padded; or fewer, with the 1-16 rows past the last whole block
//     in a tail warpgroup of swapped-operand MMAs: tail_rows, wg_first_row); a warpgroup with no
//     rows only keeps the barriers. Two shapes (Cfg below): Wide, 2 consumer warpgroups (128
//     rows) over 128-key tiles in 3 stages; Tall, 3 consumer warpgroups (192 rows) over 64-key
//     tiles in 5 stages, so fewer CTAs read each KV tile from L2 when there are >= 3 row blocks
//     of 64 that do not fill whole 128-row CTAs (the launcher's `wgs` and `tail_blocks`, chosen
//     by kdtree.kernels.cuda_gqa.launch_plan; Wide there measured 5-26 % faster, session 16).
//     WideTail (session 21): Wide's two CTAs a KV head for four whole blocks, with the 1-4 rows
//     past them in a fourth warpgroup of each (kt_warpgroup), which takes the tiles of its CTA's
//     parity (the launcher's split_tail 2).
//   * Grid (row CTAs, num_splits, B * Hkv); the row blocks of one split are the
//     fastest axis, so they run together and read the split's KV from DRAM once (L2 serves the
//     rest). Split s streams prefix keys [s*chunk, min((s+1)*chunk, L)) (chunk a multiple of the
//     tile: the S-th of the prefix and tree tiles), the LAST split
//     also the T tree keys through the ancestor bitmask (kdtree_sm90::split_tiles).
//   * Warp specialisation: each consumer warpgroup copies its own Q rows by cp.async (load_q);
//     a producer warpgroup brings whole prefix tiles by TMA (one 5-D tensor map over both the K
//     and V pools, one box a page run:
//     see kv_off for the stage layout); partial and tree tiles and pages of < 8 slots by
//     zero-filling 16-byte cp.async completing on the stage's mbarrier
//     (cp.async.mbarrier.arrive.noinc). It waits only for a stage to be released (named barrier
//     EMPTY + s).
//   * Consumer warpgroup, per tile j: S_j = Q K_j^T (8 x wgmma.m64nBNk16, both operands from
//     shared memory) is issued together with O += P_{j-1} V_{j-1} (BN / 16 x m64n128k16, P from
//     registers: the accumulator fragments of S are the A fragments of P V, V MN-major); the
//     softmax of S_j runs while P_{j-1} V_{j-1} is still on the tensor cores (FlashAttention-3's
//     intra-warpgroup overlap), then stage j-1 is released and O rescaled. Wide's consumer
//     warpgroups take turns issuing their MMAs (KDTREE_GQA_PINGPONG=1, the default; =2 makes
//     Tall's three take turns in a ring too, measured no faster). Session 24: a row's offset
//     moves only when a score rises more than 2^8 above it (lazy_max, FlashAttention-4's lazy
//     rescale), and the consumers skip the row max on whole tiles while every P stays within
//     that bound (consume_tile's max-free path; Cfg::MAX_FREE; Wide's since session 25).
//   * One split: the CTA writes the normalised output. Several: normalised partials in the
//     input dtype [B, Hkv, S, G*T, 128] (session 22: half the bytes of fp32 to write and merge;
//     the merges add them in fp32) + fp32 base-2 LSE [B, Hkv, S, G*T], merged by the shared
//     merge kernel (sm90_common.cuh, launched by kdtree_gqa_tree_launch) or the caller.
//
// Everything depends only on shapes and device pointers: graph-capturable.
//
// History (session 11, tools/gpu/gqa_phases.py, docs/kernels_notes.md): the first version issued
// every KV copy as 16-byte cp.async from the producer warpgroup, ~3600 cycles a tile, longer than
// the consumers' work; whole prefix tiles now come by TMA. A thread-block cluster of a split's
// row blocks with each TMA tile multicast once into all of them (commits 0dcb8c1..e074de9) was
// slower everywhere (8q/1kv, T=65, 128k: 111 us at its best one-wave split count, against 98 us
// here) and was taken out. Reading the TMA runs' page entries three tiles ahead instead of one
// (commit 140ec86, call i) changed nothing (99.0 against 98.2 us): the box issue's ~2.8k cycles a
// tile are the TMA unit's back-pressure, not the page-table read. The Tall shape (call j) took
// 8q/1kv, T=65, 128k from 98 to 91 us and T=17 from 49 to 44 us (two row-block CTAs -> one).
// Session 12 (calls f-g): at page size 16 the copies alone took 62 of the 90 us at 8q/1kv, T=65,
// 128k, and 43 at page size 64 (4 boxes of 8 KB a tile instead of 16 of 2 KB): the TMA box count
// limits the copies, so a page run's two 64-dim halves now come in one box (kv_off). Session 13:
// K and V of a page run in one box too (one map over both pools), and the rows past the last
// whole 64-row block in a tail warpgroup of swapped-operand MMAs (tail_rows). Session 14: the
// consumers copy Q (the producer's copies of the whole CTA's Q delayed its first tile: 8q/1kv,
// 16k, T=17 21.5 -> 16.0 us); two KV heads' last blocks and tails in one CTA ("head pairs",
// commit c3e89c0) were correct but 1.5x slower (the pair CTA's ring held two tiles a head).
// Session 15 (docs/kernels_notes.md): more keys for the lighter last row CTA at 32q/8kv, T=65
// (commit a30fe46: it too takes ~1.1 us a 64-key tile) and part of the softmax's 2^x on the FMA
// pipe (commit 62de0aa: the softmax is issue-bound) were slower and were taken out. Session 16
// (docs/kernels_notes.md): [3 blocks] [1 block + tail]'s third block shared by tile parity
// (commit 8a6728b) was 3-6 % slower; at T=64 Wide's [2] [2] ran 26 % faster than Tall's [3] [1]
// (launch_plan now takes Wide for whole 128-row CTAs); Tall's two-block CTAs with the tail idle
// ran 17 % faster than [3] [1], and the tail split by tile parity between them (tail_even_cta,
// not one tile ahead: tail_step_serial) 7-13 % faster at 32q/8kv, T=65; the tail's MMAs at
// m64n8 for <= 8 rows another 0.5-1.3 %. Sessions 19-20: Wide's two-block CTAs with the rows
// past them in the producer warps (mma.sync, then wgmma) or in the block warpgroups' own steps
// (four forms) were all slower than the split tail. Session 21: in a warpgroup of their own
// (WideTail, 512 threads) 6-15 % less time at 32q/8kv, T=65.

#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

#include "sm90_common.cuh"

namespace kdtree_gqa {

using namespace kdtree_sm90;

constexpr int D = 128;                   // head dim
constexpr int WG_ROWS = 64;              // query rows per consumer warpgroup
constexpr int Q_REGION = WG_ROWS * 128;  // 64 rows x 64 dims, 128B-swizzled (8 KB)
constexpr int ALIGN = 1024;              // swizzle atoms need 1024-byte aligned regions
constexpr int MAX_STAGES = 5;
constexpr int BAR_EMPTY = 1;                    // + stage: consumers arrive, the producer syncs
constexpr int BAR_TURN = BAR_EMPTY + MAX_STAGES;  // + warpgroup: its turn to issue MMAs (256)
constexpr int BAR_TAIL = BAR_TURN + 3;  // the tail warpgroup's own barrier (128)
constexpr int BAR_Q = BAR_TAIL + 1;     // + warpgroup: its Q rows copied (128)
// The tail warpgroup (tail_rows): up to TAIL_N query rows past the last whole 64-row block, as
// the N of swapped-operand MMAs (m64n8 for at most 8 rows, else m64n16); its P buffers and
// reduction scratch sit in the unused part of its Q region (rows >= TAIL_N of each 64-dim half).
constexpr int TAIL_N = 16;
constexpr int TAIL_P0 = TAIL_N * 128;             // P of even tiles: after Q's 16 rows, half 0
constexpr int TAIL_P1 = Q_REGION + TAIL_N * 128;  // P of odd tiles: the same in half 1
constexpr int TAIL_RED = 6144;                    // [2][4 warps][16] row maxima, [4][16] sums
constexpr int CLOCK_BYTES = 4 * 8 * 4;  // SmemClocks: 8 words for each of 4 warpgroups
// The tail warpgroup of WideTail (kt_warpgroup): 1-4 rows past four whole 64-row blocks in a
// warpgroup of its own beside Wide's two, in the 3 KB Wide's Q and stages leave of the 227 KB
// (no alignment slack: dynamic shared memory starts 1024-aligned, session 19's probe): after the
// stages, Q^T of the tail rows (two 128B-swizzled atoms of 8 rows x 64 dims, 2 KB; rows 0-3 the
// tail rows) and P^T (one atom of 8 rows x 64 keys, 1 KB: a 64-key half's P^T in rows 0-3; rows
// 4-7 are never written, and the O^T columns they feed are never read). Q^T's rows 4-7 --
// columns of the S^T MMAs no tail row uses -- hold the stage mbarriers and the column maxima /
// sums.
constexpr int KEY_TAIL_ROWS = 4;
constexpr int KEY_TAIL_BYTES = 3072;
constexpr int KT_P = 2048;          // P^T's atom
constexpr int KT_BAR = 512;         // mbarriers (Q^T's row 4 of the first atom)
constexpr int KT_RED = KT_BAR + 64;  // [4 warps][4 columns] maxima, then [4 warps][4] sums
// The CTA timeline's record in WideTail (KDTREE_TIMELINE builds: no static shared memory is left
// beside its 227 KB): TL_WORDS words and the warpgroups' countdown in Q^T's rows 4-7 of the
// second atom, which nothing else uses.
constexpr int KT_TL = 1024 + 512;

// A split kernel's shape: CWG consumer warpgroups of 64 rows, BN-key tiles in STAGES stages, the
// producer's and consumers' register budgets (setmaxnreg).
// KEY_TAIL: a tail warpgroup of its own (kt_warpgroup, TAIL_REGS registers) after the producer.
template <int CWG_, int BN_, int STAGES_, int PRODUCER_REGS_, int CONSUMER_REGS_, bool CLOCKS_,
          bool KEY_TAIL_ = false, int TAIL_REGS_ = 0>
struct Cfg {
  static constexpr int CWG = CWG_, BN = BN_, STAGES = STAGES_;
  static constexpr bool CLOCKS = CLOCKS_;  // compile the phase clocks in (their 10 registers)
  static constexpr bool KEY_TAIL = KEY_TAIL_;
  static constexpr int PRODUCER_REGS = PRODUCER_REGS_, CONSUMER_REGS = CONSUMER_REGS_;
  static constexpr int TAIL_REGS = TAIL_REGS_;
  static constexpr int BLOCK_M = WG_ROWS * CWG;
  static constexpr int CONSUMERS = 128 * CWG;
  // + the producer warpgroup (+ the tail warpgroup)
  static constexpr int THREADS = CONSUMERS + 128 + (KEY_TAIL ? 128 : 0);
  static constexpr int KV_REGION = BN * 128;       // BN keys x 64 dims
  static constexpr int SMEM_Q = CWG * 2 * Q_REGION;
  static constexpr int SMEM_STAGE = 4 * KV_REGION;  // BN keys x (K, V) x 128 dims (kv_off)
  static constexpr int SMEM_TOTAL =
      KEY_TAIL ? SMEM_Q + STAGES * SMEM_STAGE + KEY_TAIL_BYTES
               : ALIGN + SMEM_Q + STAGES * SMEM_STAGE + 8 * (STAGES + 1) + CLOCK_BYTES;
  static constexpr uint64_t STAGE_STEP = SMEM_STAGE >> 4;  // descriptor start-address units
  static constexpr int SN = BN / 2;     // S accumulator registers a thread
  static constexpr int KS = BN / 16;    // P V k-steps a tile
  static constexpr int WORDS = BN / 64;  // tree-mask words a tile
  // The consumers' max-free path on whole tiles (consume_tile, session 24), in every shape
  // without register clocks. With them (Wide's measurement build) it spilled its MMA descriptors
  // in the loop and ran up to 6.2 % slower at 32q/8kv, T=17 (session 24, call f), so that build
  // keeps the exact path on every tile.
  static constexpr bool MAX_FREE = !CLOCKS;
  static_assert(SMEM_TOTAL <= 227 * 1024, "GQA kernel shared memory above the sm_90 limit");
  // setmaxnreg moves registers within the CTA's launch allocation: ptxas gives every thread the
  // same count at launch (65536 / THREADS, rounded down to 8), so the warpgroups' counts must sum
  // to no more (384 threads: 504 a thread of each warpgroup). Above it setmaxnreg.inc waits
  // forever (session 19, call a: a 64 + 2 x 224 build deadlocked).
  static_assert(128 * PRODUCER_REGS + CONSUMERS * CONSUMER_REGS + 128 * TAIL_REGS <=
                    (65536 / THREADS) / 8 * 8 * THREADS,
                "register file");
  static_assert(!KEY_TAIL || (BN == 128 && CWG == 2 && !CLOCKS && 8 * (STAGES + 1) <= 64 &&
                              KT_RED + 128 <= 1024 && TAIL_REGS >= 24),
                "the tail warpgroup: Wide's tiles, its barriers and scratch in Q^T's rows 4-7");
  static_assert(STAGES <= MAX_STAGES && BAR_TURN + CWG <= BAR_TAIL && BAR_Q + CWG <= 16,
                "named barriers");
  static_assert(TAIL_P0 + (BN / 64) * 2048 <= TAIL_RED && TAIL_RED + 768 <= Q_REGION &&
                    TAIL_P1 + (BN / 64) * 2048 <= 2 * Q_REGION,
                "the tail warpgroup's P buffers and scratch fit its Q region");
  static_assert(BN == 64 || BN == 128, "tiles of 64 or 128 keys");
};
// Two consumer warpgroups (128 rows a CTA) over 128-key tiles: the FlashAttention-3 shape. Its
// phase clocks (PhaseClocks: ten registers a thread, in the consumers and the producer) only in a
// measurement build (KDTREE_CUDA_DEFINES=KDTREE_GQA_WIDE_CLOCKS, tools/gpu/gqa_phases.py), since
// session 25: without them the max-free path fits Wide's 232 registers (4 bytes of spills, one
// store and one load a tile, against two 8-byte descriptor reloads with them).
#ifdef KDTREE_GQA_WIDE_CLOCKS
constexpr bool kWideClocks = true;
#else
constexpr bool kWideClocks = false;
#endif
// The ring's depth is a measurement knob (session 35: whether the KV stream's pace follows the
// bytes a CTA keeps in flight; it does not): KDTREE_CUDA_DEFINES=KDTREE_GQA_WIDE_STAGES=n or
// KDTREE_GQA_TALL_STAGES=n.
#ifndef KDTREE_GQA_WIDE_STAGES
#define KDTREE_GQA_WIDE_STAGES 3
#endif
#ifndef KDTREE_GQA_TALL_STAGES
#define KDTREE_GQA_TALL_STAGES 5
#endif
using Wide = Cfg<2, 128, KDTREE_GQA_WIDE_STAGES, 40, 232, kWideClocks>;
// Wide with a tail warpgroup of its own for 1-4 rows past four whole blocks (32q/8kv at T=65),
// session 21: 512 threads, 64K registers: the block warpgroups at 224 (below it ptxas serialises
// their wgmma, C7512: 200 and 216 did), the tail warpgroup at 40 (one S^T and one O^T
// accumulator), the producer at 24 (2 x 128 x 224 + 128 x 40 + 128 x 24).
using WideTail = Cfg<2, 128, 3, 24, 224, false, true, 40>;
// Three consumer warpgroups (192 rows a CTA, so fewer CTAs read each KV tile) over 64-key
// tiles. 512 threads leave ptxas 160 registers a consumer thread (128 x 32 + 384 x 160 = 64K):
// the S, P and O fragments fit, PhaseClocks' ten registers do not (spills), so its clocks sum
// in shared memory, in a measurement build only (SmemClocks, TallClocks).
using Tall = Cfg<3, 64, KDTREE_GQA_TALL_STAGES, 32, 160, false>;

// Phase clocks summed in shared memory (KDTREE_GQA_CLOCKS=1 in the Tall shape's measurement
// build, session 15): one register for the last stamp; each stamp adds the cycles since the
// last one to this thread's row of 8 words at `row` (CLOCK_BYTES after the stage mbarriers),
// flushed to g_gqa_clocks like PhaseClocks'.
struct SmemClocks {
  bool on;
  unsigned t;
  uint32_t row;
  __device__ __forceinline__ SmemClocks(bool enabled, uint32_t row_addr)
      : on(enabled), t(0u), row(row_addr) {
    if (on) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(row + 4 * i), "r"(0u) : "memory");
      t = clock();
    }
  }
  __device__ __forceinline__ void stamp(int i) {
    if (on) {
      const unsigned now = clock();
      asm volatile("red.shared.add.u32 [%0], %1;\n" ::"r"(row + 4 * i), "r"(now - t) : "memory");
      t = now;
    }
  }
  __device__ __forceinline__ void flush(unsigned long long* out, int tiles) const {
    if (!on) return;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      unsigned v;
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(row + 4 * i) : "memory");
      atomicAdd(out + i, static_cast<unsigned long long>(v));
    }
    atomicAdd(out + 8, static_cast<unsigned long long>(tiles));
    atomicAdd(out + 9, 1ull);
  }
};
// PhaseClocks with SmemClocks' constructor (the row address unused).
struct RegClocks : PhaseClocks {
  __device__ __forceinline__ RegClocks(bool enabled, uint32_t) : PhaseClocks(enabled) {}
};
// No clocks (the Tall producer: at 32 registers SmemClocks' two spill).
struct NoClocks {
  __device__ __forceinline__ NoClocks(bool, uint32_t) {}
  __device__ __forceinline__ void stamp(int) {}
  __device__ __forceinline__ void flush(unsigned long long*, int) const {}
};
// The Tall consumers' clocks only in a measurement build (KDTREE_CUDA_DEFINES=
// KDTREE_GQA_TALL_CLOCKS, tools/gpu/gqa_phases.py): compiled in, switched off, they cost the
// default kernel 2-7 % at T=65 (session 15, call b: 32q/8kv, 128k 325 -> 346 us).
#ifdef KDTREE_GQA_TALL_CLOCKS
using TallClocks = SmemClocks;
#else
using TallClocks = NoClocks;
#endif
template <class C>
using ClocksOf = typename std::conditional<
    C::CLOCKS, RegClocks,
    typename std::conditional<C::CWG == 3, TallClocks, NoClocks>::type>::type;
template <class C>
using ProducerClocksOf = typename std::conditional<C::CLOCKS, RegClocks, NoClocks>::type;

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* page_table;
  const int32_t* prefix_lens;
  const int64_t* tree_mask;
  void* out;
  void* part;   // [B, Hkv, S, ws_rows, D] in the input dtype (num_splits > 1)
  float* lse;   // [B, Hkv, S, ws_rows]
  int64_t sq_b, sq_t, sq_h;  // q strides (elements); last dim contiguous
  int64_t sk_slot, sk_h;     // k_cache: between slots (stride(1)), between KV heads (stride(2))
  int64_t sv_slot, sv_h;
  int64_t spt_b;             // page_table row stride
  int64_t sm_b, sm_t;        // tree_mask strides (words)
  int64_t so_b, so_t, so_h;  // out strides
  int T, G, Hkv, rows;       // rows = G * T; Hkv the launch's KV heads (q_groups a cache head)
  int q_groups;              // launch heads a KV head of the cache: launch head h reads cache
                             // head h / q_groups (1, or up to 4: cuda_gqa.q_groups; 2 at
                             // 8q/1kv, T=65: two WideTail halves)
  int blocks;                // 64-row blocks a CTA's consumer warpgroups take (<= CWG)
  int full_rows;             // rows those blocks cover (rows, or the tail's first row)
  int tail_cta, tail_wg;     // the tail warpgroup (tail_rows): CTA x and warpgroup; -1 none
  int tail_even_cta;         // a split tail: this CTA's warpgroup tail_wg takes the tail's even
                             // tiles, tail_cta's the odd ones (their partials in shadow rows
                             // rows .. of the workspace, merged by the CUDA merge); -1 none
  int half_row;              // the merge's shared rows' first (full_rows with a split tail), -1
  int ws_rows;               // the workspace's rows a split: rows (+ TAIL_N with a split tail)
  int max_pages;
  int page_shift;            // log2(page_size)
  int num_splits;
  float qk_scale;            // sm_scale * log2(e)
  int tma_rows;              // rows of one TMA box of kv_map (0: cp.async only)
  int kv_swap;               // 1: V before K in each key group (kv_map's base is the V pool)
  CUtensorMap kv_map;        // both pools as one 5-D map (64 dims; 8 keys; 2 Hkv head halves;
                             // K / V, the pools' distance apart; key groups), boxes {64, 8, 2,
                             // 2, tma_rows / 8}, 128-byte swizzle (encoded on the host per
                             // launch; the stage layout of kv_off)
  int pingpong;              // turns issuing MMAs: 0 none, 1 two-warpgroup shape, 2 both shapes
                             // (KDTREE_GQA_PINGPONG, default 1)
  int clocks;                // accumulate phase clocks (KDTREE_GQA_CLOCKS=1)
  int ablate;                // measurement only (KDTREE_GQA_ABLATE, wrong results; the tail
                             // warpgroup keeps its softmax under bit 3): bit 0 no KV
                             // loads past the first STAGES tiles, bit 3 no softmax (P = S cast),
                             // bit 4 consumers only wait and release (no MMAs, no softmax)
  int trigger;               // when a CTA lets the dependent merge be scheduled
                             // (griddepcontrol.launch_dependents; split_trigger_of, or
                             // KDTREE_GQA_TRIGGER, a measurement knob): 1 at its start, 2 once
                             // its producer has issued its last copy, 3 once a consumer
                             // warpgroup has stored its rows, 0 never (at its exit)
};

// Phase clocks (KDTREE_GQA_CLOCKS=1), summed over CTAs: [w] thread 0 of consumer warpgroup w
// (kdtree.kernels.cuda_gqa.CONSUMER_PHASES; [2] only in the Tall shape), [3] the producer's
// thread 0 (PRODUCER_PHASES).
__device__ unsigned long long g_gqa_clocks[4][10];

// cp.async completion -> one arrival on `bar` (the pending count is not raised: the mbarrier's
// expected count includes these arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Whether tile `tile` goes through TMA: a whole prefix tile inside the page table (partial and
// tree tiles keep the zero-filling cp.async path: a TMA box would bring whatever the unused
// slots of a page hold, and P = 0 times a NaN there is NaN).
template <class C>
__device__ __forceinline__ bool tma_tile(const Params& p, const TileSeq& ts, int tile) {
  if (p.tma_rows == 0 || tile >= ts.n_pre) return false;
  const int pos = ts.start + tile * C::BN;
  return ts.end - pos >= C::BN && ((pos + C::BN - 1) >> p.page_shift) < p.max_pages;
}

// A TMA tile's first slot of page run `lt` (lanes lt < BN / tma_rows issue one run's boxes),
// read before the producer waits for the stage so the page-table read overlaps that wait.
template <class C>
__device__ __forceinline__ int run_slot(const Params& p, const int32_t* pt_row, const TileSeq& ts,
                                        int tile, int lt) {
  if (!tma_tile<C>(p, ts, tile) || lt * p.tma_rows >= C::BN) return 0;
  const int pos = ts.start + tile * C::BN + lt * p.tma_rows;
  return (__ldg(pt_row + (pos >> p.page_shift)) << p.page_shift) + (pos & ((1 << p.page_shift) - 1));
}

// The first packed query row of consumer warpgroup w of this CTA, -1 when it has none; `tail`:
// it is the tail warpgroup (rows full_rows .. rows - 1, at most TAIL_N). Warpgroup w < blocks
// takes 64-row block blockIdx.x * blocks + w.
__device__ __forceinline__ int wg_first_row(const Params& p, int w, bool& tail) {
  const int x = static_cast<int>(blockIdx.x);
  tail = (x == p.tail_cta || x == p.tail_even_cta) && w == p.tail_wg;
  if (tail) return p.full_rows;
  if (w >= p.blocks) return -1;
  const int first = (static_cast<int>(blockIdx.x) * p.blocks + w) * WG_ROWS;
  return first < p.full_rows ? first : -1;
}

// A consumer warpgroup's copies of its own query rows (thread t of 128): row r (of `nrows`, 64,
// or TAIL_N for the tail warpgroup, the rest of whose region holds its P buffers) -> its two
// 64-dim slices at sQw; rows past G*T are zero-filled. The warpgroup waits for all of them.
// (Session 13's producer copied the whole CTA's Q before its first KV tile: 16 or 24 copies a
// thread and their index arithmetic on the producer's critical path; call c of session 14
// measured the first tiles' TMA issued before Q 1.4-2.7 us slower: the copies' order matters.)
template <typename E>
__device__ __forceinline__ void load_q(uint32_t sQw, const Params& p, int b, int kvh, int first,
                                       int nrows, int w, int t) {
  const E* q = static_cast<const E*>(p.q) + b * p.sq_b;
  const int c = t & 15;
  for (int r = t >> 4; r < nrows; r += 8) {
    const int row = first + r;
    const bool valid = row < p.rows;
    const int tok = valid ? row / p.G : 0;
    const int h = valid ? kvh * p.G + row - tok * p.G : 0;
    cp_async16(sQw + (c >> 3) * Q_REGION + swz(r, c & 7), q + tok * p.sq_t + h * p.sq_h + c * 8,
               valid ? 16 : 0);
  }
  cp_async_commit();  // (wait_group waits for committed groups only)
  cp_async_wait<0>();
  fence_async_smem();
  named_sync(BAR_Q + w, 128);
  fence_async_smem();  // the other threads' copies -> this thread's wgmma operand reads
}

#ifdef KDTREE_GQA_PRODUCER_Q  // (a measurement build: the producer copies Q first, session 13)
// The producer's copies of the CTA's query rows: warpgroup w's row r -> its two 64-dim slices;
// rows past G*T are zero-filled. The tail warpgroup gets its TAIL_N rows only (the rest of its
// region holds its P buffers).
template <class C, typename E>
__device__ __forceinline__ void copy_q(uint32_t sQ, const Params& p, int b, int kvh, int pt) {
  const E* q = static_cast<const E*>(p.q);
  for (int idx = pt; idx < C::BLOCK_M * 16; idx += 128) {
    const int w = idx >> 10;
    const int r = (idx >> 4) & 63;
    const int c = idx & 15;
    bool tail;
    const int first = wg_first_row(p, w, tail);
    if (first < 0 || (tail && r >= TAIL_N)) continue;
    const int row = first + r;
    const bool valid = row < p.rows;
    const int t = valid ? row / p.G : 0;
    const int h = valid ? kvh * p.G + row % p.G : 0;
    const E* src = q + b * p.sq_b + t * p.sq_t + h * p.sq_h + c * 8;
    const uint32_t dst = sQ + (w * 2 + (c >> 3)) * Q_REGION + swz(r, c & 7);
    cp_async16(dst, src, valid ? 16 : 0);
  }
}
#endif

// A stage holds BN keys of K and V (BN * 512 bytes), in groups of 8 keys: K's and V's 64-dim
// halves side by side, each a 128B-swizzled atom of 8 keys x 64 dims: [keys 0-7: K dims 0-63,
// K dims 64-127, V dims 0-63, V dims 64-127][keys 8-15: ...] (V first with kv_swap). One TMA box
// then brings a whole page run of both tensors (one 5-D map over both pools: 64 dims, 8 keys, the
// head's two halves, K / V, key groups); the wgmma descriptors step 4096 bytes a group of 8 keys
// (SBO) and 1024 from one half to the other (K: the k-step's start address; V: LBO).
constexpr int KV_GROUP = 4096;  // one group of 8 keys: K and V, both halves
constexpr int KV_PART = 2048;   // K -> V (or V -> K) inside a group
constexpr int KV_HALF = 1024;   // one half's swizzle atom
// Byte offset of key r's chunk c of 64-dim half `half` of the tensor at position `part` (K:
// kv_swap, V: 1 - kv_swap).
__device__ __forceinline__ uint32_t kv_off(int r, int part, int half, int c) {
  return static_cast<uint32_t>((r >> 3) * KV_GROUP + part * KV_PART + half * KV_HALF) +
         swz(r & 7, c);
}

// The producer's copies of one KV tile: keys (pt >> 3) + 16 k (k < BN / 16), chunk pt & 7 of
// each half of K and V (8 adjacent threads read one key's 128 contiguous bytes of a half).
template <class C, typename E, int SWAP>
__device__ __forceinline__ void copy_kv_tile(uint32_t stage, const E* kbase, const E* vbase,
                                             const Params& p, const int32_t* pt_row,
                                             const TileSeq& ts, int tile, int pt) {
  const int sub = pt & 7;
  constexpr uint32_t k_part = SWAP * KV_PART, v_part = (1 - SWAP) * KV_PART;
#pragma unroll 2
  for (int k = 0; k < C::BN / 16; ++k) {
    const int r = (pt >> 3) + 16 * k;
    const int64_t slot = key_slot<C::BN>(p, pt_row, ts, tile, r);
    const int bytes = slot >= 0 ? 16 : 0;
    const E* ks = slot >= 0 ? kbase + slot * p.sk_slot : kbase;
    const E* vs = slot >= 0 ? vbase + slot * p.sv_slot : vbase;
    const uint32_t dst = stage + kv_off(r, 0, 0, sub);
    cp_async16(dst + k_part, ks + sub * 8, bytes);
    cp_async16(dst + k_part + KV_HALF, ks + 64 + sub * 8, bytes);
    cp_async16(dst + v_part, vs + sub * 8, bytes);
    cp_async16(dst + v_part + KV_HALF, vs + 64 + sub * 8, bytes);
  }
}

// Visibility of the BN keys of tile `tile` for query row `row` (one word per 64 keys).
template <class C>
__device__ __forceinline__ void tile_bits(uint64_t (&bits)[C::WORDS], const Params& p,
                                          const TileSeq& ts, int b, int tile, int row) {
  const auto low64 = [](int k) {
    return k >= 64 ? ~0ull : (k <= 0 ? 0ull : ((1ull << k) - 1ull));
  };
  if (tile < ts.n_pre) {
    const int left = ts.end - (ts.start + tile * C::BN);
#pragma unroll
    for (int w = 0; w < C::WORDS; ++w) bits[w] = low64(left - 64 * w);
    return;
  }
#pragma unroll
  for (int w = 0; w < C::WORDS; ++w) bits[w] = 0ull;
  if (row >= p.rows) return;
  const int j0 = (tile - ts.n_pre) * C::BN;  // a multiple of 64: whole mask words
  const int64_t* mrow = p.tree_mask + b * p.sm_b + (row / p.G) * p.sm_t + (j0 >> 6);
#pragma unroll
  for (int w = 0; w < C::WORDS; ++w)
    if (j0 + 64 * w < ts.T)
      bits[w] = static_cast<uint64_t>(__ldg(mrow + w)) & low64(ts.T - j0 - 64 * w);
}

// Whether tile `tile` is a whole prefix tile (no mask).
template <class C>
__device__ __forceinline__ bool tile_is_full(const TileSeq& ts, int tile) {
  return tile < ts.n_pre && ts.end - (ts.start + tile * C::BN) >= C::BN;
}

// S (64 x BN) = Q K^T: 8 k-steps of m64nBNk16, issued and committed (not waited for).
template <class C, typename E>
__device__ __forceinline__ void issue_scores(float (&s)[C::SN], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint64_t oq = static_cast<uint64_t>((ks >> 2) * (Q_REGION >> 4) + (ks & 3) * 2);
    const uint64_t ok = static_cast<uint64_t>((ks >> 2) * (KV_HALF >> 4) + (ks & 3) * 2);
    if constexpr (C::BN == 128)
      Wgmma<E>::ss_n128(s, dq + oq, dk + ok, ks > 0);
    else
      Wgmma<E>::ss_n64(s, dq + oq, dk + ok, ks > 0);
  }
  wg_commit();
}

// O (64 x 128) += P V: BN / 16 k-steps of 16 keys, P from registers, V MN-major; committed.
template <class C, typename E>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pc)[C::KS][4],
                                         uint64_t dv) {
#pragma unroll
  for (int kk = 0; kk < C::KS; ++kk)
    Wgmma<E>::rs_n128_tb(o, pc[kk], dv + kk * (2 * KV_GROUP >> 4), 1);
  wg_commit();
}

// Writes this warpgroup's rows r0, r1 of O (normalised by l0, l1), and with splits the base-2
// log-sum-exp.
template <typename E>
__device__ __forceinline__ void store_out(const Params& p, const float (&o)[64], int b, int kvh,
                                          int split, int row0, int row1, int q4, float m0,
                                          float m1, float l0, float l1) {
  const int S = p.num_splits;
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f;
  const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const bool ok0 = row0 < p.rows;
  const bool ok1 = row1 < p.rows;
  const int col0 = 2 * q4;  // + 8 j
  if (S == 1) {
    E* out = static_cast<E*>(p.out) + b * p.so_b;
    if (ok0) {
      E* dst = out + (row0 / p.G) * p.so_t + (kvh * p.G + row0 % p.G) * p.so_h + col0;
#pragma unroll
      for (int j = 0; j < 16; ++j) Mma<E>::store2(dst + 8 * j, o[4 * j] * inv0, o[4 * j + 1] * inv0);
    }
    if (ok1) {
      E* dst = out + (row1 / p.G) * p.so_t + (kvh * p.G + row1 % p.G) * p.so_h + col0;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        Mma<E>::store2(dst + 8 * j, o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    return;
  }
  const int64_t rbase = ((static_cast<int64_t>(b) * p.Hkv + kvh) * S + split) * p.ws_rows;
  // Partials in the input dtype (session 22), stored a whole 32-byte sector a quad: thread q4
  // holds columns 8 j + 2 q4 (+1) of each 8; a quad's values of 16 columns go round so that it
  // stores columns 16 J + 4 q4 .. + 3 (8 bytes) -- four threads, one sector.
  const int quad = (threadIdx.x & 31) & ~3;
  const int src = quad + 2 * (q4 & 1);  // (the source of the first word; + 1 the second's)
  E* dst0 = static_cast<E*>(p.part) + (rbase + row0) * D + 4 * q4;
  E* dst1 = static_cast<E*>(p.part) + (rbase + row1) * D + 4 * q4;
#pragma unroll
  for (int J = 0; J < 8; ++J) {
    const uint32_t a0 = Mma<E>::pack(o[8 * J] * inv0, o[8 * J + 1] * inv0);
    const uint32_t b0 = Mma<E>::pack(o[8 * J + 4] * inv0, o[8 * J + 5] * inv0);
    const uint32_t a1 = Mma<E>::pack(o[8 * J + 2] * inv1, o[8 * J + 3] * inv1);
    const uint32_t b1 = Mma<E>::pack(o[8 * J + 6] * inv1, o[8 * J + 7] * inv1);
    uint32_t w[4];  // row0's two words, row1's
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t xa0 = __shfl_sync(0xffffffffu, a0, src + h);
      const uint32_t xb0 = __shfl_sync(0xffffffffu, b0, src + h);
      const uint32_t xa1 = __shfl_sync(0xffffffffu, a1, src + h);
      const uint32_t xb1 = __shfl_sync(0xffffffffu, b1, src + h);
      w[h] = q4 < 2 ? xa0 : xb0;
      w[2 + h] = q4 < 2 ? xa1 : xb1;
    }
    if (ok0) *reinterpret_cast<uint2*>(dst0 + 16 * J) = make_uint2(w[0], w[1]);
    if (ok1) *reinterpret_cast<uint2*>(dst1 + 16 * J) = make_uint2(w[2], w[3]);
  }
  if (q4 == 0) {
    if (ok0) p.lse[rbase + row0] = l0 > 0.f ? m0 + __log2f(l0) : neg_inf();
    if (ok1) p.lse[rbase + row1] = l1 > 0.f ? m1 + __log2f(l1) : neg_inf();
  }
}

// One consumer step, tile j >= 1: S_j = Q K_j^T issued together with O += P_{j-1} V_{j-1}
// (`pc`); the online softmax of S_j (into `pn`) runs while the latter is on the tensor cores;
// then stage j-1 is released and O rescaled by alpha_j.
template <class C, typename E>
__device__ __forceinline__ void consume_tile(float (&o)[64], float (&s)[C::SN],
                                             uint32_t (&pc)[C::KS][4], uint32_t (&pn)[C::KS][4],
                                             float& m_run0, float& m_run1, float& l_run0,
                                             float& l_run1, const Params& p, const TileSeq& ts,
                                             int b, int tile, int row0, int row1, int q4,
                                             uint64_t dq, uint64_t dk0, uint64_t dv0,
                                             uint32_t sBar, int turns, int w,
                                             ClocksOf<C>& clk) {
  constexpr int STAGES = C::STAGES;
  const int n = ts.n_tiles;
  const int st = tile % STAGES;
  const int pst = (tile - 1) % STAGES;  // the previous tile's stage
  uint64_t bits0[C::WORDS], bits1[C::WORDS];
  tile_bits<C>(bits0, p, ts, b, tile, row0);
  tile_bits<C>(bits1, p, ts, b, tile, row1);
  const uint64_t dk = dk0 + st * C::STAGE_STEP, dv = dv0 + pst * C::STAGE_STEP;
  mbar_wait(sBar + 8 * st, (tile / STAGES) & 1);
  fence_async_smem();  // the cp.async writes (generic proxy) -> wgmma's operand reads
  clk.stamp(0);
  pin(o);              // the rescale and P_{j-1} complete before the batch starts
  pin(pc);
  if (turns) named_sync(BAR_TURN + w, 256);  // the previous warpgroup issued its batch
  wg_fence();
  issue_scores<C, E>(s, dq, dk);
  issue_pv<C, E>(o, pc, dv);
  // hand the turn to the next warpgroup of the ring (the last one's last batch has no taker:
  // warpgroup 0 is done issuing)
  if (turns && !(w == turns - 1 && tile == n - 1))
    named_arrive(BAR_TURN + (w + 1 == turns ? 0 : w + 1), 256);
  clk.stamp(1);
  wg_wait<1>();  // S_j done (groups retire in order)
  pin(s);
  clk.stamp(2);
  // online softmax of S_j (base 2, the scale folded into the exponent's multiply-add)
  float alpha0 = 1.f, alpha1 = 1.f;
  if (p.ablate & 8) {
#pragma unroll
    for (int kk = 0; kk < C::KS; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) pn[kk][i] = Mma<E>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  } else {
    const float scale = p.qk_scale;
    float2 sum;
    // the exact online softmax: the row max (masked unless `whole`), the running offsets moved
    // past the slack (lazy_max), O's factors, P
    const auto exact = [&](bool whole) {
      const float2 mx = wg_mask_max<C::SN>(s, whole, bits0, bits1, q4);
      const float mnew0 = lazy_max(m_run0, mx.x * scale);  // scale > 0: order kept
      const float mnew1 = lazy_max(m_run1, mx.y * scale);
      const float off0 = wg_offset(mnew0), off1 = wg_offset(mnew1);
      alpha0 = exp2f(m_run0 - off0);
      alpha1 = exp2f(m_run1 - off1);
      m_run0 = mnew0;
      m_run1 = mnew1;
      sum = wg_exp_pack<E>(s, pn, scale, off0, off1);
    };
#ifndef KDTREE_GQA_EXACT_MAX
    if constexpr (!C::MAX_FREE) {  // (register clocks: the exact path on every tile)
      exact(tile_is_full<C>(ts, tile));
    } else if (tile_is_full<C>(ts, tile)) {
      // The max-free path (session 24): P against the running offsets, no row max. Exact where
      // every P <= 2^SLACK, which a thread's partial row sum (its 32 keys of the row, each P >= 0)
      // bounds; a warp with a larger sum (or inf / NaN, or a row with no offset yet) takes the
      // exact path over the same scores (kept in s).
      sum = wg_exp_pack<E, C::SN, true>(s, pn, scale, m_run0, m_run1);
      constexpr float BOUND = static_cast<float>(1u << KDTREE_RESCALE_SLACK);
      const bool ok = sum.x <= BOUND && sum.y <= BOUND && m_run0 != neg_inf() &&
                      m_run1 != neg_inf();
      if (__any_sync(0xffffffffu, !ok)) exact(true);
    } else {
      exact(false);
    }
#else  // (a measurement build: the exact path on every tile, as before session 24)
    exact(tile_is_full<C>(ts, tile));
#endif
    l_run0 = l_run0 * alpha0 + sum.x;
    l_run1 = l_run1 * alpha1 + sum.y;
  }
  clk.stamp(3);
  wg_wait<0>();  // P_{j-1} V_{j-1} done
  pin(o);
  clk.stamp(4);
  if (tile - 1 + STAGES < n) named_arrive(BAR_EMPTY + pst, C::THREADS);  // tile j-1 released
  // O *= alpha_j (skipped when no row of the warp moved)
  if (__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j + 0] *= alpha0;
      o[4 * j + 1] *= alpha0;
      o[4 * j + 2] *= alpha1;
      o[4 * j + 3] *= alpha1;
    }
  }
  clk.stamp(5);
}

// The last tile's O += P V (a whole fence / MMA / commit / wait sequence: callable from either
// side of a branch without ptxas serialising it).
template <class C, typename E>
__device__ __forceinline__ void finish_pv(float (&o)[64], uint32_t (&pc)[C::KS][4], uint64_t dv) {
  pin(o);
  pin(pc);
  wg_fence();
  issue_pv<C, E>(o, pc, dv);
  wg_wait<0>();
  pin(o);
}

// ------------------------------------------------------------------ the tail warpgroup
//
// The rows full_rows .. rows - 1 (at most TAIL_N: the rest of G * T past its whole 64-row
// blocks, G rows at T = 8 k + 1) with the MMA operands swapped, so they cost N = 16 columns of
// the tensor-core work instead of a whole 64-row block (at 32q/8kv, T = 65: 4 rows of 260, a
// fifth of the MMAs as a padded block). Per tile: S^T (BN keys x 16 rows) = K Q^T (m64n16k16,
// A = the stage's K, K-major; B = the tail's Q rows), the online softmax down its columns (a
// row's keys are spread over the four warps: their maxima meet in shared memory), P^T to shared
// memory (the K-major B operand, 128B-swizzled), and O^T (128 dims x 16 rows) += V^T P^T (A = the
// stage's V, MN-major). One tile ahead on S: S^T_{j+1} is issued together with P_{j-1} V_{j-1},
// and the softmax of S^T_j runs while both are on the tensor cores (tail_step).

__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(static_cast<unsigned short>(v))
               : "memory");
}

// The tail's query row (column) of its value i (0..3) in the m64n16 fragments: 8 (i / 2) +
// 2 q4 + i % 2; fragment register 4 (i / 2) + 2 h + i % 2 holds it for key (or dim) kr + 8 h.
__device__ __forceinline__ int tail_col(int i, int q4) { return 8 * (i >> 1) + 2 * q4 + (i & 1); }

// S^T_j = K_j Q^T: KB key blocks of 64, 8 k-steps each; committed.
template <class C, typename E, int TN>
__device__ __forceinline__ void tail_issue_scores(float (&s)[C::BN / 64][TN / 2], uint64_t dq,
                                                  uint64_t dk) {
#pragma unroll
  for (int kb = 0; kb < C::BN / 64; ++kb)
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint64_t oq = static_cast<uint64_t>((ks >> 2) * (Q_REGION >> 4) + (ks & 3) * 2);
      const uint64_t ok = static_cast<uint64_t>(kb * (8 * KV_GROUP >> 4) +
                                                (ks >> 2) * (KV_HALF >> 4) + (ks & 3) * 2);
      if constexpr (TN == 8)
        Wgmma<E>::ss_n8(s[kb], dk + ok, dq + oq, ks > 0);
      else
        Wgmma<E>::ss_n16(s[kb], dk + ok, dq + oq, ks > 0);
    }
  wg_commit();
}

// O^T += V_j^T P_j^T: the two 64-dim halves, BN / 16 k-steps of 16 keys; committed.
template <class C, typename E, int TN>
__device__ __forceinline__ void tail_issue_pv(float (&o)[2][TN / 2], uint64_t dv, uint64_t dp) {
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int kk = 0; kk < C::KS; ++kk)
      if constexpr (TN == 8)
        Wgmma<E>::ss_n8_ta(o[mb], dv + mb * (KV_HALF >> 4) + kk * (2 * KV_GROUP >> 4),
                            dp + (kk >> 2) * (2048 >> 4) + (kk & 3) * 2, 1);
      else
        Wgmma<E>::ss_n16_ta(o[mb], dv + mb * (KV_HALF >> 4) + kk * (2 * KV_GROUP >> 4),
                            dp + (kk >> 2) * (2048 >> 4) + (kk & 3) * 2, 1);
  wg_commit();
}

// The online softmax of S^T_j: masks, the row maxima across the warpgroup (scratch `red`, one
// barrier), P^T_j as E into the buffer at `pb`, the running max / sums, and alpha_j per row.
template <class C, typename E, int TN>
__device__ __forceinline__ void tail_softmax(float (&s)[C::BN / 64][TN / 2],
                                             float (&m_run)[TN / 4], float (&l_run)[TN / 4],
                                             float (&alpha)[TN / 4],
                                             const Params& p, const TileSeq& ts, int b, int tile,
                                             int kr, int q4, int lane, int wi, uint32_t red,
                                             uint32_t pb) {
  constexpr int KB = C::BN / 64;
  const float scale = p.qk_scale;
  const bool full = tile_is_full<C>(ts, tile);
  float mx[TN / 4];
#pragma unroll
  for (int i = 0; i < TN / 4; ++i) {
    uint64_t bits[C::WORDS];
    if (!full) tile_bits<C>(bits, p, ts, b, tile, p.full_rows + tail_col(i, q4));
    mx[i] = neg_inf();
#pragma unroll
    for (int kb = 0; kb < KB; ++kb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& v = s[kb][4 * (i >> 1) + 2 * h + (i & 1)];
        if (!full && !((bits[kb] >> (kr + 8 * h)) & 1ull)) v = neg_inf();
        mx[i] = fmaxf(mx[i], v);
      }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], off));
    if (lane < 4) st_shared_f32(red + (wi * TAIL_N + tail_col(i, q4)) * 4, mx[i]);
  }
  named_sync(BAR_TAIL, 128);
  float off[TN / 4];
#pragma unroll
  for (int i = 0; i < TN / 4; ++i) {
    float m = ld_shared_f32(red + tail_col(i, q4) * 4);
#pragma unroll
    for (int w = 1; w < 4; ++w)
      m = fmaxf(m, ld_shared_f32(red + (w * TAIL_N + tail_col(i, q4)) * 4));
    const float mnew = fmaxf(m_run[i], m * scale);  // scale > 0: order kept
    off[i] = wg_offset(mnew);
    alpha[i] = exp2f(m_run[i] - off[i]);
    m_run[i] = mnew;
  }
#pragma unroll
  for (int i = 0; i < TN / 4; ++i) {
    const int col = tail_col(i, q4);
    float sum = 0.f;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float e = exp2f(fmaf(s[kb][4 * (i >> 1) + 2 * h + (i & 1)], scale, -off[i]));
        sum += e;
        const int key = kr + 8 * h;  // within key block kb
        st_shared_u16(pb + kb * 2048 + (col >> 3) * 1024 + swz(col & 7, key >> 3) + (key & 7) * 2,
                      Mma<E>::pack(e, 0.f));
      }
    l_run[i] = l_run[i] * alpha[i] + sum;
  }
}

// Zeroes S^T's registers before a batch writes them (left holding the last softmax's values, the
// batch's inputs as far as ptxas can tell, every wgmma of the kernel is serialised: C7511).
template <int KB, int R>
__device__ __forceinline__ void tail_fresh(float (&s)[KB][R]) {
#pragma unroll
  for (int kb = 0; kb < KB; ++kb)
#pragma unroll
    for (int i = 0; i < R; ++i) s[kb][i] = 0.f;
#pragma unroll
  for (int kb = 0; kb < KB; ++kb) pin(s[kb]);  // written here, before the caller's wgmma.fence
}

// A split tail's warpgroup does not take tile j - 1 (the other CTA's does): it releases it once
// tile j has landed (the producer issues tiles in order, so it has passed its wait for tile
// j - 1 - STAGES's release, and this arrival cannot count towards that earlier use of the stage).
template <class C>
__device__ __forceinline__ void tail_skip_before(int tile, int n) {
  if (tile - 1 + C::STAGES < n) named_arrive(BAR_EMPTY + (tile - 1) % C::STAGES, C::THREADS);
}

// The end of a tail step: O^T *= alpha_j, then P^T_j published to the next batch.
template <int TN>
__device__ __forceinline__ void tail_rescale_publish(float (&o)[2][TN / 2],
                                                     const float (&alpha)[TN / 4]) {
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int i = 0; i < TN / 4; ++i) {
      o[mb][4 * (i >> 1) + (i & 1)] *= alpha[i];
      o[mb][4 * (i >> 1) + 2 + (i & 1)] *= alpha[i];
    }
  fence_async_smem();  // P^T_j (generic stores) -> the next batch's wgmma, after everyone's
  named_sync(BAR_TAIL, 128);
}

// One tail step, the warpgroup's k-th tile j (k >= 1; its tiles are `step` apart: 1 in the
// layouts that call it, the split tail stepping 2 in tail_step_serial; S^T_j done, in `cur`): S^T_{j+step} (into `nxt`) and O^T += V_prev^T P_prev^T
// (prev = j - step) are issued, the softmax of S^T_j runs while both are on the tensor cores (so
// the tail's S never waits behind the other warpgroups' MMAs on its critical path), then both are
// waited for, stage prev released, O^T rescaled, and P^T_j published to the next batch. The P
// buffers and the maxima scratch alternate with k.
template <class C, typename E, int TN>
__device__ __forceinline__ void tail_step(float (&o)[2][TN / 2],
                                          float (&cur)[C::BN / 64][TN / 2],
                                          float (&nxt)[C::BN / 64][TN / 2],
                                          float (&m_run)[TN / 4], float (&l_run)[TN / 4],
                                          const Params& p, const TileSeq& ts,
                                          int b, int tile, int step, int k, int kr, int q4,
                                          int lane, int wi, uint32_t sQw, uint32_t sBar,
                                          uint64_t dq, uint64_t dk0, uint64_t dv0) {
  constexpr int STAGES = C::STAGES;
  const int n = ts.n_tiles;
  const uint64_t dp0 = wg_desc(sQw + TAIL_P0, 16, 1024), dp1 = wg_desc(sQw + TAIL_P1, 16, 1024);
  pin(o[0]);
  pin(o[1]);
  tail_fresh(nxt);
  // (the last step recomputes its own tile's S^T into `nxt`, discarded: no branch between the
  // fence and the batch, which would make ptxas inject another fence, C7519)
  const bool more = tile + step < n;
  const int nt = more ? tile + step : tile;
  const int st = nt % STAGES;
  if (more) {
    mbar_wait(sBar + 8 * st, (nt / STAGES) & 1);
    if (step == 2) tail_skip_before<C>(nt, n);
    fence_async_smem();
  }
  wg_fence();
  tail_issue_scores<C, E, TN>(nxt, dq, dk0 + st * C::STAGE_STEP);
  const int prev = tile - step;
  const int pst = prev % STAGES;
  tail_issue_pv<C, E, TN>(o, dv0 + pst * C::STAGE_STEP, (k & 1) ? dp0 : dp1);  // P_prev
  float alpha[TN / 4];
  tail_softmax<C, E, TN>(cur, m_run, l_run, alpha, p, ts, b, tile, kr, q4, lane, wi,
                         sQw + TAIL_RED + (k & 1) * (4 * TAIL_N * 4),
                         sQw + ((k & 1) ? TAIL_P1 : TAIL_P0));
  wg_wait<0>();  // S^T_{j+step} and P_prev V_prev done
  pin(o[0]);
  pin(o[1]);
#pragma unroll
  for (int kb = 0; kb < C::BN / 64; ++kb) pin(nxt[kb]);
  if (prev + STAGES < n) named_arrive(BAR_EMPTY + pst, C::THREADS);  // tile prev released
  tail_rescale_publish<TN>(o, alpha);
}

// One step of a split tail's warpgroup, its k-th tile j (k >= 1; its tiles two apart): S^T_j and
// O^T += V_prev^T P_prev^T (prev = j - 2) are issued, the softmax of S^T_j runs once S^T_j is done
// (while P_prev V_prev may still be on the tensor cores), then stage prev is released, O^T
// rescaled and P^T_j published. Not one tile ahead (tail_step): that would hold its tiles j - 2,
// j and j + 2, the five-stage ring's whole span (call h: 381 -> 414 us at 128k), and it has two
// tiles' time for each of its own.
template <class C, typename E, int TN>
__device__ __forceinline__ void tail_step_serial(float (&o)[2][TN / 2],
                                                 float (&sc)[C::BN / 64][TN / 2],
                                                 float (&m_run)[TN / 4], float (&l_run)[TN / 4],
                                                 const Params& p, const TileSeq& ts, int b,
                                                 int tile, int k, int kr, int q4, int lane, int wi,
                                                 uint32_t sQw, uint32_t sBar, uint64_t dq,
                                                 uint64_t dk0, uint64_t dv0) {
  constexpr int STAGES = C::STAGES;
  const int n = ts.n_tiles;
  const uint64_t dp0 = wg_desc(sQw + TAIL_P0, 16, 1024), dp1 = wg_desc(sQw + TAIL_P1, 16, 1024);
  const int st = tile % STAGES;
  mbar_wait(sBar + 8 * st, (tile / STAGES) & 1);
  tail_skip_before<C>(tile, n);
  fence_async_smem();
  pin(o[0]);
  pin(o[1]);
  tail_fresh(sc);
  wg_fence();
  tail_issue_scores<C, E, TN>(sc, dq, dk0 + st * C::STAGE_STEP);
  const int prev = tile - 2;
  const int pst = prev % STAGES;
  tail_issue_pv<C, E, TN>(o, dv0 + pst * C::STAGE_STEP, (k & 1) ? dp0 : dp1);  // P_prev
  wg_wait<1>();  // S^T_j done (groups retire in order)
#pragma unroll
  for (int kb = 0; kb < C::BN / 64; ++kb) pin(sc[kb]);
  float alpha[TN / 4];
  tail_softmax<C, E, TN>(sc, m_run, l_run, alpha, p, ts, b, tile, kr, q4, lane, wi,
                         sQw + TAIL_RED + (k & 1) * (4 * TAIL_N * 4),
                         sQw + ((k & 1) ? TAIL_P1 : TAIL_P0));
  wg_wait<0>();  // P_prev V_prev done
  pin(o[0]);
  pin(o[1]);
  if (prev + STAGES < n) named_arrive(BAR_EMPTY + pst, C::THREADS);  // tile prev released
  tail_rescale_publish<TN>(o, alpha);
}

// The tail's P V of its last tile `tile` (its k-th: P^T in TAIL_P0 / TAIL_P1 by k's parity),
// retired before the row sums.
template <class C, typename E, int TN>
__device__ __forceinline__ void tail_last_pv(float (&o)[2][TN / 2], uint64_t dv0, int tile, int k,
                                             uint32_t sQw) {
  pin(o[0]);
  pin(o[1]);
  wg_fence();
  tail_issue_pv<C, E, TN>(o, dv0 + (tile % C::STAGES) * C::STAGE_STEP,
                          wg_desc(sQw + ((k & 1) ? TAIL_P1 : TAIL_P0), 16, 1024));
  wg_wait<0>();
  pin(o[0]);
  pin(o[1]);
}

// The tail warpgroup's whole split (thread t of 128; its Q rows at sQw, the stages at sKV): every
// tile, or with a split tail (Params::tail_even_cta) the even ones in that CTA and the odd ones
// in tail_cta, whose partials go to the shadow rows.
template <class C, typename E, int SWAP, int TN>
__device__ __forceinline__ void tail_rows(const Params& p, const TileSeq& ts, int b, int kvh,
                                          int split, uint32_t sQw, uint32_t sKV, uint32_t sBar,
                                          int t) {
  constexpr int STAGES = C::STAGES, KB = C::BN / 64;
  const int n = ts.n_tiles;
  const bool halves = p.tail_even_cta >= 0;
  const int t0 = halves && static_cast<int>(blockIdx.x) == p.tail_cta ? 1 : 0;
  constexpr int step = 1;  // (the split tail's own loop below steps 2)
  const int lane = t & 31, wi = t >> 5, q4 = lane & 3;
  const int kr = wi * 16 + (lane >> 2);  // this thread's keys (dims) kr, kr + 8 of each 64
  float o[2][TN / 2];                    // O^T: dims 64 mb + kr (+ 8) x the rows tail_col(i)
  float sa[KB][TN / 2], sb[KB][TN / 2];  // S^T of two tiles: keys 64 kb + kr (+ 8) x the rows
  float m_run[TN / 4], l_run[TN / 4];
#pragma unroll
  for (int i = 0; i < TN / 4; ++i) {
    m_run[i] = neg_inf();
    l_run[i] = 0.f;
  }
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int i = 0; i < TN / 2; ++i) o[mb][i] = 0.f;
  const uint32_t red = sQw + TAIL_RED;  // maxima: [tile parity][4 warps][TAIL_N]
  if (halves && n > t0) {  // (the odd half of a one-tile split has nothing: an empty partial)
    const uint64_t dq = wg_desc(sQw, 16, 1024);
    const uint64_t dk0 = wg_desc(sKV + SWAP * KV_PART, 16, KV_GROUP);
    const uint64_t dv0 = wg_desc(sKV + (1 - SWAP) * KV_PART, KV_HALF, KV_GROUP);
    // ---- its first tile t0: S^T and its softmax
#ifdef KDTREE_GQA_PRODUCER_Q
    mbar_wait(sBar + 8 * STAGES, 0);  // Q
#endif
    mbar_wait(sBar + 8 * (t0 % STAGES), (t0 / STAGES) & 1);
    if (t0 == 1) tail_skip_before<C>(1, n);
    fence_async_smem();
    wg_fence();
    tail_issue_scores<C, E, TN>(sa, dq, dk0 + (t0 % STAGES) * C::STAGE_STEP);
    wg_wait<0>();
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) pin(sa[kb]);
    {
      float alpha[TN / 4];
      tail_softmax<C, E, TN>(sa, m_run, l_run, alpha, p, ts, b, t0, kr, q4, lane, wi, red,
                             sQw + TAIL_P0);
    }
    fence_async_smem();  // P^T_t0 (generic stores) -> the wgmma reads, after everyone's stores
    named_sync(BAR_TAIL, 128);
    // ---- its k-th tiles t0 + 2 k
    int tile = t0 + 2, k = 1;
#pragma unroll 1
    for (; tile < n; tile += 2, ++k)
      tail_step_serial<C, E, TN>(o, sa, m_run, l_run, p, ts, b, tile, k, kr, q4, lane, wi, sQw,
                                 sBar, dq, dk0, dv0);
    // ---- its last tile's P V (tile - 2, the (k - 1)-th; a tile after it is n - 1, which needs
    // no release)
    tail_last_pv<C, E, TN>(o, dv0, tile - 2, k - 1, sQw);
  } else if (!halves && n > 0) {
    const uint64_t dq = wg_desc(sQw, 16, 1024);
    const uint64_t dk0 = wg_desc(sKV + SWAP * KV_PART, 16, KV_GROUP);
    const uint64_t dv0 = wg_desc(sKV + (1 - SWAP) * KV_PART, KV_HALF, KV_GROUP);
    // ---- tile 0: S^T_0, then S^T_1 issued while the softmax of S^T_0 runs
#ifdef KDTREE_GQA_PRODUCER_Q
    mbar_wait(sBar + 8 * STAGES, 0);  // Q
#endif
    mbar_wait(sBar, 0);
    fence_async_smem();
    wg_fence();
    tail_issue_scores<C, E, TN>(sa, dq, dk0);
    wg_wait<0>();
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) pin(sa[kb]);
    tail_fresh(sb);
    const int t1 = 1;
    if (t1 < n) {
      mbar_wait(sBar + 8 * (t1 % STAGES), (t1 / STAGES) & 1);
      fence_async_smem();
    }
    wg_fence();  // (one tile: S^T_0 again, discarded, as in tail_step)
    tail_issue_scores<C, E, TN>(sb, dq, dk0 + (t1 < n ? t1 % STAGES : 0) * C::STAGE_STEP);
    float alpha[TN / 4];
    tail_softmax<C, E, TN>(sa, m_run, l_run, alpha, p, ts, b, 0, kr, q4, lane, wi, red,
                           sQw + TAIL_P0);
    wg_wait<0>();
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) pin(sb[kb]);
    fence_async_smem();  // P^T_0 (generic stores) -> the wgmma reads, after everyone's stores
    named_sync(BAR_TAIL, 128);
    // ---- tiles j >= 1, two a round so S^T_j and S^T_{j+1} live in named registers (sa, sb)
    int tile = t1, k = 1;
#pragma unroll 1
    for (; tile + step < n; tile += 2 * step, k += 2) {
      tail_step<C, E, TN>(o, sb, sa, m_run, l_run, p, ts, b, tile, step, k, kr, q4, lane, wi, sQw,
                      sBar, dq, dk0, dv0);
      tail_step<C, E, TN>(o, sa, sb, m_run, l_run, p, ts, b, tile + step, step, k + 1, kr, q4, lane,
                      wi, sQw, sBar, dq, dk0, dv0);
    }
    if (tile < n) {
      tail_step<C, E, TN>(o, sb, sa, m_run, l_run, p, ts, b, tile, step, k, kr, q4, lane, wi, sQw,
                      sBar, dq, dk0, dv0);
      tile += step;
      ++k;
    }
    // ---- its last tile's P V (tile - step, the (k - 1)-th; a tile after it is n - 1, which
    // needs no release)
    tail_last_pv<C, E, TN>(o, dv0, tile - step, k - 1, sQw);
  }
  // ---- the row sums across the warpgroup, then the rows' output (or partials and LSE)
  const uint32_t sums = red + 2 * (4 * TAIL_N * 4);  // [4 warps][TAIL_N]
#pragma unroll
  for (int i = 0; i < TN / 4; ++i) {
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], off);
    if (lane < 4) st_shared_f32(sums + (wi * TAIL_N + tail_col(i, q4)) * 4, l_run[i]);
  }
  named_sync(BAR_TAIL, 128);
  const int S = p.num_splits;
#pragma unroll
  for (int i = 0; i < TN / 4; ++i) {
    const int row = p.full_rows + tail_col(i, q4);
    if (row >= p.rows) continue;
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) l += ld_shared_f32(sums + (w * TAIL_N + tail_col(i, q4)) * 4);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (S == 1) {
      E* dst = static_cast<E*>(p.out) + b * p.so_b + (row / p.G) * p.so_t +
               (kvh * p.G + row % p.G) * p.so_h;
#pragma unroll
      for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          dst[64 * mb + kr + 8 * h] = E(o[mb][4 * (i >> 1) + 2 * h + (i & 1)] * inv);
    } else {
      const int64_t r = ((static_cast<int64_t>(b) * p.Hkv + kvh) * S + split) * p.ws_rows + row +
                        (t0 == 1 ? p.rows - p.half_row : 0);  // (the odd half: shadow rows)
      E* dst = static_cast<E*>(p.part) + r * D;
#pragma unroll
      for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          dst[64 * mb + kr + 8 * h] = E(o[mb][4 * (i >> 1) + 2 * h + (i & 1)] * inv);
      if (wi == 0 && lane < 4) p.lse[r] = l > 0.f ? m_run[i] + __log2f(l) : neg_inf();
    }
  }
}

// ------------------------------------------------------------------ the tail warpgroup (WideTail)
//
// The 1-4 rows past four whole 64-row blocks (G rows at 32q/8kv, T = 65) beside Wide's two
// 128-row CTAs a KV head: each CTA has a fourth warpgroup (after the producer, 40 registers)
// that takes the tail's tiles of the CTA's parity (x), CTA 1's partials to the merge's shadow
// rows. A tile of its own, a 64-key half at a time: S^T (64 keys x 8 columns) = K Q^T by
// swapped-operand m64n8k16 MMAs (A = the stage's K, B = Q^T), waited for; the online softmax
// down the columns (the four warps' maxima meet in shared memory); P^T published by a barrier;
// O^T (128 dims x 8) += V^T P^T, waited for; after both halves the stage released. A tile of the
// other parity is released once it has landed (the producer has then passed the stage's
// previous release). Off the block
// warpgroups' critical path (sessions 19-20 ran these steps in the producer's and in the block
// warpgroups' own paths, each slower than the Tall split tail), its MMAs take the tensor cores
// ~290 cycles a tile on average, beside the blocks' 2048.

// The descriptor of a tile's K or V at its keys 64 h .. 64 h + 63.
__device__ __forceinline__ uint64_t kt_keys(uint64_t d, int h) {
  return d + static_cast<uint64_t>(h * (8 * KV_GROUP >> 4));
}

// S^T = K Q^T over 64 keys (dk: their first key group): 8 k-steps, not committed.
template <typename E>
__device__ __forceinline__ void kt_issue_scores(float (&s)[4], uint64_t dk, uint64_t dqt) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    Wgmma<E>::ss_n8(s, dk + (ks >> 2) * (KV_HALF >> 4) + (ks & 3) * 2,
                    dqt + (ks >> 2) * (1024 >> 4) + (ks & 3) * 2, ks > 0);
}

// O^T += V^T P^T over 64 keys (dv: their first key group): the two 64-dim halves, 4 k-steps
// each, not committed.
template <typename E>
__device__ __forceinline__ void kt_issue_pv(float (&o)[2][4], uint64_t dv, uint64_t dpt) {
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      Wgmma<E>::ss_n8_ta(o[mb], dv + mb * (KV_HALF >> 4) + kk * (2 * KV_GROUP >> 4),
                         dpt + kk * 2, 1);
}

// Measurement builds of the tail warpgroup (wrong results, timing only): KDTREE_GQA_KT_IDLE, it
// only waits for each tile and releases it; KDTREE_GQA_KT_NO_MMA, no tail MMAs.
#ifdef KDTREE_GQA_KT_IDLE
constexpr bool KT_IDLE = true;
#else
constexpr bool KT_IDLE = false;
#endif
#ifdef KDTREE_GQA_KT_NO_MMA
constexpr bool KT_MMA = false;
#else
constexpr bool KT_MMA = true;
#endif

// The online softmax of the tail's S^T over keys 64 h .. 64 h + 63 of tile `tile` (done, in
// s4): their visibility, the column maxima across the four warps (one barrier), P^T as E into
// rows 0-3 of the P^T atom, the running max / this thread's sums, O^T rescaled, and P^T published
// to the next MMA (a second barrier, which also orders every warp's reads of the maxima before
// the next half's stores).
template <class C, typename E>
__device__ __forceinline__ void kt_half_softmax(float (&s4)[4], float (&o)[2][4],
                                                float (&m_run)[2], float (&l_run)[2],
                                                const Params& p, const TileSeq& ts, int b,
                                                int tile, int h, bool full, uint32_t sKT, int t) {
  const int lane = t & 31, wi = t >> 5, q4 = lane & 3;
  const int kr = wi * 16 + (lane >> 2);
  const bool live = 2 * q4 < KEY_TAIL_ROWS;
  const uint32_t red = sKT + KT_RED;
  const float scale = p.qk_scale;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!full) {
      uint64_t bits[C::WORDS];
      tile_bits<C>(bits, p, ts, b, tile, p.full_rows + 2 * q4 + i);
      const uint64_t word = h ? bits[1] : bits[0];  // (no local array: h is not a constant)
#pragma unroll
      for (int k = 0; k < 2; ++k)
        if (!((word >> (kr + 8 * k)) & 1ull)) s4[2 * k + i] = neg_inf();
    }
    float mx = fmaxf(s4[i], s4[2 + i]);
#pragma unroll
    for (int o4 = 4; o4 < 32; o4 <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o4));
    if (lane < 2) st_shared_f32(red + (wi * 4 + 2 * q4 + i) * 4, mx);  // (q4 0, 1)
  }
  named_sync(BAR_TAIL, 128);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int col = 2 * q4 + i;
    float m = neg_inf();
    if (live) {
#pragma unroll
      for (int v = 0; v < 4; ++v) m = fmaxf(m, ld_shared_f32(red + (v * 4 + col) * 4));
    }
    const float mnew = live ? fmaxf(m_run[i], m * scale) : 0.f;  // scale > 0: order kept
    const float off = wg_offset(mnew);
    const float alpha = live ? exp2f(m_run[i] - off) : 1.f;  // (0 from -inf)
    m_run[i] = mnew;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float e = exp2f(fmaf(s4[2 * k + i], scale, -off));
      sum += e;
      const int key = kr + 8 * k;
      if (live)
        st_shared_u16(sKT + KT_P + swz(col, key >> 3) + (key & 7) * 2, Mma<E>::pack(e, 0.f));
    }
    l_run[i] = l_run[i] * alpha + sum;
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) {
      o[mb][i] *= alpha;
      o[mb][2 + i] *= alpha;
    }
  }
  fence_async_smem();  // P^T (generic stores) -> the wgmma reads, after everyone's stores
  named_sync(BAR_TAIL, 128);
}

// The tail warpgroup's whole split (thread t of 128): Q^T, its tiles' two 64-key halves in turn
// (one S^T and one O^T accumulator: 12 registers of MMA state), its rows' output.
template <class C, typename E, int SWAP>
__device__ __forceinline__ void kt_warpgroup(const Params& p, const TileSeq& ts, int b, int kvh,
                                             int split, uint32_t sKV, uint32_t sKT,
                                             uint32_t sBar, int t) {
  constexpr int STAGES = C::STAGES;
  const int n = ts.n_tiles;
  const int c = static_cast<int>(blockIdx.x);  // its parity (the launcher's two CTAs)
  const int lane = t & 31, wi = t >> 5, q4 = lane & 3;
  const int kr = wi * 16 + (lane >> 2);  // this thread's keys (dims) kr, kr + 8 of each 64
  const bool live = 2 * q4 < KEY_TAIL_ROWS;  // (columns >= 4: Q^T's barrier rows, no tail row)
  const uint32_t red = sKT + KT_RED;
  float o[2][4];  // O^T: dims 64 mb + kr (+ 8) x columns 2 q4 + i
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int mb = 0; mb < 2; ++mb)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[mb][i] = 0.f;
  if (n > c) {
    // Q^T: rows 0-3 of both 64-dim atoms (rows past G*T zero)
    if (t < KEY_TAIL_ROWS * 16) {
      const E* q = static_cast<const E*>(p.q) + b * p.sq_b;
      const int r = t >> 4, h = (t >> 3) & 1, row = p.full_rows + r;
      const bool valid = row < p.rows;
      const int tok = valid ? row / p.G : 0;
      const int hh = valid ? kvh * p.G + row - tok * p.G : 0;
      cp_async16(sKT + h * 1024 + swz(r, t & 7),
                 q + tok * p.sq_t + hh * p.sq_h + (8 * h + (t & 7)) * 8, valid ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_async_smem();
    named_sync(BAR_TAIL, 128);
#pragma unroll 1
    for (int tile = 0; tile < n; ++tile) {
      const int st = tile % STAGES;
      mbar_wait(sBar + 8 * st, (tile / STAGES) & 1);
      if ((tile & 1) != c) {  // the other CTA's: released once landed
        if (tile + STAGES < n) named_arrive(BAR_EMPTY + st, C::THREADS);
        continue;
      }
      fence_async_smem();  // the cp.async writes (generic proxy) -> wgmma's operand reads
      const bool full = tile_is_full<C>(ts, tile);
      const uint64_t dk = wg_desc(sKV + SWAP * KV_PART, 16, KV_GROUP) + st * C::STAGE_STEP;
      const uint64_t dv =
          wg_desc(sKV + (1 - SWAP) * KV_PART, KV_HALF, KV_GROUP) + st * C::STAGE_STEP;
      const uint64_t dqt = wg_desc(sKT, 16, 1024), dpt = wg_desc(sKT + KT_P, 16, 1024);
      if constexpr (!KT_IDLE) {
        // each 64-key half: S^T, its softmax, O^T += V^T P^T, each waited for (issuing the
        // second half's S^T with the first's O^T needs four more registers than the 40: spills)
#pragma unroll 1
        for (int h = 0; h < 2; ++h) {
          float s4[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) s4[i] = 0.f;
          pin(s4);
          wg_fence();
          if constexpr (KT_MMA) kt_issue_scores<E>(s4, kt_keys(dk, h), dqt);
          wg_commit();
          wg_wait<0>();
          pin(s4);
          kt_half_softmax<C, E>(s4, o, m_run, l_run, p, ts, b, tile, h, full, sKT, t);
          pin(o[0]);
          pin(o[1]);
          wg_fence();
          if constexpr (KT_MMA) kt_issue_pv<E>(o, kt_keys(dv, h), dpt);
          wg_commit();
          wg_wait<0>();
          pin(o[0]);
          pin(o[1]);
        }
      }
      if (tile + STAGES < n) named_arrive(BAR_EMPTY + st, C::THREADS);
    }
  }
  // ---- the column sums across the warpgroup, then the rows' output (or partials and LSE)
  const uint32_t sums = red + 64;  // [4 warps][4]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int o4 = 4; o4 < 32; o4 <<= 1) l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], o4);
    if (lane < 2) st_shared_f32(sums + (wi * 4 + 2 * q4 + i) * 4, l_run[i]);
  }
  named_sync(BAR_TAIL, 128);
  const int S = p.num_splits;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int col = 2 * q4 + i;
    const int row = p.full_rows + col;
    if (!live || row >= p.rows) continue;
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) l += ld_shared_f32(sums + (w * 4 + col) * 4);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (S == 1) {
      E* dst = static_cast<E*>(p.out) + b * p.so_b + (row / p.G) * p.so_t +
               (kvh * p.G + row % p.G) * p.so_h;
#pragma unroll
      for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int k = 0; k < 2; ++k) dst[64 * mb + kr + 8 * k] = E(o[mb][2 * k + i] * inv);
    } else {
      const int64_t r = ((static_cast<int64_t>(b) * p.Hkv + kvh) * S + split) * p.ws_rows + row +
                        (c == 1 ? p.rows - p.half_row : 0);  // (CTA 1: shadow rows)
      E* dst = static_cast<E*>(p.part) + r * D;
#pragma unroll
      for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int k = 0; k < 2; ++k) dst[64 * mb + kr + 8 * k] = E(o[mb][2 * k + i] * inv);
      if (wi == 0 && lane < 2) p.lse[r] = l > 0.f ? m_run[i] + __log2f(l) : neg_inf();
    }
  }
}

#ifdef KDTREE_TIMELINE
// The CTA timeline's record of a split CTA in static shared memory (TL_WORDS words, then the
// warpgroups' countdown): the Wide and Tall shapes' (ptxas allocates it only in the kernels that
// reach it; WideTail's is in its dynamic shared memory, KT_TL).
__device__ __forceinline__ unsigned long long* tl_static_record() {
  __shared__ unsigned long long record[TL_WORDS + 1];
  return record;
}
#endif

// SWAP: the stage layout with V before K in each key group (Params::kv_swap).
template <class C, typename E, int SWAP>
__global__ void __launch_bounds__(C::THREADS, 1)
    gqa_split_kernel(const __grid_constant__ Params p) {
  constexpr int STAGES = C::STAGES, BN = C::BN;
  constexpr int CONSUMERS = C::CONSUMERS, THREADS = C::THREADS;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  // (WideTail takes all 227 KB: no slack; dynamic shared memory starts 1024-aligned)
  const uint32_t base =
      C::KEY_TAIL ? raw : (raw + ALIGN - 1) & ~static_cast<uint32_t>(ALIGN - 1);
  if (C::KEY_TAIL && (raw & (ALIGN - 1)) != 0) __trap();
  const uint32_t sQ = base;
  const uint32_t sKV = sQ + C::SMEM_Q;
  const uint32_t sKT = sKV + STAGES * C::SMEM_STAGE;  // the tail warpgroup's Q^T and P^T
  // STAGES mbarriers ("full"), then Q's (used by the -DKDTREE_GQA_PRODUCER_Q build only); in
  // WideTail in Q^T's unused rows
  const uint32_t sBar = C::KEY_TAIL ? sKT + KT_BAR : sKV + STAGES * C::SMEM_STAGE;

  const int tid = threadIdx.x;
  // the merge may be scheduled once every CTA has started, or has exited (split_trigger_of)
  if (p.trigger == 1) griddep_launch_dependents();
  const int split = blockIdx.y;
  const int b = blockIdx.z / p.Hkv;
  const int kvh = blockIdx.z % p.Hkv;
  const TileSeq ts = split_tiles<BN, Params, true>(p, split, b);
  const int n = ts.n_tiles;
  const int32_t* pt_row = p.page_table + b * p.spt_b;
#ifdef KDTREE_TIMELINE
  // (the CTA timeline's measurement build, sm90_common.cuh: each warpgroup's thread 0 stamps
  // its exit; the last one out appends the CTA's record: TL_WORDS words and the warpgroups'
  // countdown, WideTail's in its dynamic shared memory, KT_TL, the other shapes' in static
  // shared memory)
  static_assert(KT_TL + 8 * (TL_WORDS + 1) <= KT_P, "the record fits Q^T's second atom");
  // (its shared-memory address: 32-bit shared accesses, as the static array's were)
  const uint32_t tl_a = C::KEY_TAIL ? raw + C::SMEM_Q + STAGES * C::SMEM_STAGE + KT_TL
                                    : smem_u32(tl_static_record());
  const auto tl_set = [](uint32_t a, unsigned long long v) {
    asm volatile("st.shared.u64 [%0], %1;\n" ::"r"(a), "l"(v) : "memory");
  };
  if (tid == 0) {
    tl_set(tl_a, TL_SPLIT | tl_smid() << 8 | static_cast<unsigned long long>(n) << 32);
    tl_set(tl_a + 8, tl_block_id());
    tl_set(tl_a + 16, tl_now());
#pragma unroll
    for (int k = 3; k <= 6; ++k) tl_set(tl_a + 8 * k, 0ull);
    tl_set(tl_a + 56, static_cast<unsigned long long>(clock64()));
    tl_set(tl_a + 8 * TL_WORDS, THREADS / 128);  // (the countdown: its low word)
  }
  const auto tl_exit = [&]() {
    if ((tid & 127) != 0) return;
    asm volatile("red.shared.max.u64 [%0], %1;\n" ::"r"(tl_a + 48), "l"(tl_now()) : "memory");
    __threadfence_block();
    unsigned left;
    asm volatile("atom.shared.add.u32 %0, [%1], -1;\n"
                 : "=r"(left)
                 : "r"(tl_a + 8 * TL_WORDS)
                 : "memory");
    if (left != 1u) return;
    __threadfence_block();
    unsigned long long w[TL_WORDS];
#pragma unroll
    for (int k = 0; k < TL_WORDS; ++k)
      asm volatile("ld.volatile.shared.u64 %0, [%1];\n" : "=l"(w[k]) : "r"(tl_a + 8 * k) : "memory");
    w[7] = static_cast<unsigned long long>(clock64()) - w[7];
    tl_append(w);
  };
#define GQA_TL_EXIT() tl_exit()
#define GQA_TL_STAMP(k, cond) \
  if ((cond) && (tid & 127) == 0) tl_set(tl_a + 8 * (k), tl_now())
#else
#define GQA_TL_EXIT()
#define GQA_TL_STAMP(k, cond)
#endif

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st <= STAGES; ++st) mbar_init(sBar + 8 * st, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (C::KEY_TAIL && tid >= CONSUMERS + 128) {
    // ================= the tail warpgroup (WideTail) =======================================
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::TAIL_REGS));
    griddep_wait();  // Q, the tree mask, the workspace: after the kernel before completes
    kt_warpgroup<C, E, SWAP>(p, ts, b, kvh, split, sKV, sKT, sBar, tid - CONSUMERS - 128);
    GQA_TL_EXIT();
    return;
  }
  if (tid >= CONSUMERS) {
    // ================= producer warpgroup ==================================================
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::PRODUCER_REGS));
    const int pt = tid - CONSUMERS;
    const int kv_head = kvh / p.q_groups;  // (the cache's)
    const E* kbase = static_cast<const E*>(p.k) + kv_head * p.sk_h;
    const E* vbase = static_cast<const E*>(p.v) + kv_head * p.sv_h;
    ProducerClocksOf<C> clk(p.clocks && pt == 0, sBar + 8 * (STAGES + 1) + 32 * 3);
#ifdef KDTREE_GQA_PRODUCER_Q
    if (n > 0) {
      griddep_wait();  // (Q: the kernel before may have written it)
      copy_q<C, E>(sQ, p, b, kvh, pt);
      cp_async_mbar_arrive(sBar + 8 * STAGES);  // Q's own mbarrier
    }
#endif
    int next_slot = !C::KEY_TAIL && pt < 32 ? run_slot<C>(p, pt_row, ts, 0, pt) : 0;
    for (int tile = 0; tile < n; ++tile) {
      // A programmatic dependent launch (split_pdl) starts while the kernel before runs: the
      // prefix tiles (and the page table, the prefix lengths) are read before it has finished,
      // the tree tokens' keys and values (which it may have written) after
      if (tile == ts.n_pre) griddep_wait();
      const int st = tile % STAGES;
      const uint32_t bar = sBar + 8 * st;
      const uint32_t stage = sKV + st * C::SMEM_STAGE;
      // (WideTail's producer, at 24 registers, reads this tile's slot here, before the wait for
      // the stage as the others' read of the next one: no value carried across tiles)
      const int slot = C::KEY_TAIL ? (pt < 32 ? run_slot<C>(p, pt_row, ts, tile, pt) : 0)
                                   : next_slot;
      if (!C::KEY_TAIL) next_slot = pt < 32 ? run_slot<C>(p, pt_row, ts, tile + 1, pt) : 0;
      if (tile >= STAGES) named_sync(BAR_EMPTY + st, THREADS);  // tile - STAGES released
      clk.stamp(0);
      if (tile >= STAGES && (p.ablate & 1)) {
        mbar_arrive(bar);
      } else if (tma_tile<C>(p, ts, tile)) {
        // one warp: lane 0 sets the byte count (its arrival), lanes < BN / tma_rows issue one
        // page run's box (K and V, both 64-dim halves each); the rest arrive
        if (pt == 0) mbar_expect_tx(bar, C::SMEM_STAGE);
        if (pt < 32) __syncwarp();
        if (pt * p.tma_rows < BN) {
          const uint32_t dst = stage + (pt * p.tma_rows >> 3) * KV_GROUP;
          tma_load_5d(dst, &p.kv_map, 0, 0, 2 * kv_head, 0, slot >> 3, bar);
        }
        if (pt != 0) mbar_arrive(bar);
      } else {
        copy_kv_tile<C, E, SWAP>(stage, kbase, vbase, p, pt_row, ts, tile, pt);
        cp_async_mbar_arrive(bar);
      }
      clk.stamp(1);
      GQA_TL_STAMP(4, tile == 0);
    }
    if (p.trigger == 2 && pt == 0) griddep_launch_dependents();
    cp_async_wait<0>();
    clk.flush(g_gqa_clocks[3], n);
    GQA_TL_EXIT();
    return;
  }

  // ================= consumer warpgroups ===================================================
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::CONSUMER_REGS));
  griddep_wait();  // Q, the tree mask, the workspace and out: after the kernel before completes
  const int lane = tid & 31;
  const int w = tid >> 7;
  const int wi = (tid >> 5) & 3;  // warp within the warpgroup: rows [16 wi, 16 wi + 16)
  const int q4 = lane & 3;
  const int r0 = wi * 16 + (lane >> 2);
  bool tail;
  const int first = wg_first_row(p, w, tail);
#ifdef KDTREE_GQA_NO_TAIL  // (a measurement build without the tail warpgroup's code: it idles)
  const bool idle = first < 0 || (p.ablate & 16) || tail;
#else
  const bool idle = first < 0 || (p.ablate & 16);
#endif
  if (idle) {  // no rows: keep the stage protocol only
    for (int tile = 0; tile < n; ++tile) {
      const int st = tile % STAGES;
      mbar_wait(sBar + 8 * st, (tile / STAGES) & 1);
      if (tile + STAGES < n) named_arrive(BAR_EMPTY + st, THREADS);
    }
    GQA_TL_EXIT();
    return;
  }
#ifndef KDTREE_GQA_PRODUCER_Q
  if (n > 0)
    load_q<E>(sQ + w * 2 * Q_REGION, p, b, kvh, first, tail ? TAIL_N : WG_ROWS, w, tid & 127);
#endif
#ifndef KDTREE_GQA_NO_TAIL
  if (tail) {
    // (m64n8 MMAs for at most 8 rows: 32q/8kv, T=65 has 4; -DKDTREE_GQA_TAIL_N16, a measurement
    // build, keeps m64n16 for any count)
#ifdef KDTREE_GQA_TAIL_N16
    if (false)
#else
    if (p.rows - p.full_rows <= 8)
#endif
      tail_rows<C, E, SWAP, 8>(p, ts, b, kvh, split, sQ + w * 2 * Q_REGION, sKV, sBar, tid & 127);
    else
      tail_rows<C, E, SWAP, 16>(p, ts, b, kvh, split, sQ + w * 2 * Q_REGION, sKV, sBar, tid & 127);
    GQA_TL_EXIT();
    return;
  }
#endif
  const int row0 = first + r0;  // packed rows of this thread's fragments
  const int row1 = row0 + 8;

  const uint64_t dq = wg_desc(sQ + w * 2 * Q_REGION, 16, 1024);
  const uint64_t dk0 = wg_desc(sKV + SWAP * KV_PART, 16, KV_GROUP);
  // V (MN-major, 128B swizzle): the leading byte offset steps between the two 64-dim slices,
  // the stride byte offset between 8-key groups (the MLA kernels' V layout, probed in session 9)
  const uint64_t dv0 = wg_desc(sKV + (1 - SWAP) * KV_PART, KV_HALF, KV_GROUP);

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m_run0 = neg_inf(), m_run1 = neg_inf();
  float l_run0 = 0.f, l_run1 = 0.f;  // this thread's keys of a row (quad-reduced at the end)
  if (n == 0) {  // a split past the prefix: an empty partial (before any wgmma: no divergent MMAs)
    store_out<E>(p, o, b, kvh, split, row0, row1, q4, m_run0, m_run1, l_run0, l_run1);
    GQA_TL_EXIT();
    return;
  }
  const float scale = p.qk_scale;
  float s[C::SN];
  uint32_t pc[C::KS][4], pn[C::KS][4];  // P_{j-1}, P_j: the A fragments of their P V k-steps
  uint64_t bits0[C::WORDS], bits1[C::WORDS];

  ClocksOf<C> clk(p.clocks && (tid & 127) == 0, sBar + 8 * (STAGES + 1) + 32 * w);
  // Turns (FlashAttention-3's ping-pong, extended to a ring of the warpgroups that have rows):
  // they issue their S_j + P V batches in order 0, 1, (2,) 0, ..., so one's softmax runs while
  // the others' MMAs hold the tensor cores. `turns` = the ring's size (0: no turns, fewer than
  // two warpgroups with rows, or KDTREE_GQA_PINGPONG=0; the three-warpgroup shape only with
  // KDTREE_GQA_PINGPONG=2: measured within 4.5 % either way, session 12 call i); its last
  // warpgroup gives warpgroup 0 the first turn.
  // (the 64-row warpgroups with rows are 0 .. with_rows - 1; the tail warpgroup takes no turns)
  const int with_rows =
      min(p.blocks, max(0, p.full_rows - static_cast<int>(blockIdx.x) * p.blocks * WG_ROWS +
                               WG_ROWS - 1) / WG_ROWS);
  const bool ring = p.pingpong == 2 || (p.pingpong == 1 && C::CWG == 2);
  const int turns = ring && with_rows >= 2 ? with_rows : 0;
  if (turns && w == turns - 1 && n > 1) named_arrive(BAR_TURN, 256);
  // ---- tile 0: S_0 and its softmax
  tile_bits<C>(bits0, p, ts, b, 0, row0);
  tile_bits<C>(bits1, p, ts, b, 0, row1);
#ifdef KDTREE_GQA_PRODUCER_Q
  mbar_wait(sBar + 8 * STAGES, 0);  // Q
#endif
  mbar_wait(sBar, 0);
  GQA_TL_STAMP(3, w == 0);
  fence_async_smem();  // the cp.async writes (generic proxy) -> wgmma's operand reads
  wg_fence();
  issue_scores<C, E>(s, dq, dk0);
  wg_wait<0>();
  pin(s);
  {
    const float2 mx = wg_mask_max<C::SN>(s, tile_is_full<C>(ts, 0), bits0, bits1, q4);
    m_run0 = mx.x * scale;
    m_run1 = mx.y * scale;
    const float2 sum = wg_exp_pack<E>(s, pc, scale, wg_offset(m_run0), wg_offset(m_run1));
    l_run0 = sum.x;
    l_run1 = sum.y;
  }

  // ---- tiles j >= 1, two a round so P_{j-1} and P_j live in named registers (pc, pn)
  int tile = 1;
  for (; tile + 1 < n; tile += 2) {
    consume_tile<C, E>(o, s, pc, pn, m_run0, m_run1, l_run0, l_run1, p, ts, b, tile, row0,
                       row1, q4, dq, dk0, dv0, sBar, turns, w, clk);
    consume_tile<C, E>(o, s, pn, pc, m_run0, m_run1, l_run0, l_run1, p, ts, b, tile + 1, row0,
                       row1, q4, dq, dk0, dv0, sBar, turns, w, clk);
  }
  const uint64_t dv_last = dv0 + ((n - 1) % STAGES) * C::STAGE_STEP;
  if (tile < n) {  // an even tile count: the last tile's P lands in pn
    consume_tile<C, E>(o, s, pc, pn, m_run0, m_run1, l_run0, l_run1, p, ts, b, tile, row0, row1,
                       q4, dq, dk0, dv0, sBar, turns, w, clk);
    finish_pv<C, E>(o, pn, dv_last);
  } else {
    finish_pv<C, E>(o, pc, dv_last);
  }

  GQA_TL_STAMP(5, w == 0);
  clk.flush(g_gqa_clocks[w], n);
  l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 1);
  l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, 2);
  l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 1);
  l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, 2);
  store_out<E>(p, o, b, kvh, split, row0, row1, q4, m_run0, m_run1, l_run0, l_run1);
  if (p.trigger == 3) griddep_launch_dependents();
  GQA_TL_EXIT();
}
#undef GQA_TL_EXIT
#undef GQA_TL_STAMP

// The split kernel is a programmatic dependent of the kernel before it (cudaLaunchAttribute-
// ProgrammaticStreamSerialization; KDTREE_CUDA_SPLIT_PDL=0 launches it plainly). It then starts
// on the SMs that kernel frees and reads the page table, the prefix lengths and the prefix's keys
// and values before that kernel has finished: the caller's contract is that the kernel launched
// right before does not write those (Q, the tree tokens' keys and values, the tree mask, the
// workspace and the output are touched only after it has completed). Session 18, call d: 1.0-1.3
// us a call faster at 8q/1kv (3-7 %), 0.9-1.0 at 32q/8kv 16k, 0.3-0.7 slower at 32q/8kv 32k-128k.
// (split_pdl, launch_kernel: sm90_common.cuh)

// When a split CTA lets the dependent merge be scheduled (Params::trigger; KDTREE_GQA_TRIGGER
// forces it): at its exit (0) where the merge is a programmatic dependent of a grid of one CTA
// a split (row_ctas 1) and takes a row a CTA or a row a warp, else at its start (1). Triggered
// at the start, a grid of one CTA a split leaves the SMs it does not fill free while it runs,
// and a merge held to an SM by nothing but its threads and registers crowds its CTAs onto them
// (session 35: the dependent row-a-CTA merge 2.5-3.1 us slower); triggered at the exits it is
// scheduled as the grid drains, onto all of them. Session 41, call a (alternating rounds,
// tools/gpu/stages_s41a.txt): 8q/1kv, batch 1, T=17, 16k-256k, the row-a-CTA merge as a
// dependent at the exit trigger 0.975-0.989x the stream-order merge; the sliced and wide merges
// (four CTAs an SM) keep the start trigger (T 5-13 at the exit trigger 1.02-1.07x from 16k to
// 64k; T=65 level).
template <typename E>
static inline int split_trigger_of(const Params& p, int B, int row_ctas, int merge) {
  if (p.trigger >= 0) return p.trigger;
  if (merge != MERGE_PDL || row_ctas != 1 || p.num_splits == 1) return 1;
  MergeParams mp = merge_params_of(p, p.Hkv, p.G);
  mp.ws_rows = p.ws_rows;
  mp.half_row = p.half_row;
  int cs = 0;
  const MergeForm form = merge_form_of<D, E>(mp, B, true, &cs);
  return form == MERGE_FORM_CTA || form == MERGE_FORM_WARP ? 0 : 1;
}

template <class C, typename E, int SWAP>
int launch_swap(const Params& p_in, int B, int row_ctas, int merge, cudaStream_t stream) {
  Params p = p_in;
  p.trigger = split_trigger_of<E>(p_in, B, row_ctas, merge);
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return static_cast<int>(err);
  static bool raised[128] = {};  // host-side only: capture-safe (one flag per instantiation)
  if (dev < 0 || dev >= 128) return -9;
  if (!raised[dev]) {
    err = cudaFuncSetAttribute(gqa_split_kernel<C, E, SWAP>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_TOTAL);
    if (err != cudaSuccess) return static_cast<int>(err);
    raised[dev] = true;
  }
  const int rc = launch_kernel(gqa_split_kernel<C, E, SWAP>, dim3(row_ctas, p.num_splits, B * p.Hkv),
                               dim3(C::THREADS), C::SMEM_TOTAL, stream, split_pdl(), p);
  if (rc != 0) return rc;
  if (p.num_splits == 1 || merge == MERGE_BY_CALLER) return 0;
  MergeParams mp = merge_params_of(p, p.Hkv, p.G);
  mp.ws_rows = p.ws_rows;
  mp.half_row = p.half_row;
  return launch_merge_splits<E, D, E>(mp, B, stream, merge == MERGE_PDL);
}

template <class C, typename E>
int launch(const Params& p, int B, int row_ctas, int merge, cudaStream_t stream) {
  return p.kv_swap ? launch_swap<C, E, 1>(p, B, row_ctas, merge, stream)
                   : launch_swap<C, E, 0>(p, B, row_ctas, merge, stream);
}

}  // namespace kdtree_gqa

// ------------------------------------------------------------------ C ABI

extern "C" {

// Shared memory, rows a CTA and keys a tile of the split kernel with `wgs` consumer warpgroups
// (2: kdtree_gqa::Wide, 3: Tall); -1 for any other count.
int kdtree_gqa_smem_bytes(int wgs) {
  return wgs == 2 ? kdtree_gqa::Wide::SMEM_TOTAL : (wgs == 3 ? kdtree_gqa::Tall::SMEM_TOTAL : -1);
}
int kdtree_gqa_block_m(int wgs) {
  return wgs == 2 ? kdtree_gqa::Wide::BLOCK_M : (wgs == 3 ? kdtree_gqa::Tall::BLOCK_M : -1);
}
int kdtree_gqa_block_n(int wgs) {
  return wgs == 2 ? kdtree_gqa::Wide::BN : (wgs == 3 ? kdtree_gqa::Tall::BN : -1);
}

// Copy the phase clocks (40 values, see g_gqa_clocks) to `host` and zero them.
int kdtree_gqa_clocks(unsigned long long* host) {
  cudaError_t err = cudaMemcpyFromSymbol(host, kdtree_gqa::g_gqa_clocks, 40 * 8);
  if (err != cudaSuccess) return static_cast<int>(err);
  static const unsigned long long zero[40] = {};
  return static_cast<int>(cudaMemcpyToSymbol(kdtree_gqa::g_gqa_clocks, zero, 40 * 8));
}

// The CTA timeline's records (KDTREE_TIMELINE builds, sm90_common.cuh): copies up to `cap`
// records of TL_WORDS words to `host`, resets the ring and returns how many CTAs appended one
// since the last read (more than `cap` or TL_CAP: the rest were dropped); -1 when this library
// is not a timeline build; a cudaError_t value (> 0 as -(1000 + err)) on a failed copy.
int kdtree_gqa_timeline(unsigned long long* host, int cap) {
#ifdef KDTREE_TIMELINE
  using namespace kdtree_sm90;
  unsigned int count = 0;
  cudaError_t err = cudaMemcpyFromSymbol(&count, g_tl_count, sizeof(count));
  if (err != cudaSuccess) return -(1000 + static_cast<int>(err));
  const unsigned int n = min(count, static_cast<unsigned int>(min(cap, TL_CAP)));
  if (n > 0) err = cudaMemcpyFromSymbol(host, g_tl, n * TL_WORDS * sizeof(unsigned long long));
  if (err != cudaSuccess) return -(1000 + static_cast<int>(err));
  const unsigned int zero = 0;
  err = cudaMemcpyToSymbol(g_tl_count, &zero, sizeof(zero));
  if (err != cudaSuccess) return -(1000 + static_cast<int>(err));
  return static_cast<int>(count);
#else
  (void)host;
  (void)cap;
  return -1;
#endif
}
int kdtree_gqa_timeline_words() { return kdtree_sm90::TL_WORDS; }

const char* kdtree_gqa_error_string(int code) {
  switch (code) {
    case -1: return "dtype code: expected 0 (bfloat16) or 1 (float16)";
    case -2: return "head dim: the CUDA GQA kernel is compiled for 128";
    case -3: return "page_size: expected a power of two";
    case -4: return "shape: expected B, T, Hq, Hkv, max_pages >= 1 and Hq a multiple of Hkv";
    case -5: return "num_splits: expected >= 1";
    case -6: return "num_splits > 1 needs the part / lse workspace";
    case -7: return "alignment: q, k, v and part 16-byte aligned, their strides multiples of 8 "
                    "elements, out 4-byte aligned with even strides";
    case -8: return "grid: B * Hkv * q_groups, num_splits <= 65535 and G * T <= 2^30";
    case -9: return "device ordinal above 127";
    case -10: return "consumer warpgroups: expected 2 (128-key tiles) or 3 (64-key tiles)";
    case -11: return "merge: expected 0 (the caller merges), 1 or 2 (the CUDA merge in stream order "
                     "or as a programmatic dependent launch, at most 2048 splits)";
    case -12: return "KDTREE_GQA_TMA=1: no TMA map over the K / V pools (their slot strides must "
                     "match, heads be 128 contiguous dims, the driver encode the map)";
    case -13: return "tail_blocks: expected 0, or 1 .. wgs 64-row blocks a CTA with 1 .. 16 rows "
                     "past the last whole 64-row block (the tail warpgroup)";
    case -14: return "split_tail: needs 3 warpgroups, tail_blocks 2, an even count >= 4 of whole "
                     "64-row blocks with 1 .. 16 rows past them, num_splits > 1 and the CUDA merge "
                     "(at most 1024 splits)";
    case -15: return "split_tail 2 (the tail warpgroup): needs 2 warpgroups, tail_blocks 2, four "
                     "whole 64-row blocks with 1 .. 4 rows past them, num_splits > 1 and the CUDA "
                     "merge (at most 1024 splits)";
    case -17: return "q_groups: expected >= 1, dividing the Hq / Hkv query heads of a KV head";
    default: return cudaGetErrorString(static_cast<cudaError_t>(code));
  }
}

// Launch the split kernel on `stream` (strides in elements) and, with num_splits > 1 and
// `merge` 1 (in stream order) or 2 (as a programmatic dependent), the shared merge; `merge` 0
// leaves the partials to the caller. `tail_blocks` 0: each CTA's `wgs` consumer warpgroups take
// consecutive 64-row blocks, the last one padded; k >= 1: k whole blocks a CTA and the 1..16
// rows past them in the tail warpgroup (tail_rows), in the last CTA's first free warpgroup (or a
// CTA of their own). `split_tail` 1 (3 warpgroups, tail_blocks 2, an even number >= 4 of whole
// blocks): the last two CTAs' free warpgroups share the tail by tile parity (even: the one before
// the last), the odd half's partials in TAIL_N shadow rows a split (workspace [B, Hkv, S, rows +
// TAIL_N, D] and LSE), added by the CUDA merge. `split_tail` 2 (2 warpgroups, tail_blocks 2,
// four whole blocks and 1-4 rows): WideTail, two CTAs a KV head whose tail warpgroups take the
// tail's tiles by parity, CTA 1's partials in the shadow rows. `q_groups` R: the Hq / Hkv query
// heads of a KV head are launched as R heads of G = Hq / (Hkv R) (rows G * T each, the grid's
// and the workspace's Hkv R heads; launch head h reads the cache's head h / R), so e.g. 8q/1kv
// at T=65 runs as two WideTail halves of 260 rows. 0, a negative argument error or a
// cudaError_t value.
int kdtree_gqa_tree_launch(int dtype, const void* q, const void* k, const void* v,
                           const int32_t* page_table, const int32_t* prefix_lens,
                           const int64_t* tree_mask, void* out, void* part, float* lse,
                           int64_t sq_b, int64_t sq_t, int64_t sq_h, int64_t sk_slot,
                           int64_t sk_h, int64_t sv_slot, int64_t sv_h, int64_t spt_b,
                           int64_t sm_b, int64_t sm_t, int64_t so_b, int64_t so_t, int64_t so_h,
                           int B, int T, int Hq, int Hkv, int head_dim, int page_size,
                           int max_pages, int num_splits, float sm_scale, int64_t num_slots,
                           int wgs, int tail_blocks, int split_tail, int q_groups, int merge,
                           uintptr_t stream) {
  using namespace kdtree_gqa;
  if (dtype != 0 && dtype != 1) return -1;
  if (merge < MERGE_BY_CALLER || merge > MERGE_PDL ||
      (merge != MERGE_BY_CALLER && num_splits > MERGE_MAX_SPLITS))
    return -11;
  if (wgs != 2 && wgs != 3) return -10;
  if (head_dim != D) return -2;
  if (page_size < 1 || (page_size & (page_size - 1)) != 0) return -3;
  if (B < 1 || T < 1 || Hq < 1 || Hkv < 1 || max_pages < 1 || Hq % Hkv != 0) return -4;
  if (q_groups < 1 || (Hq / Hkv) % q_groups != 0) return -17;
  if (num_splits < 1) return -5;
  if (num_splits > 1 && (part == nullptr || lse == nullptr)) return -6;
  const auto mis16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) != 0; };
  if (mis16(q) || mis16(k) || mis16(v) || mis16(part) || (sq_b | sq_t | sq_h) & 7 ||
      (sk_slot | sk_h | sv_slot | sv_h) & 7 || (reinterpret_cast<uintptr_t>(out) & 3) ||
      (so_b | so_t | so_h) & 1)
    return -7;
  const int G = Hq / (Hkv * q_groups);  // a launch head's query heads
  if (static_cast<int64_t>(B) * Hkv * q_groups > 65535 || num_splits > 65535 ||
      static_cast<int64_t>(G) * T > (1 << 30))
    return -8;
  int shift = 0;
  while ((1 << shift) < page_size) ++shift;
  Params p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.page_table = page_table;
  p.prefix_lens = prefix_lens;
  p.tree_mask = tree_mask;
  p.out = out;
  p.part = part;
  p.lse = lse;
  p.sq_b = sq_b;
  p.sq_t = sq_t;
  p.sq_h = sq_h;
  p.sk_slot = sk_slot;
  p.sk_h = sk_h;
  p.sv_slot = sv_slot;
  p.sv_h = sv_h;
  p.spt_b = spt_b;
  p.sm_b = sm_b;
  p.sm_t = sm_t;
  p.so_b = so_b;
  p.so_t = so_t;
  p.so_h = so_h;
  p.T = T;
  p.G = G;
  p.Hkv = Hkv * q_groups;
  p.q_groups = q_groups;
  p.rows = G * T;
  int row_ctas;  // grid.x
  p.tail_cta = p.tail_wg = -1;
  if (tail_blocks == 0) {
    p.blocks = wgs;
    p.full_rows = p.rows;
    row_ctas = (p.rows + wgs * WG_ROWS - 1) / (wgs * WG_ROWS);
  } else {
    const int n_full = p.rows / WG_ROWS, rest = p.rows % WG_ROWS;
    if (tail_blocks < 0 || tail_blocks > wgs || rest < 1 || rest > TAIL_N) return -13;
    p.blocks = tail_blocks;
    p.full_rows = n_full * WG_ROWS;
    row_ctas = (n_full + tail_blocks - 1) / tail_blocks;
    const int last = row_ctas > 0 ? n_full - (row_ctas - 1) * tail_blocks : wgs;
    if (last < wgs) {  // a free warpgroup in the last CTA
      p.tail_cta = row_ctas - 1;
      p.tail_wg = last;
    } else {  // a CTA of its own
      p.tail_cta = row_ctas++;
      p.tail_wg = 0;
    }
  }
  p.tail_even_cta = p.half_row = -1;
  p.ws_rows = p.rows;
  if (split_tail == 2) {  // WideTail: the tail in a warpgroup of its own in both CTAs
    const int n_full = p.full_rows / WG_ROWS;
    if (wgs != 2 || tail_blocks != 2 || n_full != 4 || p.rows - p.full_rows > KEY_TAIL_ROWS ||
        num_splits < 2 || merge == MERGE_BY_CALLER || 2 * num_splits > MERGE_MAX_SPLITS)
      return -15;
    row_ctas = 2;
    p.tail_cta = p.tail_wg = -1;
    p.half_row = p.full_rows;  // CTA 1's partials: shadow rows
    p.ws_rows = p.rows + TAIL_N;
  } else if (split_tail) {
    const int n_full = p.full_rows / WG_ROWS;
    if (wgs != 3 || tail_blocks != 2 || n_full < 4 || n_full % 2 || p.tail_cta != row_ctas - 1 ||
        num_splits < 2 || merge == MERGE_BY_CALLER || 2 * num_splits > MERGE_MAX_SPLITS)
      return -14;
    p.tail_even_cta = row_ctas - 2;  // [2 blocks + even tail tiles] [2 blocks + odd ones]
    p.half_row = p.full_rows;
    p.ws_rows = p.rows + TAIL_N;
  }
  p.max_pages = max_pages;
  p.page_shift = shift;
  p.num_splits = num_splits;
  p.qk_scale = sm_scale * 1.4426950408889634f;
  const char* env_clocks = getenv("KDTREE_GQA_CLOCKS");
  const char* env_ablate = getenv("KDTREE_GQA_ABLATE");
  const char* env_pingpong = getenv("KDTREE_GQA_PINGPONG");
  p.pingpong = env_pingpong == nullptr ? 1 : (env_pingpong[0] == '0' ? 0 : (env_pingpong[0] == '2' ? 2 : 1));
  p.clocks = env_clocks != nullptr && env_clocks[0] == '1';
  p.ablate = env_ablate != nullptr ? atoi(env_ablate) : 0;
  const char* env_trigger = getenv("KDTREE_GQA_TRIGGER");
  p.trigger = env_trigger != nullptr && env_trigger[0] != '\0' ? atoi(env_trigger) : -1;
  // Whole prefix tiles go through TMA when a page holds >= 8 slots: a TMA box's key groups of 8
  // (kv_off) must not cross a page, so smaller pages keep the cp.async path. KDTREE_GQA_TMA=0
  // keeps every tile on cp.async; a layout the driver will not map does too, except under
  // KDTREE_GQA_TMA=1, where that is an error (-12: tests that mean to run the TMA path).
  p.tma_rows = 0;
  p.kv_swap = 0;
  const char* env_tma = getenv("KDTREE_GQA_TMA");
  const bool tma_required = env_tma != nullptr && env_tma[0] == '1';
  if (page_size >= 8 && num_slots >= 1 && num_slots <= INT32_MAX &&
      !(env_tma != nullptr && env_tma[0] == '0')) {
    const int bn = wgs == 2 ? Wide::BN : Tall::BN;
    const int rows = page_size < bn ? page_size : bn;
    // 5-D over both pools: 64 dims (contiguous); 8 keys (a slot apart); the 2 Hkv 64-dim head
    // halves (128 bytes apart: heads of 128 contiguous dims); K / V (the pools' distance apart,
    // the lower pool first); groups of 8 keys. One box = one page run of `rows` keys, both
    // tensors, both halves of the head (kv_off). Pools with other strides keep cp.async.
    const uintptr_t ka = reinterpret_cast<uintptr_t>(k), va = reinterpret_cast<uintptr_t>(v);
    p.kv_swap = va < ka;
    const uint64_t gap = p.kv_swap ? ka - va : va - ka;
    // (one KV head: the halves dimension never steps past the head, whatever its stride)
    const bool heads_ok = Hkv == 1 || (sk_h == D && sv_h == D);
    if (sk_slot == sv_slot && heads_ok && gap > 0 && gap < (1ull << 40)) {
      const cuuint64_t dims[5] = {64, 8, static_cast<cuuint64_t>(2 * Hkv), 2,
                                  static_cast<cuuint64_t>(num_slots / 8)};
      const cuuint64_t strides[4] = {static_cast<cuuint64_t>(sk_slot) * 2, 128, gap,
                                     static_cast<cuuint64_t>(sk_slot) * 16};
      const cuuint32_t box[5] = {64, 8, 2, 2, static_cast<cuuint32_t>(rows / 8)};
      if (encode_swizzled_map(&p.kv_map, p.kv_swap ? v : k, dtype, 5, dims, strides, box) == 0)
        p.tma_rows = rows;
    }
    if (p.tma_rows == 0 && tma_required) return -12;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (wgs == 2 && split_tail == 2)
    return dtype == 0 ? launch<WideTail, __nv_bfloat16>(p, B, row_ctas, merge, s)
                      : launch<WideTail, __half>(p, B, row_ctas, merge, s);
  if (wgs == 2)
    return dtype == 0 ? launch<Wide, __nv_bfloat16>(p, B, row_ctas, merge, s)
                      : launch<Wide, __half>(p, B, row_ctas, merge, s);
  return dtype == 0 ? launch<Tall, __nv_bfloat16>(p, B, row_ctas, merge, s)
                    : launch<Tall, __half>(p, B, row_ctas, merge, s);
}

}  // extern "C"
