// attnlab: step 2 of the dynamic-mask forward's tile kernel — the loop over
// a block's active key tiles, on either tensor-core path (DmaConfig::kWgmma):
// two K/V slots, tile i+1 copied while tile i is computed; per tile S = Q·Kᵀ,
// the logits (fwd_scores.cuh), the online softmax, O += P·V. The 4 warps are
// one warpgroup either way and the accumulators have mma.sync's layout, so
// everything between the two products is one code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/fwd_config.cuh"
#include "dmattn/fwd_scores.cuh"
#include "dmattn/fwd_tile_list.cuh"

namespace attnlab {
namespace {

// The block's operands of the tile loop, as references to the kernel's own
// values (the way a lambda of the kernel captures them: with copies, ptxas
// allocates these register-bound loops differently).
template <typename T>
struct DmaFwdOperands {
  const DynamicMaskProblem& p;
  // sQ [Br][kRowStride], sK and sV [2 slots][Bc][kRowStride]: rows padded by
  // 8 halves (mma.sync) or dense in the 128-byte swizzle (wgmma: Sw128Blocks,
  // 1024-byte aligned).
  T* const& sQ;
  T* const& sK;
  T* const& sV;
  const T* __restrict__ const& q;  // the block's queries: q + (q_head·Nq + q_start)·D
  const int64_t& q_head;
  const int& q_start;
  const T* const& Kg;  // its KV head's keys and values, [Nk][D]
  const T* const& Vg;
  const int64_t& kv_head;  // (the index of Kg, Vg's head in the tensor maps)
};

// The mma.sync core: rung 02's stage2 loop over the active tiles (warp_row:
// the warp's first row of the tile).
template <typename Cfg, typename T, bool kMaskBits>
__device__ __forceinline__ void dma_fwd_mainloop_mma(float (&O)[Cfg::kTilesO][4], RowStats& stats,
                                                     const DmaFwdScores<Cfg, T, kMaskBits>& scores,
                                                     const DmaActiveTiles& tiles, const DmaFwdOperands<T>& x,
                                                     const int& warp_row, const int& lane) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kRowStride;
  const DynamicMaskProblem& p = x.p;
  auto &sQ = x.sQ, &sK = x.sK, &sV = x.sV;
  auto &Kg = x.Kg, &Vg = x.Vg;
  const int& n_active = tiles.count;
  auto load_kv = [&](int i, int tile) {
    const int slot = i % 2, rows = p.Nk - tile * Bc;
    // At D >= 192 rolled copies: unrolled, their loop-invariant addresses would
    // be hoisted out of the tile loop into registers that O needs. Below, the
    // unrolled copies of rung 02 (fewer instructions per 16-byte copy).
    if constexpr (D >= 192) {
      load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sK + slot * Bc * kStride,
                                                                        Kg + int64_t(tile) * Bc * D, D, rows);
      cp_async_commit();
      load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sV + slot * Bc * kStride,
                                                                        Vg + int64_t(tile) * Bc * D, D, rows);
    } else {
      load_tile_async<Bc, D, kStride, Cfg::kThreads>(sK + slot * Bc * kStride, Kg + int64_t(tile) * Bc * D, D, rows);
      cp_async_commit();
      load_tile_async<Bc, D, kStride, Cfg::kThreads>(sV + slot * Bc * kStride, Vg + int64_t(tile) * Bc * D, D, rows);
    }
    cp_async_commit();
  };
  if (n_active > 0)
    load_tile_async<Br, D, kStride, Cfg::kThreads>(sQ, x.q + (x.q_head * p.Nq + x.q_start) * D, D, p.Nq - x.q_start);
  // The tile index is carried one iteration ahead in a register, so that
  // neither the copies nor the bias loads wait on a shared-memory read after
  // the barrier.
  int tile = n_active > 0 ? tiles.at(0) : 0;
  if (n_active > 0) load_kv(0, tile);
  for (int i = 0; i < n_active; ++i) {
    const int next_tile = i + 1 < n_active ? tiles.at(i + 1) : 0;
    if (i + 1 < n_active) load_kv(i + 1, next_tile);
    else { cp_async_commit(); cp_async_commit(); }
    const bool mask_full = tiles.full(tile);
    cp_async_wait<2>();  // K and V of tile i (and Q) have landed
    __syncthreads();

    // The tile's keys in kSubTiles slices (one below D = 192, two of 32 above).
#pragma unroll 1
    for (int sub = 0; sub < Cfg::kSubTiles; ++sub) {
      const int key_off = sub * Cfg::kSubCols;  // in the tile
      const int kv_start = tile * Bc + key_off;
      uint32_t bias_bits[2][Cfg::kTilesS];
      scores.load_bias(bias_bits, kv_start);
      float S[Cfg::kTilesS][4] = {};
      const T* sKj = sK + ((i % 2) * Bc + key_off) * kStride;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        load_a_fragment<kStride>(a, sQ + warp_row * kStride + kk * 16, lane);
        qk_slice<T, Cfg::kTilesS, kStride>(S, a, sKj + kk * 16, lane);
      }
      // (the mask pairs after the MMAs: registers)
      scores.logits(S, bias_bits, kv_start, mask_full, [&](uint32_t (&bits)[2][Cfg::kTilesS]) {
        scores.load_mask(bits, kv_start);
        if constexpr (kMaskBits) scores.expand_mask_bits(bits);
      });
      online_softmax_update(S, O, stats, scores.softmax_scale_log2);
      pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(O, S, sV + ((i % 2) * Bc + key_off) * kStride, lane);
    }
    __syncthreads();  // slot i % 2 is refilled next iteration
    tile = next_tile;
  }
}

