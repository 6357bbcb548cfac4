// What a split-KV call's end costs when the splits add their partials into one fp32 accumulator
// with vector reductions and the last CTA to arrive normalises it (no merge kernel), against
// the partials written and merged by kdtree's own merge kernel (sm90_common.cuh). A standalone
// probe (tools/gpu/atomic_merge_probe.py drives it), not part of kdtree's kernels.
//
// Each CTA of a (C row CTAs, S splits) grid stands for one split CTA of the GQA kernel: it takes
// the whole SM (the largest dynamic shared memory), spins `spin` cycles plus a per-CTA jitter
// (the stream and its stragglers), then ends one of these ways (`mode`):
//   0 none      nothing: the launch, the spin and the drain alone
//   1 partials  its R rows' normalised partials (bf16, 8-byte stores) and base-2 LSE, as the GQA
//               kernel writes them; the host adds kdtree's merge kernel (stream order or PDL)
//   2 atomic    per row, the first CTA to arrive publishes its running max as the row's common
//               offset (atomicCAS on a sentinel; the others read it back), then every CTA adds
//               O * 2^(m - ref) (red.global.add.v4.f32) and l * 2^(m - ref); a fence, one
//               counter atomic a row CTA; the last arrival reads the sums, writes out = O / l
//               (bf16) and clears the accumulator, the offsets and the counter for the next call
//   3 atomic, a fixed offset (0: no atomicCAS round trip; overflows for large scores)
//   4 atomic with scalar red.global.add.f32
//   5 merge only   kdtree's merge kernel alone over partials written before (no split grid)
//   6 partials only  mode 1's stores with no merge after them
//   7 empty        an empty kernel with the merge's grid (a row a CTA, 256 threads)
//   8 merge only, kdtree's merge with 16-byte loads (merge_splits_wide_kernel: eight bf16
//               columns a thread, 128 threads a row; at most 72 splits). Session 38's call e ran
//               this probe's own first forms of it, at 256 and 128 threads (commit 30ed78b).
//   9-12 merge only, kdtree's column-sliced merge (merge_splits_cols_kernel: 2, 4, 8 or 16 CTAs
//               of 128 threads a row, each a slice of the columns; session 39)
// The synthetic partials are the same in every mode, so mode 2's output is checked against the
// merge kernel's (probe_check).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../kernels/sm90_common.cuh"

using namespace kdtree_sm90;

namespace {

constexpr int D = 128;
constexpr int THREADS = 256;
constexpr unsigned SENTINEL = 0x7fc00001u;  // a NaN no max takes
int SMEM = 0;  // the most dynamic shared memory beside the static: one CTA an SM, as the split kernels

struct Probe {
  int S, C, R, mode;
  long long spin;
  int jitter;
  __nv_bfloat16* part;  // [S][C*R][D]
  float* lse;           // [S][C*R]
  float* acc;           // [C*R][D]
  float* accl;          // [C*R]
  unsigned* ref;        // [C*R]
  unsigned* counter;    // [C]
  __nv_bfloat16* out;   // [C*R][D]
};

// Split s's synthetic state of row `row` (of all C*R): running max m, row sum l, normalised
// partial column c.
__device__ __forceinline__ float syn_m(int row, int s) { return ((row * 7 + s * 13) % 17) * 0.25f; }
__device__ __forceinline__ float syn_l(int row, int s) { return 1.f + ((row + 3 * s) % 5); }
__device__ __forceinline__ float syn_v(int row, int s, int c) {
  return (((row * 131 + s * 71 + c * 29) % 97) - 48) * (1.f / 64.f);
}

__device__ __forceinline__ void red_v4(float* a, float x, float y, float z, float w) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(x), "f"(y), "f"(z),
               "f"(w)
               : "memory");
}

