// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: rung 14's mainloop — what its producer thread and its two compute
// warpgroups do for one key tile, in the roles of FlashAttention-3's
// CollectiveMainloopBwd (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp):
// bwd_load issues K_j, V_j once and then every visible query tile's Q_i, dO_i,
// LSE_i, Δ_i into a ring of kStages slots; bwd_compute runs the five GEMMs of
// each query tile, stages its dQ in shared memory and ends in the epilogue
// (bwd_store_dkv) with dK_j, dV_j. The dQ writers (hopper/bwd_dq_writer.cuh)
// add each staged dQ into the fp32 accumulator (a bulk reduce-add), and the
// kernel skeleton (hopper/bwd_kernel.cuh) splits a block's warps between them;
// rung 15 (hopper/bwd_roles_mainloop.cuh) reuses all but the compute
// warpgroups and the writer's staging.
//
// Two things are parameters, so that other kernels on this engine share it
// (the block-sparse backward, kernels/blocksparse/), as the forward's
// ws_load_tiles / ws_compute_tiles are: the walk — which query tiles a key
// tile visits (w.n_slots, w.slot(s)) and each dQ add's turn (w.turn), rung
// 14's in hopper/bwd_scheduler.h — and
// the score step of bwd_compute_walk (Pᵀ from Sᵀ, and dSᵀ's chain rule), as
// FlashAttention-3's backward mainloop takes its m_block range and its Mask.
#pragma once

#include <cuda.h>

#include <type_traits>

#include "common/bwd_prepost.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "hopper/bwd_scheduler.h"
#include "host/attn_problem.h"

