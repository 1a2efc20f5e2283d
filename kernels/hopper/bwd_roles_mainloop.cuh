// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: rung 15's mainloop — its two compute warpgroups, which share one
// tile of 64 keys and split the backward's work by role instead of by keys:
// warpgroup 0 runs the P chain (Sᵀ, Pᵀ, dV), warpgroup 1 the dS chain (dPᵀ,
// dSᵀ, dK), and both take half of dQ's columns, which they stage over the
// ring slot that the tile's Q and dO came in, for a dQ writer warp to add by
// bulk reduce-add. The producer (bwd_load), the walk (BwdWork, or the
// block-sparse backward's BsBwdWork), the score step (BwdCausalScores, or
// BsBwdScores), dQ's staging and the epilogue are rung 14's
// (hopper/bwd_mainloop.cuh).
#pragma once

#include "hopper/bwd_dq_writer.cuh"
#include "hopper/bwd_mainloop.cuh"

namespace attnlab {

// Rung 15's tiles (its header's table), for rung 15 and the block-sparse
// backward at D = 256.
template <int kHeadDim_, int kHeadDimV_, int kStages_>
struct BwdRolesConfig : ProducerWarpgroupSplit<2, 24, 240> {  // 2 compute warpgroups + 1 producer warpgroup
  static constexpr int kHeadDim = kHeadDim_;    // D: Q, K, dQ, dK
  static constexpr int kHeadDimV = kHeadDimV_;  // Dv: V, O, dO, dV
  static constexpr int kBr = 64;                // queries per tile (Sᵀ's N)
  static constexpr int kBc = 64;                // keys per block (wgmma's M, both warpgroups)
  static constexpr int kStages = kStages_;
  static constexpr int kComputeThreads = 32 * kComputeWarps;
  static constexpr int kKElems = kBc * kHeadDim, kVElems = kBc * kHeadDimV;
  static constexpr int kQElems = kBr * kHeadDim, kdOElems = kBr * kHeadDimV;
  // BwdShared's tiles: one dSᵀ buffer, no dQ staging, Pᵀ in fp32.
  static constexpr int kdSElems = kBc * kBr, kDsBuffers = 1;
  static constexpr int kdQFloats = 0, kDqBuffers = 0;
  static constexpr int kPFloats = kBc * kBr;
  static constexpr int kKVBytes = 2 * (kKElems + kVElems);
  static constexpr int kQdoBytes = 2 * (kQElems + kdOElems) + 2 * kBr * 4;  // Q, dO, LSE, Δ
  static constexpr int kBarriers = 1 + 2 * kStages;
  static constexpr int kTileBytes = 2 * (kKElems + kVElems + kStages * (kQElems + kdOElems) + kdSElems) +
                                    4 * kPFloats + 4 * 2 * kStages * kBr;
  static constexpr int kSmemBytes = kTileBytes + 8 * kBarriers + 1024;  // + slack to align to 1024
  // q_empty: every compute thread once its dQ is staged, and the dQ writer once the adds have read it.
  static constexpr int kSlotReleasers = kComputeThreads + 1;
  // Named barriers: Pᵀ handed over, dSᵀ stored, the slot's Q and dO read
  // (256 compute threads each), and per stage "dQ staged" (+ its writer warp).
  static constexpr int kPBarrier = 1, kDsBarrier = 2, kSlotReadBarrier = 3, kDqFullBarrier = 4;
  static constexpr int kDqWriterWarp = kProducerWarp + 1;
  static constexpr int kDqWriters = kStages;  // a dQ writer warp per ring slot (its staging)
  static_assert(kDqWriterWarp + kDqWriters <= kWarps, "the dQ writers are warps of the producer warpgroup");
  static_assert(kComputeWarps == 8 && kComputeThreads == 256, "two compute warpgroups: the P and the dS chain");
  static_assert(kBr == 64 && kBc == 64, "Sᵀ and dPᵀ are one m64n64 tile per chain");
  static_assert(kHeadDim == kHeadDimV && kHeadDim % 128 == 0 && kHeadDim <= 256,
                "dV and dK are one RS wgmma of N = D; dQ two SS ones of N = D/2, each starting on a 64-column block");
  static_assert(kPFloats == 128 * 4 * (kBr / 8), "Pᵀ: one float4 per thread per n8 tile");
  static_assert((2 * kdSElems) % 1024 == 0 && (kBr * 128) % 1024 == 0 && (kBc * 128) % 1024 == 0,
                "every 64-column block starts 1024-aligned");
  static_assert(kStages >= 2, "the producer fills one slot while the compute warps read the other");
  static_assert(kDqFullBarrier + kStages - 1 <= 15, "hardware barriers 1..15");
  static_assert(4 * kBr * kHeadDim / 2 == 2 * kQElems && kQElems == kdOElems,
                "a warpgroup's half of dQ in fp32 fills the slot's Q (or dO) tile exactly");
};


#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- dQ: both warpgroups -----------------------------------------------------------
// dQ_i[:, cols] = dS·K_j[:, cols] for 64 of warpgroup wg's D/2 columns, its
// half `half` (A = dS read from dSᵀ, M-major; B = K, N-major; 16 keys per
// k-step), one commit group.
template <typename Cfg, typename T>
__device__ __forceinline__ void bwd_roles_dq_mma(const BwdShared<Cfg, T>& sm, int wg, int half,
                                                 float (&dQ)[8][4]) {
  constexpr int Bc = Cfg::kBc, kCols = Cfg::kHeadDim / 2;
  static_assert(kCols == 128, "two 64-column halves per warpgroup");
  wgmma_fence();
  wgmma_rows_tt<T, 64, Bc>(dQ, sm.sdS, sm.sK + (wg * 2 + half) * Bc * 64);
  wgmma_commit();
}

// ---- the dQ writer -----------------------------------------------------------------
// Rung 14's writer (bwd_dq_writer) over a different staging: the compute
// warps stage each tile's dQ in its own ring slot, whose Q and dO are read by
// then (warpgroup 0's columns over Q, warpgroup 1's over dO: 64 x 128 fp32
// each, exactly a 64 x 256 16-bit tile), and the writer, once the adds have
// read the slot, adds its release of it to the compute threads'.
template <typename Cfg, typename T>
__device__ __forceinline__ float* bwd_roles_dq_staging(const BwdShared<Cfg, T>& sm, int stage, int wg) {
  return reinterpret_cast<float*>(wg == 0 ? sm.sQ + stage * Cfg::kQElems : sm.sdO + stage * Cfg::kdOElems);
}

template <typename Cfg, typename T, bool kDeterministic, typename Work>
__device__ __forceinline__ void bwd_roles_write_dq(const BwdShared<Cfg, T>& sm, const AttnProblem& p,
                                                   const Work& w, float* dq_accum, int nq_pad, int* dq_turns,
                                                   int writer) {
  bwd_dq_writer<Cfg, kDeterministic, 2>(  // part wg: warpgroup wg's columns, from its half of the slot
      p, w, dq_accum, nq_pad, dq_turns, writer,
      // A barrier per stage: the compute warps may stage slot s + 1 before
      // this warp has taken slot s, but not slot s + kStages (it needs s's release).
      [&](int s) { named_barrier_sync_any(Cfg::kDqFullBarrier + s % Cfg::kStages, Cfg::kComputeThreads + 32); },
      [&](int s, int part) { return bwd_roles_dq_staging(sm, s % Cfg::kStages, part); },
      [&](int s) {
        if (threadIdx.x % 32 == 0) mbarrier_arrive(&sm.q_empty[s % Cfg::kStages]);
      });
}

// ---- the two chains ------------------------------------------------------------------
// Warpgroup 0, the P chain: Sᵀ = K_j·Q_iᵀ (SS, m64 n=Br), Pᵀ = exp2(Sᵀ·scale·
// log2e − LSE·log2e) masked, dV_j += Pᵀ·dO_i (RS: Pᵀ from registers), Pᵀ in
// fp32 to shared memory for the dS chain, then its half of dQ.
// Warpgroup 1, the dS chain: dPᵀ = V_j·dO_iᵀ (SS), then, once the P chain has
// handed Pᵀ over, dSᵀ = Pᵀ ∘ (dPᵀ − Δ_i), dK_j += dSᵀ·Q_i (RS), dSᵀ to
// shared memory for both warpgroups' dQ, then its half of dQ.
// Each ends by storing its gradient (dV, or dK scaled) for the tile's keys.
// At the peak a chain holds its gradient (128 registers at D = 256), its half
// of dQ (64) and Pᵀ or dSᵀ in 16 bits (16).
template <typename Cfg, typename T, bool kPChain, typename Work, typename ScoreStep>
__device__ __forceinline__ void bwd_roles_chain(const BwdShared<Cfg, T>& sm, const AttnProblem& p, Work w,
                                                const ScoreStep& score_step, T* grad_out) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kTiles = Br / 8;
  static_assert(Cfg::kHeadDim == Cfg::kHeadDimV, "one gradient shape for both chains");
  constexpr int wg = kPChain ? 0 : 1;
  const int tid = threadIdx.x, wi = (tid / 32) % 4, g = (tid % 32) / 4, t = tid % 4;
  const int key_row0 = w.kv0 + 16 * wi + g;  // the keys of c0, c1 (c2, c3: + 8)
  // Pᵀ, in fp32 and in the P chain's fragment order: only the thread of the
  // dS chain with the same fragment (tid + 128) reads an element back, so
  // each n8 tile is one conflict-free 16-byte store and load.
  float4* sP = reinterpret_cast<float4*>(sm.sP) + tid % 128;
  float grad[D / 8][4] = {};  // dV (P chain) or dK (dS chain), unscaled

