// kernels/flash_attn/: used by rungs 03 and 04 alone, so it sits beside them.
// attnlab: a ring of shared-memory slots through which K and V stream in the
// order they are used: K_0, V_0, K_1, V_1, ... (item i is tile i/2; K when i is
// even). K and V no longer need buffers of their own: with 2 slots, V_j lands
// while S_j = Q·K_jᵀ is computed and K_{j+1} lands while P_j·V_j is computed,
// in the memory rung 02 spent on one K and one V buffer.
//
// Each item is one cp.async commit group. With kSlots >= 2 the ring keeps
// kSlots - 1 items in flight; with one slot nothing overlaps (the item can only
// be fetched once the block is done with the previous one).
#pragma once

#include "common/ptx.cuh"
#include "common/tile_copy.cuh"

namespace attnlab {

template <int kSlots, int Bc, int D, int kStride, int kThreads, typename T>
struct KVRing {
  static_assert(kSlots >= 1, "at least one slot");
  static constexpr int kSlotElems = Bc * kStride;  // one [Bc, D + pad] tile

  T* base;       // [kSlots][Bc, kStride] in shared memory
  const T* K;    // [Nk, D] of the KV head this block reads
  const T* V;    // [Nk, D] of the KV head this block reads
  int Nk;
  int n_items;   // 2 · (number of KV tiles)

  __device__ T* slot(int item) const { return base + (item % kSlots) * kSlotElems; }

  // Starts copying item `item` into its slot (an empty group past the end, so
  // the group count stays uniform).
  __device__ void issue(int item) const {
    if (item < n_items) {
      const int tile = item / 2;
      const T* src = ((item & 1) ? V : K) + int64_t(tile) * Bc * D;
      load_tile_async<Bc, D, kStride, kThreads>(slot(item), src, D, Nk - tile * Bc);
    }
    cp_async_commit();
  }

  __device__ void prologue() const {
    for (int i = 0; i < kSlots - 1; ++i) issue(i);
  }

  // Returns item `item` once the whole block can read it, and refills the slot
  // of item - 1 (every warp is past it when this barrier opens).
  __device__ const T* acquire(int item) const {
    if constexpr (kSlots == 1) {
      __syncthreads();  // the only slot is free once every warp is done with item - 1
      issue(item);
      cp_async_wait<0>();
      __syncthreads();
    } else {
      cp_async_wait<kSlots - 2>();
      __syncthreads();
      issue(item + kSlots - 1);
    }
    return slot(item);
  }
};

}  // namespace attnlab
