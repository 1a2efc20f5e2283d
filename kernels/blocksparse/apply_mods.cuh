// attnlab: a mask_mod and a score_mod (mods.h) applied to one tile of scores
// in accumulator fragments — the mask/score step of the block-sparse
// mainloops, in the roles of FlashAttention-3's Mask (hopper/mask.h) and of
// flash_attn/cute's apply_mask / apply_score_mod (mask.py, softmax.py).
//
//   S: [kTilesS][4] fp32 of one lane: keys kv_start + n·8 + 2t (+1) of rows
//      row0 (c0, c1) and row0 + 8 (c2, c3), t = lane % 4 (wgmma's and
//      mma.sync's accumulator layout alike).
//
// A mod's kind is a kernel argument. Each function switches on it once per
// tile and calls, per case, a copy of the mod whose kind is that case's
// constant: after inlining, the per-element loop holds one formula, not the
// switch. The tensor mods (a tensor mask_mod, a bias score_mod) are
// compiled only into kernels instantiated for them (kTensorMods): their loads
// in the unrolled loops cost registers (the bias spilled 20–64 bytes at
// D = 128, the tensor mask 8 in the backward at D = 192), and the other
// mods' kernels stay as they were.
#pragma once

#include <cmath>

#include "blocksparse/mods.h"

namespace attnlab {

// f(mod with its kind fixed at compile time): a case per row of mods_table.h,
// so that no kind can lack one. A tensor mask only in the kTensorMods kernels
// (the others are never launched with one); a tensor score_mod never here:
// the kTensorMods kernels add the bias in add_bias.
template <bool kTensorMods, typename F>
__device__ __forceinline__ void with_static_kind(const MaskMod& mod, F&& f) {
  auto as = [&](MaskModKind kind) {
    MaskMod fixed = mod;
    fixed.kind = kind;
    f(fixed);
  };
  switch (mod.kind) {
#define ATTNLAB_CASE(k, name, args, form, least_a, least_b, need, tensor) \
  case MaskModKind::k:                                                    \
    if constexpr (kTensorMods || !(tensor)) as(MaskModKind::k);           \
    break;
    ATTNLAB_MASK_MODS(ATTNLAB_CASE)
#undef ATTNLAB_CASE
  }
}
template <bool kTensorMods, typename F>
__device__ __forceinline__ void with_static_kind(const ScoreMod& mod, F&& f) {
  auto as = [&](ScoreModKind kind) {
    ScoreMod fixed = mod;
    fixed.kind = kind;
    f(fixed);
  };
  switch (mod.kind) {
#define ATTNLAB_CASE(k, name, args, form, chain_rule, tensor) \
  case ScoreModKind::k:                                       \
    if constexpr (!(tensor)) as(ScoreModKind::k);             \
    break;
    ATTNLAB_SCORE_MODS(ATTNLAB_CASE)
#undef ATTNLAB_CASE
  }
}

// Calls f(S[n][e], q, k) for every entry of the lane's fragment.
template <int kTilesS, typename F>
__device__ __forceinline__ void for_each_score(float (&S)[kTilesS][4], int row0, int kv_start, int t, F&& f) {
#pragma unroll
  for (int n = 0; n < kTilesS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(S[n][e], row0 + (e / 2) * 8, kv_start + n * 8 + 2 * t + e % 2);
}

// A bias's two neighbouring elements as the 4 bytes of one load, and back to
// two floats.
__device__ __forceinline__ float2 pair_bits_to_float2(uint32_t bits, const __half*) {
  return __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)),
                                       __ushort_as_half(static_cast<unsigned short>(bits >> 16))));
}
__device__ __forceinline__ float2 pair_bits_to_float2(uint32_t bits, const __nv_bfloat16*) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));  // bf16: fp32's top half
}
template <typename T>
__device__ __forceinline__ uint32_t load_pair_bits(const T* x) {
  return __ldg(reinterpret_cast<const unsigned int*>(x));
}
template <typename T>
__device__ __forceinline__ float2 load_pair(const T* x) {
  return pair_bits_to_float2(load_pair_bits(x), x);
}
// The bias row of query `row` (clamped into Nq, as bias_at clamps it).
template <typename T>
__device__ __forceinline__ const T* bias_row(const ScoreMod& mod, int batch, int head, int row) {
  return static_cast<const T*>(mod.bias.data) + mod.bias.row_offset(batch, head, min(row, mod.nq - 1));
}
// Whether every row of the bias starts 4-byte aligned (even strides and Nk, an
// aligned base), so that a lane's two neighbouring keys are one load (the
// last pair of a row clamped to Nk − 2: keys past Nk are dropped afterwards).
__device__ __forceinline__ bool bias_pairs_aligned(const ScoreMod& mod) {
  const BroadcastOperand& b = mod.bias;
  return mod.nk % 2 == 0 && (b.stride_b | b.stride_h | b.stride_q) % 2 == 0 &&
         reinterpret_cast<uintptr_t>(b.data) % 4 == 0;
}

