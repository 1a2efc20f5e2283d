// attnlab: the dynamic-mask backward's wgmma core (sm_90a) for one (key tile,
// query tile) pair of the main kernel: per slice of queries Sᵀ and dPᵀ, P and
// dS (bwd_scores.cuh), dV += Pᵀ·dO and dK += dSᵀ·Q, dSᵀ into shared memory;
// then dQ = dS·K, added to dQ's fp32 accumulator. The five products are
// warpgroup MMAs of common/wgmma.cuh; the 4 warps are one warpgroup.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/bwd_scores.cuh"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

// dQ = dS·K of the tile, scaled, added to dq_accum: M = 64 queries, K = 64
// keys, N = D in parts of 64 columns (registers). A = dS read from dSᵀ
// ([key][query]: M-major), B = a 64-column block of K ([key][d]: N-major):
// both transposed. Cfg::kDqTma: staged in the tile's own Q/dO slot and added
// by TMA tensor reductions (tma_dq); else fp32 atomics. Waits for every wgmma
// group in flight (the slices' dV, dK too).
template <typename Cfg, typename T>
__device__ __forceinline__ void dma_bwd_dq_wgmma(const DmaBwdTile<T>& x, const DynamicMaskProblem& p,
                                                 float* __restrict__ const& dq_accum, const CUtensorMap& tma_dq) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc;
  auto &sK = x.sK, &sQ = x.sQ, &sdS = x.sdS;
  auto &q0 = x.q0, &warp = x.warp, &t = x.t;
  const int64_t& q_head = x.q_head;
  const int g = Cfg::kLaneOffsetsPerTile ? opaque(x.g) : x.g;  // (the staging offsets)
  fence_proxy_async_shared();  // the st.shared of dSᵀ, before the async proxy reads it
  __syncthreads();  // every warp's dSᵀ rows are in place
  // kDqTma: dQ is staged in this tile's own Q/dO slot, D/32 boxes of [Br][32] fp32.
  [[maybe_unused]] float* const sdQ = reinterpret_cast<float*>(sQ);
  constexpr bool kTogether = Cfg::kDqPartsTogether;
  [[maybe_unused]] float dQ_all[kTogether ? 2 : 1][8][4];
  auto issue_dq = [&](float (&acc)[8][4], int part) {
    wgmma_fence();
    wgmma_rows_tt<T, 64, Bc>(acc, sdS, sK + part * Bc * 64);
    wgmma_commit();
  };
  if constexpr (kTogether) {
    issue_dq(dQ_all[0], 0);
    issue_dq(dQ_all[1], 1);
  }
#pragma unroll(kTogether ? 2 : 1)
  for (int part = 0; part < D / 64; ++part) {
    float dQ[8][4];
    if constexpr (kTogether) {
      if (part == 0) wgmma_wait<1>();  // part 0 (and every slice's dV, dK before it)
      else wgmma_wait<0>();
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) dQ[n][i] = dQ_all[part][n][i];
    } else {
      issue_dq(dQ, part);
      wgmma_wait<0>();  // (and every slice's dV, dK before it)
    }
    fence_accumulators(dQ);
    // The slot's Q and dO are dead once every warp is past that wait.
    if (Cfg::kDqTma && part == 0) __syncthreads();
    // Warp w holds query rows 16w + g (+8) of the tile, columns 64·part + 8n + 2t, +1.
    if constexpr (Cfg::kDqTma) {
      // Column c of row r: box c/32, 16-byte chunk (c%32)/4 ^ (r%8) of the
      // row's 128 bytes (the map's 128-byte swizzle). A warp's 8 rows
      // then spread over all 32 banks: 2 wavefronts per 256-byte store.
      constexpr int kBoxFloats = Br * Cfg::kDqBoxCols;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const int row = warp * 16 + g + 8 * r, col = part * 64 + n * 8 + 2 * t;
          const int in_box = col % Cfg::kDqBoxCols;
          *reinterpret_cast<float2*>(sdQ + (col / Cfg::kDqBoxCols) * kBoxFloats + row * Cfg::kDqBoxCols +
                                     ((in_box / 4) ^ (row % 8)) * 4 + in_box % 4) =
              make_float2(p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
        }
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = q0 + warp * 16 + g + 8 * r;
        if (qi >= p.Nq) continue;
        float* row = dq_accum + (q_head * p.Nq + qi) * D + part * 64;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          atomic_add2(row + n * 8 + 2 * t, p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
      }
    }
  }
  if constexpr (Cfg::kDqTma) {
    fence_proxy_async_shared();  // the st.shared of dQ, before the tensor reduction reads them
    __syncthreads();
    // One thread adds the tile's D/32 boxes (rows past Nq: not written, the
    // map's bounds). Their reads are waited for before the next tile's first
    // barrier, after which the slot takes the tile after next's Q, dO.
    if (threadIdx.x == 0) {
#pragma unroll
      for (int box = 0; box < D / Cfg::kDqBoxCols; ++box)
        tma_reduce_add_3d(&tma_dq, sdQ + box * Br * Cfg::kDqBoxCols, box * Cfg::kDqBoxCols, q0, int(q_head));
      bulk_commit();
    }
  }
#endif
}

