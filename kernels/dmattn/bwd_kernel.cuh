// attnlab: the dynamic-mask backward's main kernel, dma_bwd_kernel
// (dmattn_bwd.cu's header says what it does; docs/dmattn_backward.md): its
// block (bwd_scheduler.cuh), its main loop (bwd_mainloop.cuh) and its
// epilogue (bwd_epilogue.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/tma.cuh"
#include "dmattn/bwd_config.cuh"
#include "dmattn/bwd_epilogue.cuh"
#include "dmattn/bwd_mainloop.cuh"
#include "dmattn/bwd_scheduler.cuh"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

// Where a block adds its dBias: one fp32 accumulator in the bias's shape, or
// (deterministic mode, bias broadcast over the batch and/or the KV heads) one
// copy per batch and/or KV head, so that no element is shared by two blocks.
struct DbiasTarget {
  float* base = nullptr;  // nullptr: no bias
  int64_t copy_elems = 0;
  bool per_batch = false, per_kv_head = false;
  int batches = 1, Hkv = 1;
  int copies() const { return (per_batch ? batches : 1) * (per_kv_head ? Hkv : 1); }
  __device__ float* for_block(int b, int hk) const {
    if (base == nullptr) return nullptr;
    const int c = (per_batch ? b : 0) * (per_kv_head ? Hkv : 1) + (per_kv_head ? hk : 0);
    return base + int64_t(c) * copy_elems;
  }
};

// The main backward kernel: block (j·chunks + c, KV head, batch) holds key
// tile j and walks chunk c's share of the key tile's (query head, query tile)
// slots (see dmattn_bwd.cu's opening comment: query chunks).
template <typename Cfg, typename T, bool kMaskBits>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
dma_bwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
               float* __restrict__ dq_accum, const __grid_constant__ CUtensorMap tma_dq,
               const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_do, bool qdo_tma,
               T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dkv_accum, DbiasTarget dbias_target,
               const DynamicMaskProblem p, const MaskSummary summary, int chunks,
               const unsigned long long* __restrict__ chunk_plan, bool rotate_slots) {
  // ---- 1. the block's key tile, chunk, KV head and batch, and its slots (bwd_scheduler.cuh)
  const DmaBwdBlock blk = dma_bwd_block(chunks, chunk_plan);
  if (blk.chunk >= blk.live_chunks) return;  // uniform: the whole block
  const int kv0 = blk.j_tile * Cfg::kBc;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const DmaBwdSmem<Cfg, T> sm(smem_raw);  // (bwd_config.cuh)
  float* const dbias_accum = dbias_target.for_block(blk.b, blk.hk);
  float dK[Cfg::kTilesO][4] = {}, dV[Cfg::kTilesO][4] = {};
  const int key_row[2] = {kv0 + warp * 16 + g, kv0 + warp * 16 + g + 8};  // keys of c0,c1 / c2,c3
  const DmaBwdSlots slots(p, blk, chunks, kv0, rotate_slots);

  // ---- 2. the walk over the active slots (bwd_mainloop.cuh), per tile its core (bwd_tile_*.cuh)
  const DmaBwdInputs<T> in{q, k, v, dout, lse, delta, tma_q, tma_do, qdo_tma};
  const bool kv_loaded = dma_bwd_mainloop<Cfg, T, kMaskBits>(dK, dV, p, summary, blk, slots, sm, in, dq_accum, tma_dq,
                                                             dbias_accum, key_row);
  if constexpr (Cfg::kDqTma)
    if (dq_accum != nullptr && threadIdx.x == 0) bulk_wait();  // dQ's reductions done (their thread)

  // ---- 3. dK_j, dV_j of this KV head (bwd_epilogue.cuh) -----------------------------
  const int64_t kv_head = int64_t(blk.b) * p.Hkv + blk.hk;
  dma_bwd_store_dkv<Cfg, T>(dK, dV, p, dk, dv, dkv_accum, blk.live_chunks, kv_loaded, kv_head, key_row, t);
}

}  // namespace
}  // namespace attnlab
