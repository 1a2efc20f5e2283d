// attnlab: the dynamic-mask backward's deterministic dQ, dma_bwd_dq_kernel
// (DmaBackwardArgs::deterministic; docs/dmattn_backward.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "dmattn/bwd_config.cuh"
#include "dmattn/bwd_scores.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace {

// Deterministic mode's dQ: one block per (64-query tile m, head h, batch b);
// warp w owns query rows 16w..16w+15 and, over the active key tiles j in
// order, recomputes S = Q K_jᵀ and dP = dO V_jᵀ (as the forward computes S),
// forms dS exactly as the main kernel does, and accumulates dQ += dS K_j in
// registers (dS is already an A fragment's values, as P is in the forward's
// P·V). The same four 64-row tiles of shared memory as the main kernel.
template <typename Cfg, typename T, bool kMaskBits>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
dma_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                  T* __restrict__ dq, const DynamicMaskProblem p, const MaskSummary summary) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kStride;
  constexpr int kTilesS = Bc / 8;
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = m * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t q_head = int64_t(b) * p.H + h;
  const int64_t kv_head = int64_t(b) * p.Hkv + h / (p.H / p.Hkv);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Bc * kStride;
  T* sQ = sV + Bc * kStride;
  T* sdO = sQ + Br * kStride;

  load_tile_async<Br, D, kStride, Cfg::kThreads>(sQ, q + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
  load_tile_async<Br, D, kStride, Cfg::kThreads>(sdO, dout + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
  cp_async_commit();
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = rows[r] < p.Nq ? lse[q_head * p.Nq + rows[r]] : -INFINITY;
    row_lse[r] = l == -INFINITY ? INFINITY : l;  // P = 0 for rows that saw no key
    row_delta[r] = rows[r] < p.Nq ? delta[q_head * p.Nq + rows[r]] : 0.f;
  }

  const int n_tiles = kv_tiles_for_query_tile(p.dense(), q0, Br, Bc);
  float dQ[Cfg::kTilesO][4] = {};
  for (int j = 0; j < n_tiles; ++j) {
    if (!summary.tile_any(p, b, h, m, j)) continue;  // uniform
    const bool mask_full = summary.tile_all(p, b, h, m, j);
    const int kv0 = j * Bc;
    load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sK, k + (kv_head * p.Nk + kv0) * D, D,
                                                                      p.Nk - kv0);
    load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sV, v + (kv_head * p.Nk + kv0) * D, D,
                                                                      p.Nk - kv0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float S[kTilesS][4] = {}, dP[kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a_fragment<kStride>(a, sQ + (warp * 16) * kStride + kk * 16, lane);
      qk_slice<T, kTilesS, kStride>(S, a, sK + kk * 16, lane);
      load_a_fragment<kStride>(a, sdO + (warp * 16) * kStride + kk * 16, lane);
      qk_slice<T, kTilesS, kStride>(dP, a, sV + kk * 16, lane);
    }
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const ScoreProb sp =
            score_prob<T, kMaskBits>(p, b, h, rows[e / 2], kv0 + n * 8 + 2 * t + (e & 1), S[n][e], row_lse[e / 2], mask_full);
        S[n][e] = sp.p * (dP[n][e] - row_delta[e / 2]) * sp.dcap;  // dS
      }
    pv_tile<T, kTilesS, Cfg::kTilesO, kStride>(dQ, S, sK, lane);  // dQ += dS K_j
    __syncthreads();  // sK, sV are refilled next
  }
  cp_async_wait<0>();  // Q, dO copies (if no key tile ran) finish before the block exits
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= p.Nq) continue;
    T* row = dq + (q_head * p.Nq + rows[r]) * D;
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(row + n * 8 + 2 * t) = pack2<T>(p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
  }
}

}  // namespace
}  // namespace attnlab