// The wgmma core over the active tiles (sm_90a).
// Per tile i: K, V of tile i+1 are copied while tile i is computed (two
// slots, as the mma.sync core); S = Q·K_iᵀ (wgmma, async; the bias loads
// in flight meanwhile); logits and softmax; O += P·V_i. Two blocks per SM
// keep the tensor cores busy while one of them is in its softmax.
// Slower here (one warpgroup per block; docs/experiments.md): rung
// 07's overlap (S_i issued with P_{i-1}·V_{i-1}, the softmax under that
// P·V), and one barrier per tile with the next copies issued after it
// (less time in flight).
// K and V tiles by TMA where the host could build the tensor maps
// (use_tma, uniform: 16-byte aligned bases): one thread issues D/64 box
// copies per matrix onto the slot's mbarrier, everyone waits on its phase
// — no per-thread copy instructions or addresses (rung 09's loads).
// Otherwise cp.async by every thread, as the mma.sync core.
// tma_k, tma_v: the tensor maps of K and V (use_tma).
template <typename Cfg, typename T, bool kMaskBits>
__device__ __forceinline__ void dma_fwd_mainloop_wgmma(float (&O)[Cfg::kTilesO][4], RowStats& stats,
                                                       const DmaFwdScores<Cfg, T, kMaskBits>& scores,
                                                       const DmaActiveTiles& tiles, const DmaFwdOperands<T>& x,
                                                       const CUtensorMap& tma_k, const CUtensorMap& tma_v,
                                                       const bool& use_tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kRowStride;
  const DynamicMaskProblem& p = x.p;
  auto &sQ = x.sQ, &sK = x.sK, &sV = x.sV;
  auto &Kg = x.Kg, &Vg = x.Vg;
  const int64_t& kv_head = x.kv_head;
  const int& n_active = tiles.count;
  __shared__ alignas(8) uint64_t kv_full[2];  // slot s: phase k completes with its k-th tile
  if (use_tma) {
    if (threadIdx.x == 0) {
      mbarrier_init(&kv_full[0], 1);
      mbarrier_init(&kv_full[1], 1);
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  auto load_kv = [&](int i, int tile) {  // K, V of `tile` into slot i % 2
    T* sKs = sK + (i % 2) * Bc * kStride;
    T* sVs = sV + (i % 2) * Bc * kStride;
    if (use_tma) {
      if (threadIdx.x == 0) {
        uint64_t* bar = &kv_full[i % 2];
        mbarrier_arrive_expect_tx(bar, 2 * Bc * D * sizeof(T));  // rows past Nk arrive as zeros, counted too
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {  // one box per 64-column block of Sw128Blocks<Bc>
          tma_load_3d(sKs + c * Bc * 64, &tma_k, bar, c * 64, tile * Bc, int(kv_head));
          tma_load_3d(sVs + c * Bc * 64, &tma_v, bar, c * 64, tile * Bc, int(kv_head));
        }
      }
      cp_async_commit();  // two empty groups: the cp.async accounting below stays the same
      cp_async_commit();
      return;
    }
    load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sKs, Kg + int64_t(tile) * Bc * D, D, p.Nk - tile * Bc);
    cp_async_commit();
    load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sVs, Vg + int64_t(tile) * Bc * D, D, p.Nk - tile * Bc);
    cp_async_commit();
  };
  int tile = 0;
  if (n_active > 0) {
    tile = tiles.at(0);
    load_tile_async<Br, D, Sw128Blocks<Br>, Cfg::kThreads>(sQ, x.q + (x.q_head * p.Nq + x.q_start) * D, D, p.Nq - x.q_start);
    load_kv(0, tile);  // Q joins K's group
  }
  for (int i = 0; i < n_active; ++i) {
    const int next_tile = i + 1 < n_active ? tiles.at(i + 1) : 0;
    if (i + 1 < n_active) load_kv(i + 1, next_tile);
    else { cp_async_commit(); cp_async_commit(); }
    const bool mask_full = tiles.full(tile);
    // Bias and mask pairs issued now: their round trips (the mask's from
    // DRAM: it is read once) overlap the wait for K and V instead of
    // following the MMAs. No faster (the chain waits on K and V, not on the
    // mask), but fewer registers (196 instead of 212 at D = 128).
    uint32_t bias_bits[2][Cfg::kTilesS], mask_bits[2][Cfg::kTilesS];
    scores.load_bias(bias_bits, tile * Bc);
    if (!mask_full) scores.load_mask(mask_bits, tile * Bc);
    cp_async_wait<2>();          // K_i, V_i (and Q) have landed
    if (use_tma) mbarrier_wait(&kv_full[i % 2], (i / 2) & 1);  // TMA: K_i, V_i
    fence_proxy_async_shared();  // cp.async wrote Q (and K, V): wgmma reads through the async proxy
    __syncthreads();

    float S[Cfg::kTilesS][4];
    const T* sKi = sK + (i % 2) * Bc * kStride;
    wgmma_fence();
    wgmma_qk_tile<T, D, Br, Bc>(S, sQ, sKi);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(S);

    scores.logits(S, bias_bits, tile * Bc, mask_full, [&](uint32_t (&bits)[2][Cfg::kTilesS]) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < Cfg::kTilesS; ++n) bits[r][n] = mask_bits[r][n];
      if constexpr (kMaskBits) scores.expand_mask_bits(bits);
    });
    float alpha[2];
    online_softmax_scores(S, stats, scores.softmax_scale_log2, alpha);
    // O *= alpha only where a row's maximum moved (alpha = exp2(0) = 1
    // exactly otherwise: the same bits, 64 multiplications fewer per
    // thread at D = 128). Decided per warp: the branch stays uniform.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_output(O, alpha);
    uint32_t P[Cfg::kTilesS / 2][4];
    pack_p_fragments<T>(P, S);
    const T* sVi = sV + (i % 2) * Bc * kStride;
    wgmma_fence();  // O was just rescaled by the softmax
    wgmma_pv_tile<T, D, Bc>(O, P, sVi);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(O);
    __syncthreads();  // slot i % 2 is refilled next iteration
    tile = next_tile;
  }
#else
  __trap();  // never launched: the host picks this core only on sm_90 with sm_90a code
#endif
}

}  // namespace
}  // namespace attnlab
