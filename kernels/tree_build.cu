// DDTree draft-tree builder for CUDA: one CTA per request, every phase in shared memory.
//
// Semantics: identical to kdtree.spec.gpu.tree_build.build_trees_torch (the heap's tree, node
// for node, in pop order). Inputs: lp float32 [B, D, K] sorted descending per depth, tok int64
// [B, D, K], bonus int64 [B], budget N. Outputs (contiguous): tokens / parents / depths / ranks
// int64 [B, T = N + 1], scores float32 [B, T], mask int64 [B, T, W], n_nodes int64 [B], and
// path int32 [B] (1: the seeded threshold held; 0: the build re-ran at threshold -inf).
//
// Why it is exact (tree_build.py's module docstring has the long form). The heap pops nodes in
// the total order (score desc, rank tuple asc) and its tree is the global top-N in that order,
// a prefix-closed set. Take any threshold theta that at least N real nodes reach: the tree lies
// inside U(theta) = {nodes scoring >= theta}. Level-synchronously, S_d = the best N (in the
// total order) of the children of S_{d-1} that score >= theta contains the tree's depth-d
// nodes, because those are at most N, are children of tree nodes, and beat every other depth-d
// node. With the kept sets stored in lexicographic (parent, rank) order, the rank-tuple order
// inside one depth is the flat index parent * KE + rank. So:
//   1. seed: estimate theta from a binned count of nodes per deviation from the rank-0 chain
//      (the Triton threshold builder's seed, same bins); only speed rests on it;
//   2. expand: per depth, the children scoring >= theta are a prefix of each parent's ranks
//      (log-probs sorted, float addition monotone), found by bisection over the ranks; a prefix
//      sum places them (one warp while a depth has at most 32 parents, else the block). Where
//      a depth holds more than N of them, a radix select (8-bit digits) finds the N-th largest
//      (score, flat index) key and only keys at or above it are kept (exactly N); the kept
//      minimum score then bounds the deeper depths too. If the kept union holds fewer than N
//      nodes and theta > -inf, the seed was too optimistic: expand again at -inf (path = 0);
//   3. preorder: per node, with no barrier, the number of nodes before it in rank-tuple order:
//      its ancestors' level indices + 1, its own level index, and per deeper depth the nodes
//      under earlier nodes (first-child slots chained down);
//   4. order: one 64-bit key per kept node (score image, then 0xFFFF - preorder, then the slot),
//      bitonic-sorted descending (stages within a warp by shuffles, the rest through shared
//      memory): the first N are the pop order;
//   5. emit rows, parents' rows and the ancestor bitmask (one parent-chain walk per row, the
//      mask words in registers).
// Nothing depends on host-visible values: graph-capturable. Shared memory is sized by the host
// (kdtree_tree_build_smem_bytes) for (N, KE, DM).

#include <math.h>
#include <stdint.h>

#ifdef KDTREE_CPU_EMU  // g++ build for the CPU tests (kernels/cuda_cpu_emu.h)
#include "cuda_cpu_emu.h"
#define KDTREE_DYN_SMEM(name) unsigned char* name = kdtree_emu::block_smem()
#else
#include <cuda_runtime.h>

#include <atomic>
#define KDTREE_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace kdtree_tb {

constexpr int NT = 256;      // threads per CTA
constexpr int NWARP = NT / 32;
constexpr int NB = 256;      // seed bins (the Triton builder's NB)
constexpr int MAX_BUDGET = 512;
constexpr int MAX_NODES = 8192;  // DM * N: slots must fit 16 bits with room for the sort key
constexpr int CLOCK_COLS = 22;   // profiling columns per request (o_clock)
static_assert(NT == NB && NB == 256, "the radix select gives one bin a thread, eight a lane");

struct Params {
  const float* lp;
  const int64_t* tok;
  const int64_t* bonus;
  int64_t s_lpb, s_lpd, s_tkb, s_tkd;
  int64_t* o_tok;
  int64_t* o_par;
  int64_t* o_dep;
  int64_t* o_rank;
  int64_t* o_mask;
  int64_t* o_nn;
  float* o_score;
  int32_t* o_path;
  int64_t* o_clock;  // [B, 22] phase clock stamps of thread 0, counters, splits (profiling) or null
  int N, KE, DM, W, T;
  float theta_override;  // NaN: seed the threshold; else start from this one (tests)
  int ucap;  // DM * N
  int pcap;  // next power of two >= max(ucap, 32) (sort buffer)
};

__host__ __device__ inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Seed deviation rows are padded to a multiple of 8 ranks (16 bytes: one vector load).
__host__ __device__ inline int kep(int KE) { return (KE + 7) & ~7; }

struct alignas(16) Dev8 {
  int16_t v[8];
};

// Shared-memory layout, shared by host (size) and device (carving).
struct Layout {
  size_t keys, lp, udev, seed, score, par, rank, coff, row, dep, misc, total;
  __host__ __device__ Layout(int N, int KE, int DM, int ucap, int pcap) {
    size_t o = 0;
    keys = o;  o = align_up(o + sizeof(uint64_t) * pcap, 16);
    lp = o;    o = align_up(o + sizeof(float) * DM * KE, 16);
    udev = o;  o = align_up(o + sizeof(int16_t) * DM * kep(KE), 16);
    // the seed's rows and scalars, then the radix histograms and their key range
    // two DP rows, each NB zeros (bins below 0) then NB bins; per-depth scalars
    const int seed_words = 4 * NB + 3 * DM + 4, radix_words = 3 * NB + 4 * NWARP;
    seed = o;  o = align_up(o + sizeof(float) * (seed_words > radix_words ? seed_words : radix_words), 16);
    score = o; o = align_up(o + sizeof(float) * ucap, 16);
    par = o;   o = align_up(o + sizeof(int16_t) * ucap, 16);
    rank = o;  o = align_up(o + sizeof(int16_t) * ucap, 16);
    coff = o;  o = align_up(o + sizeof(int16_t) * ucap, 16);
    row = o;   o = align_up(o + sizeof(int16_t) * ucap, 16);
    dep = o;   o = align_up(o + sizeof(uint8_t) * ucap, 16);
    misc = o;  o = align_up(o + sizeof(int32_t) * (2 * NWARP + 16 + DM + 2), 16);
    total = o;
  }
};

