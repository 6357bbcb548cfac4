// What does one wgmma cost the tensor cores, by its N? (session 20: the key tail's swapped-operand
// m64n8k16 MMAs cost the GQA kernel far more than their FLOPs.) Every SM's CTA runs WGS warpgroups,
// each issuing ROUNDS x 8 k-steps of m64nNk16 (bf16, both operands from 128B-swizzled shared
// memory, as in kernels/gqa_tree_sm90.cu) into CHAINS accumulators in turn (one: each MMA waits
// for the last through its accumulator; more: independent MMAs in flight), then waits for them.
// Prints, per shape, the SM cycles per MMA of the busiest SM (clock64 around the issue loop and
// the final wait, the largest over the warpgroups' first threads; all start after a barrier) and
// the multiply-adds a cycle that makes, against the dense bf16 peak of 2048 a cycle per SM
// (989 TFLOP/s = 132 SMs x 4096 FLOP x 1.83 GHz; an m64n128k16 MMA is then 64 cycles).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/wgmma_rate_probe \
//     tools/gpu/wgmma_rate_probe.cu && /tmp/wgmma_rate_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstdio>

#include "../../kernels/sm90_common.cuh"

using namespace kdtree_sm90;
using E = __nv_bfloat16;

constexpr int ROUNDS = 256;

// TA: A MN-major (the swapped-operand P V^T's V^T), else K-major
template <int N, bool TA>
__device__ __forceinline__ void mma(float (&d)[N / 2], uint64_t da, uint64_t db) {
  if constexpr (TA && N == 8) Wgmma<E>::ss_n8_ta(d, da, db, 1);
  if constexpr (TA && N == 16) Wgmma<E>::ss_n16_ta(d, da, db, 1);
  if constexpr (TA) return;
  if constexpr (N == 8) Wgmma<E>::ss_n8(d, da, db, 1);
  if constexpr (N == 16) Wgmma<E>::ss_n16(d, da, db, 1);
  if constexpr (N == 32) Wgmma<E>::ss_n32(d, da, db, 1);
  if constexpr (N == 64) Wgmma<E>::ss_n64(d, da, db, 1);
  if constexpr (N == 128) Wgmma<E>::ss_n128(d, da, db, 1);
}

template <int N, int CHAINS, bool TA>
__global__ void __launch_bounds__(384, 1) probe(unsigned long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // zero A (64 rows x 64 dims; MN-major: 64 keys x 64 dims, a k-step 16 keys = 2 KB) and B (N
  // rows x 64 dims)
  for (int i = threadIdx.x; i < (64 + N) * 128 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0u;
  fence_async_smem();
  __syncthreads();
  // (MN-major A as the GQA kernel's V: the leading byte offset between 64-dim halves, unused at
  // M = 64, the stride byte offset between 8-key groups)
  const uint64_t da = TA ? wg_desc(base, 8192, 1024) : wg_desc(base, 16, 1024);
  const uint64_t db = wg_desc(base + 64 * 128, 16, 1024);
  float acc[CHAINS][N / 2];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[c][i] = 0.f;
  const long long t0 = clock64();
#pragma unroll 1
  for (int r = 0; r < ROUNDS; ++r) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) pin(acc[c]);
    wg_fence();  // (a batch's fence, as in the kernels)
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)  // (k-steps 4-7 repeat 0-3: one 64-dim atom)
      mma<N, TA>(acc[ks % CHAINS], da + (TA ? (ks & 3) * (2048 >> 4) : (ks & 3) * 2),
                 db + (ks & 3) * 2);
    wg_commit();
    wg_wait<1>();  // (at most two rounds in flight, as a kernel's batches would be)
  }
  wg_wait<0>();
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) pin(acc[c]);
  const long long t1 = clock64();
  if ((threadIdx.x & 127) == 0) atomicMax(cycles, static_cast<unsigned long long>(t1 - t0));
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += acc[c][i];
  if (s != 0.f) sink[threadIdx.x] = s;  // (never: zeros; keeps the MMAs)
}

template <int N, int CHAINS, bool TA = false>
void run(int wgs, unsigned long long* d_cycles, float* d_sink, int sms) {
  const int smem = (64 + N) * 128;
  cudaFuncSetAttribute(probe<N, CHAINS, TA>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaMemset(d_cycles, 0, sizeof(unsigned long long));
  probe<N, CHAINS, TA><<<sms, 128 * wgs, smem>>>(d_cycles, d_sink);  // warm-up
  cudaMemset(d_cycles, 0, sizeof(unsigned long long));
  probe<N, CHAINS, TA><<<sms, 128 * wgs, smem>>>(d_cycles, d_sink);
  unsigned long long cyc = 0;
  cudaMemcpy(&cyc, d_cycles, sizeof(cyc), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  const double per = static_cast<double>(cyc) / (static_cast<double>(ROUNDS) * 8 * wgs);
  const double macs = 64.0 * N * 16 / per;
  printf("m64n%-3dk16%s  warpgroups %d  chains %d  %8.1f cycles a MMA (SM)  %6.0f MAC a cycle  %5.1f %%"
         " of peak %s\n",
         N, TA ? " A MN-major" : "           ", wgs, CHAINS, per, macs, 100.0 * macs / 2048.0,
         err == cudaSuccess ? "" : cudaGetErrorString(err));
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, sizeof(unsigned long long));
  cudaMalloc(&d_sink, 384 * sizeof(float));
  printf("one CTA a SM (%d), %d rounds of 8 k-steps a warpgroup\n", sms, ROUNDS);
  for (int wgs = 1; wgs <= 3; wgs += 1) {
    run<8, 1>(wgs, d_cycles, d_sink, sms);
    run<8, 4>(wgs, d_cycles, d_sink, sms);
    run<16, 4>(wgs, d_cycles, d_sink, sms);
    run<32, 4>(wgs, d_cycles, d_sink, sms);
    run<64, 2>(wgs, d_cycles, d_sink, sms);
    run<128, 1>(wgs, d_cycles, d_sink, sms);
    run<8, 4, true>(wgs, d_cycles, d_sink, sms);
    run<16, 4, true>(wgs, d_cycles, d_sink, sms);
  }
  return 0;
}