namespace attnlab {

// Rung 14's block: two compute warpgroups of 64 keys each and a producer
// warpgroup (the producer thread, the dQ writer warps); the tile of each head
// dim is the kernel's choice (14_bwd_ws.cu's BwdWsTile).
template <int kHeadDim_, int kHeadDimV_, int kBr_, int kSliceQ_, bool kEarlyDv_, int kDsBuffers_, int kDqBuffers_,
          int kStages_>
struct BwdWsConfig : ProducerWarpgroupSplit<2, 24, 240> {  // 2 compute warpgroups + 1 producer warpgroup
  using Split = ProducerWarpgroupSplit<2, 24, 240>;        // 24 + 2 · 240 = 3 · 168, the launch's registers
  using Split::kComputeWarps, Split::kProducerWarp, Split::kWarps, Split::kThreads;
  static constexpr int kHeadDim = kHeadDim_;    // D: Q, K, dQ, dK
  static constexpr int kHeadDimV = kHeadDimV_;  // Dv: V, O, dO, dV
  static constexpr int kBr = kBr_;
  static constexpr int kBc = 128;  // 64 keys per compute warpgroup (wgmma's M)
  static constexpr int kStages = kStages_;
  static constexpr int kSliceQ = kSliceQ_;
  static constexpr bool kEarlyDv = kEarlyDv_;
  static constexpr int kDsBuffers = kDsBuffers_;
  static constexpr int kDqBuffers = kDqBuffers_;
  static constexpr int kComputeThreads = 32 * kComputeWarps;
  // dQ = dS·K (Br x D) between the two warpgroups: by rows (64 each) when Br =
  // 128, else by columns, D/2 each, in parts that start on a 64-column block
  // or half-way into one (the descriptor's start moves by 16-byte chunks): one
  // part of kDqColsA, or at D = 192 a part of 64 and one of 32 — warpgroup 0
  // columns 0-63 and 64-95, warpgroup 1 columns 128-191 and 96-127.
  static constexpr bool kDqSplitRows = kBr == 128;
  static constexpr int kDqCols = kDqSplitRows ? kHeadDim : kHeadDim / 2;
  static constexpr int kDqColsB = kDqCols % 64 == 0 || kDqCols < 64 ? 0 : kDqCols % 64;
  static constexpr int kDqColsA = kDqCols - kDqColsB;
  // The first column of warpgroup wg's part (0: A, 1: B).
  ATTNLAB_HOST_DEVICE static constexpr int dq_part_col(int wg, int part) {
    return kDqSplitRows ? 0 : part == 0 ? wg * (kDqColsA + 2 * kDqColsB) : kDqColsA + wg * kDqColsB;
  }
  static constexpr int kKElems = kBc * kHeadDim, kVElems = kBc * kHeadDimV;
  static constexpr int kQElems = kBr * kHeadDim, kdOElems = kBr * kHeadDimV;
  static constexpr int kdSElems = kBc * kBr;
  static constexpr int kdQFloats = kBr * kHeadDim;  // one dQ staging buffer
  static constexpr int kPFloats = 0;                // (no Pᵀ handed between warpgroups)
  static constexpr int kSlotReleasers = kComputeThreads;  // q_empty: every compute thread
  static constexpr int kKVBytes = 2 * (kKElems + kVElems);                  // what kv_full expects
  static constexpr int kQdoBytes = 2 * (kQElems + kdOElems) + 2 * kBr * 4;  // q_full: Q, dO, LSE, Δ
  static constexpr int kBarriers = 1 + 2 * kStages;
  static constexpr int kTileBytes =
      2 * (kKElems + kVElems + kStages * (kQElems + kdOElems) + kDsBuffers * kdSElems) + 4 * kDqBuffers * kdQFloats +
      4 * 2 * kStages * kBr;
  static constexpr int kSmemBytes = kTileBytes + 8 * kBarriers + 1024;  // + slack to align to 1024
  // Named barriers (0 is __syncthreads'): "both compute warpgroups' dSᵀ are
  // stored" (256 threads), and per dQ staging buffer and warpgroup "its part
  // is staged" and "read by the dQ writer" (the warpgroup and that buffer's
  // writer warp, 160: a warpgroup never waits for the other's dQ; FA3 hands
  // dQ over per warpgroup too): kDqFullBarrier + dq_barrier(buffer, wg).
  // With one dSᵀ buffer, kDsFreeBarrier: "both have read the previous dSᵀ".
  static constexpr int kDsBarrier = 1, kDqFullBarrier = 2, kDqEmptyBarrier = 6, kDsFreeBarrier = 10;
  static constexpr int kDqHandoffThreads = 128 + 32;
  ATTNLAB_HOST_DEVICE static constexpr int dq_barrier(int buffer, int wg) { return 2 * buffer + wg; }
  static constexpr int kDqWriterWarp = kProducerWarp + 1;
  static constexpr int kDqWriters = kDqBuffers;  // a dQ writer warp per staging buffer
  static_assert(kComputeWarps == 8 && kComputeThreads == 256 && kBc == 64 * 2, "two compute warpgroups of 64 keys");
  static_assert(kKVBytes == 2 * kBc * (kHeadDim + kHeadDimV) && kQdoBytes == 2 * kBr * (kHeadDim + kHeadDimV + 4),
                "the bytes each full barrier expects");
  static_assert(kDsBarrier >= 1 && kDqFullBarrier == kDsBarrier + 1 && kDqEmptyBarrier == kDqFullBarrier + 4 &&
                    kDsFreeBarrier == kDqEmptyBarrier + 4 && kDsFreeBarrier <= 15,
                "hardware barriers 1..15, four per kind for (two dQ buffers) x (two warpgroups)");
  static_assert(kDqWriterWarp + kDqWriters <= kWarps, "the dQ writers are warps of the producer warpgroup");
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "Sw128Blocks stores 64-column blocks, one TMA box each");
  static_assert(kBr == 64 || kBr == 128, "Sᵀ's N and the dQ split");
  static_assert(kDqColsA == 64 && (kDqColsB == 0 || kDqColsB == 32), "dQ parts: m64n64 (+ m64n32) per warpgroup");
  static_assert(kDqSplitRows || (dq_part_col(1, 0) + kDqColsA == kHeadDim && dq_part_col(0, 1) == kDqColsA &&
                                 dq_part_col(1, 1) + kDqColsB == dq_part_col(1, 0)),
                "the two warpgroups' parts tile dQ's columns");
  static_assert(kHeadDim % 8 == 0, "dQ is staged in groups of 8 fp32 columns");
  static_assert((kBr * 128) % 1024 == 0 && (kBc * 128) % 1024 == 0, "every 64-column block starts 1024-aligned");
  static_assert((4 * kdQFloats) % 1024 == 0 && (2 * kdSElems) % 1024 == 0, "sdQ's boxes stay 1024-aligned");
  static_assert(kStages >= 2, "the producer fills one slot while the compute warps read the other");
  static_assert(kDsBuffers == 1 || kDsBuffers == 2, "dSᵀ in one buffer (and a barrier) or two");
  static_assert(kDqBuffers == 1 || kDqBuffers == 2, "two named barriers of each kind for the dQ buffers");
  static_assert(kBr % kSliceQ == 0 && kSliceQ % 32 == 0, "whole slices, 8-row groups of the swizzle");
  static_assert(kSliceQ == kBr || !kEarlyDv, "dV early only with one slice");
};