// Order-preserving unsigned image of a float32 score (-0.0 folded into +0.0).
__device__ __forceinline__ uint32_t simg(float s) {
  s = (s == 0.0f) ? 0.0f : s;
  int32_t b = __float_as_int(s);
  int32_t o = b ^ ((b >> 31) & 0x7FFFFFFF);
  return static_cast<uint32_t>(o) ^ 0x80000000u;
}

// Per-depth key: score image high, smaller flat index (parent * KE + rank) wins the tie.
__device__ __forceinline__ uint64_t level_key(float s, int flat) {
  return (static_cast<uint64_t>(simg(s)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(flat));
}

// Block-wide exclusive prefix sum of one int per thread; *total receives the sum. Two
// barriers: consecutive scans alternate between the two halves of red (`parity`, flipped here,
// advances identically in every thread because every thread runs every scan), so a scan's
// writes never meet the previous scan's readers.
__device__ int block_excl_scan(int v, int* red, int& parity, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int* buf = red + NWARP * parity;
  parity ^= 1;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int y = __shfl_up_sync(0xFFFFFFFFu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) buf[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < NWARP ? buf[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int y = __shfl_up_sync(0xFFFFFFFFu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < NWARP) buf[lane] = w;
  }
  __syncthreads();
  const int before = warp > 0 ? buf[warp - 1] : 0;
  *total = buf[NWARP - 1];
  return before + x - v;
}

__device__ int block_min(int v, int* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (lane == 0) red[warp] = v;
  __syncthreads();
  int r = red[0];
  for (int i = 1; i < NWARP; ++i) r = min(r, red[i]);
  __syncthreads();
  return r;
}

// Children of parent score s at depth d whose key clears thr: a prefix of the ranks (keys fall
// with the rank), found by bisection over [0, limit].
__device__ __forceinline__ int prefix_count(const float* lpd, int limit, float s, int flat0,
                                            uint64_t thr) {
  int lo = 0, hi = limit;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (level_key(s + lpd[mid], flat0 + mid) >= thr) lo = mid + 1; else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ uint64_t shfl_xor64(uint64_t v, int o) {
  const uint32_t lo = __shfl_xor_sync(0xFFFFFFFFu, static_cast<uint32_t>(v), o);
  const uint32_t hi = __shfl_xor_sync(0xFFFFFFFFu, static_cast<uint32_t>(v >> 32), o);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// The seed's bin width from the chain's statistics (sc[0] = w, sc[1] = 1 if the range is
// finite): the N best nodes score at least the chain's worst finite sibling when the chain and
// its siblings number N or more; else at least the worst of those and of the siblings' own
// children (a deviation of rank >= 1 at depth d, then any finite rank at d + 1) when the two
// number N or more; else the deepest node of the last finite ranks bounds them. The middle
// bound keeps the grid fine where K * D < N (K=8, B=256: a bound 15 depths deep spread the 256
// bins so wide that the DP ran every depth).
__device__ __forceinline__ void seed_bin_width(float* sc, float n_sib, float low_chain,
                                               float n_two, float low_two, float low_all,
                                               int N) {
  const float fn = static_cast<float>(N);
  const float low = n_sib >= fn ? low_chain
                    : n_sib + n_two >= fn ? fminf(low_chain, low_two)
                                          : low_all;
  float rng = -low;
  const bool finite = rng < 3.0e38f;  // false for inf and NaN
  rng = finite ? fmaxf(rng, 1e-30f) : 1.0f;
  sc[0] = rng / static_cast<float>(NB - 1);
  sc[1] = finite ? 1.0f : 0.0f;
}

// Depth d's n nodes, slots ns .. ns + n - 1, written by the whole block, one slot a thread: a
// slot's parent is the last of the np parents (slots ps ..) whose first-child slot coff is at
// or below it (a parent with no child shares the next one's coff, so the last is the owner),
// its rank the distance from that coff. Depth 0's parent is the root (-1), rank = slot - ns.
// Writing a parent's children in its own thread put up to K writes on one thread's chain.
__device__ __forceinline__ void write_depth(float* score, int16_t* par, int16_t* rank,
                                            uint8_t* dep, const int16_t* coff, const float* lpd,
                                            int ns, int n, int ps, int np, int d) {
  for (int j = threadIdx.x; j < n; j += NT) {
    const int u = ns + j;
    int parent = -1, k = j;
    float s = 0.0f;
    if (d > 0) {
      int lo = 0, hi = np;  // the first parent whose coff is above u
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (coff[ps + mid] <= u) lo = mid + 1; else hi = mid;
      }
      parent = ps + lo - 1;
      k = u - coff[parent];
      s = score[parent];
    }
    score[u] = d == 0 ? lpd[k] : s + lpd[k];  // depth 0: the root's children score lpd[k]
    par[u] = static_cast<int16_t>(parent);
    rank[u] = static_cast<int16_t>(k);
    dep[u] = static_cast<uint8_t>(d);
  }
}

constexpr int MAXW = (MAX_BUDGET + 1 + 63) / 64;  // ancestor-mask words per row

__global__ void __launch_bounds__(NT, 1) tree_build_kernel(Params p) {
  KDTREE_DYN_SMEM(smem);
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int N = p.N, KE = p.KE, DM = p.DM, W = p.W, T = p.T;
  const Layout L(N, KE, DM, p.ucap, p.pcap);
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem + L.keys);
  float* lp = reinterpret_cast<float*>(smem + L.lp);
  int16_t* udev = reinterpret_cast<int16_t*>(smem + L.udev);
  float* seed = reinterpret_cast<float*>(smem + L.seed);
  float* score = reinterpret_cast<float*>(smem + L.score);
  int16_t* par = reinterpret_cast<int16_t*>(smem + L.par);
  int16_t* rank = reinterpret_cast<int16_t*>(smem + L.rank);
  int16_t* coff = reinterpret_cast<int16_t*>(smem + L.coff);
  int16_t* row = reinterpret_cast<int16_t*>(smem + L.row);
  uint8_t* dep = reinterpret_cast<uint8_t*>(smem + L.dep);
  int32_t* misc = reinterpret_cast<int32_t*>(smem + L.misc);
  int* red = misc;                      // [2 * NWARP] scan / reduction scratch
  int parity = 0;                       // block_excl_scan's half of red
  int* ctl = misc + 2 * NWARP;          // [16] values one thread hands to all
  int* lvl = misc + 2 * NWARP + 16;     // [DM + 2] first slot of each depth
  float* bufA = seed + NB;              // [NB] seed DP rows (ping-pong), each after NB zeros
  float* bufB = seed + 3 * NB;
  int* hist = reinterpret_cast<int*>(seed);  // [3][NB] radix histograms once the seed is done
  uint64_t* mm64 = reinterpret_cast<uint64_t*>(seed + 3 * NB);  // [2 * NWARP] their key range
  float* dlast = seed + 4 * NB;         // [DM] last finite log-prob per depth
  float* dfin = dlast + DM;             // [DM] finite count per depth
  float* zc = dfin + DM;                // [DM] chain score after depth d, then in bins (/ w)
  float* sc = zc + DM;                  // [2]: w, finite flag

  // clk[0..7]: thread 0's clock64() at the phase boundaries; clk[8..15]: what the build did;
  // clk[16..21]: finer splits (kdtree.spec.gpu.tree_build_cuda's CLOCK_* tuples name them)
  int64_t* clk = p.o_clock ? p.o_clock + static_cast<int64_t>(b) * CLOCK_COLS : nullptr;
#define KDTREE_STAMP(i) \
  if (clk && tid == 0) clk[i] = static_cast<int64_t>(clock64())
#define KDTREE_NOW() (clk ? static_cast<int64_t>(clock64()) : 0)
  int64_t t_select = 0, t_warp = 0, t_block = 0, dp_steps = 0;  // thread 0's are stored
  KDTREE_STAMP(0);
  const float* lpg = p.lp + b * p.s_lpb;
  // ---- 0. log-probs into shared memory; row 0 (the root) now, so that T = NT + 1 rows leave
  // one row a thread for the emit ------------------------------------------------------
  for (int i = tid; i < DM * KE; i += NT) lp[i] = lpg[(i / KE) * p.s_lpd + (i % KE)];
  const int64_t ob = static_cast<int64_t>(b) * T;
  if (tid < W) p.o_mask[ob * W + tid] = tid == 0 ? 1 : 0;
  // the bonus token's load issues here; its store waits for the end (call f of session 8 had the
  // store here: thread 0 waited for the load before the first barrier, ~500 cycles)
  const int64_t bonus0 = tid == 0 ? p.bonus[b] : 0;
  if (tid == 0) {
    p.o_par[ob] = -1;
    p.o_dep[ob] = 0;
    p.o_rank[ob] = 0;
    p.o_score[ob] = 0.0f;
  }
  __syncthreads();
  KDTREE_STAMP(1);

  // ---- 1. seed -------------------------------------------------------------------------
  for (int d = tid; d < DM; d += NT) {
    // a row is sorted descending: its finite entries are a prefix, the last one its minimum
    int lo = 0, hi = KE;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (lp[d * KE + mid] > -INFINITY) lo = mid + 1; else hi = mid;
    }
    dlast[d] = lo > 0 ? lp[d * KE + lo - 1] : INFINITY;
    dfin[d] = static_cast<float>(lo);
  }
  __syncthreads();
  if (DM <= 32) {
    // one warp, lane = depth: the chain (depths up to the first -inf rank-0 log-prob), its
    // finite siblings, the chain's score per depth, by warp scans
    if (warp == 0) {
      const bool in = lane < DM;
      const float l0 = in ? lp[lane * KE] : 0.0f;
      const float last = in ? dlast[lane] : INFINITY;
      const unsigned bad = __ballot_sync(0xFFFFFFFFu, in && !(l0 > -INFINITY));
      const bool chain = in && (bad & ((2u << lane) - 1u)) == 0u;
      float zin = chain ? l0 : 0.0f;  // inclusive scan (it only sets the bin width)
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float a = __shfl_up_sync(0xFFFFFFFFu, zin, o);
        if (lane >= o) zin += a;
      }
      const float zprev = zin - (chain ? l0 : 0.0f);
      const float fin = in ? dfin[lane] : 0.0f;
      const float fin_next = __shfl_down_sync(0xFFFFFFFFu, fin, 1);  // lane 31: its own, unused
      const float last_next = __shfl_down_sync(0xFFFFFFFFu, last, 1);
      const bool two = chain && lane + 1 < DM && fin > 1.0f && fin_next > 0.0f;
      float low_chain = chain ? zprev + last : INFINITY;
      float n_sib = chain ? fin : 0.0f;
      float low_two = two ? zprev + last + last_next : INFINITY;
      float n_two = two ? (fin - 1.0f) * fin_next : 0.0f;
      float low_all = (in && last < INFINITY) ? last : 0.0f;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        low_chain = fminf(low_chain, __shfl_xor_sync(0xFFFFFFFFu, low_chain, o));
        n_sib += __shfl_xor_sync(0xFFFFFFFFu, n_sib, o);
        low_two = fminf(low_two, __shfl_xor_sync(0xFFFFFFFFu, low_two, o));
        n_two += __shfl_xor_sync(0xFFFFFFFFu, n_two, o);
        low_all += __shfl_xor_sync(0xFFFFFFFFu, low_all, o);
      }
      // the chain's scores summed in depth order, as the expansion sums them (a scan's other
      // rounding could put a chain node just below a grid threshold it counted); every lane
      // sums the same shuffled values, so the adds are the only dependent chain
      float z = 0.0f, zmine = 0.0f;
#pragma unroll
      for (int d = 0; d < 32; ++d) {
        const float x = __shfl_sync(0xFFFFFFFFu, l0, d);
        if (d < DM) z += x;
        zmine = d == lane ? z : zmine;
      }
      if (in) zc[lane] = zmine;
      if (lane == 0) seed_bin_width(sc, n_sib, low_chain, n_two, low_two, low_all, N);
    }
  } else if (tid == 0) {
    float zprev = 0.0f, z = 0.0f, n_sib = 0.0f, low_chain = INFINITY, low_all = 0.0f;
    float n_two = 0.0f, low_two = INFINITY;
    bool chain = true;
    for (int d = 0; d < DM; ++d) {
      const float l0 = lp[d * KE];
      chain = chain && (l0 > -INFINITY);
      if (chain) {
        n_sib += dfin[d];
        low_chain = fminf(low_chain, zprev + dlast[d]);
        if (d + 1 < DM && dfin[d] > 1.0f && dfin[d + 1] > 0.0f) {
          n_two += (dfin[d] - 1.0f) * dfin[d + 1];
          low_two = fminf(low_two, zprev + dlast[d] + dlast[d + 1]);
        }
        zprev += l0;
      }
      if (dlast[d] < INFINITY) low_all += dlast[d];
      z += l0;
      zc[d] = z;
    }
    seed_bin_width(sc, n_sib, low_chain, n_two, low_two, low_all, N);
  }
  __syncthreads();
  KDTREE_STAMP(2);
  const float w = sc[0];
  const bool seed_finite = sc[1] != 0.0f;
  const int KEP = kep(KE);
  for (int i = tid; i < DM * KEP; i += NT) {
    const int d = i / KEP, j = i % KEP;
    const float x = j < KE ? (lp[d * KE] - lp[d * KE + j]) / w : INFINITY;  // padding: out
    udev[i] = static_cast<int16_t>(x < NB ? fmaxf(ceilf(x), 0.0f) : NB);  // NaN / inf: out
  }
  if (tid < NB) {  // bins below 0 count nothing: a shift past them reads these
    bufA[tid - NB] = 0.0f;
    bufB[tid - NB] = 0.0f;
  }
  for (int d = tid; d < DM; d += NT) zc[d] = zc[d] / w;  // the chain's score in bins
  // The count per grid threshold t (theta = -t w) reads C_d at bin zc_d + t only, and C_d
  // depends on lower bins only, so a first pass over the lowest 128 bins (two threads a bin,
  // each half the shifts) finds t* whenever t* < 128 (every draft-like case measured: t* <= 68);
  // else a second pass runs all 256 bins. Depth d needs bins up to zc_d + nbins - 1 only, and
  // once that is negative no deeper depth needs any.
  int tstar = NB, seed_passes = 0;
  for (int pass = 0; pass < 2 && tstar == NB; ++pass) {
    ++seed_passes;
    const int nbins = pass == 0 ? NB / 2 : NB, split = pass == 0 ? 2 : 1;
    const int c = tid / split, h = tid % split;
    float* prev = bufA;
    float* cur = bufB;
    float cnt = 0.0f;
    if (h == 0 && c < nbins) prev[c] = 1.0f;  // C_0: the root, deviation 0
    int* tfound = ctl + 4;  // [2] the lowest bin whose count reached N, by depth parity
    if (tid < 2) tfound[tid] = NB;
    __syncthreads();
    for (int d = 0; d < DM; ++d) {
      const float zt = zc[d] + static_cast<float>(nbins - 1);
      if (!(zt >= 0.0f)) break;  // uniform: no bin of this depth or a deeper one counts
      // Early exit: once a bin t has count >= N, t* <= t, and depth d adds to the counts at
      // bins <= t only if zc_d + t >= 0 (nor does any deeper one, zc falling with the depth).
      // tfound[d & 1] holds depths d - 2, d - 4, ...: written before the last barrier and
      // next written after the coming one, so every thread reads the same value here.
      if (d >= 2 && zc[d] + static_cast<float>(tfound[d & 1]) < 0.0f) break;  // uniform
      ++dp_steps;
      const int cmax = static_cast<int>(zt);
      float acc = 0.0f;
      if (c <= cmax && c < nbins) {
        // this thread's ranks: the first or second half of the padded row (whole vectors of 8);
        // a shift u in [0, NB] reads prev[c - u] >= prev[-NB], the zeros, so no test per rank
        const Dev8* u8 = reinterpret_cast<const Dev8*>(udev + d * KEP);
        const int half = split == 2 ? ((KEP / 2 + 7) & ~7) : KEP;
        const int g_end = min(KEP, (h + 1) * half) / 8;
        for (int g = h * half / 8; g < g_end; ++g) {
          const Dev8 u = u8[g];  // one 16-byte load
          if (u.v[0] > c) break;  // deviations grow with the rank: the rest shift out too
          float v[8];
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) v[jj] = prev[c - u.v[jj]];
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) acc += v[jj];
        }
      }
      if (split == 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, 1);  // the bin's two halves
      if (h == 0 && c < nbins) cur[c] = acc;
      __syncthreads();
      if (h == 0 && c < nbins) {
        const float f = zc[d] + static_cast<float>(c);
        if (f >= 0.0f) cnt += cur[min(static_cast<int>(f), nbins - 1)];
      }
      // the warp's lowest bin at N (bins rise with the lane): one atomic a warp
      const unsigned at_n = __ballot_sync(0xFFFFFFFFu, h == 0 && c < nbins && cnt >= static_cast<float>(N));
      if (at_n != 0u && lane == __ffs(static_cast<int>(at_n)) - 1) atomicMin(&tfound[d & 1], c);
      float* t = prev;
      prev = cur;
      cur = t;
    }
    tstar = block_min((h == 0 && c < nbins && cnt >= static_cast<float>(N)) ? c : NB, red);
  }
  float theta = (seed_finite && tstar < NB) ? -static_cast<float>(tstar) * w : -INFINITY;
  if (!isnan(p.theta_override)) theta = p.theta_override;
  KDTREE_STAMP(3);
  // the seed's area is free now (block_min ended on a barrier)
  for (int i = tid; i < 3 * NB; i += NT) hist[i] = 0;

  // ---- 2. expand -----------------------------------------------------------------------
  int path = 1, n_u = 0, d_eff = 0, n_radix = 0, n_capped = 0;  // the last two: counters
  for (int attempt = 0; attempt < 2; ++attempt) {
    uint64_t thr = theta > -INFINITY ? static_cast<uint64_t>(simg(theta)) << 32 : 0ull;
    int ps = 0, np = 1;  // parents of depth 0: the root (virtual, score 0)
    n_u = 0;
    d_eff = 0;
    for (int d = 0; d < DM; ++d) {
      const float* lpd = lp + d * KE;
      const int ns = ps + (d == 0 ? 0 : np);  // first slot of this depth
      if (tid == 0) lvl[d] = ns;
      int n = 0;
      bool written = false;
      const int64_t t_depth = KDTREE_NOW();
      if (np <= 32) {
        // one warp: counts and scan; then the block writes the depth
        int* nbox = ctl + 8 + (d & 1);  // double-buffered: read after this depth's barrier
        if (warp == 0) {
          const float s = lane < np ? (d == 0 ? 0.0f : score[ps + lane]) : 0.0f;
          const int c = lane < np ? prefix_count(lpd, KE, s, lane * KE, thr) : 0;
          int x = c;
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xFFFFFFFFu, x, o);
            if (lane >= o) x += y;
          }
          const int tot = __shfl_sync(0xFFFFFFFFu, x, 31);
          if (tot <= N && lane < np && d > 0) coff[ps + lane] = static_cast<int16_t>(ns + x - c);
          if (lane == 0) *nbox = tot;
        }
        __syncthreads();
        n = *nbox;
        written = n <= N;
        if (written) {
          write_depth(score, par, rank, dep, coff, lpd, ns, n, ps, np, d);
          __syncthreads();  // the next depth reads these scores
        }
        t_warp += KDTREE_NOW() - t_depth;
      }
      if (!written) {
        const int64_t t_blk = KDTREE_NOW();
        // one or two parents per thread (N <= 2 * NT)
        int c0 = 0, c1 = 0;
        const int i0 = tid, i1 = tid + NT;
        float s0 = 0.0f, s1 = 0.0f;
        if (i0 < np) {
          s0 = d == 0 ? 0.0f : score[ps + i0];
          c0 = prefix_count(lpd, KE, s0, i0 * KE, thr);
        }
        if (i1 < np) {
          s1 = score[ps + i1];
          c1 = prefix_count(lpd, KE, s1, i1 * KE, thr);
        }
        const bool two = np > NT;  // uniform: a second scan only past NT parents
        int n0, n1 = 0;
        int off0 = block_excl_scan(c0, red, parity, &n0);
        int off1 = two ? block_excl_scan(c1, red, parity, &n1) : 0;
        n = n0 + n1;
        if (n > N) {
          const int64_t t_sel = KDTREE_NOW();
          // Keep the N best keys of this depth: radix select for the N-th largest key, 8-bit
          // digits from the highest bit where this depth's largest and smallest keys differ
          // (the bits above are common to all, and a digit over them would put every key in
          // one bin: serialised atomics). Keys are distinct, so the bin that holds the N-th is
          // taken whole once it holds exactly the keys still needed. The keys are spread over
          // the whole block: G threads a parent (a depth over the budget often has <= 32
          // parents with K children each, which one warp would otherwise walk alone).
          ++n_capped;
          const bool spread = np <= NT;  // uniform
          int gshift = 0;
          while (spread && (np << (gshift + 1)) <= NT) ++gshift;
          const int gi = tid >> gshift, gk = tid & ((1 << gshift) - 1);
          if (spread && i0 < np) row[ps + i0] = static_cast<int16_t>(c0);  // np <= NT: no i1
          // this thread's keys: ranks gk, gk + G, ... of parent gi (spread), else all ranks of
          // parents i0 and i1; fn(key) for each
          auto for_my_keys = [&](auto&& fn) {
            if (spread) {
              if (gi < np) {
                const int c = row[ps + gi];
                const float s = score[ps + gi];
                for (int k = gk; k < c; k += 1 << gshift) fn(level_key(s + lpd[k], gi * KE + k));
              }
            } else {
              for (int r = 0; r < 2; ++r) {
                const int i = r == 0 ? i0 : i1;
                if (i >= np) continue;
                const int c = r == 0 ? c0 : c1;
                const float s = r == 0 ? s0 : s1;
                for (int k = 0; k < c; ++k) fn(level_key(s + lpd[k], i * KE + k));
              }
            }
          };
          // largest and smallest key: a parent's first and last kept child
          uint64_t kmax = 0ull, kmin = ~0ull;
          for (int r = 0; r < 2; ++r) {
            const int i = r == 0 ? i0 : i1;
            const int c = r == 0 ? c0 : c1;
            if (i >= np || c == 0) continue;
            const float s = r == 0 ? s0 : s1;
            const uint64_t a = level_key(s + lpd[0], i * KE), z = level_key(s + lpd[c - 1], i * KE + c - 1);
            kmax = a > kmax ? a : kmax;
            kmin = z < kmin ? z : kmin;
          }
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) {
            const uint64_t a = shfl_xor64(kmax, o), z = shfl_xor64(kmin, o);
            kmax = a > kmax ? a : kmax;
            kmin = z < kmin ? z : kmin;
          }
          if (lane == 0) {
            mm64[warp] = kmax;
            mm64[NWARP + warp] = kmin;
          }
          __syncthreads();  // also publishes row[ps + gi]
          for (int x = 0; x < NWARP; ++x) {
            kmax = mm64[x] > kmax ? mm64[x] : kmax;
            kmin = mm64[NWARP + x] < kmin ? mm64[NWARP + x] : kmin;
          }
          // the first digit's top bit is the highest differing bit (kmax > kmin: n > N >= 1)
          int top_bit = 64 - __clzll(static_cast<long long>(kmax ^ kmin));
          uint64_t prefix = top_bit >= 64 ? 0ull : (kmax >> top_bit) << top_bit;
          int need = N;
          while (true) {
            // One barrier a pass: three histograms in rotation (pass p counts into H[p % 3]
            // and, once past its barrier, clears H[(p + 2) % 3], which every warp finished
            // reading before that barrier and which pass p + 2 fills after the next one), and
            // every warp finds the digit itself from the whole histogram.
            int* H = hist + NB * (n_radix % 3);
            int* H_clear = hist + NB * ((n_radix + 2) % 3);
            ++n_radix;
            const int lo_bit = top_bit > 8 ? top_bit - 8 : 0;
            const uint64_t dmask = (1ull << (top_bit - lo_bit)) - 1ull;
            const uint64_t hi = top_bit >= 64 ? 0ull : prefix >> top_bit;
            for_my_keys([&](uint64_t key) {
              if (top_bit >= 64 || (key >> top_bit) == hi)
                atomicAdd(&H[static_cast<int>((key >> lo_bit) & dmask)], 1);
            });
            __syncthreads();
            H_clear[tid] = 0;  // NT == NB: one bin a thread
            // lane l: digits 255 - 8 l down to 248 - 8 l (descending digit order)
            int hb[8], lsum = 0;
#pragma unroll
            for (int q = 0; q < 8; ++q) {
              hb[q] = H[255 - 8 * lane - q];
              lsum += hb[q];
            }
            int incl = lsum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
              const int y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
              if (lane >= o) incl += y;
            }
            int run = incl - lsum, digit = 0, left = 0, hsel = 0;
            const bool mine = run < need && need <= incl;
#pragma unroll
            for (int q = 0; q < 8; ++q) {
              if (mine && run < need && need <= run + hb[q]) {
                digit = 255 - 8 * lane - q;
                left = need - run;
                hsel = hb[q];
              }
              run += hb[q];
            }
            const int src = __ffs(static_cast<int>(__ballot_sync(0xFFFFFFFFu, mine))) - 1;
            digit = __shfl_sync(0xFFFFFFFFu, digit, src);
            left = __shfl_sync(0xFFFFFFFFu, left, src);
            hsel = __shfl_sync(0xFFFFFFFFu, hsel, src);
            prefix |= static_cast<uint64_t>(digit) << lo_bit;
            const bool whole = hsel == left;
            need = left;
            if (whole || lo_bit == 0) break;  // at bit 0 one key is left: whole
            top_bit = lo_bit;
          }
          // every key >= prefix (low digits 0) is kept: exactly N of them
          if (i0 < np) c0 = prefix_count(lpd, c0, s0, i0 * KE, prefix);
          if (i1 < np) c1 = prefix_count(lpd, c1, s1, i1 * KE, prefix);
          off0 = block_excl_scan(c0, red, parity, &n0);
          off1 = two ? block_excl_scan(c1, red, parity, &n1) : 0;
          n = n0 + n1;
          // N nodes of this depth score at least the kept minimum, so the tree's N-th node
          // does too: deeper depths need no node below it
          const uint64_t floor_key = prefix & 0xFFFFFFFF00000000ull;
          if (floor_key > thr) thr = floor_key;
          t_select += KDTREE_NOW() - t_sel;
        }
        off1 += n0;
        if (d > 0) {  // depth 0 has one parent, the root: never here (KE <= N)
          if (i0 < np) coff[ps + i0] = static_cast<int16_t>(ns + off0);
          if (i1 < np) coff[ps + i1] = static_cast<int16_t>(ns + off1);
        }
        __syncthreads();
        write_depth(score, par, rank, dep, coff, lpd, ns, n, ps, np, d);
        __syncthreads();
        t_block += KDTREE_NOW() - t_blk;
      }
      n_u = ns + n;
      if (n == 0) break;
      d_eff = d + 1;
      ps = ns;
      np = n;
    }
    if (n_u >= N || theta == -INFINITY) break;
    theta = -INFINITY;  // too few nodes above the seed: every node is a candidate
    path = 0;
    // the last depth's hand-off slot may be the first depth's again: every thread must have
    // read it before warp 0 writes (call e's racecheck: a write-after-read hazard here)
    __syncthreads();
  }
  if (tid == 0) lvl[d_eff] = n_u;
  __syncthreads();
  KDTREE_STAMP(4);

  // ---- 3. preorder keys: no barrier, a chain of loads per node --------------------------
  // pre(u) = the nodes before u in rank-tuple (preorder) order, root included: per depth e
  // above u the ancestor's index + 1 (it and the nodes before it); at u's depth its index;
  // per deeper depth the nodes under earlier nodes (first-child slots chained down).
  for (int u = tid; u < n_u; u += NT) {
    const int d = dep[u];
    int pre = 1 + (u - lvl[d]);
    for (int a = par[u], e = d - 1; a >= 0; a = par[a], --e) pre += a - lvl[e] + 1;
    if (d + 1 < d_eff) {
      int pos = coff[u] - lvl[d + 1];
      pre += pos;
      for (int e = d + 2; e < d_eff; ++e) {
        pos = pos < lvl[e] - lvl[e - 1] ? coff[lvl[e - 1] + pos] - lvl[e] : lvl[e + 1] - lvl[e];
        pre += pos;
      }
    }
    keys[u] = (static_cast<uint64_t>(simg(score[u])) << 32) |
              (static_cast<uint64_t>(0xFFFFu - static_cast<uint32_t>(pre)) << 16) |
              static_cast<uint64_t>(u);
    row[u] = -1;
  }
  const int nsel = min(N, n_u);
  // ---- 4. order: bitonic sort of the keys, descending. Every stage whose partner is in the same
  // warp (j < 32) runs in registers by shuffles (two runs of 32 a warp, interleaved), once per k
  // for all such j; only j >= 32 goes through shared memory, one barrier a stage (P = 512, a
  // 256-node tree's union: 10 of them and 5 register passes). Call c of session 8 merged the
  // sorted runs pairwise by binary search instead (4 levels at 512): 9.1k cycles against 6.2k,
  // as the per-thread instruction chain, not the barrier count, sets the time here.
  int P = 32;
  while (P < n_u) P <<= 1;
  for (int i = n_u + tid; i < P; i += NT) keys[i] = 0ull;  // 0: below every key
  __syncthreads();
  KDTREE_STAMP(16);
  // the stages (k, j) for k in [k_lo, k_hi] and j < min(k, 32)
  auto register_stages = [&](int k_lo, int k_hi) {
    for (int base = warp * 64; base < P; base += 2 * NT) {
      const int i0 = base + lane, i1 = i0 + 32;
      if (base + 32 < P) {  // uniform in the warp
        uint64_t v0 = keys[i0], v1 = keys[i1];
        for (int k = k_lo; k <= k_hi; k <<= 1) {
          const bool desc0 = (i0 & k) == 0, desc1 = (i1 & k) == 0;
          for (int j = min(k >> 1, 16); j > 0; j >>= 1) {
            const uint64_t o0 = shfl_xor64(v0, j), o1 = shfl_xor64(v1, j);
            const bool low = (lane & j) == 0;
            v0 = (low == desc0) ? (v0 > o0 ? v0 : o0) : (v0 < o0 ? v0 : o0);
            v1 = (low == desc1) ? (v1 > o1 ? v1 : o1) : (v1 < o1 ? v1 : o1);
          }
        }
        keys[i0] = v0;
        keys[i1] = v1;
      } else {
        uint64_t v0 = keys[i0];
        for (int k = k_lo; k <= k_hi; k <<= 1) {
          const bool desc0 = (i0 & k) == 0;
          for (int j = min(k >> 1, 16); j > 0; j >>= 1) {
            const uint64_t o0 = shfl_xor64(v0, j);
            v0 = (((lane & j) == 0) == desc0) ? (v0 > o0 ? v0 : o0) : (v0 < o0 ? v0 : o0);
          }
        }
        keys[i0] = v0;
      }
    }
    __syncthreads();
  };
  register_stages(2, 32);
  KDTREE_STAMP(17);
  for (int k = 64; k <= P; k <<= 1) {
    for (int j = k >> 1; j >= 32; j >>= 1) {
      for (int t = tid; t < P / 2; t += NT) {
        const int i = ((t & ~(j - 1)) << 1) | (t & (j - 1));  // the pair's lower index (j: 2^x)
        const uint64_t a = keys[i], c = keys[i + j];
        if (((i & k) == 0) == (a < c)) {
          keys[i] = c;
          keys[i + j] = a;
        }
      }
      __syncthreads();
    }
    register_stages(k, k);
  }
  const uint64_t* top = keys;  // the first nsel keys, in pop order
  KDTREE_STAMP(5);

  // ---- 5. emit -------------------------------------------------------------------------
  for (int r = tid; r < nsel; r += NT) row[top[r] & 0xFFFFu] = static_cast<int16_t>(r + 1);
  __syncthreads();
  KDTREE_STAMP(6);
  const int64_t* tkg = p.tok + b * p.s_tkb;
  for (int r = tid + 1; r < T; r += NT) {  // row 0 went out with phase 0 (its token at the end)
    int64_t tk = 0, pr = -1, dp = 0, rk = -1;
    float sv = -INFINITY;
    uint64_t m[MAXW];  // the row's ancestor bits, in registers (every index is unrolled)
#pragma unroll
    for (int x = 0; x < MAXW; ++x) m[x] = 0ull;
#define KDTREE_SET_BIT(rr)                                                   \
  do {                                                                       \
    const int wd_ = (rr) >> 6;                                               \
    const uint64_t bit_ = 1ull << ((rr) & 63);                               \
    _Pragma("unroll") for (int x = 0; x < MAXW; ++x) m[x] |= wd_ == x ? bit_ : 0ull; \
  } while (0)
    KDTREE_SET_BIT(r);
    if (r <= nsel) {
      const int u = static_cast<int>(top[r - 1] & 0xFFFFu);
      const int d = dep[u];
      tk = tkg[d * p.s_tkd + rank[u]];
      pr = par[u] < 0 ? 0 : row[par[u]];
      dp = d + 1;
      rk = rank[u];
      sv = score[u];
      for (int a = par[u]; a >= 0; a = par[a]) KDTREE_SET_BIT(row[a]);
      KDTREE_SET_BIT(0);
    }
    p.o_par[ob + r] = pr;
    p.o_dep[ob + r] = dp;
    p.o_rank[ob + r] = rk;
    p.o_score[ob + r] = sv;
#pragma unroll
    for (int x = 0; x < MAXW; ++x)
      if (x < W) p.o_mask[(ob + r) * W + x] = static_cast<int64_t>(m[x]);
    p.o_tok[ob + r] = tk;  // last: the token's global load overlaps the walk and the stores
  }
