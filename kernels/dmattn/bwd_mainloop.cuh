// attnlab: the dynamic-mask backward's main loop — a block's walk over the
// active slots of its key tile: the slots' skip bits a batch at a time, per
// active slot the copies (K_j, V_j with the first; Q_i, dO_i, LSE_i, Δ_i, the
// next active slot's in flight on the wgmma core) and the tile's core
// (bwd_tile_wgmma.cuh or bwd_tile_mma.cuh).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/ptx.cuh"
#include "common/tile_copy.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/bwd_config.cuh"
#include "dmattn/bwd_scheduler.cuh"
#include "dmattn/bwd_scores.cuh"
#include "dmattn/bwd_tile_mma.cuh"
#include "dmattn/bwd_tile_wgmma.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace {

// The tensors the main kernel reads: Q, dO [B][H][Nq][D], K, V [B][Hkv][Nk][D],
// LSE and Δ [B][H][Nq]; with qdo_tma (wgmma; uniform: the host built the maps)
// Q and dO also through their tensor maps.
template <typename T>
struct DmaBwdInputs {
  const T* __restrict__ q;
  const T* __restrict__ k;
  const T* __restrict__ v;
  const T* __restrict__ dout;
  const float* __restrict__ lse;
  const float* __restrict__ delta;
  const CUtensorMap& tma_q;
  const CUtensorMap& tma_do;
  bool qdo_tma;
};

// The walk, accumulating dK, dV of the block's key tile (the warp's 16 keys,
// key_row: the lane's two). dq_accum, tma_dq: dQ's fp32 accumulator and its
// map (nullptr in deterministic mode: dQ is dma_bwd_dq_kernel's); dbias_accum:
// this block's dBias (DbiasTarget::for_block). Returns whether K_j, V_j were
// loaded: a chunk without an active tile (most blocks of a sparse mask) reads
// nothing but its skip bits.
template <typename Cfg, typename T, bool kMaskBits>
__device__ __forceinline__ bool dma_bwd_mainloop(float (&dK)[Cfg::kTilesO][4], float (&dV)[Cfg::kTilesO][4],
                                                 const DynamicMaskProblem& p, const MaskSummary& summary,
                                                 const DmaBwdBlock& blk, const DmaBwdSlots& slots,
                                                 const DmaBwdSmem<Cfg, T>& sm, const DmaBwdInputs<T>& in,
                                                 float* __restrict__ const& dq_accum, const CUtensorMap& tma_dq,
                                                 float* const& dbias_accum, const int (&key_row)[2]) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kStride;
  constexpr int kStages = Cfg::kQdoStages;
  // The tiles' layout: padded rows (mma.sync) or Sw128Blocks<64> (wgmma; Br = Bc = 64).
  using Layout = std::conditional_t<Cfg::kWgmma, Sw128Blocks<64>, StridedRows<kStride>>;
  static_assert(Br == 64 && Bc == 64, "one layout for all four tiles");
  const int &b = blk.b, &j_tile = blk.j_tile, &live_chunks = blk.live_chunks;
  const int kv0 = j_tile * Bc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t kv_head = int64_t(b) * p.Hkv + blk.hk;
  const bool dq_here = dq_accum != nullptr;
  // A bias broadcast over queries depends on (b, head, key) only: each thread
  // loads its two keys' elements once per tile instead of once per score.
  const bool bias_by_key = p.bias.data != nullptr && p.bias.stride_q == 0;

  // The tiles of the slot being computed (reassigned per tile; scores reads sLSE, sDelta).
  // kDqTma: the slot then holds the tile's dQ, D/32 boxes of [Br][32] fp32.
  T* sQ = sm.sQ_slots;
  T* sdO = sQ + Br * kStride;
  float* sLSE = sm.sLSE_slots;
  float* sDelta = sLSE + Br;
  // Skip bits of this block's next kThreads slots: [0] any, [1] all ones; one word per warp.
  __shared__ uint32_t s_bits[2][Cfg::kWarps];
  // P, dS (in place of Sᵀ, dPᵀ) and dBias of a slice of queries (bwd_scores.cuh).
  const DmaBwdScores<Cfg, T, kMaskBits> scores{p, b, kv0, t, key_row, dbias_accum, bias_by_key, sLSE, sDelta};

  bool kv_loaded = false;
  // wgmma with qdo_tma: a slot's Q_i, dO_i arrive by TMA — one thread issues
  // 2·D/64 boxes of 64 x 64 onto the slot's mbarrier — instead of 2·64·D·2/16
  // cp.async copies spread over the threads, each with its address
  // arithmetic. Slot s's phase k completes with its k-th load; every load is
  // waited for exactly once (a prefetch never crosses a batch), so one parity
  // bit per slot follows it.
  [[maybe_unused]] __shared__ alignas(8) uint64_t qdo_full[2];
  [[maybe_unused]] uint32_t qdo_parity = 0;  // bit s: the parity of slot s's next wait
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (Cfg::kWgmma) {
    if (in.qdo_tma && threadIdx.x == 0) {
      mbarrier_init(&qdo_full[0], 1);
      mbarrier_init(&qdo_full[1], 1);
      fence_mbarrier_init();  // before the batch loop's first barrier, ahead of any use
    }
  }
