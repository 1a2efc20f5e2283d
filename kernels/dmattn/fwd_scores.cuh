// attnlab: step 3 of the dynamic-mask forward's tile kernel — the logits of
// a block's scores: scale, bias, softcap, mask (and the sequence bounds and
// causal rule of mask_scores), applied to one slice of S fragments between
// S = Q·Kᵀ and the online softmax by either tensor-core path of
// fwd_mainloop.cuh. Every choice is uniform (bias or not, softcap or not, an
// all-ones tile, aligned pairs): no branch runs per element. The
// block-sparse family's counterpart is blocksparse/apply_mods.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "common/softcap.h"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

// Two adjacent elements (keys k, k+1) of an operand row as one raw 32-bit
// value: 16-bit bias elements in bits 0-15 / 16-31, mask bytes in bits 0-7 /
// 8-15. `aligned` (uniform): the pair is one aligned load.
__device__ __forceinline__ uint32_t load_pair(const uint16_t* row, int k) {
  return __ldg(reinterpret_cast<const unsigned int*>(row + k));
}
__device__ __forceinline__ uint32_t load_pair(const uint8_t* row, int k) {
  return __ldg(reinterpret_cast<const unsigned short*>(row + k));
}

// The operand pairs of a lane's scores in one slice of kTilesS n8 tiles:
// bits[r][n] holds keys key0 + 8n, +1 (key0 = the slice's first key + 2t) of
// the lane's row r (rows[r]: row g, g + 8; rows past Nq point at row Nq - 1,
// their scores are never stored). No branch per element: the fast path
// (`aligned`, uniform: every key of the slice < Nk and the pairs 2- or
// 4-byte aligned) is one load per pair; otherwise each element is loaded on
// its own at a key clamped to Nk - 1 (keys >= Nk are set to -inf by
// mask_scores afterwards, whatever was loaded). `one_row` (uniform): the
// operand is broadcast over queries and, on the fast path, bits[1] is left 0
// for the caller to take bits[0] instead (a copy here would wait for the load).
template <int kTilesS, typename E>
__device__ __forceinline__ void load_pairs(uint32_t (&bits)[2][kTilesS], const E* const (&rows)[2], bool one_row,
                                           int key0, int Nk, bool aligned) {
  if (aligned) {
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) bits[0][n] = load_pair(rows[0], key0 + 8 * n);
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) bits[1][n] = one_row ? 0u : load_pair(rows[1], key0 + 8 * n);
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) {
        const int k = key0 + 8 * n;
        bits[r][n] = uint32_t(__ldg(rows[r] + min(k, Nk - 1))) |
                     (uint32_t(__ldg(rows[r] + min(k + 1, Nk - 1))) << (8 * sizeof(E)));
      }
  }
}

template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits);
template <>
__device__ __forceinline__ float2 unpack_pair<half>(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t bits) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// The logits of a block's scores, one slice of S fragments at a time: the
// bias and mask pairs of the lane's two rows (row0, row0 + 8) and what they
// do to S. kMaskBits: the mask is bit-packed (DmaMaskFormat::kBits).
// The fields refer to the kernel's own values, computed once per block in
// dma_forward_kernel (`dp`, the dense view, carries the softmax's scale) —
// the way a lambda of the kernel captures them: with copies in the struct
// instead, ptxas allocates most of the register-bound instantiations
// differently.
template <typename Cfg, typename T, bool kMaskBits>
struct DmaFwdScores {
  const DynamicMaskProblem& p;
  const AttnProblem& dp;
  const int &q_start, &row0, &t;  // the block's first query row, the lane's first row, lane % 4
  const float &softcap, &inv_softcap;  // C and 1/C (0: no softcap)
  // Uniform: a bias, a mask; broadcast over the queries (one row for all);
  // key pairs as single aligned loads; S rewritten into logits at all.
  const bool &has_bias, &has_mask, &bias_one_row, &mask_one_row, &bias_pairs, &mask_pairs, &logit_pass;
  const float& softmax_scale_log2;
  const uint16_t* const (&bias_rows)[2];  // the lane's rows of the bias (16-bit elements) and of the mask
  const uint8_t* const (&mask_rows)[2];

