// Does compute-sanitizer racecheck model the one-way named-barrier hand-over (writer
// `barrier.arrive`, reader `barrier.sync`)? The seesaw MLA kernel hands P and the row maxima
// between its consumer warpgroups that way; PTX ISA (barrier{.cta}): "The barrier{.cta}.sync or
// barrier{.cta}.arrive instruction guarantees that when the barrier completes, prior memory
// accesses requested by this thread are performed relative to all threads participating in the
// barrier." One CTA of 64 threads: warp 0 writes 32 shared words, warp 1 reads them.
//   none:   no barrier between them (a real race: racecheck must report it)
//   sync:   both warps barrier.sync 1, 64 (the two-way form)
//   arrive: warp 0 barrier.arrive 1, 64 after its writes; warp 1 barrier.sync 1, 64 before its
//           reads (the one-way form)
// Build and run: nvcc -arch=sm_90a -o probe racecheck_barrier_probe.cu
//   compute-sanitizer --tool racecheck --racecheck-report hazard ./probe arrive
#include <cstdio>
#include <cstring>

__global__ void probe(int mode, int* out) {
  __shared__ int buf[32];
  const int lane = threadIdx.x & 31;
  if (threadIdx.x < 32) {
    buf[lane] = lane * 3 + 1;
    if (mode == 1) asm volatile("barrier.sync 1, 64;\n" ::: "memory");
    if (mode == 2) asm volatile("barrier.arrive 1, 64;\n" ::: "memory");
  } else {
    if (mode == 1 || mode == 2) asm volatile("barrier.sync 1, 64;\n" ::: "memory");
    out[lane] = buf[31 - lane];
  }
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "arrive";
  const int mode = strcmp(name, "none") == 0 ? 0 : strcmp(name, "sync") == 0 ? 1 : 2;
  int* out = nullptr;
  cudaMalloc(&out, 32 * sizeof(int));
  probe<<<1, 64>>>(mode, out);
  int host[32];
  cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < 32; ++i) bad += host[i] != (31 - i) * 3 + 1;
  printf("mode %s: %d of 32 words wrong (%s)\n", name, bad, cudaGetErrorString(cudaGetLastError()));
  cudaFree(out);
  return 0;
}
