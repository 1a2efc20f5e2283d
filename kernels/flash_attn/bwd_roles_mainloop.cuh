// attnlab: rung 15's mainloop — its two compute warpgroups, which share one
// tile of 64 keys and split the backward's work by role instead of by keys:
// warpgroup 0 runs the P chain (Sᵀ, Pᵀ, dV), warpgroup 1 the dS chain (dPᵀ,
// dSᵀ, dK), and both take half of dQ's columns, which they add to the fp32
// accumulator with vector atomics from registers (FlashAttention-3 does the
// same at D = 256: hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp, !dQacc_use_TMA).
// The producer (bwd_load), the walk (BwdWork), the element-wise steps and the
// epilogue are rung 14's (bwd_ws_mainloop.cuh).
#pragma once

#include "flash_attn/bwd_ws_mainloop.cuh"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- dQ: both warpgroups -----------------------------------------------------------
// dQ_i[:, cols] += scale·dS·K_j[:, cols] for warpgroup wg's D/2 columns (A = dS
// read from dSᵀ, M-major; B = K, N-major; 16 keys per k-step), added to the
// accumulator [heads][nq_pad][D] once every MMA of the warpgroup has landed
// (so this also ends the tile's dV or dK). Padding rows past Nq get zeros
// (their dS is 0), inside the padded accumulator. Deterministic: the adds to
// a dQ tile take turns in key-tile order (rung 14's counters), here taken by
// the compute warps themselves: thread 0 waits, both warpgroups add, and
// thread 0 passes the turn once every thread's adds are issued (CUTLASS's
// barrier: bar.sync, then one release).
template <typename Cfg, typename T, bool kDeterministic>
__device__ __forceinline__ void bwd_roles_dq(const BwdShared<Cfg, T>& sm, const AttnProblem& p, const BwdWork& w,
                                             int wg, int q0, int64_t q_head, float* dq_accum, int* dq_turn,
                                             int nq_pad) {
  constexpr int D = Cfg::kHeadDim, Bc = Cfg::kBc, kCols = D / 2;
  const int tid = threadIdx.x, wi = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  float dQ[kCols / 8][4];
  const uint64_t ds = opaque(make_sw128_desc(sm.sdS, Bc * 128, 1024));
  const uint64_t kd = opaque(make_sw128_desc(sm.sK + wg * (kCols / 64) * Bc * 64, Bc * 128, 1024));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk)
    wgmma_ss_tt<T, kCols>(dQ, advance_desc(ds, kk * 16 * 128), advance_desc(kd, kk * 16 * 128), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(dQ);

  if constexpr (kDeterministic) {
    if (tid == 0) bwd_wait_turn(dq_turn, w.j_tile);
    named_barrier_sync(Cfg::kTurnBarrier, Cfg::kComputeThreads);
  }
  float* rows = dq_accum + (q_head * nq_pad + q0 + 16 * wi + g) * D + wg * kCols + 2 * t;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n)
      atomic_add2(rows + 8 * r * D + n * 8, p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
  if constexpr (kDeterministic) {
    named_barrier_sync(Cfg::kTurnBarrier, Cfg::kComputeThreads);
    if (tid == 0) bwd_release_turn(dq_turn);
  }
}

// ---- warpgroup 0: the P chain --------------------------------------------------------
// Per query tile: Sᵀ = K_j·Q_iᵀ (SS, m64 n=Br), Pᵀ = exp2(Sᵀ·scale·log2e −
// LSE·log2e) masked, Pᵀ in fp32 to shared memory for the dS chain, dV_j +=
// Pᵀ·dO_i (RS: Pᵀ from registers), then its half of dQ.
template <typename Cfg, typename T, bool kDeterministic>
__device__ __forceinline__ void bwd_roles_p_chain(const BwdShared<Cfg, T>& sm, const AttnProblem& p,
                                                  const BwdWork& w, T* dv, float* dq_accum, int* dq_turns,
                                                  int nq_pad) {
  constexpr int D = Cfg::kHeadDim, Dv = Cfg::kHeadDimV, Br = Cfg::kBr, Bc = Cfg::kBc, kTiles = Br / 8;
  const int tid = threadIdx.x, wi = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  const int key_row0 = w.kv0 + 16 * wi + g;  // the keys of c0, c1 (c2, c3: + 8)
  const float scale_log2 = p.scale * kLog2e;
  float dV[Dv / 8][4] = {};

  if (w.n_slots > 0) mbarrier_wait(sm.kv_full, 0);
#pragma unroll 1
  for (int s = 0; s < w.n_slots; ++s) {
    const int stage = s % Cfg::kStages;
    int h, m;
    w.slot(s, h, m);
    const T* sQ = sm.sQ + stage * Cfg::kQElems;
    const T* sdO = sm.sdO + stage * Cfg::kdOElems;
    const float* sLSE2 = sm.sLSE2 + stage * Br;
    mbarrier_wait(&sm.q_full[stage], (s / Cfg::kStages) & 1);

    float St[kTiles][4];
    wgmma_fence();
    wgmma_rows_tile<T, D, Br, Bc, Br>(St, sm.sK, sQ);
    wgmma_commit();
    float2 lse[kTiles];  // queries 8n + 2t, +1: read while the MMA runs
#pragma unroll
    for (int n = 0; n < kTiles; ++n) lse[n] = *reinterpret_cast<const float2*>(sLSE2 + n * 8 + 2 * t);
    wgmma_wait<0>();
    fence_accumulators(St);
    bwd_probabilities(St, lse, p, scale_log2, w.kv0, key_row0, m * Br);

    uint32_t Pa[kTiles / 2][4];
    pack_p_fragments<T>(Pa, St);
    wgmma_fence();
    wgmma_rows_rs<T, Dv, Br, Br>(dV, Pa, sdO);  // runs while Pᵀ is handed over
    wgmma_commit();
    // NEW: Pᵀ to the dS chain, in fp32 and in this thread's fragment order —
    // only the thread of warpgroup 1 with the same fragment (tid + 128) reads
    // it back, so each n8 tile is one conflict-free 16-byte store.
    float4* sP = reinterpret_cast<float4*>(sm.sP) + tid;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) sP[n * 128] = make_float4(St[n][0], St[n][1], St[n][2], St[n][3]);
    named_barrier_arrive(Cfg::kPBarrier, Cfg::kComputeThreads);
    named_barrier_sync(Cfg::kDsBarrier, Cfg::kComputeThreads);  // dSᵀ stored

    const int64_t q_head = int64_t(w.b) * p.H + h;
    bwd_roles_dq<Cfg, T, kDeterministic>(sm, p, w, 0, m * Br, q_head, dq_accum,
                                         dq_turns + q_head * (nq_pad / Br) + m, nq_pad);
    fence_proxy_async_shared();  // this thread's reads of the slot, before the producer's next copies into it
    mbarrier_arrive(&sm.q_empty[stage]);
  }
  bwd_store_key_rows<T, Dv>(p, w, key_row0, dV, 1.f, dv);
}