// A rung's header table row, checked against its config (static_assert):
// the tile, the 384 threads, the dQ split, the early dV, the buffers and the
// shared memory less the 1024 bytes of alignment slack.
template <typename Cfg>
constexpr bool bwd_ws_table_row(int br, int slice_q, int bc, bool dq_split_rows, bool early_dv, int ds_buffers,
                                int dq_buffers, int smem_bytes) {
  return Cfg::kBr == br && Cfg::kSliceQ == slice_q && Cfg::kBc == bc && Cfg::kThreads == 384 &&
         Cfg::kDqSplitRows == dq_split_rows && Cfg::kEarlyDv == early_dv && Cfg::kDsBuffers == ds_buffers &&
         Cfg::kDqBuffers == dq_buffers && Cfg::kSmemBytes - 1024 == smem_bytes;
}

// Device code of sm_90a only (TMA, mbarriers and wgmma exist there alone).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The block's shared memory (Cfg's tiles, 1024-aligned, then the barriers).
template <typename Cfg, typename T>
struct BwdShared {
  T* sK;          // [Bc, D]   Sw128Blocks<Bc>, resident
  T* sV;          // [Bc, Dv]  Sw128Blocks<Bc>, resident
  T* sQ;          // [kStages][Br, D]   Sw128Blocks<Br>
  T* sdO;         // [kStages][Br, Dv]  Sw128Blocks<Br>
  T* sdS;         // [kDsBuffers][Bc, Br] dSᵀ (keys x queries), Sw128Blocks<Bc>: A of dQ = dS·K
  float* sdQ;     // [kDqBuffers] Br x D fp32 in the tile layout (bwd_stage_dq): dQ of a tile, for the reduce-add
  float* sP;      // [kPFloats] Pᵀ handed from one warpgroup to the other (rung 15; none here)
  float* sLSE2;   // [kStages][Br] LSE·log2e
  float* sDelta;  // [kStages][Br] Δ
  uint64_t* kv_full;
  uint64_t* q_full;   // [kStages] Q, dO, LSE, Δ of a slot landed
  uint64_t* q_empty;  // [kStages] the slot may be refilled: kSlotReleasers arrivals (every compute thread; rung 15 also the dQ writer)

  __device__ __forceinline__ explicit BwdShared(unsigned char* smem_raw) {
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    sK = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    sV = sK + Cfg::kKElems;
    sQ = sV + Cfg::kVElems;
    sdO = sQ + Cfg::kStages * Cfg::kQElems;
    sdS = sdO + Cfg::kStages * Cfg::kdOElems;
    sdQ = reinterpret_cast<float*>(sdS + Cfg::kDsBuffers * Cfg::kdSElems);
    sP = sdQ + Cfg::kDqBuffers * Cfg::kdQFloats;
    sLSE2 = sP + Cfg::kPFloats;
    sDelta = sLSE2 + Cfg::kStages * Cfg::kBr;
    kv_full = reinterpret_cast<uint64_t*>(sDelta + Cfg::kStages * Cfg::kBr);
    q_full = kv_full + 1;
    q_empty = q_full + Cfg::kStages;
  }

  // By one thread, before the block's first __syncthreads.
  __device__ __forceinline__ void init_barriers() const {
    mbarrier_init(kv_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(&q_full[s], 1);                    // the producer's arrive_expect_tx, then the bytes
      mbarrier_init(&q_empty[s], Cfg::kSlotReleasers);
    }
    fence_mbarrier_init();
  }
};

// ---- the producer ------------------------------------------------------------------
// One thread: K_j, V_j (rows past Nk zero-filled), then the ring. The n-th use
// of slot s = n % kStages waits for the compute warps' release of its previous
// use (phase n / kStages − 1 of q_empty[s]).
template <typename Cfg, typename T, typename Work>
__device__ __forceinline__ void bwd_load(const BwdShared<Cfg, T>& sm, const AttnProblem& p, Work w,
                                         const CUtensorMap* tma_q, const CUtensorMap* tma_k, const CUtensorMap* tma_v,
                                         const CUtensorMap* tma_do, const float* lse2, const float* delta,
                                         int nq_pad) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc;
  mbarrier_arrive_expect_tx(sm.kv_full, Cfg::kKVBytes);