// s' = scale · s + bias[b, h, q, k] with each of the lane's two rows'
// addresses formed once, the indices clamped into Nq x Nk as bias_at clamps
// them; a bias broadcast over the queries (dmattn's [B, H, 1, N]) read once
// for both rows; a lane's two keys as one load where bias_pairs_aligned.
template <typename T, int kTilesS>
__device__ __forceinline__ void add_bias(float (&S)[kTilesS][4], const ScoreMod& mod, float scale, int batch,
                                         int head, int row0, int kv_start, int t) {
  const T* row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row[r] = bias_row<T>(mod, batch, head, row0 + 8 * r);
  const bool one_row = mod.bias.stride_q == 0;
  if (bias_pairs_aligned(mod)) {
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      const int k = min(kv_start + n * 8 + 2 * t, mod.nk - 2);
      const float2 b0 = load_pair(row[0] + k), b1 = one_row ? b0 : load_pair(row[1] + k);
      S[n][0] = S[n][0] * scale + b0.x, S[n][1] = S[n][1] * scale + b0.y;
      S[n][2] = S[n][2] * scale + b1.x, S[n][3] = S[n][3] * scale + b1.y;
    }
    return;
  }
#pragma unroll
  for (int n = 0; n < kTilesS; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int k = min(kv_start + n * 8 + 2 * t + c, mod.nk - 1);
      const float b0 = element_to_float(row[0][k]);
      S[n][c] = S[n][c] * scale + b0;
      S[n][2 + c] = S[n][2 + c] * scale + (one_row ? b0 : element_to_float(row[1][k]));
    }
}

// A bias with bias_pairs_aligned: a tile's lane pairs loaded before its score
// MMA is issued (ws_compute_tiles' ahead), so that their latency runs under
// the MMA, not between it and the softmax; then added. kRows = 1: broadcast
// over the queries ([.., 1, Nk]: dmattn's [B, H, 1, N]), one row for the
// lane's two; kRows = 2: the lane's two rows.
template <int kTilesS, int kRows>
struct BiasAhead {
  static_assert(kRows == 1 || kRows == 2, "one row for both, or the lane's two rows");
  uint32_t pairs[kRows][kTilesS];  // row r's keys kv_start + 8n + 2t, + 1 as two elements

  __device__ __forceinline__ static bool applies(const ScoreMod& mod) {
    return mod.kind == ScoreModKind::kBias && (mod.bias.stride_q == 0) == (kRows == 1) && bias_pairs_aligned(mod);
  }
  template <typename T>
  __device__ __forceinline__ void load(const ScoreMod& mod, int batch, int head, int row0, int kv_start, int t) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const T* row = bias_row<T>(mod, batch, head, row0 + 8 * r);
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) pairs[r][n] = load_pair_bits(row + min(kv_start + n * 8 + 2 * t, mod.nk - 2));
    }
  }
  template <typename T>
  __device__ __forceinline__ void add(float (&S)[kTilesS][4], float scale) const {
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      const float2 b0 = pair_bits_to_float2(pairs[0][n], static_cast<const T*>(nullptr));
      const float2 b1 = pair_bits_to_float2(pairs[kRows - 1][n], static_cast<const T*>(nullptr));
      S[n][0] = S[n][0] * scale + b0.x, S[n][1] = S[n][1] * scale + b0.y;
      S[n][2] = S[n][2] * scale + b1.x, S[n][3] = S[n][3] * scale + b1.y;
    }
  }
};

// s' = score_mod(scale · s): the raw scores become the softmax's (scaled) input.
template <bool kTensorMods, int kTilesS>
__device__ __forceinline__ void apply_score_mod(float (&S)[kTilesS][4], const ScoreMod& score, float scale, int batch,
                                                int head, int row0, int kv_start, int t) {
  if (kTensorMods && score.kind == ScoreModKind::kBias) {
    if (score.bias_bf16) add_bias<__nv_bfloat16>(S, score, scale, batch, head, row0, kv_start, t);
    else add_bias<__half>(S, score, scale, batch, head, row0, kv_start, t);
    return;
  }
  with_static_kind<kTensorMods>(score, [&](const ScoreMod& mod) {
    for_each_score(S, row0, kv_start, t, [&](float& s, int q, int k) { s = mod(s * scale, batch, head, q, k); });
  });
}