  // The bias of a lane's scores in the slice at kv_start, as packed 16-bit
  // pairs; issued before the MMAs so that its latency hides behind them.
  __device__ __forceinline__ void load_bias(uint32_t (&bias_bits)[2][Cfg::kTilesS], int kv_start) const {
    const bool in_range = kv_start + Cfg::kSubCols <= p.Nk;  // no key of the slice past Nk
    if (has_bias) load_pairs(bias_bits, bias_rows, bias_one_row, kv_start + 2 * t, p.Nk, in_range && bias_pairs);
  }
  // The mask of a lane's scores in the slice at kv_start, as packed byte
  // pairs (none on an all-ones tile). The wgmma core issues them with the
  // bias, before it waits for K and V; the mma.sync core after its MMAs.
  // A bit-packed mask: the slice's raw words instead, kSubCols / 32 per row in
  // mask_bits[r][0..] (one 8- or 4-byte load; the rows are padded to whole
  // tiles, so no key clamp), turned into the byte pairs by expand_mask_bits
  // once they are needed (the wgmma core loads them before its MMAs).
  __device__ __forceinline__ void load_mask(uint32_t (&mask_bits)[2][Cfg::kTilesS], int kv_start) const {
    if constexpr (kMaskBits) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (r == 1 && mask_one_row) {  // (row 1 is row 0's: left 0, as load_pairs does)
#pragma unroll
          for (int i = 0; i < Cfg::kSubCols / 32; ++i) mask_bits[1][i] = 0u;
          break;
        }
        const uint32_t* w = reinterpret_cast<const uint32_t*>(mask_rows[r]) + kv_start / 32;
        if constexpr (Cfg::kSubCols == 64) {
          const uint2 x = __ldg(reinterpret_cast<const uint2*>(w));
          mask_bits[r][0] = x.x;
          mask_bits[r][1] = x.y;
        } else {
          mask_bits[r][0] = __ldg(w);
        }
      }
    } else {
      const bool in_range = kv_start + Cfg::kSubCols <= p.Nk;
      load_pairs(mask_bits, mask_rows, mask_one_row, kv_start + 2 * t, p.Nk, in_range && mask_pairs);
    }
  }
  // The raw words of load_mask (bit-packed mask) as the byte pairs logits
  // tests: pair n of row r = keys 8n + 2t, +1 of the slice, bits
  // 8 (n % 4) + 2t, +1 of word n / 4, moved to bits 0 and 8. In place, the
  // words copied first; every index static (no local memory).
  __device__ __forceinline__ void expand_mask_bits(uint32_t (&bits)[2][Cfg::kTilesS]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t words[Cfg::kSubCols / 32];
#pragma unroll
      for (int w = 0; w < Cfg::kSubCols / 32; ++w) words[w] = bits[r][w];
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n) {
        const uint32_t x = words[n / 4] >> (8 * (n % 4) + 2 * t);
        bits[r][n] = (x & 1u) | (x & 2u) << 7;
      }
    }
  }
  // S = the logits of one slice of scores (kv_start: its first key), in
  // place. get_mask(bits) fills the mask pairs where the tile is not all ones:
  // a load (mma.sync core) or the pairs loaded earlier (wgmma core).
  template <typename GetMask>
  __device__ __forceinline__ void logits(float (&S)[Cfg::kTilesS][4], const uint32_t (&bias_bits)[2][Cfg::kTilesS],
                                         int kv_start, bool mask_full, GetMask&& get_mask) const {
    if (has_bias) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // (row 1 of a query-broadcast bias is row 0: selected here, after
          // the MMAs, not at the load, which would wait for it)
          const float2 bv = unpack_pair<T>(r == 1 && bias_one_row ? bias_bits[0][n] : bias_bits[r][n]);
          S[n][2 * r] = fmaf(S[n][2 * r], p.scale, bv.x);
          S[n][2 * r + 1] = fmaf(S[n][2 * r + 1], p.scale, bv.y);
        }
    } else if (logit_pass) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[n][e] *= p.scale;
    }
    if (softcap > 0.f) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[n][e] = apply_softcap(S[n][e], softcap, inv_softcap);
    }
    if (!mask_full) {  // -inf where the mask pair is 0 (no mask on all-ones tiles)
      uint32_t mask_bits[2][Cfg::kTilesS];
      get_mask(mask_bits);
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t mv = r == 1 && mask_one_row ? mask_bits[0][n] : mask_bits[r][n];
          if ((mv & 0xffu) == 0u) S[n][2 * r] = -INFINITY;
          if ((mv & 0xff00u) == 0u) S[n][2 * r + 1] = -INFINITY;
        }
    }
    mask_scores(S, dp, kv_start, q_start, row0, row0 + 8, t);  // past Nk; causal
  }
};

}  // namespace
}  // namespace attnlab