#pragma unroll 1
  for (int c = 0; c < Cfg::kHeadDim / 64; ++c)
    tma_load_3d(sm.sK + c * Bc * 64, tma_k, sm.kv_full, c * 64, bwd_kv_row0(w) + w.kv0, int(w.kv_head));
#pragma unroll 1
  for (int c = 0; c < Cfg::kHeadDimV / 64; ++c)
    tma_load_3d(sm.sV + c * Bc * 64, tma_v, sm.kv_full, c * 64, bwd_kv_row0(w) + w.kv0, int(w.kv_head));
#pragma unroll 1
  for (int s = 0; s < w.n_slots; ++s) {
    const int stage = s % Cfg::kStages;
    if (s >= Cfg::kStages) mbarrier_wait(&sm.q_empty[stage], ((s / Cfg::kStages) & 1) ^ 1);
    const auto sl = w.slot(s);
    const int q0 = sl.m * Br;
    const int64_t q_head = int64_t(w.b) * p.H + sl.h;
    uint64_t* bar = &sm.q_full[stage];
    mbarrier_arrive_expect_tx(bar, Cfg::kQdoBytes);
#pragma unroll 1
    for (int c = 0; c < Cfg::kHeadDim / 64; ++c)
      tma_load_3d(sm.sQ + stage * Cfg::kQElems + c * Br * 64, tma_q, bar, c * 64, bwd_q_row0(w) + q0, int(q_head));
#pragma unroll 1
    for (int c = 0; c < Cfg::kHeadDimV / 64; ++c)
      tma_load_3d(sm.sdO + stage * Cfg::kdOElems + c * Br * 64, tma_do, bar, c * 64, bwd_q_row0(w) + q0, int(q_head));
    const int64_t stats = q_head * nq_pad + bwd_stats_row0(w) + q0;  // the tile's LSE·log2e and Δ
    bulk_load(sm.sLSE2 + stage * Br, lse2 + stats, Br * 4, bar);
    bulk_load(sm.sDelta + stage * Br, delta + stats, Br * 4, bar);
  }
}

// ---- the epilogue: dK_j (scaled), dV_j of this KV head, keys < Nk -----------------
// A warp holds keys key_row0 (+8) of its 16-key slice, columns 8n + 2t, +1 of
// an accumulator of N columns; out: dK or dV, its rows where bwd_dkv_row puts
// them (hopper/bwd_scheduler.h; dense: [KV heads][Nk][N]), times factor.
template <typename T, int N, typename Work>
__device__ __forceinline__ void bwd_store_key_rows(const AttnProblem& p, const Work& w, int key_row0,
                                                   const float (&acc)[N / 8][4], float factor, T* out) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_row0 + 8 * r;
    if (key >= p.Nk) continue;
    T* row = out + bwd_dkv_row(p, w, key) * N;
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
      *reinterpret_cast<uint32_t*>(row + n * 8 + 2 * t) = pack2<T>(factor * acc[n][2 * r], factor * acc[n][2 * r + 1]);
  }
}
// Warp (wg, wi) holds keys kv0 + 64·wg + 16·wi + g (+8) of both.
template <typename T, int D, int Dv, typename Work>
__device__ __forceinline__ void bwd_store_dkv(const AttnProblem& p, const Work& w, int key_row0,
                                              const float (&dK)[D / 8][4], const float (&dV)[Dv / 8][4], T* dk,
                                              T* dv) {
  bwd_store_key_rows<T, D>(p, w, key_row0, dK, p.scale, dk);
  bwd_store_key_rows<T, Dv>(p, w, key_row0, dV, 1.f, dv);
}

