// attnlab: the dynamic-mask backward's scores, recomputed from Sᵀ — one
// score's visibility (bounds, causal rule, mask), its logit (scale, bias,
// softcap) and P, for the main kernel and the deterministic dQ kernel; and,
// for the main kernel's cores, the tile they compute (DmaBwdTile) and the P
// and dS of a slice of its queries, with their dBias (DmaBwdScores).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/softcap.h"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

template <typename T>
__device__ __forceinline__ float as_float(T x);
template <>
__device__ __forceinline__ float as_float<half>(half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float as_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// One score of the backward, recomputed: visible (in range, causal, mask —
// the mask byte or bit read only when the tile is not all ones), the logit
// scale·s + bias and its softcap, P = exp(logit - LSE) (0 where not visible),
// and the softcap's derivative dcap = 1 - tanh² for dS.
struct ScoreProb {
  float p, dcap;
  bool visible;
};
// `bias_given`: the caller has loaded this score's bias element already
// (`bias_value`, the same element converted the same way: the same float).
// kMaskBits: the mask is bit-packed (DmaMaskFormat::kBits; the kernels'
// template flag: one kernel for both formats cost 4-7 registers, and spills
// on the mma.sync core at D = 128).
template <typename T, bool kMaskBits>
__device__ __forceinline__ ScoreProb score_prob(const DynamicMaskProblem& p, int b, int h, int qi, int key, float s,
                                                float lse, bool mask_full, bool bias_given = false,
                                                float bias_value = 0.f) {
  bool visible = key < p.Nk && qi < p.Nq && (!p.causal || key <= qi + (p.Nk - p.Nq));
  if (visible && !mask_full) {
    if constexpr (kMaskBits)  // the byte of the row (little-endian words) that holds the key's bit
      visible = (__ldg(static_cast<const uint8_t*>(p.mask.data) + 4 * p.mask.row_offset(b, h, qi) +
                       (unsigned(key) >> 3)) >> (key & 7) & 1u) != 0u;
    else
      visible = __ldg(static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, qi) + key) != 0;
  }
  float x = s * p.scale;
  if (p.bias.data != nullptr && visible)
    x += bias_given ? bias_value
                    : as_float(__ldg(static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, qi) + key));
  float dcap = 1.f;
  if (p.softcap > 0.f) {  // (common/softcap.h)
    const float capped = apply_softcap(x, p.softcap);
    dcap = softcap_grad(x, p.softcap);
    x = capped;
  }
  return {visible ? exp2_approx((x - lse) * kLog2e) : 0.f, dcap, visible};
}

// The (key tile, query tile) pair a core computes, as references to the main
// loop's values (bwd_mainloop.cuh): the tiles in shared memory (mma.sync: rows
// padded to kStride; wgmma: Sw128Blocks<64>), the query tile and its head, and
// the lane's place in the warpgroup.
template <typename T>
struct DmaBwdTile {
  T* const& sK;   // [Bc][kStride] K_j
  T* const& sV;   // [Bc][kStride] V_j
  T* const& sQ;   // [Br][kStride] Q_i: the tile's Q/dO slot
  T* const& sdO;  // [Br][kStride] dO_i, after it
  T* const& sdS;  // [Bc][kDsStride] dSᵀ, for dQ
  const int &q0, &h;   // the query tile's first row, its query head
  const int64_t& q_head;  // b·H + h
  const bool& mask_full;  // the tile's mask is all ones
  const float (&key_bias)[2];  // the lane's keys' bias elements (a bias broadcast over queries)
  const int &warp, &lane, &g, &t;
};

// P, dS (in place of Sᵀ, dPᵀ) and dBias for a slice of Cfg::kHalf queries of
// the main kernel's tile, the same code for both cores. The block's values,
// as references to the main loop's own: sLSE and sDelta follow the slot of
// the tile it computes.
template <typename Cfg, typename T, bool kMaskBits>
struct DmaBwdScores {
  const DynamicMaskProblem& p;
  const int &b, &kv0, &t;  // batch, the key tile's first key, lane % 4
  const int (&key_row)[2];  // the lane's keys: c0, c1 / c2, c3 of the Sᵀ fragments
  float* const& dbias_accum;  // this block's dBias (DbiasTarget::for_block)
  const bool& bias_by_key;    // a bias broadcast over queries: one element per key
  float* const& sLSE;    // [Br] the tile's LSE and Δ (its Q/dO slot's)
  float* const& sDelta;

  // St, dPt: Sᵀ and dPᵀ of the slice from column qh of query tile q0 (head h);
  // key_bias: the lane's keys' bias elements (bias_by_key).
  __device__ __forceinline__ void to_ds(float (&St)[Cfg::kTilesS][4], float (&dPt)[Cfg::kTilesS][4], int qh, int q0,
                                        int h, bool mask_full, const float (&key_bias)[2]) const {
    constexpr int Bc = Cfg::kBc;
    float bias_row_sum[2] = {0.f, 0.f};
    // The fast path (uniform, as in the forward: no test, load or branch
    // per score): every score of this half tile is visible — the tile's
    // mask is all ones, its keys and queries are in range and none is past
    // the causal diagonal — its bias, if any, is the key's (loaded once
    // per tile), and there is no softcap. Then P = exp(scale·s + bias −
    // LSE) and dS = P·(dP − Δ), the same operations score_prob does there.
    const int q_half0 = q0 + qh;
    const bool fast = mask_full && kv0 + Bc <= p.Nk && q_half0 + Cfg::kHalf <= p.Nq &&
                      (!p.causal || kv0 + Bc - 1 <= q_half0 + (p.Nk - p.Nq)) &&
                      (p.bias.data == nullptr || bias_by_key) && !(p.softcap > 0.f);
    if (fast) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = qh + n * 8 + 2 * t + (e & 1);  // query column in the tile
          const float x = St[n][e] * p.scale + key_bias[e / 2];
          const float prob = exp2_approx((x - sLSE[qc]) * kLog2e);
          const float ds = prob * (dPt[n][e] - sDelta[qc]);
          St[n][e] = prob;
          dPt[n][e] = ds;
          bias_row_sum[e / 2] += ds;  // used only with a bias
        }
    } else {
      const int keys[2] = {Cfg::kLaneOffsetsPerTile ? opaque(key_row[0]) : key_row[0],
                           Cfg::kLaneOffsetsPerTile ? opaque(key_row[1]) : key_row[1]};
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = keys[e / 2];
          const int qc = qh + n * 8 + 2 * t + (e & 1);  // query column in the tile
          const int qi = q0 + qc;
          const ScoreProb sp =
              score_prob<T, kMaskBits>(p, b, h, qi, key, St[n][e], sLSE[qc], mask_full, bias_by_key, key_bias[e / 2]);
          const float ds = sp.p * (dPt[n][e] - sDelta[qc]) * sp.dcap;
          St[n][e] = sp.p;
          dPt[n][e] = ds;
          if (p.bias.data != nullptr && sp.visible) {
            if (p.bias.stride_q == 0) bias_row_sum[e / 2] += ds;
            else atomicAdd(dbias_accum + p.bias.row_offset(b, h, qi) + key, ds);
          }
        }
    }
    if (bias_by_key) {  // one add per key per half tile
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = bias_row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0 && key_row[r] < p.Nk && sum != 0.f)
          atomicAdd(dbias_accum + p.bias.row_offset(b, h, 0) + key_row[r], sum);
      }
    }
  }
};

}  // namespace
}  // namespace attnlab
