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
// Warpgroup wg takes dQ's columns wg·D/2 .. + D/2, in parts of kDqPart = 64
// (so that a part and the next tile's scores fit beside the gradient).
// dQ_i[:, part] = dS·K_j[:, part] (A = dS read from dSᵀ, M-major; B = K,
// N-major; 16 keys per k-step), one commit group.
template <typename Cfg, typename T>
__device__ __forceinline__ void bwd_roles_dq_mma(const BwdShared<Cfg, T>& sm, int col0,
                                                 float (&dQ)[Cfg::kDqPart / 8][4]) {
  constexpr int Bc = Cfg::kBc;
  const uint64_t ds = opaque(make_sw128_desc(sm.sdS, Bc * 128, 1024));
  const uint64_t kd = opaque(make_sw128_desc(sm.sK + (col0 / 64) * Bc * 64, Bc * 128, 1024));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk)
    wgmma_ss_tt<T, Cfg::kDqPart>(dQ, advance_desc(ds, kk * 16 * 128), advance_desc(kd, kk * 16 * 128), kk > 0);
  wgmma_commit();
}

// scale·dQ of a part (rows q0.., columns col0..) added to the accumulator
// [heads][nq_pad][D] with vector fp32 atomics; padding rows past Nq get zeros
// (their dS is 0) inside the padded accumulator.
template <typename Cfg>
__device__ __forceinline__ void bwd_roles_dq_add(const AttnProblem& p, int64_t row0, int col0,
                                                 const float (&dQ)[Cfg::kDqPart / 8][4], float* dq_accum) {
  constexpr int D = Cfg::kHeadDim;
  const int tid = threadIdx.x, wi = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  float* rows = dq_accum + (row0 + 16 * wi + g) * D + col0 + 2 * t;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < Cfg::kDqPart / 8; ++n)
      atomic_add2(rows + 8 * r * D + n * 8, p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
}

// Deterministic: the adds to a dQ tile take turns in key-tile order (rung
// 14's counters), here taken by the compute warps themselves: thread 0 waits,
// both warpgroups add, and thread 0 passes the turn once every thread's adds
// are issued (CUTLASS's barrier: bar.sync, then one release).
template <typename Cfg>
__device__ __forceinline__ void bwd_roles_take_turn(const BwdWork& w, int* dq_turn) {
  if (threadIdx.x == 0) bwd_wait_turn(dq_turn, w.j_tile);
  named_barrier_sync_any(Cfg::kTurnBarrier, Cfg::kComputeThreads);
}
template <typename Cfg>
__device__ __forceinline__ void bwd_roles_pass_turn(int* dq_turn) {
  named_barrier_sync_any(Cfg::kTurnBarrier, Cfg::kComputeThreads);
  if (threadIdx.x == 0) bwd_release_turn(dq_turn);
}

// ---- the two chains ------------------------------------------------------------------
// Both run the same software pipeline over the block's query tiles: the
// scores of tile s+1 (Sᵀ or dPᵀ) are issued right behind dQ of tile s, so
// that the tensor cores have them to run while dQ's atomics go out:
//   [scores s landed] element-wise s, gradient MMA s, hand-over,
//   [slot s released] dQ MMAs s (two parts), [part 0 landed] its adds,
//   scores s+1, [part 1 landed] its adds, ...
// At the peak a chain holds its gradient (128 registers at D = 256) and two
// of dQ's parts or one part and the next scores (32 + 32).
template <typename Cfg, typename T>
__device__ __forceinline__ void bwd_roles_issue_scores(const BwdShared<Cfg, T>& sm, const BwdWork& w, int s,
                                                       bool p_chain, float (&acc)[Cfg::kBr / 8][4]) {
  const int stage = s % Cfg::kStages;
  mbarrier_wait(&sm.q_full[stage], (s / Cfg::kStages) & 1);
  wgmma_fence();
  if (p_chain)  // Sᵀ = K_j·Q_iᵀ
    wgmma_rows_tile<T, Cfg::kHeadDim, Cfg::kBr, Cfg::kBc, Cfg::kBr>(acc, sm.sK, sm.sQ + stage * Cfg::kQElems);
  else          // dPᵀ = V_j·dO_iᵀ
    wgmma_rows_tile<T, Cfg::kHeadDimV, Cfg::kBr, Cfg::kBc, Cfg::kBr>(acc, sm.sV, sm.sdO + stage * Cfg::kdOElems);
  wgmma_commit();
}