// ---- the compute warpgroups' element-wise steps ------------------------------------
// Pᵀ = exp2(Sᵀ·scale·log2e − LSE·log2e) in place, for a warp's keys key_row0
// (c0, c1; c2, c3: + 8) and queries q_first + 8n + 2t (+1). Rows past Nq and
// rows that saw no key have LSE·log2e = +inf: P = 0 there without a test.
// Then, only on a tile that the causal diagonal or the end of the keys
// crosses (its 64 keys from key_base), the mask element by element — one
// branch around the loop, not one per element.
template <int kTiles>
__device__ __forceinline__ void bwd_probabilities(float (&St)[kTiles][4], const float2 (&lse)[kTiles],
                                                  const AttnProblem& p, float scale_log2, int key_base, int key_row0,
                                                  int q_first) {
  const int t = threadIdx.x % 4, diag = p.Nk - p.Nq;  // query i sees key j iff j <= i + diag (causal)
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) St[n][e] = exp2_approx(St[n][e] * scale_log2 - (e & 1 ? lse[n].y : lse[n].x));
  if (key_base + 64 > p.Nk || (p.causal && key_base + 63 > q_first + diag)) {
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key_row0 + 8 * (e / 2), q = q_first + n * 8 + 2 * t + (e & 1);
        St[n][e] = key >= p.Nk || (p.causal && key > q + diag) ? 0.f : St[n][e];
      }
  }
}

// Where one slice of a tile sits: the warpgroup's first key, the keys of
// this thread's c0, c1 (c2, c3: + 8), and the slice's first query.
struct BwdTileAt {
  int key_base, key_row0, q_first;
};

// The score step of rungs 14 and 15 (bwd_compute_walk's ScoreStep):
// probabilities(Sᵀ → Pᵀ) with the causal mask and the bounds; dS needs no
// chain rule and has no other use (record_ds). The block-sparse backward's
// (kernels/blocksparse/bwd_mods.cuh) applies its mask_mod and score_mod
// instead, and writes a bias's gradient from dS.
struct BwdCausalScores {
  const AttnProblem& p;
  float scale_log2;
  template <int kTiles, typename Slot>
  __device__ __forceinline__ void probabilities(float (&St)[kTiles][4], const float2 (&lse)[kTiles], const Slot&,
                                                const BwdTileAt& at) const {
    bwd_probabilities(St, lse, p, scale_log2, at.key_base, at.key_row0, at.q_first);
  }
  template <int kTiles, typename Slot>
  __device__ __forceinline__ void chain_rule(float (&)[kTiles][4], const float (&)[kTiles][4], const float*,
                                             const Slot&, const BwdTileAt&) const {}
  __device__ __forceinline__ constexpr bool chain_rule_needed() const { return false; }
  __device__ __forceinline__ constexpr float ds_factor(float, float) const { return 1.f; }
  template <int kTiles, typename Slot>
  __device__ __forceinline__ void record_ds(const float (&)[kTiles][4], const Slot&, const BwdTileAt&) const {}
};

// dSᵀ (16-bit A fragments) to shared memory, [key][query] in Sw128Blocks<Bc>,
// for the warp's 16 keys from key row `rows`: register i of k-step kk holds
// key rows + g (+8 for odd i), queries qh + 16kk + 8·(i/2) + 2t, +1 — the
// slice of an 8 x 8 matrix that stmatrix stores, so one stmatrix.x4 per
// k-step writes its four matrices (lanes 8i..8i+7 address matrix i's rows,
// each 16 contiguous bytes in the swizzle) where sixteen 4-byte stores did
// (FlashAttention-3 stores dS with stmatrix, mainloop_bwd_sm90_tma_gmma_ws.hpp).
template <int Bc, typename T, int kSteps>
__device__ __forceinline__ void bwd_store_dst(T* sdS, const uint32_t (&dSa)[kSteps][4], int rows, int qh) {
  const int lane = threadIdx.x % 32, mi = lane / 8;
  const int row = rows + lane % 8 + 8 * (mi & 1);
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    stmatrix_x4(sdS + Sw128Blocks<Bc>::offset(row, qh + kk * 16 + 8 * (mi / 2)), dSa[kk][0], dSa[kk][1], dSa[kk][2],
                dSa[kk][3]);
}