// ---- warpgroup 1: the dS chain -------------------------------------------------------
// Per query tile: dPᵀ = V_j·dO_iᵀ (SS), then, once the P chain has handed
// Pᵀ over, dSᵀ = Pᵀ ∘ (dPᵀ − Δ_i), dK_j += dSᵀ·Q_i (RS), dSᵀ to shared
// memory for both warpgroups' dQ, then its half of dQ.
template <typename Cfg, typename T, bool kDeterministic>
__device__ __forceinline__ void bwd_roles_ds_chain(const BwdShared<Cfg, T>& sm, const AttnProblem& p,
                                                   const BwdWork& w, T* dk, float* dq_accum, int* dq_turns,
                                                   int nq_pad) {
  constexpr int D = Cfg::kHeadDim, Dv = Cfg::kHeadDimV, Br = Cfg::kBr, Bc = Cfg::kBc, kTiles = Br / 8;
  const int tid = threadIdx.x, wi = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  const int key_row0 = w.kv0 + 16 * wi + g;
  float dK[D / 8][4] = {};

  if (w.n_slots > 0) mbarrier_wait(sm.kv_full, 0);
#pragma unroll 1
  for (int s = 0; s < w.n_slots; ++s) {
    const int stage = s % Cfg::kStages;
    int h, m;
    w.slot(s, h, m);
    const T* sQ = sm.sQ + stage * Cfg::kQElems;
    const T* sdO = sm.sdO + stage * Cfg::kdOElems;
    const float* sDelta = sm.sDelta + stage * Br;
    mbarrier_wait(&sm.q_full[stage], (s / Cfg::kStages) & 1);

    float dPt[kTiles][4];
    wgmma_fence();
    wgmma_rows_tile<T, Dv, Br, Bc, Br>(dPt, sm.sV, sdO);
    wgmma_commit();
    float2 delta[kTiles];
#pragma unroll
    for (int n = 0; n < kTiles; ++n) delta[n] = *reinterpret_cast<const float2*>(sDelta + n * 8 + 2 * t);
    wgmma_wait<0>();
    fence_accumulators(dPt);

    named_barrier_sync(Cfg::kPBarrier, Cfg::kComputeThreads);  // Pᵀ handed over
    const float4* sP = reinterpret_cast<const float4*>(sm.sP) + (tid - 128);
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const float4 P = sP[n * 128];
      dPt[n][0] = P.x * (dPt[n][0] - delta[n].x);
      dPt[n][1] = P.y * (dPt[n][1] - delta[n].y);
      dPt[n][2] = P.z * (dPt[n][2] - delta[n].x);
      dPt[n][3] = P.w * (dPt[n][3] - delta[n].y);
    }
    uint32_t dSa[kTiles / 2][4];
    pack_p_fragments<T>(dSa, dPt);
    wgmma_fence();
    wgmma_rows_rs<T, D, Br, Br>(dK, dSa, sQ);  // runs while dSᵀ is stored
    wgmma_commit();
    // dSᵀ is rewritten only after the P chain's next hand-over, which comes
    // after its dQ MMA of this tile has read it.
    bwd_store_dst<Bc>(sm.sdS, dSa, 16 * wi + g, 0);
    fence_proxy_async_shared();  // the st.shared of dSᵀ, before wgmma reads them
    named_barrier_sync(Cfg::kDsBarrier, Cfg::kComputeThreads);

    const int64_t q_head = int64_t(w.b) * p.H + h;
    bwd_roles_dq<Cfg, T, kDeterministic>(sm, p, w, 1, m * Br, q_head, dq_accum,
                                         dq_turns + q_head * (nq_pad / Br) + m, nq_pad);
    fence_proxy_async_shared();
    mbarrier_arrive(&sm.q_empty[stage]);
  }
  bwd_store_key_rows<T, D>(p, w, key_row0, dK, p.scale, dk);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