#undef KDTREE_SET_BIT
  if (clk) {  // uniform
    __syncthreads();
    KDTREE_STAMP(7);
  }
#undef KDTREE_STAMP
#undef KDTREE_NOW
  if (clk && tid == 0) {  // CLOCK_COUNTERS in 8..15; CLOCK_SPLITS' cycle sums and DP steps
    const int64_t counters[8] = {tstar, seed_passes, n_u, d_eff, n_capped, n_radix, path, P};
    for (int i = 0; i < 8; ++i) clk[8 + i] = counters[i];
    const int64_t splits[4] = {t_select, t_warp, t_block, dp_steps};
    for (int i = 0; i < 4; ++i) clk[18 + i] = splits[i];
  }
  if (tid == 0) {
    p.o_tok[ob] = bonus0;
    p.o_nn[b] = 1 + nsel;
    if (p.o_path) p.o_path[b] = path;
  }
}

}  // namespace kdtree_tb

extern "C" {

// Dynamic shared memory the kernel needs for (budget, KE, DM); 0 if outside the kernel's range.
size_t kdtree_tree_build_smem_bytes(int N, int KE, int DM) {
  using namespace kdtree_tb;
  if (N < 1 || N > MAX_BUDGET || KE < 1 || DM < 1 || KE > N || DM > N || DM > 255) return 0;
  const int ucap = DM * N;
  if (ucap > MAX_NODES) return 0;
  int pcap = 32;  // the sorted runs are whole warps
  while (pcap < ucap) pcap <<= 1;
  return Layout(N, KE, DM, ucap, pcap).total;
}

const char* kdtree_tree_build_error_string(int code) {
  switch (code) {
    case 0: return "success";
    case -1: return "shape outside the kernel's range (budget 1..512, DM * budget <= 8192, "
                    "DM <= 255, KE and DM <= budget)";
    case -2: return "shared memory above the device's per-block limit";
    case -3: return "expected B >= 1";
    default:
#ifdef KDTREE_CPU_EMU
      return "unknown error";
#else
      return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
#endif
  }
}

// Launch one CTA per request on `stream`. Strides in elements. Returns 0, a negative argument
// error (kdtree_tree_build_error_string) or a cudaError_t value.
int kdtree_tree_build_launch(const float* lp, const int64_t* tok, const int64_t* bonus,
                             int64_t s_lpb, int64_t s_lpd, int64_t s_tkb, int64_t s_tkd,
                             int64_t* o_tok, int64_t* o_par, int64_t* o_dep, int64_t* o_rank,
                             float* o_score, int64_t* o_mask, int64_t* o_nn, int32_t* o_path,
                             int64_t* o_clock,
                             int B, int N, int KE, int DM, int W, float theta_override,
                             uintptr_t stream) {
  using namespace kdtree_tb;
  if (B < 1) return -3;
  const size_t smem = kdtree_tree_build_smem_bytes(N, KE, DM);
  if (smem == 0) return -1;
#ifndef KDTREE_CPU_EMU
  int dev = 0, max_optin = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return static_cast<int>(e);
  e = cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (smem > static_cast<size_t>(max_optin)) return -2;
  // Raise the kernel's dynamic shared-memory limit (a per-device attribute) only when a larger
  // shape needs it, so calls captured in a CUDA graph after a warm-up call make no attribute
  // change. Concurrent callers may both set it: the call is idempotent.
  static std::atomic<size_t> configured[64];
  if (dev >= 64 || smem > configured[dev].load()) {
    e = cudaFuncSetAttribute(tree_build_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
    if (dev < 64) {
      size_t seen = configured[dev].load();
      while (smem > seen && !configured[dev].compare_exchange_weak(seen, smem)) {
      }
    }
  }
#endif
  Params p;
  p.lp = lp;
  p.tok = tok;
  p.bonus = bonus;
  p.s_lpb = s_lpb;
  p.s_lpd = s_lpd;
  p.s_tkb = s_tkb;
  p.s_tkd = s_tkd;
  p.o_tok = o_tok;
  p.o_par = o_par;
  p.o_dep = o_dep;
  p.o_rank = o_rank;
  p.o_mask = o_mask;
  p.o_nn = o_nn;
  p.o_score = o_score;
  p.o_path = o_path;
  p.o_clock = o_clock;
  p.N = N;
  p.KE = KE;
  p.DM = DM;
  p.W = W;
  p.T = N + 1;
  p.theta_override = theta_override;
  p.ucap = DM * N;
  int pcap = 32;
  while (pcap < p.ucap) pcap <<= 1;
  p.pcap = pcap;
#ifdef KDTREE_CPU_EMU
  (void)stream;
  kdtree_emu::launch(B, NT, smem, [&] { tree_build_kernel(p); });
  return 0;
#else
  tree_build_kernel<<<B, NT, smem, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
#endif
}

}  // extern "C"