// scale·dQ of a warp's rows row0, row0 + 8 and columns col0 + 8n + 2t, +1
// (an accumulator of kTiles n8 tiles) into a dQ tile of Br rows in the tile
// layout (8-column groups of Br rows: dq_tile_offset, common/bwd_prepost.cuh),
// in which dq_accum holds each tile, so that the dQ writer adds a tile by one
// bulk copy (bwd_dq_writer). A warp's store of one
// n8 tile fills 8 consecutive rows of one group, 256 contiguous bytes: two
// wavefronts, free of bank conflicts. (Staged for a tensor map in the
// 128-byte swizzle, rows g and g^1 of a half-warp shared their banks under
// any order of the stores: twice the wavefronts, as measured.)
template <int Br, int kTiles>
__device__ __forceinline__ void bwd_stage_dq(float* sdQ, const float (&acc)[kTiles][4], int row0, int col0,
                                             float scale) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
      *reinterpret_cast<float2*>(sdQ + dq_tile_offset(row0 + 8 * r, col0 / 8 + n, 2 * t, Br)) =
          make_float2(scale * acc[n][2 * r], scale * acc[n][2 * r + 1]);
}

// ---- the compute warpgroups ---------------------------------------------------------
// Warpgroup wg owns keys kv0 + 64·wg .. + 63 and their dK, dV (fp32 registers).
// Per query tile (Br queries of head h), in the transposed form (Sᵀ, with the
// keys as the MMA's M), so that Pᵀ and dSᵀ come out of the accumulators
// already as the A operands of dV and dK:
//   Sᵀ = K_wg·Q_iᵀ,  dPᵀ = V_wg·dO_iᵀ                          (SS, m64 n=Br)
//   Pᵀ = exp2(Sᵀ·scale·log2e − LSE_i·log2e),  dSᵀ = Pᵀ ∘ (dPᵀ − Δ_i)
//   dV_wg += Pᵀ·dO_i,  dK_wg += dSᵀ·Q_i                          (RS: Pᵀ, dSᵀ from registers)
//   dQ_i += scale·dS·K_j  (all Bc keys: dSᵀ of both warpgroups through shared
//        memory; they split dQ's rows when Br = 128, its columns when Br = 64;
//        staged for the dQ writer warp, bwd_write_dq)
// over the query tiles of walk w. The score step: scores.probabilities turns
// Sᵀ into Pᵀ (masking it), scores.chain_rule multiplies dSᵀ by d(score)/d(S)
// where a score_mod changes it (it sees Pᵀ and the slice's LSE·log2e).
template <typename Cfg, typename T, typename Work, typename ScoreStep>
__device__ __forceinline__ void bwd_compute_walk(const BwdShared<Cfg, T>& sm, const AttnProblem& p, Work w,
                                                 const ScoreStep& scores, T* dk, T* dv) {
  constexpr int D = Cfg::kHeadDim, Dv = Cfg::kHeadDimV, Br = Cfg::kBr, Bc = Cfg::kBc;
  constexpr int kSlices = Br / Cfg::kSliceQ;
  constexpr int kTilesS = Cfg::kSliceQ / 8;  // n8 tiles across the queries of a slice of Sᵀ
  // wg_uniform: wg through a shuffle from lane 0, so the compiler knows it is
  // uniform in the warp and keeps the descriptors of the warpgroup's K and V
  // rows (and their k-step advances) in uniform registers (CUTLASS's
  // canonical_warp_group_idx). Used there only: with every use of wg taken
  // from it, or dQ's descriptors too, ptxas spills 40-100 bytes.
  const int tid = threadIdx.x, wg = tid / 128, wi = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wg_uniform = __shfl_sync(0xffffffffu, wg, 0);
  const int key_base = w.kv0 + 64 * wg;           // this warpgroup's first key
  const int key_row0 = key_base + 16 * wi + g;    // the keys of c0, c1 (c2, c3: + 8)
  float dK[D / 8][4] = {}, dV[Dv / 8][4] = {};

  if (w.n_slots > 0) mbarrier_wait(sm.kv_full, 0);
#pragma unroll 1
  for (int s = 0; s < w.n_slots; ++s) {
    const int stage = s % Cfg::kStages;
    const auto slot = w.slot(s);
    const int q0 = slot.m * Br;
    const T* sQ = sm.sQ + stage * Cfg::kQElems;
    const T* sdO = sm.sdO + stage * Cfg::kdOElems;
    const float* sLSE2 = sm.sLSE2 + stage * Br;
    const float* sDelta = sm.sDelta + stage * Br;
    mbarrier_wait(&sm.q_full[stage], (s / Cfg::kStages) & 1);

    // The tile's queries in kSlices slices of kSliceQ (one slice but at
    // D = 192, where Sᵀ and dPᵀ of 64 queries do not fit beside dK and dV).
    uint32_t dSa[kTilesS / 2][4];
    T* sdS = sm.sdS + (Cfg::kDsBuffers == 2 ? s % 2 : 0) * Cfg::kdSElems;
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) {
      const int qh = sl * Cfg::kSliceQ;  // the slice's first query column
      // Sᵀ and dPᵀ: the forward's S = Q·Kᵀ with the roles swapped (A = the
      // warpgroup's 64 rows of K or V, B = the slice's rows of Q or dO), two groups.
      // This thread's LSE·log2e (queries qh + 8n + 2t, +1: one 8-byte load per
      // n8 tile), loaded before the MMAs are issued: behind them, the loads
      // queue after the MMAs' operand reads and the exponentials wait on them.
      float2 lse[kTilesS];
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) lse[n] = *reinterpret_cast<const float2*>(sLSE2 + qh + n * 8 + 2 * t);
      float St[kTilesS][4], dPt[kTilesS][4];
      wgmma_fence();
      wgmma_rows_tile<T, D, Cfg::kSliceQ, Bc, Br>(St, sm.sK + wg_uniform * 64 * 64, sQ + qh * 64);
      wgmma_commit();
      wgmma_rows_tile<T, Dv, Cfg::kSliceQ, Bc, Br>(dPt, sm.sV + wg_uniform * 64 * 64, sdO + qh * 64);
      wgmma_commit();
      wgmma_wait<1>();
      fence_accumulators(St);

      const BwdTileAt at{key_base, key_row0, q0 + qh};
      scores.probabilities(St, lse, slot, at);
      float2 delta[kTilesS];  // Δ likewise, loaded before the wait for dPᵀ
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) delta[n] = *reinterpret_cast<const float2*>(sDelta + qh + n * 8 + 2 * t);
      // dV += Pᵀ·dO and dK += dSᵀ·Q over the slice: A from registers (16
      // queries per k-step), B = dO or Q rows read N-major (as V in the
      // forward's P·V). With kEarlyDv, dV is issued as soon as Pᵀ is ready and
      // runs under the dS code (which then holds Pᵀ twice: fp32 for dS,
      // 16-bit for the MMA).
      uint32_t Pa[kTilesS / 2][4];
      if constexpr (Cfg::kEarlyDv) {
        pack_p_fragments<T>(Pa, St);
        wgmma_fence();
        wgmma_rows_rs<T, Dv, Cfg::kSliceQ, Br>(dV, Pa, sdO + qh * 64);
        wgmma_commit();
        wgmma_wait<1>();  // dPᵀ (dV may run on)
      } else {
        wgmma_wait<0>();
      }
      fence_accumulators(dPt);
