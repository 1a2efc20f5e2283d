// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the forward kernel's skeleton, in the roles of FlashAttention-3's
// kernel (hopper/flash_fwd_kernel_sm90.h): the block's shared memory and
// barriers, then the producer warpgroup, whose one thread issues every copy,
// and the compute warpgroups, all walking the block's work pieces as the tile
// scheduler deals them (hopper/fwd_scheduler.cuh). What a piece means is the
// caller's: rung 12 loads and computes a range of key tiles
// (hopper/fwd_mainloop.cuh), the block-sparse forward the tiles a block mask
// lists (kernels/blocksparse/fwd_mainloop.cuh).
#pragma once

#include <cuda.h>

#include "common/ptx.cuh"
#include "common/tma.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "hopper/fwd_scheduler.cuh"
#include "hopper/fwd_scheduler.h"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// One block of a forward kernel on Cfg's tiles: produce(sm, piece, ring) on
// the producer thread and compute(sm, piece, ring) on every compute thread,
// for each work piece of the block, in order (the two count the ring alike:
// WsRing). kOnePiece: the block takes its first piece only (a grid of one
// block per item, whose kernel has no loop to keep registers for).
template <typename Cfg, typename T, bool kOnePiece = false, typename Produce, typename Compute>
__device__ __forceinline__ void ws_fwd_block(unsigned char* smem_raw, const TileOrder& order, int* counter,
                                             const CUtensorMap* tma_q, const CUtensorMap* tma_k,
                                             const CUtensorMap* tma_v, Produce&& produce, Compute&& compute) {
  const WsShared<Cfg, T> sm(smem_raw);
  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // no copy may signal a barrier before it is initialised

  WsRing ring;
  if (threadIdx.x / 32 >= Cfg::kProducerWarp) {
    // ---- the producer: one thread issues every copy of the block -----------------
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 32 * Cfg::kProducerWarp) {
      prefetch_tensor_map(tma_q);
      prefetch_tensor_map(tma_k);
      prefetch_tensor_map(tma_v);
      WorkPiece piece;
      for (int round = 0; (piece = fwd_producer_piece(sm.sched, order, counter, round)).item >= 0; ++round) {
        produce(sm, piece, ring);
        if constexpr (kOnePiece) break;
      }
    }
    __syncwarp();
    return;
  }
  // ---- the compute warpgroups ---------------------------------------------------------
  warpgroup_reg_alloc<Cfg::kComputeRegs>();
  WorkPiece piece;
  for (int round = 0; (piece = fwd_compute_piece(sm.sched, order, round)).item >= 0; ++round) {
    compute(sm, piece, ring);
    if constexpr (kOnePiece) break;
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