__global__ void __launch_bounds__(THREADS, 1) split_probe(const Probe p) {
  extern __shared__ float smem[];  // (only reserves the SM)
  __shared__ float scale[256];
  __shared__ int last;
  griddep_launch_dependents();
  const int c = blockIdx.x, s = blockIdx.y, tid = threadIdx.x;
  const unsigned h = (static_cast<unsigned>(s) * 2654435761u + c * 40503u) >> 7;
  const long long until = p.spin + (p.jitter ? h % p.jitter : 0);
  const long long t0 = clock64();
  while (clock64() - t0 < until) {
  }
  if (p.mode == 0) {
    if (tid == 0 && until < 0) smem[0] = 1.f;
    return;
  }
  const int rows = p.C * p.R, r0 = c * p.R;
  constexpr int C4 = D / 4;
  if (p.mode == 1) {
    for (int i = tid; i < p.R * C4; i += THREADS) {
      const int row = r0 + i / C4, col = 4 * (i % C4);
      __nv_bfloat16* dst = p.part + (static_cast<int64_t>(s) * rows + row) * D + col;
      __nv_bfloat162 a = __floats2bfloat162_rn(syn_v(row, s, col), syn_v(row, s, col + 1));
      __nv_bfloat162 b = __floats2bfloat162_rn(syn_v(row, s, col + 2), syn_v(row, s, col + 3));
      uint2 u;
      u.x = *reinterpret_cast<unsigned*>(&a);
      u.y = *reinterpret_cast<unsigned*>(&b);
      *reinterpret_cast<uint2*>(dst) = u;
    }
    for (int i = tid; i < p.R; i += THREADS) {
      const int row = r0 + i;
      p.lse[s * rows + row] = syn_m(row, s) + log2f(syn_l(row, s));
    }
    return;
  }
  // ---- atomic: the common offsets, then the weighted sums
  for (int i = tid; i < p.R; i += THREADS) {
    const int row = r0 + i;
    const float m = syn_m(row, s);
    float ref = 0.f;
    if (p.mode != 3) {
      const unsigned old = atomicCAS(p.ref + row, SENTINEL, __float_as_uint(m));
      ref = old == SENTINEL ? m : __uint_as_float(old);
    }
    const float w = exp2f(m - ref);
    scale[i] = w;
    atomicAdd(p.accl + row, syn_l(row, s) * w);
  }
  __syncthreads();
  for (int i = tid; i < p.R * C4; i += THREADS) {
    const int row = r0 + i / C4, col = 4 * (i % C4);
    const float w = scale[i / C4] * syn_l(row, s);
    float* a = p.acc + static_cast<int64_t>(row) * D + col;
    const float x = w * syn_v(row, s, col), y = w * syn_v(row, s, col + 1);
    const float z = w * syn_v(row, s, col + 2), q = w * syn_v(row, s, col + 3);
    if (p.mode == 4) {
      atomicAdd(a, x);
      atomicAdd(a + 1, y);
      atomicAdd(a + 2, z);
      atomicAdd(a + 3, q);
    } else {
      red_v4(a, x, y, z, q);
    }
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(p.counter + c, 1u) == static_cast<unsigned>(p.S - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // ---- the last arrival: out = O / l, then clear for the next call
  for (int i = tid; i < p.R * C4; i += THREADS) {
    const int row = r0 + i / C4, col = 4 * (i % C4);
    float4* a = reinterpret_cast<float4*>(p.acc + static_cast<int64_t>(row) * D + col);
    const float4 v = __ldcg(a);
    const float l = __ldcg(p.accl + row);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * inv, v.y * inv);
    __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * inv, v.w * inv);
    uint2 u;
    u.x = *reinterpret_cast<unsigned*>(&lo);
    u.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(p.out + static_cast<int64_t>(row) * D + col) = u;
    __stcg(a, make_float4(0.f, 0.f, 0.f, 0.f));
  }
  __syncthreads();  // every accl read above before it is cleared
  for (int i = tid; i < p.R; i += THREADS) {
    __stcg(p.accl + r0 + i, 0.f);
    p.ref[r0 + i] = SENTINEL;
  }
  if (tid == 0) p.counter[c] = 0u;
}

__global__ void __launch_bounds__(256) empty_kernel(int never) {
  if (never == 12345 && threadIdx.x == 0) asm volatile("trap;");
}

__global__ void fill_u32(unsigned* a, unsigned v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = v;
}

struct State {
  Probe p{};
  MergeParams mp{};
  bool ready = false;
};
State g;

int setup(int S, int C, int R) {
  if (g.ready) {
    cudaFree(g.p.part);
    cudaFree(g.p.lse);
    cudaFree(g.p.acc);
    cudaFree(g.p.accl);
    cudaFree(g.p.ref);
    cudaFree(g.p.counter);
    cudaFree(g.p.out);
  }
  const int rows = C * R;
  Probe& p = g.p;
  p.S = S, p.C = C, p.R = R;
  cudaMalloc(&p.part, sizeof(__nv_bfloat16) * S * rows * D);
  cudaMalloc(&p.lse, sizeof(float) * S * rows);
  cudaMalloc(&p.acc, sizeof(float) * rows * D);
  cudaMalloc(&p.accl, sizeof(float) * rows);
  cudaMalloc(&p.ref, sizeof(unsigned) * rows);
  cudaMalloc(&p.counter, sizeof(unsigned) * C);
  cudaMalloc(&p.out, sizeof(__nv_bfloat16) * rows * D);
  cudaMemset(p.acc, 0, sizeof(float) * rows * D);
  cudaMemset(p.accl, 0, sizeof(float) * rows);
  cudaMemset(p.counter, 0, sizeof(unsigned) * C);
  fill_u32<<<(rows + 255) / 256, 256>>>(p.ref, SENTINEL, rows);
  MergeParams& m = g.mp;
  m.part = p.part;
  m.lse = p.lse;
  m.out = p.out;
  m.so_b = static_cast<int64_t>(rows) * D;
  m.so_t = D;
  m.so_h = D;
  m.Hkv = 1, m.G = 1, m.rows = rows, m.num_splits = S, m.ws_rows = rows, m.half_row = -1;
  g.ready = true;
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, split_probe);
  SMEM = optin - static_cast<int>(fa.sharedSizeBytes);
  cudaFuncSetAttribute(split_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
  return static_cast<int>(cudaDeviceSynchronize());
}