// Warpgroup 0, the P chain: Sᵀ = K_j·Q_iᵀ (SS, m64 n=Br), Pᵀ = exp2(Sᵀ·scale·
// log2e − LSE·log2e) masked, dV_j += Pᵀ·dO_i (RS: Pᵀ from registers), Pᵀ in
// fp32 to shared memory for the dS chain, then its half of dQ.
// Warpgroup 1, the dS chain: dPᵀ = V_j·dO_iᵀ (SS), then, once the P chain has
// handed Pᵀ over, dSᵀ = Pᵀ ∘ (dPᵀ − Δ_i), dK_j += dSᵀ·Q_i (RS), dSᵀ to
// shared memory for both warpgroups' dQ, then its half of dQ.
// Each ends by storing its gradient (dV, or dK scaled) for the tile's keys.
template <typename Cfg, typename T, bool kDeterministic, bool kPChain>
__device__ __forceinline__ void bwd_roles_chain(const BwdShared<Cfg, T>& sm, const AttnProblem& p, const BwdWork& w,
                                                T* grad_out, float* dq_accum, int* dq_turns, int nq_pad) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kTiles = Br / 8;
  static_assert(Cfg::kHeadDim == Cfg::kHeadDimV, "one gradient shape for both chains");
  constexpr int wg = kPChain ? 0 : 1;
  const int tid = threadIdx.x, wi = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  const int key_row0 = w.kv0 + 16 * wi + g;  // the keys of c0, c1 (c2, c3: + 8)
  const float scale_log2 = p.scale * kLog2e;
  // Pᵀ, in fp32 and in the P chain's fragment order: only the thread of the
  // dS chain with the same fragment (tid + 128) reads an element back, so
  // each n8 tile is one conflict-free 16-byte store and load.
  float4* sP = reinterpret_cast<float4*>(sm.sP) + tid % 128;
  float grad[D / 8][4] = {};  // dV (P chain) or dK (dS chain), unscaled
  float scores[kTiles][4];    // Sᵀ or dPᵀ of the tile in flight

  if (w.n_slots > 0) {
    mbarrier_wait(sm.kv_full, 0);
    bwd_roles_issue_scores<Cfg, T>(sm, w, 0, kPChain, scores);
  }
