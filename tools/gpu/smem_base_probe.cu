// Where does a CTA's dynamic shared memory start? (session 19: whether the GQA kernel's 1 KB
// alignment slack, ALIGN in kernels/gqa_tree_sm90.cu, could be reclaimed for a tail in the Wide
// shape.) Prints the shared-window address of the dynamic array, mod 1024, for kernels with no
// static shared memory and with 16 / 200 bytes of it, at 1 KB / 100 KB / 227 KB of dynamic
// shared memory, and across the CTAs of a full wave.
//   nvcc -arch=sm_90a -o /tmp/smem_base_probe tools/gpu/smem_base_probe.cu && /tmp/smem_base_probe
#include <cstdio>
#include <cuda_runtime.h>

template <int STATIC_BYTES>
__global__ void probe(unsigned* out) {
  extern __shared__ __align__(1024) unsigned char dyn[];
  unsigned addr;
  asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(dyn));
  if constexpr (STATIC_BYTES > 0) {
    __shared__ unsigned char st[STATIC_BYTES];
    st[threadIdx.x % STATIC_BYTES] = 1;
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(out + 1, static_cast<unsigned>(st[0]));
  }
  if (threadIdx.x == 0) {
    atomicMax(out + 2, addr & 1023u);  // the largest misalignment over the grid
    atomicMin(out + 3, addr & 1023u);
    out[0] = addr;
  }
}

template <int S>
void run(int dyn_bytes, int ctas) {
  unsigned* d;
  cudaMalloc(&d, 16);
  unsigned init[4] = {0, 0, 0, 0xffffffffu};
  cudaMemcpy(d, init, 16, cudaMemcpyHostToDevice);
  cudaFuncSetAttribute(probe<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn_bytes);
  probe<S><<<ctas, 128, dyn_bytes>>>(d);
  cudaError_t e = cudaDeviceSynchronize();
  unsigned h[4];
  cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost);
  printf("static=%4d dynamic=%6d ctas=%4d: dyn base 0x%05x (mod 1024: max %u, min %u) %s\n", S,
         dyn_bytes, ctas, h[0], h[2], h[3], cudaGetErrorString(e));
  cudaFree(d);
}

int main() {
  int reserved = 0;
  cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0);
  printf("reserved shared memory a block: %d bytes\n", reserved);
  for (int dyn : {1024, 100 * 1024, 227 * 1024}) {
    run<0>(dyn, 264);
    run<16>(dyn - 1024, 264);
    run<200>(dyn - 1024, 264);
  }
  return 0;
}