#endif
  int base_of_batch = blk.chunk;  // the batch's first slot (load_q_tiles' slot numbers are batch-relative)
  // Q_i, dO_i, LSE_i, Δ_i of batch slot i into tile slot `slot`, one cp.async
  // group. LSE and Δ by 4-byte copies (a plain load would hold the thread
  // until it arrives); rows past Nq get +inf and 0 (P = 0, dS = 0) directly,
  // and an LSE of -inf (a row that saw no key) becomes +inf after the wait.
  auto load_q_tiles = [&](int i, int slot) {
    int m, h;
    slots.head(base_of_batch + i * live_chunks, m, h);
    const int q0 = m * Br;
    const int64_t q_head = int64_t(b) * p.H + h;
    T* q_dst = sm.sQ_slots + slot * Cfg::kQdoSlotElems;
    bool by_tma = false;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (Cfg::kWgmma) {
      if (in.qdo_tma) {
        by_tma = true;
        if (threadIdx.x == 0) {  // column block c of a tile: Sw128Blocks<64> at c·64·64 (rows past Nq: zeros)
          uint64_t* bar = &qdo_full[slot];
          mbarrier_arrive_expect_tx(bar, 2 * Br * D * int(sizeof(T)));
#pragma unroll 1
          for (int c = 0; c < D / 64; ++c) {
            tma_load_3d(q_dst + c * Br * 64, &in.tma_q, bar, c * 64, q0, int(q_head));
            tma_load_3d(q_dst + Br * kStride + c * Br * 64, &in.tma_do, bar, c * 64, q0, int(q_head));
          }
        }
      }
    }
#endif
    if (!by_tma) {
      load_tile_async_rolled<Br, D, Layout, Cfg::kThreads>(q_dst, in.q + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
      load_tile_async_rolled<Br, D, Layout, Cfg::kThreads>(q_dst + Br * kStride, in.dout + (q_head * p.Nq + q0) * D,
                                                           D, p.Nq - q0);
    }
    if (threadIdx.x < Br) {
      float* lse_dst = sm.sLSE_slots + slot * 2 * Br + threadIdx.x;
      const int qi = q0 + threadIdx.x;
      if (qi < p.Nq) {
        cp_async_4(lse_dst, in.lse + q_head * p.Nq + qi);
        cp_async_4(lse_dst + Br, in.delta + q_head * p.Nq + qi);
      } else {
        lse_dst[0] = INFINITY;
        lse_dst[Br] = 0.f;
      }
    }
    cp_async_commit();
  };
  // The batch slot after the one in word w whose bits are `bits` (the current
  // slot is bits' lowest set bit), or -1: the same in every thread.
  [[maybe_unused]] auto next_active = [&](int w, uint32_t bits) {
    const uint32_t rest = bits & (bits - 1);
    if (rest != 0) return w * 32 + __ffs(rest) - 1;
    for (int w2 = w + 1; w2 < Cfg::kWarps; ++w2)
      if (s_bits[0][w2] != 0) return w2 * 32 + __ffs(s_bits[0][w2]) - 1;
    return -1;
  };
  int stage = 0;        // the tile slot the next tile uses
  int prefetched = -1;  // the batch slot whose tiles are already in flight (into `stage`)
  float key_bias[2] = {0.f, 0.f};
  int key_bias_head = -1;

  // This block's slots are chunk, chunk + chunks, chunk + 2·chunks, ... taken
  // kThreads at a time: every thread reads one slot's skip bits (independent
  // loads, one round trip for the batch instead of one per slot), a ballot
  // per warp gathers them in shared memory, and the loop visits the set bits.
#pragma unroll 1
  for (int base = blk.chunk; base < slots.n_slots; base += Cfg::kThreads * live_chunks) {  // int: the host bounds it
    base_of_batch = base;
    prefetched = -1;  // nothing is fetched across batches
    __syncthreads();  // every thread has read the previous batch's bits
    {
      const int s = base + int(threadIdx.x) * live_chunks;
      bool any = false, all = false;
      if (s < slots.n_slots) {
        int m, h;
        slots.head(s, m, h);
        any = summary.tile_any(p, b, h, m, j_tile);
        all = any && summary.tile_all(p, b, h, m, j_tile);
      }
      const uint32_t any_bits = __ballot_sync(0xffffffffu, any), all_bits = __ballot_sync(0xffffffffu, all);
      if (lane == 0) {
        s_bits[0][warp] = any_bits;
        s_bits[1][warp] = all_bits;
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int w = 0; w < Cfg::kWarps; ++w) {
#pragma unroll 1
      for (uint32_t bits = s_bits[0][w]; bits != 0; bits &= bits - 1) {  // the same in every thread
        const int i = w * 32 + __ffs(bits) - 1;
        const bool mask_full = s_bits[1][w] >> (i % 32) & 1u;  // no per-element mask reads
        int m, h;
        slots.head(base + i * live_chunks, m, h);
        const int q0 = m * Br;
        const int64_t q_head = int64_t(b) * p.H + h;

        // This tile's slot; the next active slot of the batch gets the other one.
        const int slot = stage;
        stage = (stage + 1) % kStages;
        sQ = sm.sQ_slots + slot * Cfg::kQdoSlotElems;
        sdO = sQ + Br * kStride;
        sLSE = sm.sLSE_slots + slot * 2 * Br;
        sDelta = sLSE + Br;
        // Rolled copies keep their addresses out of the registers dK and dV need.
        if (!kv_loaded) {
          load_tile_async_rolled<Bc, D, Layout, Cfg::kThreads>(sm.sK, in.k + (kv_head * p.Nk + kv0) * D, D,
                                                               p.Nk - kv0);
          load_tile_async_rolled<Bc, D, Layout, Cfg::kThreads>(sm.sV, in.v + (kv_head * p.Nk + kv0) * D, D,
                                                               p.Nk - kv0);
          kv_loaded = true;
        }
        if (prefetched != i) load_q_tiles(i, slot);  // (else in flight since the previous tile)
        if (bias_by_key && h != key_bias_head) {  // the same for every query tile of a head
          key_bias_head = h;
#pragma unroll
          for (int r = 0; r < 2; ++r)
            if (key_row[r] < p.Nk)
              key_bias[r] =
                  as_float(__ldg(static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, 0) + key_row[r]));
        }
        cp_async_wait<0>();  // this tile's group (and K, V)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (Cfg::kWgmma) {
          if (in.qdo_tma) {  // this tile's Q, dO (TMA)
            mbarrier_wait(&qdo_full[slot], (qdo_parity >> slot) & 1u);
            qdo_parity ^= 1u << slot;
          }
        }
#endif
        if (threadIdx.x < Br && sLSE[threadIdx.x] == -INFINITY)  // an entry this thread copied
          sLSE[threadIdx.x] = INFINITY;  // a row that saw no key: P = exp(s - inf) = 0
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (Cfg::kWgmma) fence_proxy_async_shared();  // cp.async wrote the tiles; wgmma reads via the async proxy
#endif
        // kDqTma: the previous tile's dQ reductions have read its slot (thread 0
        // issued them), so that after this barrier the slot may be refilled.
        if (Cfg::kDqTma && threadIdx.x == 0) bulk_wait_read();
        __syncthreads();
        // The next active slot's tiles into the other slot, read last by the
        // previous tile (every warp is past it: the barrier above), while this
        // tile is computed. (Issued ahead of this tile's wait instead, the
        // prefetch would need one more barrier at the previous tile's end, for
        // the slot's last readers.)
        if constexpr (kStages > 1) {
          const int next = next_active(w, bits);
          if (next >= 0) {
            load_q_tiles(next, stage);
            prefetched = next;
          }
        }

        // ---- the tile's products and scores (bwd_tile_wgmma.cuh, bwd_tile_mma.cuh) ----------
        const DmaBwdTile<T> tile{sm.sK, sm.sV, sQ, sdO, sm.sdS, q0, h, q_head, mask_full, key_bias, warp, lane, g, t};
        if constexpr (Cfg::kWgmma)
          dma_bwd_tile_wgmma<Cfg, T, kMaskBits>(dK, dV, scores, tile, p, dq_here, dq_accum, tma_dq);
        else
          dma_bwd_tile_mma<Cfg, T, kMaskBits>(dK, dV, scores, tile, p, dq_here, dq_accum);
      }
    }
  }
  return kv_loaded;
}

}  // namespace
}  // namespace attnlab