#pragma unroll
      for (int n = 0; n < kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) dPt[n][e] = St[n][e] * (dPt[n][e] - (e & 1 ? delta[n].y : delta[n].x));
      scores.record_ds(dPt, slot, at);  // dS' before the chain rule
      scores.chain_rule(dPt, St, sLSE2 + qh, slot, at);
      pack_p_fragments<T>(dSa, dPt);
      if constexpr (!Cfg::kEarlyDv) pack_p_fragments<T>(Pa, St);

      // dSᵀ to shared memory. Both warpgroups' dQ MMAs read all of it, so the
      // buffer is rewritten only once the other warpgroup's dQ of two tiles ago
      // (two buffers) or of the previous tile (one buffer: a barrier here) has
      // read it. With two buffers it is stored before dV and dK are issued
      // (FlashAttention-3's order: the stores then do not queue behind those
      // MMAs' operand reads); with one, after (the barrier would hold them back).
      auto store_ds = [&] {
        if (Cfg::kDsBuffers == 1 && sl == 0) named_barrier_sync(Cfg::kDsFreeBarrier, Cfg::kComputeThreads);
        bwd_store_dst<Bc>(sdS, dSa, 64 * wg + 16 * wi, qh);
      };
      if constexpr (Cfg::kDsBuffers == 2) store_ds();
      if constexpr (!Cfg::kEarlyDv || kSlices > 1) wgmma_fence();
      if constexpr (!Cfg::kEarlyDv) wgmma_rows_rs<T, Dv, Cfg::kSliceQ, Br>(dV, Pa, sdO + qh * 64);
      if constexpr (kSlices > 1) wgmma_rows_rs<T, D, Cfg::kSliceQ, Br>(dK, dSa, sQ + qh * 64);  // (else after dQ)
      if constexpr (!Cfg::kEarlyDv || kSlices > 1) wgmma_commit();
      if constexpr (Cfg::kDsBuffers == 1) store_ds();
    }
    fence_proxy_async_shared();  // the st.shared of dSᵀ, before wgmma reads them
    named_barrier_sync(Cfg::kDsBarrier, Cfg::kComputeThreads);

    // dQ = dS·K_j over the Bc keys (A = dS read from dSᵀ, M-major; B = K,
    // N-major), this warpgroup's columns in one or two parts (Cfg::dq_part:
    // at D = 192 a 64- and a 32-column part, so that each part starts on a
    // 64-column block or half-way into one; the second part is issued once
    // the first is staged, so that the two never hold registers beside dK and
    // dV at once: ptxas would serialise the wgmmas); with one slice then dK,
    // its own group, running while dQ is staged.
    constexpr int kColsA = Cfg::kDqColsA, kColsB = Cfg::kDqColsB;
    float dQa[kColsA / 8][4];
    const int colA = Cfg::dq_part_col(wg, 0), colB = Cfg::dq_part_col(wg, 1);
    wgmma_fence();
    wgmma_rows_tt<T, kColsA, Bc>(dQa, sdS + (Cfg::kDqSplitRows ? wg * Bc * 64 : 0),
                                 sm.sK + (colA / 64) * Bc * 64 + colA % 64);  // 16 keys per k-step
    wgmma_commit();
    if constexpr (kSlices == 1) {
      wgmma_rows_rs<T, D, Cfg::kSliceQ, Br>(dK, dSa, sQ);
      wgmma_commit();
      wgmma_wait<1>();  // dV and dQ (dK may run on)
    } else {
      wgmma_wait<0>();
    }
    fence_accumulators(dQa);

    // dQ (scaled) into staging buffer s % kDqBuffers, once the dQ writer has
    // read what it held kDqBuffers slots ago (bwd_stage_dq).
    const int buf = s % Cfg::kDqBuffers;
    if (s >= Cfg::kDqBuffers)
      named_barrier_sync(Cfg::kDqEmptyBarrier + Cfg::dq_barrier(buf, wg), Cfg::kDqHandoffThreads);
    float* sdQ = sm.sdQ + buf * Cfg::kdQFloats;
    const int row0 = (Cfg::kDqSplitRows ? 64 * wg : 0) + 16 * wi + g;
    bwd_stage_dq<Br>(sdQ, dQa, row0, colA, p.scale);
    if constexpr (kColsB > 0) {
      static_assert(kSlices > 1, "dK has landed before the second part (whose wait is the tile's last)");
      float dQb[kColsB / 8][4];
      wgmma_fence();
      wgmma_rows_tt<T, kColsB, Bc>(dQb, sdS, sm.sK + (colB / 64) * Bc * 64 + colB % 64);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(dQb);
      bwd_stage_dq<Br>(sdQ, dQb, row0, colB, p.scale);
    }
    fence_proxy_async_shared();  // the st.shared of dQ, before the tensor reduction reads them
    named_barrier_arrive(Cfg::kDqFullBarrier + Cfg::dq_barrier(buf, wg), Cfg::kDqHandoffThreads);

    wgmma_wait<0>();  // dK: the slot's Q, dO (and LSE, Δ above) are read
    fence_accumulators(dK);
    fence_accumulators(dV);
    // Every thread releases the slot itself: its own reads of sLSE2, sDelta
    // are then ordered (across proxies too) before the producer's next bulk
    // copy into them, with no warp-level step in between.
    fence_proxy_async_shared();
    mbarrier_arrive(&sm.q_empty[stage]);
  }
  bwd_store_dkv<T, D, Dv>(p, w, key_row0, dK, dV, dk, dv);
}
// Rung 14's: its walk, the causal mask.
template <typename Cfg, typename T>
__device__ __forceinline__ void bwd_compute(const BwdShared<Cfg, T>& sm, const AttnProblem& p, const BwdWork& w,
                                            T* dk, T* dv) {
  bwd_compute_walk<Cfg, T>(sm, p, w, BwdCausalScores{p, p.scale * kLog2e}, dk, dv);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
