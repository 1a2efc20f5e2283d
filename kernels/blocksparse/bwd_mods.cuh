// attnlab: the block-sparse backward's score step — the mask_mod, the
// score_mod and the bounds on one slice of a tile of Sᵀ (keys x queries, in
// the accumulator fragments of hopper/bwd_mainloop.cuh's compute warpgroups), and
// the score_mod's chain rule on dSᵀ. FlashAttention-3's backward applies its
// Mask and softcap there (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp);
// flash_attn/cute's backward calls its mask_mod and score_mod_bwd the same way.
//
//   Sᵀ: [kTiles][4] fp32 of one lane: keys key_row0 (c0, c1) and key_row0 + 8
//       (c2, c3), queries q_first + 8n + 2t (c0, c2) and + 1 (c1, c3).
//
//   forward:  s = scale·S,  s' = score_mod(s),  P = exp(s' − LSE)   (0 where dropped)
//   backward: dS' = P ∘ (dP − Δ),  dS = dS' · ds'/ds,  dQ = scale·dS·K,  dK = scale·dSᵀ·Q
#pragma once

#include <cmath>

#include "blocksparse/apply_mods.cuh"
#include "blocksparse/bwd_scheduler.cuh"
#include "blocksparse/mods.h"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "hopper/bwd_mainloop.cuh"
#include "hopper/bwd_scheduler.h"
#include "host/attn_problem.h"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Calls f(St[n][e], n, e, q, k) for every entry of the lane's transposed fragment.
template <int kTiles, typename F>
__device__ __forceinline__ void for_each_score_t(float (&St)[kTiles][4], int key_row0, int q_first, F&& f) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(St[n][e], n, e, q_first + n * 8 + 2 * t + (e & 1), key_row0 + 8 * (e / 2));
}

// bwd_compute_walk's score step under a block mask (a ScoreStep).
// kTensorMods: the instance for a tensor mask_mod or a bias score_mod
// (apply_mods.cuh says why they have their own).
template <bool kTensorMods>
struct BsBwdScores {
  const AttnProblem& p;
  const MaskMod& mask;    // the kernel's parameters (__grid_constant__): read where used,
  const ScoreMod& score;  // not held in registers across the walk
  int batch;

  // Pᵀ from Sᵀ in place. LSE·log2e is +inf for rows past Nq and rows that saw
  // no key (bwd_prepost.cuh): their P is 0 with no test, whatever the score.
  // Without a score_mod, rung 14's exp2(S·scale·log2e − LSE·log2e); with one,
  // exp2(score_mod(scale·S)·log2e − LSE·log2e). Then the mask_mod and the
  // bounds on a tile from the partial list, the key bound alone on a full
  // tile that the end of the keys crosses (one branch per slice, not per element).
  template <int kTiles>
  __device__ __forceinline__ void probabilities(float (&St)[kTiles][4], const float2 (&lse)[kTiles],
                                                const BsBwdSlot& slot, const BwdTileAt& at) const {
    const auto lse_of = [&](int n, int e) { return e & 1 ? lse[n].y : lse[n].x; };
    if (kTensorMods && score.kind == ScoreModKind::kBias) {
      if (score.bias_bf16) bias_probabilities<__nv_bfloat16>(St, lse, slot, at);
      else bias_probabilities<__half>(St, lse, slot, at);
    } else if (score.kind == ScoreModKind::kNone) {
      const float scale_log2 = p.scale * kLog2e;
      for_each_score_t(St, at.key_row0, at.q_first,
                       [&](float& s, int n, int e, int, int) { s = exp2_approx(s * scale_log2 - lse_of(n, e)); });
    } else {
      with_static_kind<kTensorMods>(score, [&](const ScoreMod& mod) {
        for_each_score_t(St, at.key_row0, at.q_first, [&](float& s, int n, int e, int q, int k) {
          s = exp2_approx(mod(s * p.scale, batch, slot.h, q, k) * kLog2e - lse_of(n, e));
        });
      });
    }
    if (slot.partial) {
      apply_mask_mod_t(St, slot.h, at);
    } else if (at.key_base + 64 > p.Nk) {
      for_each_score_t(St, at.key_row0, at.q_first, [&](float& s, int, int, int, int k) {
        if (k >= p.Nk) s = 0.f;
      });
    }
  }