  if (w.n_slots > 0) mbarrier_wait(sm.kv_full, 0);
#pragma unroll 1
  for (int s = 0; s < w.n_slots; ++s) {
    const int stage = s % Cfg::kStages;
    const auto slot = w.slot(s);
    const BwdTileAt at{w.kv0, key_row0, slot.m * Br};
    const T* sQ = sm.sQ + stage * Cfg::kQElems;
    const T* sdO = sm.sdO + stage * Cfg::kdOElems;
    mbarrier_wait(&sm.q_full[stage], (s / Cfg::kStages) & 1);

    // LSE·log2e (P chain) or Δ (dS chain) of queries 8n + 2t, +1, loaded
    // before the MMA is issued (not queued behind its operand reads).
    const float* row_stat = (kPChain ? sm.sLSE2 : sm.sDelta) + stage * Br;
    float2 stat[kTiles];
#pragma unroll
    for (int n = 0; n < kTiles; ++n) stat[n] = *reinterpret_cast<const float2*>(row_stat + n * 8 + 2 * t);
    float scores[kTiles][4];  // Sᵀ (P chain) or dPᵀ (dS chain)
    wgmma_fence();
    if constexpr (kPChain)
      wgmma_rows_tile<T, D, Br, Bc, Br>(scores, sm.sK, sQ);
    else
      wgmma_rows_tile<T, D, Br, Bc, Br>(scores, sm.sV, sdO);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(scores);

    uint32_t frag[kTiles / 2][4];  // Pᵀ or dSᵀ in 16 bits: the gradient MMA's A
    if constexpr (kPChain) {
      score_step.probabilities(scores, stat, slot, at);
      pack_p_fragments<T>(frag, scores);
      wgmma_fence();
      wgmma_rows_rs<T, D, Br, Br>(grad, frag, sdO);  // dV += Pᵀ·dO, while Pᵀ is handed over
      wgmma_commit();
      // NEW: Pᵀ to the dS chain, then wait for its dSᵀ.
#pragma unroll
      for (int n = 0; n < kTiles; ++n) sP[n * 128] = make_float4(scores[n][0], scores[n][1], scores[n][2], scores[n][3]);
      named_barrier_arrive_any(Cfg::kPBarrier, Cfg::kComputeThreads);
      // dV has landed before dQ's MMA is issued (it has, by the time dSᵀ is
      // stored): with dV's operands still live beside dQ's accumulators,
      // ptxas serialises every wgmma of the kernel (warning C7512).
      wgmma_wait<0>();
      named_barrier_sync_any(Cfg::kDsBarrier, Cfg::kComputeThreads);  // dSᵀ stored
    } else {
      named_barrier_sync_any(Cfg::kPBarrier, Cfg::kComputeThreads);  // NEW: Pᵀ handed over
#pragma unroll
      for (int n = 0; n < kTiles; ++n) {
        const float4 P = sP[n * 128];
        scores[n][0] = P.x * (scores[n][0] - stat[n].x);
        scores[n][1] = P.y * (scores[n][1] - stat[n].y);
        scores[n][2] = P.z * (scores[n][2] - stat[n].x);
        scores[n][3] = P.w * (scores[n][3] - stat[n].y);
      }
      score_step.record_ds(scores, slot, at);  // dS' before the chain rule
      if (score_step.chain_rule_needed()) {  // dS ·= ds'/ds, a score_mod's (softcap), Pᵀ read again
        const float* lse2 = sm.sLSE2 + stage * Br;
#pragma unroll
        for (int n = 0; n < kTiles; ++n) {
          const float4 P = sP[n * 128];
          const float2 l2 = *reinterpret_cast<const float2*>(lse2 + n * 8 + 2 * t);
          scores[n][0] *= score_step.ds_factor(P.x, l2.x);
          scores[n][1] *= score_step.ds_factor(P.y, l2.y);
          scores[n][2] *= score_step.ds_factor(P.z, l2.x);
          scores[n][3] *= score_step.ds_factor(P.w, l2.y);
        }
      }
      pack_p_fragments<T>(frag, scores);
      wgmma_fence();
      wgmma_rows_rs<T, D, Br, Br>(grad, frag, sQ);  // dK += dSᵀ·Q, while dSᵀ is stored
      wgmma_commit();
      // dSᵀ is rewritten only after the P chain's next hand-over, which
      // comes after its dQ MMA of this tile has landed.
      bwd_store_dst<Bc>(sm.sdS, frag, 16 * wi, 0);
      fence_proxy_async_shared();  // the st.shared of dSᵀ, before wgmma reads them
      named_barrier_sync_any(Cfg::kDsBarrier, Cfg::kComputeThreads);
    }

    // dQ in two 64-column halves, so that the first is staged while the
    // second's MMA runs.
    float dQ0[8][4], dQ1[8][4];
    bwd_roles_dq_mma<Cfg, T>(sm, wg, 0, dQ0);
    bwd_roles_dq_mma<Cfg, T>(sm, wg, 1, dQ1);
    wgmma_wait<1>();  // the gradient MMA and the first half
    fence_accumulators(grad);
    fence_accumulators(dQ0);
    // NEW: dQ staged over the slot's Q (P chain) or dO (dS chain), once both
    // chains' gradient MMAs have read them; the writer adds it and frees the slot.
    float* staging = bwd_roles_dq_staging(sm, stage, wg);
    named_barrier_sync_any(Cfg::kSlotReadBarrier, Cfg::kComputeThreads);
    bwd_stage_dq<Br>(staging, dQ0, 16 * wi + g, 0, p.scale);
    wgmma_wait<0>();
    fence_accumulators(dQ1);
    bwd_stage_dq<Br>(staging, dQ1, 16 * wi + g, 64, p.scale);
    fence_proxy_async_shared();  // the st.shared of dQ (and every read of the slot), before the TMA reads it
    named_barrier_arrive_any(Cfg::kDqFullBarrier + stage, Cfg::kComputeThreads + 32);
    // Every thread releases the slot too (as in rung 14): its own reads of
    // LSE, Δ and its dQ stores are then ordered before the producer's next
    // copies into the slot directly, not through the writer's barrier.
    mbarrier_arrive(&sm.q_empty[stage]);
  }
  bwd_store_key_rows<T, D>(p, w, key_row0, grad, kPChain ? 1.f : p.scale, grad_out);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