// The tile's slices, then dQ (dq_here: not in deterministic mode, where dQ is
// dma_bwd_dq_kernel's). dK, dV: the block's accumulators (the warp's 16 keys).
// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: m64n(kHalf), A = K or V (keys, K-major), B = Q or
// dO rows of the slice (K-major) — the forward's S = Q·Kᵀ, roles swapped.
// Software-pipelined (FA3's intra-warpgroup overlap, Shah et al. 2024,
// §3.2): slice s + 1's Sᵀ and dPᵀ are issued before slice s's dV and dK,
// each its own commit group; groups complete in order, so waiting for
// slice s + 1's scores leaves slice s's dV, dK running on the tensor
// cores under slice s + 1's score code. (Issuing every slice's Sᵀ,
// dPᵀ up front overlaps more but keeps a second slice's accumulators
// live through the general score code: 255 registers and a spill at
// D = 128.)
template <typename Cfg, typename T, bool kMaskBits>
__device__ __forceinline__ void dma_bwd_tile_wgmma(float (&dK)[Cfg::kTilesO][4], float (&dV)[Cfg::kTilesO][4],
                                                   const DmaBwdScores<Cfg, T, kMaskBits>& scores,
                                                   const DmaBwdTile<T>& x, const DynamicMaskProblem& p,
                                                   const bool& dq_here, float* __restrict__ const& dq_accum,
                                                   const CUtensorMap& tma_dq) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc;
  auto &sK = x.sK, &sV = x.sV, &sQ = x.sQ, &sdO = x.sdO, &sdS = x.sdS;  // the tile's shared memory
  auto &q0 = x.q0, &h = x.h, &warp = x.warp, &g = x.g, &t = x.t;
  constexpr int kSlices = Br / Cfg::kHalf;
  float St[kSlices][Cfg::kTilesS][4], dPt[kSlices][Cfg::kTilesS][4];
  auto issue_s_dp = [&](int sl) {
    const int qh = sl * Cfg::kHalf;
    wgmma_fence();
    wgmma_rows_tile<T, D, Cfg::kHalf, Bc, Br>(St[sl], sK, sQ + qh * 64);
    wgmma_rows_tile<T, D, Cfg::kHalf, Bc, Br>(dPt[sl], sV, sdO + qh * 64);
    wgmma_commit();
  };
  issue_s_dp(0);
  // Pᵀ and dSᵀ as 16-bit A fragments (rows: the warp's 16 keys; k: queries).
  // One set: slice s + 1 packs into it only after slice s's dV, dK are done.
  uint32_t Pa[Cfg::kTilesS / 2][4], dSa[Cfg::kTilesS / 2][4];
#pragma unroll
  for (int sl = 0; sl < kSlices; ++sl) {
    const int qh = sl * Cfg::kHalf;
    if (sl == 0) wgmma_wait<0>();
    else wgmma_wait<1>();  // this slice's Sᵀ, dPᵀ; the previous slice's dV, dK may run on
    fence_accumulators(St[sl]);
    fence_accumulators(dPt[sl]);

    scores.to_ds(St[sl], dPt[sl], qh, q0, h, x.mask_full, x.key_bias);

    if (sl > 0) wgmma_wait<0>();  // the previous slice's dV, dK: Pa, dSa are free again
    pack_p_fragments<T>(Pa, St[sl]);
    pack_p_fragments<T>(dSa, dPt[sl]);
    // dSᵀ to shared memory for dQ, [key][query] in Sw128Blocks<64>: fragment
    // register i of k-step kk holds keys g (+8 for odd i), queries qh + 16kk
    // + 8·(i/2) + 2t, +1 — one 32-bit store each.
    if (dq_here) {
      const int row = Cfg::kLaneOffsetsPerTile ? opaque(warp * 16 + g) : warp * 16 + g;  // (the 16 addresses)
#pragma unroll
      for (int kk = 0; kk < Cfg::kTilesS / 2; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          *reinterpret_cast<uint32_t*>(sdS + Sw128Blocks<64>::offset(row + 8 * (i & 1),
                                                                     qh + kk * 16 + 8 * (i / 2) + 2 * t)) =
              dSa[kk][i];
    }
    if (sl + 1 < kSlices) issue_s_dp(sl + 1);
    // dV += Pᵀ·dO and dK += dSᵀ·Q over the slice's queries: A from registers,
    // B = dO or Q rows (along the reduction dim: N-major, as V in P·V).
    wgmma_fence();
    wgmma_rows_rs<T, D, Cfg::kHalf, Br>(dV, Pa, sdO + qh * 64);
    wgmma_rows_rs<T, D, Cfg::kHalf, Br>(dK, dSa, sQ + qh * 64);
    wgmma_commit();
  }
  if (dq_here) dma_bwd_dq_wgmma<Cfg, T>(x, p, dq_accum, tma_dq);
  else wgmma_wait<0>();
  fence_accumulators(dK);
  fence_accumulators(dV);
  // No barrier here: sQ, sdO and sdS are rewritten only after the next
  // tile's first barrier (its dSᵀ stores, the prefetch into this slot).
#else
  __trap();  // never launched: the host picks this core only on sm_90 with sm_90a code
#endif
}

}  // namespace
}  // namespace attnlab
