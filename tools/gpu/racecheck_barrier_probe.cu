// Does compute-sanitizer racecheck model the one-way named-barrier hand-over (writer
// `barrier.arrive`, reader `barrier.sync`)? The seesaw MLA kernel hands P and the row maxima
// between its consumer warpgroups that way; PTX ISA (barrier{.cta}): "The barrier{.cta}.sync or
// barrier{.cta}.arrive instruction guarantees that when the barrier completes, prior memory
// accesses requested by this thread are performed relative to all threads participating in the
// barrier." Modes:
//   none:     one CTA of 64 threads, warp 0 writes 32 shared words, warp 1 reads them, no
//             barrier between (a real race: racecheck must report it)
//   sync:     the same, both warps barrier.sync 1, 64 (the two-way form)
//   arrive:   the same, warp 0 barrier.arrive 1, 64 after its writes, warp 1 barrier.sync 1, 64
//             before its reads (the one-way form, one generation)
//   pingpong: the kernel's shape: 384 threads, the last 128 exit at once (the producer), two
//             128-thread groups hand a row value back and forth `iters` times over barriers 6
//             (group 0 arrives, group 1 syncs) and 7 (the reverse), writers predicated on
//             lane % 4 == 0 (one of each quad, as the kernel's row statistics)
//   pingpong_regs: the same with setmaxnreg (producer 40, consumers 232), as the kernel
// Each mode also checks the values it read and prints how many were wrong.
// Build and run: nvcc -gencode arch=compute_90a,code=sm_90a -o probe racecheck_barrier_probe.cu
//   compute-sanitizer --tool racecheck --racecheck-report hazard ./probe pingpong
#include <cstdio>
#include <cstring>

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

__global__ void probe(int mode, int* out) {
  __shared__ int buf[32];
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    buf[lane] = lane * 3 + 1;
    if (mode == 1) bar_sync(1, 64);
    if (mode == 2) bar_arrive(1, 64);
  } else {
    if (mode == 1 || mode == 2) bar_sync(1, 64);
    out[lane] = buf[31 - lane] != (31 - lane) * 3 + 1;
  }
}

__global__ void __launch_bounds__(384, 1) pingpong(int regs, int iters, int* out) {
  __shared__ float ma[64], mb[64];
  const int tid = threadIdx.x;
  if (tid >= 256) {
    if (regs) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    return;
  }
  if (regs) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int g = tid >> 7;
  const int lane = tid & 31;
  const int row = ((tid >> 5) & 3) * 16 + (lane >> 2);
  int bad = 0;
  for (int i = 0; i < iters; ++i) {
    if (g == 0) {
      if ((lane & 3) == 0) ma[row] = static_cast<float>(2 * i + row);
      bar_arrive(6, 256);
      bar_sync(7, 256);
      bad += mb[row] != static_cast<float>(3 * i + row);
    } else {
      bar_sync(6, 256);
      bad += ma[row] != static_cast<float>(2 * i + row);
      if ((lane & 3) == 0) mb[row] = static_cast<float>(3 * i + row);
      bar_arrive(7, 256);
    }
  }
  atomicAdd(out, bad);
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "arrive";
  int* out = nullptr;
  cudaMalloc(&out, 32 * sizeof(int));
  cudaMemset(out, 0, 32 * sizeof(int));
  int mode = -1;
  if (strcmp(name, "none") == 0) mode = 0;
  if (strcmp(name, "sync") == 0) mode = 1;
  if (strcmp(name, "arrive") == 0) mode = 2;
  if (strcmp(name, "pingpong") == 0) mode = 3;
  if (strcmp(name, "pingpong_regs") == 0) mode = 4;
  if (mode < 0) {
    printf("unknown mode %s (none, sync, arrive, pingpong, pingpong_regs)\n", name);
    return 2;
  }
  if (mode <= 2)
    probe<<<1, 64>>>(mode, out);
  else
    pingpong<<<1, 384>>>(mode == 4, 8, out);
  int host[32];
  cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < (mode <= 2 ? 32 : 1); ++i) bad += host[i];
  printf("mode %s: %d wrong values read (%s)\n", name, bad, cudaGetErrorString(cudaGetLastError()));
  cudaFree(out);
  return 0;
}
