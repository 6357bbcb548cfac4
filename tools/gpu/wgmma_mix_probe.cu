// Does a small wgmma cost more among big ones than alone? (session 21: every form of the GQA
// key tail -- swapped-operand m64n8k16 MMAs beside the rows' m64n128k16 ones -- cost the Wide
// shape 1-2 us a tile of its parity, several times what wgmma_rate_probe.cu's homogeneous
// sequences price those MMAs at.) Every SM's CTA runs one or two warpgroups; each round a warpgroup
// issues the pattern of its role (below) from 128B-swizzled shared memory (zeros) and retires it
// as the GQA kernel does, and the probe prints the cycles a round of the busiest warpgroup
// (clock64 around the loop, the largest over the warpgroups' first threads, all started after a
// barrier), against what the homogeneous rates predict (m64n128k16 64 cycles, m64n8k16 18).
//
// The rows' batch ("rows"): S = Q K^T, 8 k-steps of ss_n128 (commit), then O += P V, 8 of
// rs_n128_tb with A from registers (commit), waited for as consume_tile does (S, then P V).
// The tail's MMAs ("tail"): S^T = K Q^T, 8 of ss_n8; O^T += V^T P^T, 8 of ss_n8_ta.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/wgmma_mix_probe \
//     tools/gpu/wgmma_mix_probe.cu && /tmp/wgmma_mix_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstdio>

#include "../../kernels/sm90_common.cuh"

using namespace kdtree_sm90;
using E = __nv_bfloat16;

constexpr int ROUNDS = 128;

// What a warpgroup issues each round:
enum Pattern : int {
  ROWS = 0,         // the rows' batch alone
  ROWS_ST = 1,      // + S^T in a group of its own after P V (form d's batch)
  ST_ROWS = 2,      // S^T first, then the rows' batch (form b's)
  ROWS_ST_OT = 3,   // + S^T and O^T after P V (both tail halves in the batch)
  S_ST_PV = 4,      // S, S^T in S's group, then P V (S^T retired with S)
  ROWS_THEN_RT = 5, // the rows' batch retired, then S^T and O^T each a round trip (form a)
  TAIL_ONLY = 6,    // S^T and O^T, each a round trip, no rows
  IDLE = 7,         // nothing (a warpgroup that only waits at the barrier)
};

__device__ __forceinline__ void rows_s(float (&s)[64], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) Wgmma<E>::ss_n128(s, dq + (ks & 3) * 2, dk + (ks & 3) * 2, 1);
}
__device__ __forceinline__ void rows_pv(float (&o)[64], const uint32_t (&a)[4], uint64_t dv) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) Wgmma<E>::rs_n128_tb(o, a, dv + (ks & 3) * (2048 >> 4), 1);
}
__device__ __forceinline__ void tail_st(float (&t)[4], uint64_t dk, uint64_t dqt) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) Wgmma<E>::ss_n8(t, dk + (ks & 3) * 2, dqt + (ks & 3) * 2, 1);
}
__device__ __forceinline__ void tail_ot(float (&u)[4], uint64_t dv, uint64_t dpt) {
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) Wgmma<E>::ss_n8_ta(u, dv + (ks & 3) * (2048 >> 4), dpt + (ks & 3) * 2, 1);
}

// S^T, then O^T, each a round trip (a fence before the first is the caller's).
__device__ __forceinline__ void tail_round_trips(float (&t)[4], float (&u)[4], uint64_t dk,
                                                 uint64_t dv, uint64_t dt) {
  tail_st(t, dk, dt);
  wg_commit();
  wg_wait<0>();
  pin(t);
  wg_fence();
  tail_ot(u, dv, dt);
  wg_commit();
  wg_wait<0>();
}

// One warpgroup's rounds of pattern PAT (a compile-time pattern: a run-time one makes ptxas
// serialise every wgmma, C7520); its cycles into cycles[w].
template <int PAT>
__device__ __forceinline__ void rounds(uint32_t base, int w, unsigned long long* cycles,
                                       float* sink) {
  // Q / K (K-major, 64 dims an atom row), V (MN-major as the GQA kernel's), Q^T / P^T (8 rows)
  const uint64_t dq = wg_desc(base, 16, 1024);
  const uint64_t dk = wg_desc(base + 128 * 128, 16, 1024);
  const uint64_t dv = wg_desc(base + 128 * 128, 8192, 1024);
  const uint64_t dt = wg_desc(base + 256 * 128, 16, 1024);
  float s[64], o[64], t[4], u[4];
  uint32_t a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) t[i] = u[i] = 0.f;
  const long long t0 = clock64();