#pragma unroll 1
  for (int s = 0; s < w.n_slots; ++s) {
    const int stage = s % Cfg::kStages;
    int h, m;
    w.slot(s, h, m);
    const T* sQ = sm.sQ + stage * Cfg::kQElems;
    const T* sdO = sm.sdO + stage * Cfg::kdOElems;
    // LSE·log2e (P chain) or Δ (dS chain) of queries 8n + 2t, +1, read while
    // the scores' MMA runs.
    const float* row_stat = (kPChain ? sm.sLSE2 : sm.sDelta) + stage * Br;
    float2 stat[kTiles];
#pragma unroll
    for (int n = 0; n < kTiles; ++n) stat[n] = *reinterpret_cast<const float2*>(row_stat + n * 8 + 2 * t);
    wgmma_wait<0>();
    fence_accumulators(scores);

    uint32_t frag[kTiles / 2][4];  // Pᵀ or dSᵀ in 16 bits: the gradient MMA's A
    if constexpr (kPChain) {
      bwd_probabilities(scores, stat, p, scale_log2, w.kv0, key_row0, m * Br);
      pack_p_fragments<T>(frag, scores);
      wgmma_fence();
      wgmma_rows_rs<T, D, Br, Br>(grad, frag, sdO);  // dV += Pᵀ·dO, while Pᵀ is handed over
      wgmma_commit();
#pragma unroll
      for (int n = 0; n < kTiles; ++n) sP[n * 128] = make_float4(scores[n][0], scores[n][1], scores[n][2], scores[n][3]);
      named_barrier_arrive_any(Cfg::kPBarrier, Cfg::kComputeThreads);
      named_barrier_sync_any(Cfg::kDsBarrier, Cfg::kComputeThreads);  // dSᵀ stored
    } else {
      named_barrier_sync_any(Cfg::kPBarrier, Cfg::kComputeThreads);  // Pᵀ handed over
#pragma unroll
      for (int n = 0; n < kTiles; ++n) {
        const float4 P = sP[n * 128];
        scores[n][0] = P.x * (scores[n][0] - stat[n].x);
        scores[n][1] = P.y * (scores[n][1] - stat[n].y);
        scores[n][2] = P.z * (scores[n][2] - stat[n].x);
        scores[n][3] = P.w * (scores[n][3] - stat[n].y);
      }
      pack_p_fragments<T>(frag, scores);
      wgmma_fence();
      wgmma_rows_rs<T, D, Br, Br>(grad, frag, sQ);  // dK += dSᵀ·Q, while dSᵀ is stored
      wgmma_commit();
      // dSᵀ is rewritten only after the P chain's next hand-over, which
      // comes after its dQ MMA of this tile has landed.
      bwd_store_dst<Bc>(sm.sdS, frag, 16 * wi + g, 0);
      fence_proxy_async_shared();  // the st.shared of dSᵀ, before wgmma reads them
      named_barrier_sync_any(Cfg::kDsBarrier, Cfg::kComputeThreads);
    }
    wgmma_wait<0>();  // the gradient MMA: the slot's Q, dO (and LSE, Δ above) are read
    fence_accumulators(grad);
    fence_proxy_async_shared();  // this thread's reads of the slot, before the producer's next copies into it
    mbarrier_arrive(&sm.q_empty[stage]);

    // dQ in two parts; each part's adds go out while the tensor cores run
    // the next MMA: part 1, then the next tile's scores.
    static_assert(D / 2 == 2 * Cfg::kDqPart, "two dQ parts per warpgroup");
    const int64_t q_head = int64_t(w.b) * p.H + h, row0 = q_head * nq_pad + m * Br;
    int* turn = dq_turns + q_head * (nq_pad / Br) + m;
    if constexpr (kDeterministic) bwd_roles_take_turn<Cfg>(w, turn);
    float dQa[Cfg::kDqPart / 8][4], dQb[Cfg::kDqPart / 8][4];
    bwd_roles_dq_mma<Cfg, T>(sm, wg * D / 2, dQa);
    bwd_roles_dq_mma<Cfg, T>(sm, wg * D / 2 + Cfg::kDqPart, dQb);
    wgmma_wait<1>();
    fence_accumulators(dQa);
    bwd_roles_dq_add<Cfg>(p, row0, wg * D / 2, dQa, dq_accum);
    if (s + 1 < w.n_slots) {
      bwd_roles_issue_scores<Cfg, T>(sm, w, s + 1, kPChain, scores);
      wgmma_wait<1>();  // dQ's part 1 (the next scores run on)
    } else {
      wgmma_wait<0>();
    }
    fence_accumulators(dQb);
    bwd_roles_dq_add<Cfg>(p, row0, wg * D / 2 + Cfg::kDqPart, dQb, dq_accum);
    if constexpr (kDeterministic) bwd_roles_pass_turn<Cfg>(turn);
  }
  bwd_store_key_rows<T, D>(p, w, key_row0, grad, kPChain ? 1.f : p.scale, grad_out);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
