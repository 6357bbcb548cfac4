// The read floor at a size: one kernel that streams `bytes` from global memory once and nothing
// else (tools/gpu/read_floor.py times it under a CUDA graph, back to back over rotated buffers,
// like the verify bench). What no attention kernel reading the same bytes can beat at batch 1.
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ void mix(uint4& acc, const uint4& v) {
  acc.x ^= v.x;
  acc.y ^= v.y;
  acc.z ^= v.z;
  acc.w ^= v.w;
}

// Grid-stride over 16-byte words, four independent streaming loads in flight a thread; one word
// a CTA is written only when the XOR hits a magic value, so the loads are live but nothing else
// goes to memory.
__global__ void __launch_bounds__(1024) read_kernel(const uint4* __restrict__ src, size_t n16,
                                                    uint4* __restrict__ sink) {
  uint4 acc = make_uint4(0u, 0u, 0u, 0u);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);
    const uint4 c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
    mix(acc, a);
    mix(acc, b);
    mix(acc, c);
    mix(acc, d);
  }
  for (; i < n16; i += stride) mix(acc, __ldcs(src + i));
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// The same stream through a page table: word i is word (i & (page_words - 1)) of pool page
// table[i >> page_shift] (the verify bench's pools, pages of `page_words` 16-byte words), so the
// bytes come in page-sized runs at the table's places (random: a fragmented cache).
__global__ void __launch_bounds__(1024) paged_read_kernel(const uint4* __restrict__ pool,
                                                          const int* __restrict__ table,
                                                          size_t n16, int page_shift,
                                                          uint4* __restrict__ sink) {
  uint4 acc = make_uint4(0u, 0u, 0u, 0u);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t mask = (static_cast<size_t>(1) << page_shift) - 1;
  const auto at = [&](size_t i) {
    return pool + (static_cast<size_t>(__ldg(table + (i >> page_shift))) << page_shift) +
           (i & mask);
  };
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldcs(at(i)), b = __ldcs(at(i + stride));
    const uint4 c = __ldcs(at(i + 2 * stride)), d = __ldcs(at(i + 3 * stride));
    mix(acc, a);
    mix(acc, b);
    mix(acc, c);
    mix(acc, d);
  }
  for (; i < n16; i += stride) mix(acc, __ldcs(at(i)));
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

extern "C" int paged_read_launch(const void* pool, const int* table, size_t bytes, int page_shift,
                                 void* sink, int blocks, int threads, uintptr_t stream) {
  paged_read_kernel<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(pool), table, bytes / 16, page_shift, static_cast<uint4*>(sink));
  return static_cast<int>(cudaGetLastError());
}

extern "C" int read_floor_launch(const void* src, size_t bytes, void* sink, int blocks,
                                 int threads, uintptr_t stream) {
  read_kernel<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(src), bytes / 16, static_cast<uint4*>(sink));
  return static_cast<int>(cudaGetLastError());
}