#pragma unroll 1
  for (int r = 0; r < (PAT == IDLE ? 0 : ROUNDS); ++r) {
    pin(s);
    pin(o);
    pin(t);
    pin(u);
    wg_fence();
    if constexpr (PAT == TAIL_ONLY) {
      tail_round_trips(t, u, dk, dv, dt);
      continue;
    }
    if constexpr (PAT == ST_ROWS) {
      tail_st(t, dk, dt);
      wg_commit();
    }
    rows_s(s, dq, dk);
    if constexpr (PAT == S_ST_PV) tail_st(t, dk, dt);
    wg_commit();
    rows_pv(o, a, dv);
    wg_commit();
    if constexpr (PAT == ROWS_ST || PAT == ROWS_ST_OT) {
      tail_st(t, dk, dt);
      if constexpr (PAT == ROWS_ST_OT) tail_ot(u, dv, dt);
      wg_commit();
      wg_wait<2>();  // S done
    } else {
      wg_wait<1>();  // S (and a first S^T) done
    }
    pin(s);
    wg_wait<0>();
    pin(o);
    if constexpr (PAT == ROWS_THEN_RT) {
      pin(t);
      wg_fence();
      tail_round_trips(t, u, dk, dv, dt);
    }
  }
  wg_wait<0>();
  pin(s);
  pin(o);
  pin(t);
  pin(u);
  const long long t1 = clock64();
  if ((threadIdx.x & 127) == 0) atomicMax(cycles + w, static_cast<unsigned long long>(t1 - t0));
  float z = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) z += s[i] + o[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) z += t[i] + u[i];
  if (z != 0.f) sink[threadIdx.x] = z;  // (never: zeros; keeps the MMAs)
}

template <int P0, int PR>
__global__ void __launch_bounds__(256, 1) probe(unsigned long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  for (int i = threadIdx.x; i < (128 + 128 + 64) * 128 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0u;
  fence_async_smem();
  __syncthreads();
  const int w = threadIdx.x >> 7;
  if (w == 0)
    rounds<P0>(base, w, cycles, sink);
  else
    rounds<PR>(base, w, cycles, sink);
}

const char* kName[] = {"rows",     "rows + S^T (own group)", "S^T + rows",
                       "rows + S^T + O^T", "S + S^T, P V", "rows, then S^T / O^T round trips",
                       "S^T / O^T round trips", "idle"};
// what the homogeneous rates predict for a round of the pattern (cycles of tensor work)
const double kWork[] = {1024, 1024 + 144, 1024 + 144, 1024 + 288, 1024 + 144, 1024 + 288, 288, 0};

template <int P0, int PR>
void run(int wgs, unsigned long long* d_cycles, float* d_sink, int sms) {
  const int pat0 = P0, pat_rest = PR;
  const int smem = (128 + 128 + 64) * 128;
  cudaFuncSetAttribute(probe<P0, PR>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  for (int rep = 0; rep < 2; ++rep) {  // (the first a warm-up)
    cudaMemset(d_cycles, 0, 3 * sizeof(unsigned long long));
    probe<P0, PR><<<sms, 128 * wgs, smem>>>(d_cycles, d_sink);
  }
  unsigned long long cyc[3] = {0, 0, 0};
  cudaMemcpy(cyc, d_cycles, sizeof(cyc), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  double work = kWork[pat0] + (wgs - 1) * kWork[pat_rest];
  printf("%d WG | wg0: %-34s | others: %-22s |", wgs, kName[pat0], wgs > 1 ? kName[pat_rest] : "-");
  for (int w = 0; w < wgs; ++w) printf(" wg%d %7.1f", w, static_cast<double>(cyc[w]) / ROUNDS);
  printf(" cycles a round | tensor work %6.0f %s\n", work,
         err == cudaSuccess ? "" : cudaGetErrorString(err));
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, 3 * sizeof(unsigned long long));
  cudaMalloc(&d_sink, 256 * sizeof(float));
  printf("one CTA a SM (%d), %d rounds; cycles a round of each warpgroup (clock64)\n", sms, ROUNDS);
  run<0, ROWS>(1, d_cycles, d_sink, sms);
  run<1, ROWS>(1, d_cycles, d_sink, sms);
  run<2, ROWS>(1, d_cycles, d_sink, sms);
  run<3, ROWS>(1, d_cycles, d_sink, sms);
  run<4, ROWS>(1, d_cycles, d_sink, sms);
  run<5, ROWS>(1, d_cycles, d_sink, sms);
  run<6, ROWS>(1, d_cycles, d_sink, sms);
  run<0, ROWS>(2, d_cycles, d_sink, sms);
  run<1, ROWS>(2, d_cycles, d_sink, sms);
  run<2, ROWS>(2, d_cycles, d_sink, sms);
  run<3, ROWS>(2, d_cycles, d_sink, sms);
  run<4, ROWS>(2, d_cycles, d_sink, sms);
  run<5, ROWS>(2, d_cycles, d_sink, sms);
  run<6, ROWS>(2, d_cycles, d_sink, sms);
  run<1, 1>(2, d_cycles, d_sink, sms);
  run<2, 2>(2, d_cycles, d_sink, sms);
  run<3, 3>(2, d_cycles, d_sink, sms);
  run<4, 4>(2, d_cycles, d_sink, sms);
  run<5, 5>(2, d_cycles, d_sink, sms);
  run<TAIL_ONLY, IDLE>(2, d_cycles, d_sink, sms);
  return 0;
}
