// A CPU stand-in for the few CUDA features kernels/tree_build.cu uses, so the same source runs
// under g++ (-std=c++20 -pthread) in the CPU test suite: one std::thread per CUDA thread, one
// std::barrier per block for __syncthreads and one per warp for the shuffles (which every lane
// of a warp reaches together in that kernel). Blocks run one after another. Not a general CUDA
// emulator: int atomicAdd / atomicMin only, the shuffles it uses (up, down, xor, indexed), ballot,
// __ffs and __clzll, no warp divergence inside a shuffle, no streams.
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x) alignas(x)

struct kdtree_emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};

namespace kdtree_emu {

struct Block {
  std::vector<unsigned char> smem;
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
  std::vector<uint64_t> shfl;  // [threads] exchange slots
};

inline thread_local Block* tl_block = nullptr;
inline thread_local kdtree_emu_dim3 tl_thread{}, tl_block_idx{};

inline unsigned char* block_smem() { return tl_block->smem.data(); }

// Run `body` as a grid of `blocks` blocks of `threads` threads with `smem` bytes each.
inline void launch(int blocks, int threads, size_t smem, const std::function<void()>& body) {
  for (int b = 0; b < blocks; ++b) {
    Block blk;
    blk.smem.assign(smem + 16, 0xCD);  // poisoned, like uninitialised shared memory
    blk.bar = std::make_unique<std::barrier<>>(threads);
    for (int w = 0; w < (threads + 31) / 32; ++w)
      blk.warp_bar.push_back(std::make_unique<std::barrier<>>(std::min(32, threads - 32 * w)));
    blk.shfl.assign(threads, 0);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        tl_block = &blk;
        tl_thread = {static_cast<unsigned>(t), 0, 0};
        tl_block_idx = {static_cast<unsigned>(b), 0, 0};
        body();
      });
    }
    for (auto& th : pool) th.join();
    // the 16 bytes past the block's shared memory must still hold the poison: a write past
    // the layout's end would otherwise go unseen
    for (size_t i = smem; i < smem + 16; ++i) {
      if (blk.smem[i] != 0xCD) {
        std::fprintf(stderr, "kdtree_emu: shared-memory write past byte %zu in block %d\n", smem,
                     b);
        std::abort();
      }
    }
  }
}

// Every shuffle here is warp-wide: a partial mask would mean divergent lanes, which this
// stand-in cannot model.
inline void check_full_mask(unsigned mask) {
  if (mask != 0xFFFFFFFFu) {
    std::fprintf(stderr, "kdtree_emu: shuffle with mask %08x (only full warps modelled)\n", mask);
    std::abort();
  }
}

template <typename V>
inline V shfl(V v, int src_lane, bool keep_own) {
  const unsigned t = tl_thread.x, warp = t / 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(V));
  tl_block->shfl[t] = bits;
  tl_block->warp_bar[warp]->arrive_and_wait();
  V out = v;
  if (!keep_own) std::memcpy(&out, &tl_block->shfl[warp * 32 + src_lane], sizeof(V));
  tl_block->warp_bar[warp]->arrive_and_wait();
  return out;
}

// OR of every lane's `bits` (each lane contributes its own bit).
inline uint64_t shfl_gather(uint64_t bits) {
  const unsigned t = tl_thread.x, warp = t / 32;
  tl_block->shfl[t] = bits;
  tl_block->warp_bar[warp]->arrive_and_wait();
  uint64_t out = 0;
  const unsigned n = static_cast<unsigned>(tl_block->shfl.size());
  for (unsigned l = warp * 32; l < warp * 32 + 32 && l < n; ++l) out |= tl_block->shfl[l];
  tl_block->warp_bar[warp]->arrive_and_wait();
  return out;
}

}  // namespace kdtree_emu

#define threadIdx (kdtree_emu::tl_thread)
#define blockIdx (kdtree_emu::tl_block_idx)

inline void __syncthreads() { kdtree_emu::tl_block->bar->arrive_and_wait(); }

template <typename V>
inline V __shfl_up_sync(unsigned mask, V v, int o) {
  kdtree_emu::check_full_mask(mask);
  const int lane = static_cast<int>(threadIdx.x & 31);
  return kdtree_emu::shfl(v, lane - o, lane < o);
}

template <typename V>
inline V __shfl_down_sync(unsigned mask, V v, int o) {
  kdtree_emu::check_full_mask(mask);
  const int lane = static_cast<int>(threadIdx.x & 31);
  return kdtree_emu::shfl(v, lane + o, lane + o > 31);
}

template <typename V>
inline V __shfl_xor_sync(unsigned mask, V v, int o) {
  kdtree_emu::check_full_mask(mask);
  const int lane = static_cast<int>(threadIdx.x & 31);
  return kdtree_emu::shfl(v, lane ^ o, false);
}

template <typename V>
inline V __shfl_sync(unsigned mask, V v, int src) {
  kdtree_emu::check_full_mask(mask);
  return kdtree_emu::shfl(v, src, false);
}

inline int atomicAdd(int* address, int v) { return std::atomic_ref<int>(*address).fetch_add(v); }

inline int atomicMin(int* address, int v) {
  std::atomic_ref<int> ref(*address);
  int old = ref.load();
  while (v < old && !ref.compare_exchange_weak(old, v)) {
  }
  return old;
}

inline unsigned __ballot_sync(unsigned mask, bool pred) {
  kdtree_emu::check_full_mask(mask);
  const unsigned lane = threadIdx.x & 31;
  const uint64_t all = kdtree_emu::shfl_gather(pred ? 1ull << lane : 0ull);
  return static_cast<unsigned>(all);
}

inline int __ffs(int x) { return __builtin_ffs(x); }

inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}

inline long long clock64() { return 0; }  // no cycle counter to stand in for

inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, sizeof(i));
  return i;
}

using std::fmaxf;
using std::fminf;
using std::min;
using std::max;