  // Pᵀ = exp2((scale·S + bias)·log2e − LSE·log2e) with each query's bias row
  // addressed once for the lane's two keys, indices clamped into Nq x Nk; a
  // bias broadcast over the queries (dmattn's [B, H, 1, N]): the two keys'
  // values loaded once for the slice.
  template <typename T, int kTiles>
  __device__ __forceinline__ void bias_probabilities(float (&St)[kTiles][4], const float2 (&lse)[kTiles],
                                                     const BsBwdSlot& slot, const BwdTileAt& at) const {
    const int t = threadIdx.x % 4;
    const float scale_log2 = p.scale * kLog2e;
    const T* bias = static_cast<const T*>(score.bias.data) + score.bias.row_offset(batch, slot.h, 0);
    const int k0 = min(at.key_row0, score.nk - 1), k1 = min(at.key_row0 + 8, score.nk - 1);
    if (score.bias.stride_q == 0) {
      const float b0 = element_to_float(bias[k0]) * kLog2e, b1 = element_to_float(bias[k1]) * kLog2e;
#pragma unroll
      for (int n = 0; n < kTiles; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float l2 = i ? lse[n].y : lse[n].x;
          St[n][i] = exp2_approx(St[n][i] * scale_log2 + b0 - l2);
          St[n][2 + i] = exp2_approx(St[n][2 + i] * scale_log2 + b1 - l2);
        }
      return;
    }
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const T* row = bias + int64_t(min(at.q_first + n * 8 + 2 * t + i, score.nq - 1)) * score.bias.stride_q;
        const float l2 = i ? lse[n].y : lse[n].x;
        St[n][i] = exp2_approx(St[n][i] * scale_log2 + element_to_float(row[k0]) * kLog2e - l2);
        St[n][2 + i] = exp2_approx(St[n][2 + i] * scale_log2 + element_to_float(row[k1]) * kLog2e - l2);
      }
  }

  // Pᵀ = 0 where the mask_mod drops the pair or the key is past Nk; rows past
  // Nq have P = 0 already. A lane holds two keys: block_diagonal and
  // mini_causal in their periodic forms (apply_mods.cuh) with the keys fixed
  // and the queries stepping; document with the keys' ids loaded once and each
  // query's id once for both keys, no branch; a tensor mask (its own kernels)
  // with each query's row addressed once for both keys; the rest under the
  // short-circuit, never evaluated out of bounds (keeps_pair's branch-free
  // form, which suits the forward, spilled 4–36 bytes here at 240 registers:
  // docs/experiments.md).
  template <int kTiles>
  __device__ __forceinline__ void apply_mask_mod_t(float (&St)[kTiles][4], int head, const BwdTileAt& at) const {
    const int t = threadIdx.x % 4;
    with_static_kind<kTensorMods>(mask, [&](const MaskMod& mod) {
      if (mod.kind == MaskModKind::kBlockDiagonal) {  // each key's queries: its block
        const BlockPartners queries[2] = {block_partners(mod, at.key_row0, p.Nk, p.Nq),
                                          block_partners(mod, at.key_row0 + 8, p.Nk, p.Nq)};
#pragma unroll
        for (int n = 0; n < kTiles; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!queries[e / 2].keeps(at.q_first + n * 8 + 2 * t + (e & 1))) St[n][e] = 0.f;
      } else if (mod.kind == MaskModKind::kMiniCausal) {  // q mod a >= k mod a
        int rk[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int k = at.key_row0 + 8 * j;
          rk[j] = k < p.Nk ? mod.by_a.mod(k) : mod.a;  // a: nothing kept
        }
        ResidueWalk rq[2] = {ResidueWalk(mod.by_a, at.q_first + 2 * t), ResidueWalk(mod.by_a, at.q_first + 2 * t + 1)};
#pragma unroll
        for (int n = 0; n < kTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!(rq[e & 1].r >= rk[e / 2])) St[n][e] = 0.f;
          rq[0].next(), rq[1].next();
        }
      } else if (mod.kind == MaskModKind::kDocument) {  // the same document id
        const int32_t* ids = mod.doc + int64_t(batch) * mod.doc_len;
        int id_k[2];
        bool key_in[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int k = at.key_row0 + 8 * j;
          key_in[j] = k < p.Nk;
          id_k[j] = ids[min(k, p.Nk - 1)];  // clamped into the ids, as keeps_pair does
        }
#pragma unroll
        for (int n = 0; n < kTiles; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i) {  // a query's id once for both keys
            const int id_q = ids[min(at.q_first + n * 8 + 2 * t + i, p.Nq - 1)];
            if (!(key_in[0] && id_q == id_k[0])) St[n][i] = 0.f;
            if (!(key_in[1] && id_q == id_k[1])) St[n][i + 2] = 0.f;
          }
      } else if (mod.kind == MaskModKind::kTensor) {  // each query's row once, its word(s) of the two keys
        const uint32_t* bits = static_cast<const uint32_t*>(mod.bits.data) + mod.bits.row_offset(batch, head, 0);
        int word[2], shift[2];
        bool key_in[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int k = at.key_row0 + 8 * j;
          key_in[j] = k < p.Nk;
          word[j] = min(k, p.Nk - 1) >> 5, shift[j] = k & 31;  // clamped into the row's words
        }
#pragma unroll
        for (int n = 0; n < kTiles; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const uint32_t* row = bits + int64_t(min(at.q_first + n * 8 + 2 * t + i, p.Nq - 1)) * mod.bits.stride_q;
            if (!(key_in[0] && (row[word[0]] >> shift[0] & 1u))) St[n][i] = 0.f;
            if (!(key_in[1] && (row[word[1]] >> shift[1] & 1u))) St[n][i + 2] = 0.f;
          }
      } else {
        for_each_score_t(St, at.key_row0, at.q_first, [&](float& s, int, int, int q, int k) {
          if (!(q < p.Nq && k < p.Nk && mod(batch, head, q, k))) s = 0.f;
        });
      }
    });
  }

  // dBias = dS' (s' = s + bias: the gradient of s' is the bias's), stored
  // for each pair in bounds, or added where the bias is broadcast (mods.h's
  // ScoreMod::dbias). Pairs the mask_mod drops have dS' = 0 and are written
  // too; pairs of blocks never visited keep the caller's zeros. A bias
  // broadcast over the queries ([.., 1, Nk]: every query of the tile adds
  // to the same key) is summed over the slice's queries first, in the lane
  // and across its quad (rows past Nq have dS' = 0), then added once per key.
  // Called by whole warps.
  template <int kTiles>
  __device__ __forceinline__ void record_ds(const float (&dSt)[kTiles][4], const BsBwdSlot& slot,
                                            const BwdTileAt& at) const {
    if (!kTensorMods || score.kind != ScoreModKind::kBias || score.dbias == nullptr) return;
    const int t = threadIdx.x % 4, k0 = at.key_row0;
    float* dbias = score.dbias + score.dbias_at.row_offset(batch, slot.h, 0);
    const bool key_in[2] = {k0 < p.Nk, k0 + 8 < p.Nk};
    if (score.dbias_at.stride_q == 0) {
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int n = 0; n < kTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[e / 2] += dSt[n][e];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 1);
        sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 2);
        if (t == 0 && key_in[j]) atomicAdd(dbias + k0 + 8 * j, sum[j]);
      }
      return;
    }
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int i = 0; i < 2; ++i) {  // query q_first + 8n + 2t + i, keys k0 and k0 + 8
        const int q = at.q_first + n * 8 + 2 * t + i;
        if (q >= p.Nq) continue;
        float* row = dbias + int64_t(q) * score.dbias_at.stride_q + k0;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if (!key_in[j]) continue;
          if (score.dbias_add) atomicAdd(row + 8 * j, dSt[n][2 * j + i]);
          else row[8 * j] = dSt[n][2 * j + i];
        }
      }
  }

  // dSᵀ ·= ds'/ds where the score_mod changes it (has_chain_rule: softcap).
  // ScoreMod::grad wants s, which P has replaced; s' is still in P: s' = ln P
  // + LSE = (log2 P + LSE·log2e)·ln 2, so ScoreMod::grad_from_output(s') —
  // one lg2 per element instead of a second Sᵀ in registers. Where P = 0, dS
  // is 0 already.
  __device__ __forceinline__ bool chain_rule_needed() const { return has_chain_rule(score.kind); }
  // ds'/ds of one element from its P and its query's LSE·log2e (softcap only).
  __device__ __forceinline__ float ds_factor(float P, float lse2) const {
    constexpr float kLn2 = 0.693147180559945309f;
    return P > 0.f ? score.grad_from_output((__log2f(P) + lse2) * kLn2) : 1.f;
  }
  template <int kTiles>
  __device__ __forceinline__ void chain_rule(float (&dSt)[kTiles][4], const float (&Pt)[kTiles][4],
                                             const float* lse2, const BsBwdSlot&, const BwdTileAt&) const {
    if (!chain_rule_needed()) return;
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse2 + n * 8 + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) dSt[n][e] *= ds_factor(Pt[n][e], e & 1 ? l2.y : l2.x);
    }
  }
};

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
