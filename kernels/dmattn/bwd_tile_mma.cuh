// attnlab: the dynamic-mask backward's mma.sync core for one (key tile, query
// tile) pair of the main kernel: per half of the queries Sᵀ and dPᵀ, P and dS
// (bwd_scores.cuh), dV += Pᵀ·dO and dK += dSᵀ·Q, dSᵀ into shared memory; then
// dQ = dS·K, added to dQ's fp32 accumulator by atomics. Rung 02's fragments
// (common/row_fragments.cuh), the roles of Q and K swapped.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "dmattn/bwd_scores.cuh"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

// dQ = dS·K of the tile, scaled, added to dq_accum (fp32 atomics).
// Warp w: query rows 16w..16w+15 of the tile. A = dS (queries x keys) read
// transposed from dSᵀ; B = K (keys x D) through ldmatrix.trans, as V in P·V.
// At D >= 128 in two column halves, to stay within the registers.
template <typename Cfg, typename T>
__device__ __forceinline__ void dma_bwd_dq_mma(const DmaBwdTile<T>& x, const DynamicMaskProblem& p,
                                               float* __restrict__ const& dq_accum) {
  constexpr int D = Cfg::kHeadDim, Bc = Cfg::kBc, kStride = Cfg::kStride, kDs = Cfg::kDsStride;
  auto &sK = x.sK, &sdS = x.sdS;
  auto &q0 = x.q0, &warp = x.warp, &lane = x.lane, &g = x.g, &t = x.t;
  const int64_t& q_head = x.q_head;
#pragma unroll 1
  for (int part = 0; part < Cfg::kDqParts; ++part) {
    constexpr int kTiles = Cfg::kTilesO / Cfg::kDqParts;
    const int col0 = part * kTiles * 8;
    float dQ[kTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[4];
      const int i4 = lane / 8, r = lane % 8;
      ldmatrix_x4_trans(a, sdS + (kk * 16 + (i4 / 2) * 8 + r) * kDs + warp * 16 + (i4 % 2) * 8);
#pragma unroll
      for (int nd = 0; nd < kTiles / 2; ++nd) {
        uint32_t bfr[4];
        ldmatrix_x4_trans(bfr, sK + (kk * 16 + lane % 16) * kStride + col0 + nd * 16 + (lane / 16) * 8);
        mma_m16n8k16<T>(dQ[2 * nd], a, bfr[0], bfr[1]);
        mma_m16n8k16<T>(dQ[2 * nd + 1], a, bfr[2], bfr[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qi = q0 + warp * 16 + g + 8 * r;
      if (qi >= p.Nq) continue;
      float* row = dq_accum + (q_head * p.Nq + qi) * D + col0;
#pragma unroll
      for (int n = 0; n < kTiles; ++n) {
        atomicAdd(row + n * 8 + 2 * t, p.scale * dQ[n][2 * r]);
        atomicAdd(row + n * 8 + 2 * t + 1, p.scale * dQ[n][2 * r + 1]);
      }
    }
  }
  __syncthreads();  // sQ, sdO, sdS are rewritten by the next tile
}

// The tile's two halves, then dQ (dq_here: not in deterministic mode, where dQ
// is dma_bwd_dq_kernel's). dK, dV: the block's accumulators (the warp's 16 keys).
template <typename Cfg, typename T, bool kMaskBits>
__device__ __forceinline__ void dma_bwd_tile_mma(float (&dK)[Cfg::kTilesO][4], float (&dV)[Cfg::kTilesO][4],
                                                 const DmaBwdScores<Cfg, T, kMaskBits>& scores,
                                                 const DmaBwdTile<T>& x, const DynamicMaskProblem& p,
                                                 const bool& dq_here, float* __restrict__ const& dq_accum) {
  constexpr int D = Cfg::kHeadDim, kStride = Cfg::kStride, kDs = Cfg::kDsStride;
  auto &sK = x.sK, &sV = x.sV, &sQ = x.sQ, &sdO = x.sdO, &sdS = x.sdS;  // the tile's shared memory
  auto &warp = x.warp, &lane = x.lane, &g = x.g, &t = x.t;
  // The 64 queries in two halves of 32, so that Sᵀ and dPᵀ of a half (16 keys x
  // 32 queries per warp) fit next to dK and dV (D registers per thread).
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int qh = half * Cfg::kHalf;  // first query column of this half
    // ---- Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ ---------------------------------------------
    float St[Cfg::kTilesS][4] = {}, dPt[Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a_fragment<kStride>(a, sK + (warp * 16) * kStride + kk * 16, lane);
      qk_slice<T, Cfg::kTilesS, kStride>(St, a, sQ + qh * kStride + kk * 16, lane);
      load_a_fragment<kStride>(a, sV + (warp * 16) * kStride + kk * 16, lane);
      qk_slice<T, Cfg::kTilesS, kStride>(dPt, a, sdO + qh * kStride + kk * 16, lane);
    }

    scores.to_ds(St, dPt, qh, x.q0, x.h, x.mask_full, x.key_bias);

    // ---- dV += Pᵀ dO ;  dK += dSᵀ Q (scale applied at the end) --------------------
    pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(dV, St, sdO + qh * kStride, lane);
    pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(dK, dPt, sQ + qh * kStride, lane);

    // ---- dSᵀ to shared memory for dQ ------------------------------------------------
#pragma unroll
    for (int n = 0; n < Cfg::kTilesS && dq_here; ++n) {
      *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g) * kDs + qh + n * 8 + 2 * t) =
          pack2<T>(dPt[n][0], dPt[n][1]);
      *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8) * kDs + qh + n * 8 + 2 * t) =
          pack2<T>(dPt[n][2], dPt[n][3]);
    }
  }
  __syncthreads();
  // (Without dQ, sQ, sdO and sdS are not rewritten before the barrier above.)
  if (dq_here) dma_bwd_dq_mma<Cfg, T>(x, p, dq_accum);
}

}  // namespace
}  // namespace attnlab
