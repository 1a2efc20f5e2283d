// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the forward tile scheduler's device side (its order and host plan:
// hopper/fwd_scheduler.h): the work piece of each round, for the producer
// thread and for the compute warps, and, under the dynamic order, the
// hand-off of each next item from the producer, which fetches it from the
// counter, to the compute warps, through a ring of two slots in shared
// memory that the scheduler owns (FwdSchedulerShared; FlashAttention-3's
// DynamicPersistentTileScheduler hands its tiles over the same way).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "hopper/fwd_scheduler.h"

namespace attnlab {

// The hand-off's shared memory: per slot an item and a full/empty barrier
// pair (full: the producer's arrival, which releases its store of the item;
// empty: one arrival per compute thread). kBytes of it, 8-byte aligned, after
// the block's other barriers (WsShared).
struct FwdSchedulerShared {
  static constexpr int kSlots = 2;
  static constexpr int kBarriers = 2 * kSlots;
  static constexpr int kBytes = 8 * kBarriers + 4 * kSlots;
  uint64_t* item_full;   // [kSlots]
  uint64_t* item_empty;  // [kSlots]
  int* item;             // [kSlots]
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The hand-off laid out at `at`.
__device__ __forceinline__ FwdSchedulerShared fwd_scheduler_shared(uint64_t* at) {
  FwdSchedulerShared s;
  s.item_full = at;
  s.item_empty = at + FwdSchedulerShared::kSlots;
  s.item = reinterpret_cast<int*>(at + 2 * FwdSchedulerShared::kSlots);
  return s;
}

// By one thread, before the block's first __syncthreads; `consumers`: the compute threads.
__device__ __forceinline__ void fwd_scheduler_init(const FwdSchedulerShared& s, int consumers) {
  for (int slot = 0; slot < FwdSchedulerShared::kSlots; ++slot) {
    mbarrier_init(&s.item_full[slot], 1);
    mbarrier_init(&s.item_empty[slot], consumers);  // every compute thread: see fwd_compute_piece
  }
}

// The block's work piece of round `round`, for its producer thread (the
// order's, or under a dynamic order the next item of `counter`) and for its
// compute warps (the order's, or the one the producer handed over). `counter`
// holds the items taken after round 0, from 0.
__device__ __forceinline__ WorkPiece fwd_producer_piece(const FwdSchedulerShared& s, const TileOrder& order,
                                                        int* counter, int round) {
  if (!order.dynamic || round == 0) return order.piece(blockIdx.x, gridDim.x, round);
  const int u = round - 1, slot = u % FwdSchedulerShared::kSlots;  // the hand-off's index
  const int next = atomicAdd(counter, 1) + int(gridDim.x);
  WorkPiece w;
  w.item = next < order.items ? next : -1;
  if (u >= FwdSchedulerShared::kSlots) mbarrier_wait(&s.item_empty[slot], (u / FwdSchedulerShared::kSlots - 1) & 1);
  s.item[slot] = w.item;
  mbarrier_arrive(&s.item_full[slot]);
  return w;
}
__device__ __forceinline__ WorkPiece fwd_compute_piece(const FwdSchedulerShared& s, const TileOrder& order,
                                                       int round) {
  if (!order.dynamic || round == 0) return order.piece(blockIdx.x, gridDim.x, round);
  const int u = round - 1, slot = u % FwdSchedulerShared::kSlots;
  mbarrier_wait(&s.item_full[slot], (u / FwdSchedulerShared::kSlots) & 1);
  WorkPiece w;
  w.item = *static_cast<volatile int*>(&s.item[slot]);
  // Every thread that read the slot arrives (not one lane per warp after a
  // __syncwarp): racecheck orders a read before the producer's next store only
  // through the reading thread's own arrival.
  mbarrier_arrive(&s.item_empty[slot]);
  return w;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