int launch(int mode, int merge_pdl, cudaStream_t st) {
  if (mode == 7) return launch_kernel(empty_kernel, dim3(g.mp.rows), dim3(256), 0, st, false, 0);
  if (mode == 8)
    return g.mp.num_splits > MERGE_WIDE_ENTRIES
               ? static_cast<int>(cudaErrorInvalidValue)
               : launch_kernel(merge_splits_wide_kernel<__nv_bfloat16, __nv_bfloat16>,
                               dim3(g.mp.rows), dim3(MERGE_WIDE_THREADS), 0, st, false, g.mp);
  if (mode >= 9 && mode <= 12)
    return launch_merge_cols<__nv_bfloat16, __nv_bfloat16>(g.mp, 1, st, false, 2 << (mode - 9));
  int rc = 0;
  if (mode != 5) {
    g.p.mode = mode == 6 ? 1 : mode;
    rc = launch_kernel(split_probe, dim3(g.p.C, g.p.S), dim3(THREADS), SMEM, st, false, g.p);
  }
  if (rc == 0 && (mode == 1 || mode == 5))
    rc = launch_merge_splits<__nv_bfloat16, D, __nv_bfloat16>(g.mp, 1, st,
                                                              mode == 1 && merge_pdl != 0);
  return rc;
}

}  // namespace

extern "C" {

// µs a call: `calls` back-to-back calls captured in one graph, `reps` replays between two events
// (after 3 warm-ups), the median of `rounds` such timings. <0: a CUDA error (negated).
float probe_run(int S, int C, int R, int mode, int merge_pdl, long long spin, int jitter,
                int calls, int reps, int rounds) {
  int rc = setup(S, C, R);
  if (rc) return -static_cast<float>(rc);
  g.p.spin = spin;
  g.p.jitter = jitter;
  if (mode == 5 || mode >= 8) {  // the merge alone reads partials one split grid wrote
    rc = launch(6, 0, 0);
    if (rc == 0) rc = static_cast<int>(cudaDeviceSynchronize());
    if (rc) return -static_cast<float>(rc);
  }
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < calls; ++i) launch(mode, merge_pdl, st);
  cudaStreamEndCapture(st, &graph);
  rc = static_cast<int>(cudaGraphInstantiate(&exec, graph, 0));
  if (rc) return -static_cast<float>(rc);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, st);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best[64];
  rounds = rounds > 64 ? 64 : rounds;
  for (int k = 0; k < rounds; ++k) {
    cudaEventRecord(a, st);
    for (int i = 0; i < reps; ++i) cudaGraphLaunch(exec, st);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    best[k] = ms * 1e3f / (reps * calls);
  }
  rc = static_cast<int>(cudaStreamSynchronize(st));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(st);
  if (rc) return -static_cast<float>(rc);
  for (int i = 1; i < rounds; ++i)  // insertion sort, then the median
    for (int j = i; j > 0 && best[j] < best[j - 1]; --j) {
      const float t = best[j];
      best[j] = best[j - 1];
      best[j - 1] = t;
    }
  return best[rounds / 2];
}

// The largest |atomic out - merged out| over all rows and columns after one call of each (mode
// 2 or `mode`, against mode 1 with kdtree's merge), and the largest |merged out|; <0 on error.
float probe_check(int S, int C, int R, int mode, float* max_ref) {
  int rc = setup(S, C, R);
  if (rc) return -static_cast<float>(rc);
  g.p.spin = 0;
  g.p.jitter = 1000;
  const int n = C * R * D;
  __nv_bfloat16 *h1 = new __nv_bfloat16[n], *h2 = new __nv_bfloat16[n];
  launch(1, 0, 0);
  cudaMemcpy(h1, g.p.out, sizeof(__nv_bfloat16) * n, cudaMemcpyDeviceToHost);
  cudaMemset(g.p.out, 0, sizeof(__nv_bfloat16) * n);
  if (mode >= 8) launch(6, 0, 0);  // (the merge variants read mode 1's partials)
  for (int i = 0; i < 3; ++i) launch(mode, 0, 0);  // (the accumulator must come back clear)
  rc = static_cast<int>(cudaMemcpy(h2, g.p.out, sizeof(__nv_bfloat16) * n, cudaMemcpyDeviceToHost));
  float err = 0.f, mx = 0.f;
  for (int i = 0; i < n; ++i) {
    const float x = __bfloat162float(h1[i]), y = __bfloat162float(h2[i]);
    err = fmaxf(err, fabsf(x - y));
    mx = fmaxf(mx, fabsf(x));
  }
  delete[] h1;
  delete[] h2;
  *max_ref = mx;
  return rc ? -static_cast<float>(rc) : err;
}

}  // extern "C"
