// attnlab: the dynamic-mask backward's epilogue — a block's dK_j, dV_j of its
// key tile and KV head (keys < Nk), stored in the input dtype where the block
// owns the key tile, else added to the fp32 accumulators of the query chunks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

// dK, dV: the lane's rows key_row[0] (c0, c1) and key_row[1] (c2, c3) of the
// tile's [Bc][D] accumulators, dK not yet scaled. One live chunk (or no
// accumulators): this block owns the key tile and stores scale·dK and dV.
// Several: the partial sums are added unscaled (the host's
// sum_copies_to_dtype_kernel, bwd_passes.cuh, scales dK and converts both), and
// a chunk that walked no tile (kv_loaded false) adds nothing.
template <typename Cfg, typename T>
__device__ __forceinline__ void dma_bwd_store_dkv(const float (&dK)[Cfg::kTilesO][4],
                                                  const float (&dV)[Cfg::kTilesO][4], const DynamicMaskProblem& p,
                                                  T* __restrict__ const& dk, T* __restrict__ const& dv,
                                                  float* __restrict__ const& dkv_accum, const int& live_chunks,
                                                  const bool& kv_loaded, const int64_t& kv_head,
                                                  const int (&key_row)[2], const int& t) {
  constexpr int D = Cfg::kHeadDim;
  if (dkv_accum == nullptr || live_chunks == 1) {  // one chunk: this block owns the key tile; scale now
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (key_row[r] >= p.Nk) continue;
      T* dk_row = dk + (kv_head * p.Nk + key_row[r]) * D;
      T* dv_row = dv + (kv_head * p.Nk + key_row[r]) * D;
#pragma unroll
      for (int n = 0; n < Cfg::kTilesO; ++n) {
        *reinterpret_cast<uint32_t*>(dk_row + n * 8 + 2 * t) =
            pack2<T>(p.scale * dK[n][2 * r], p.scale * dK[n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_row + n * 8 + 2 * t) = pack2<T>(dV[n][2 * r], dV[n][2 * r + 1]);
      }
    }
  } else if (kv_loaded) {  // several chunks: add the partial sums (unscaled; a chunk with no tile adds nothing)
    const int64_t kv_elems = int64_t(p.B) * p.Hkv * p.Nk * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (key_row[r] >= p.Nk) continue;
      float* dk_row = dkv_accum + (kv_head * p.Nk + key_row[r]) * D;
      float* dv_row = dk_row + kv_elems;
#pragma unroll
      for (int n = 0; n < Cfg::kTilesO; ++n) {
        atomic_add2(dk_row + n * 8 + 2 * t, dK[n][2 * r], dK[n][2 * r + 1]);
        atomic_add2(dv_row + n * 8 + 2 * t, dV[n][2 * r], dV[n][2 * r + 1]);
      }
    }
  }
}

}  // namespace
}  // namespace attnlab
