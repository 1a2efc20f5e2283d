// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: rung 12's epilogue, in the role of FlashAttention-3's
// CollectiveEpilogue (hopper/epilogue_fwd.hpp): a work piece's O / l and LSE
// stored by store_output (common/row_fragments.cuh) — LSE in natural log, O in
// the input dtype, rows past Nq not written — or, for a piece of an item that
// several blocks share (the stream-K split of hopper/fwd_scheduler.h), its
// partial state left for the block that ends the item, which merges the
// states of the blocks before it in block order (common/kv_split.cuh).
#pragma once

#include "common/kv_split.cuh"
#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "hopper/fwd_scheduler.cuh"
#include "host/attn_problem.h"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A compute warpgroup's 64 rows of work piece w, after ws_compute.
template <typename Cfg, typename T>
__device__ __forceinline__ void ws_epilogue(float (&O)[Cfg::kTilesO][4], RowStats& stats, const AttnProblem& p,
                                            const TileOrder& order, const WsWork& w, const KvSplitArgs& split,
                                            T* __restrict__ o, float* __restrict__ lse) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
  const int j0 = w.kv_begin, j_end = w.kv_begin + w.n_tiles;  // the same for every warpgroup
  const int row0 = w.q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // row of c0, c1

  // NEW (split, hopper/fwd_scheduler.h): a piece of an item that several blocks share.
  constexpr int kThreads = Cfg::kComputeWarps * 32;
  const int tid = threadIdx.x;  // the compute warps come first
  if (j_end < kv_tiles_for_query_tile(p, w.q_start, Br, Bc)) {  // its state, for the block that ends the item
    kv_split_store_partial<Cfg::kTilesO, kThreads>(split, blockIdx.x, O, stats, tid, Cfg::kSplitBarrier);
    return;
  }
  if (j0 > 0) {  // the piece that ends it: the states of the blocks before, merged in block order
    // This piece holds the block's first unit (a piece that starts later starts an item).
    const int first = order.split_begin(blockIdx.x, gridDim.x) - j0;  // the item's first unit
    auto for_each_owner = [&](auto&& f) {
      for (int u = first; u < first + j0;) {
        const int b = order.split_owner(u, gridDim.x);
        f(b);
        u = order.split_begin(b + 1, gridDim.x);
      }
    };
    if (tid == 0) for_each_owner([&](int b) { kv_split_wait(split, b); });
    named_barrier_sync(Cfg::kSplitBarrier, kThreads);
    for_each_owner([&](int b) {
      kv_split_merge_partial<Cfg::kTilesO, kThreads>(split, b, O, stats, p.scale * kLog2e, tid);
    });
  }
  store_output<T>(O, stats, p, w.head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
