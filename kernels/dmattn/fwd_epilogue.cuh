// attnlab: the end of the dynamic-mask forward's tile kernel — O and LSE of
// a block's 64 query rows (or, split-KV, the split's fp32 partials for the
// combine, combine_kernel.cuh), and the block with no active tile, which
// writes O = 0, LSE = -inf without loading anything.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/online_softmax.cuh"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

// Zeroes `bytes` (a multiple of 4) at `dst` (4-byte aligned), 16 bytes per
// store where dst is 16-byte aligned.
template <int kThreads>
__device__ __forceinline__ void zero_fill(void* dst, size_t bytes) {
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    uint4* d = static_cast<uint4*>(dst);
    for (size_t i = threadIdx.x; i < bytes / 16; i += kThreads) d[i] = make_uint4(0u, 0u, 0u, 0u);
    for (size_t i = bytes / 16 * 4 + threadIdx.x; i < bytes / 4; i += kThreads) static_cast<uint32_t*>(dst)[i] = 0u;
  } else {
    for (size_t i = threadIdx.x; i < bytes / 4; i += kThreads) static_cast<uint32_t*>(dst)[i] = 0u;
  }
}

// No active tile: every row of the block is fully masked — O = 0, LSE =
// -inf (a split's partial likewise), written straight away with wide
// stores; no Q load, no barrier setup, no epilogue. (A top-W mask at
// L = 32K leaves ~95 % of the blocks here.)
template <typename Cfg, typename T>
__device__ __forceinline__ void dma_fwd_store_empty(T* __restrict__ o, float* __restrict__ lse,
                                                    float* __restrict__ partials, const DynamicMaskProblem& p,
                                                    int64_t q_head, int q_start, int split, int splits) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr;
  const int n_rows = min(Br, p.Nq - q_start);
  const int64_t rows_total = int64_t(p.B) * p.H * p.Nq;
  const int64_t first = (splits == 1 ? q_head : int64_t(split) * p.B * p.H + q_head) * p.Nq + q_start;
  if (splits == 1) zero_fill<Cfg::kThreads>(o + first * D, size_t(n_rows) * D * sizeof(T));
  else zero_fill<Cfg::kThreads>(partials + first * D, size_t(n_rows) * D * sizeof(float));
  float* row_lse = splits == 1 ? lse + first : partials + int64_t(splits) * rows_total * D + first;
  for (int r = threadIdx.x; r < n_rows; r += Cfg::kThreads) row_lse[r] = -INFINITY;
}

// O and LSE of the lane's rows row0, row0 + 8 from the accumulators (dp:
// the dense view, whose scale is the softmax's).
template <typename Cfg, typename T>
__device__ __forceinline__ void dma_fwd_store(float (&O)[Cfg::kTilesO][4], RowStats& stats,
                                              const AttnProblem& dp, T* __restrict__ o, float* __restrict__ lse,
                                              float* __restrict__ partials, const DynamicMaskProblem& p,
                                              int64_t q_head, int row0, int t, int split, int splits) {
  constexpr int D = Cfg::kHeadDim;
  if (splits == 1) {
    store_output<T>(O, stats, dp, q_head, row0, /*col0=*/0, t, /*write_lse=*/true, o, lse);
    return;
  }
  // Split-KV: this split's normalised O and its LSE, in fp32, for the combine
  // kernel (partials: [splits][B·H][Nq][D] then [splits][B·H][Nq]). A split
  // that saw no key writes O = 0, LSE = -inf, and the combine ignores it.
  const int64_t rows_total = int64_t(p.B) * p.H * p.Nq;
  float* part_o = partials + (int64_t(split) * p.B * p.H + q_head) * p.Nq * D;
  float* part_lse = partials + int64_t(splits) * rows_total * D + (int64_t(split) * p.B * p.H + q_head) * p.Nq;
  float row_lse[2];
  online_softmax_finalize(O, stats, dp.scale, row_lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= p.Nq) continue;
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<float2*>(part_o + int64_t(row) * D + n * 8 + 2 * t) = make_float2(O[n][2 * r], O[n][2 * r + 1]);
    if (t == 0) part_lse[row] = row_lse[r];
  }
}

}  // namespace
}  // namespace attnlab