// -inf outside the sequence bounds (q >= Nq or k >= Nk) and where the mask_mod
// drops the pair. The periodic mask_mods without a division per pair: a lane
// fixes two rows and steps its keys by 8 (n8 tiles), so block_diagonal takes
// each row's partner keys once (block_partners) and compares, and mini_causal
// compares each row's residue mod a with the keys' (ResidueWalk), both in
// mods.h. A tensor mask reads each row's words of the tile once (4 at 128
// keys) and tests a bit per pair. document is evaluated on every pair
// without a branch (keeps_pair, mods.h: each key's id loaded once per column,
// selected, not branched around); the others under the short-circuit, which
// is never evaluated out of bounds. Branch-free as well, dilated_sliding_window's per-pair (q − k) % S
// and the cheap compares of the rest held more values at once: the forward
// spilled 16–56 bytes at its 240 registers (docs/experiments.md).
template <bool kTensorMods, int kTilesS>
__device__ __forceinline__ void apply_mask_mod(float (&S)[kTilesS][4], const MaskMod& mask, int batch, int head,
                                               int row0, int kv_start, int t, int Nq, int Nk) {
  with_static_kind<kTensorMods>(mask, [&](const MaskMod& mod) {
    if (mod.kind == MaskModKind::kBlockDiagonal) {  // each row's keys: its block
      const BlockPartners keys[2] = {block_partners(mod, row0, Nq, Nk), block_partners(mod, row0 + 8, Nq, Nk)};
#pragma unroll
      for (int n = 0; n < kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!keys[e / 2].keeps(kv_start + n * 8 + 2 * t + e % 2)) S[n][e] = -INFINITY;
    } else if (mod.kind == MaskModKind::kMiniCausal) {  // q mod a >= k mod a
      int rq[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) rq[r] = row0 + 8 * r < Nq ? mod.by_a.mod(row0 + 8 * r) : -1;  // -1: nothing kept
      ResidueWalk rk[2] = {ResidueWalk(mod.by_a, kv_start + 2 * t), ResidueWalk(mod.by_a, kv_start + 2 * t + 1)};
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = kv_start + n * 8 + 2 * t + e % 2;
          if (!(rq[e / 2] >= rk[e % 2].r && k < Nk)) S[n][e] = -INFINITY;
        }
        rk[0].next(), rk[1].next();
      }
    } else if (mod.kind == MaskModKind::kTensor) {  // each row's words of the tile, loaded once
      static_assert(kTilesS * 8 % 32 == 0, "a tile of whole words (kv_start is a multiple of the tile)");
      constexpr int kWords = kTilesS * 8 / 32;
      const uint32_t* bits = static_cast<const uint32_t*>(mod.bits.data);
      const int row_words = 2 * ((Nk + 63) / 64), w0 = kv_start / 32;  // dma_mask_bit_row_words
      uint32_t w[2][kWords];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int q = row0 + 8 * r;
        const int64_t at = mod.bits.row_offset(batch, head, q < Nq ? q : Nq - 1) + w0;
#pragma unroll
        for (int i = 0; i < kWords; ++i) w[r][i] = q < Nq && w0 + i < row_words ? bits[at + i] : 0u;
      }
#pragma unroll
      for (int n = 0; n < kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * t + e % 2;  // the key's column in the tile
          if (!((w[e / 2][c / 32] >> (c % 32) & 1u) && kv_start + c < Nk)) S[n][e] = -INFINITY;
        }
    } else {
      const bool branch_free = mod.kind == MaskModKind::kDocument;  // a constant here: the kind is fixed
      for_each_score(S, row0, kv_start, t, [&](float& s, int q, int k) {
        if (branch_free) s = keeps_pair(mod, batch, head, q, k, Nq, Nk) ? s : -INFINITY;
        else if (!(q < Nq && k < Nk && mod(batch, head, q, k))) s = -INFINITY;
      });
    }
  });
}

// -inf outside the sequence bounds only (a full block's ragged tile).
template <int kTilesS>
__device__ __forceinline__ void apply_bounds(float (&S)[kTilesS][4], int row0, int kv_start, int t, int Nq, int Nk) {
  for_each_score(S, row0, kv_start, t, [&](float& s, int q, int k) {
    if (q >= Nq || k >= Nk) s = -INFINITY;
  });
}

}  // namespace attnlab
