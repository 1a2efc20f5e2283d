// attnlab: FlexAttention's programming model — which (query, key) pairs a
// mask_mod keeps, and how a score_mod changes the scaled score — as
// compile-time functors, usable on the host (the block-mask builder and the
// references) and in kernels alike. Definitions follow FlashAttention's
// tests (tests/cute/mask_mod_definitions.py, score_mod_definitions.py) and
// torch.nn.attention.flex_attention:
//
//   mask_mod(b, h, q, k) -> keep           score_mod(s, b, h, q, k) -> s'
//   s = scale · q·kᵀ; a kept pair contributes exp(s' − LSE), a dropped one 0.
//
// Offsets: `causal` and `sliding_window` are aligned to the bottom-right
// corner (off = Nk − Nq, as rung 0's causal flag); the block-structured masks
// (block_diagonal, mini_causal, prefix_lm, dilated_sliding_window) and
// `document` are top-left aligned, as FlashAttention's tests define them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "blocksparse/mods_table.h"
#include "common/softcap.h"
#include "host/attn_problem.h"
#include "host/broadcast_operand.h"

namespace attnlab {

// ---- division by a runtime divisor ------------------------------------------------
// n / d and n % d for 0 <= n < 2^31 by a multiply-high and a shift (CUTLASS's
// FastDivmod, after Granlund and Montgomery, "Division by invariant integers
// using multiplication", 1994): m = ceil(2^p / d), p = 31 + ceil(log2 d), and
// n / d = (n·m) >> p. On the GPU an integer division by a runtime divisor is a
// subroutine of some twenty instructions, and the periodic mask_mods divide
// both indices of every pair they evaluate. The host computes the same
// product, so that the CPU tests check the GPU's arithmetic.
struct FastDivmod {
  int d = 1;
  uint32_t mul = 0, shift = 0;  // d = 1: n itself

  FastDivmod() = default;
  explicit FastDivmod(int divisor) : d(divisor) {
    if (d <= 1) return;
    uint32_t log2_ceil = 0;
    while ((uint32_t(1) << log2_ceil) < uint32_t(d)) ++log2_ceil;
    const uint32_t p = 31 + log2_ceil;
    mul = uint32_t(((uint64_t(1) << p) + uint64_t(d) - 1) / uint64_t(d));
    shift = p - 32;
  }
  ATTNLAB_HOST_DEVICE int div(int n) const {
    if (d <= 1) return n;
#if defined(__CUDA_ARCH__)
    return int(__umulhi(uint32_t(n), mul) >> shift);
#else
    return int(uint32_t((uint64_t(uint32_t(n)) * mul) >> 32) >> shift);
#endif
  }
  ATTNLAB_HOST_DEVICE int mod(int n) const { return n - div(n) * d; }
};

// (x0 + 8n) mod d for n = 0, 1, 2, ... without a division per step: the
// residue advanced by (8 mod d), less d once where it reaches d. A lane's
// indices along one side of an accumulator fragment step by 8 (n8 tiles);
// the periodic mask_mods compare such residues (apply_mods.cuh).
struct ResidueWalk {
  int r, step, d;
  ATTNLAB_HOST_DEVICE ResidueWalk(const FastDivmod& by, int x0)
      : r(by.mod(x0)), step(by.mod(8)), d(by.d) {}
  ATTNLAB_HOST_DEVICE void next() {
    r += step;
    r -= r >= d ? d : 0;
  }
};

// ---- tensors read per pair --------------------------------------------------------
ATTNLAB_HOST_DEVICE inline float element_to_float(__half x) { return __half2float(x); }
ATTNLAB_HOST_DEVICE inline float element_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// A tensor mask_mod or score_mod (dmattn's mask and bias) is a
// BroadcastOperand (host/broadcast_operand.h) of shape ({B|1}, {H|1}, {Nq|1},
// row), the row contiguous; h is the query head.

// ---- the kinds: one per row of mods_table.h ---------------------------------------
#define ATTNLAB_KIND(kind, ...) kind,
#define ATTNLAB_ONE(...) +1
enum class MaskModKind { ATTNLAB_MASK_MODS(ATTNLAB_KIND) };
enum class ScoreModKind { ATTNLAB_SCORE_MODS(ATTNLAB_KIND) };
inline constexpr int kMaskModCount = 0 ATTNLAB_MASK_MODS(ATTNLAB_ONE);
inline constexpr int kScoreModCount = 0 ATTNLAB_SCORE_MODS(ATTNLAB_ONE);
#undef ATTNLAB_ONE
#undef ATTNLAB_KIND

// Two of the rows' columns as functions of the kind, each `false || (column
// && kind == k) || ...`, which folds to the compares of the rows that set it:
// whether the mod reads a tensor the caller attaches, and whether ds'/ds is
// not 1 (the backward's chain rule).
#define ATTNLAB_MASK_TENSOR(k, name, args, form, least_a, least_b, need, tensor) || ((tensor) && kind == MaskModKind::k)
#define ATTNLAB_SCORE_TENSOR(k, name, args, form, chain_rule, tensor) || ((tensor) && kind == ScoreModKind::k)
#define ATTNLAB_SCORE_CHAIN(k, name, args, form, chain_rule, tensor) || ((chain_rule) && kind == ScoreModKind::k)
ATTNLAB_HOST_DEVICE constexpr bool is_tensor_mod(MaskModKind kind) { return false ATTNLAB_MASK_MODS(ATTNLAB_MASK_TENSOR); }
ATTNLAB_HOST_DEVICE constexpr bool is_tensor_mod(ScoreModKind kind) { return false ATTNLAB_SCORE_MODS(ATTNLAB_SCORE_TENSOR); }
ATTNLAB_HOST_DEVICE constexpr bool has_chain_rule(ScoreModKind kind) { return false ATTNLAB_SCORE_MODS(ATTNLAB_SCORE_CHAIN); }
#undef ATTNLAB_SCORE_CHAIN
#undef ATTNLAB_SCORE_TENSOR
#undef ATTNLAB_MASK_TENSOR
constexpr int chain_rule_count() {
  int n = 0;
  for (int k = 0; k < kScoreModCount; ++k) n += has_chain_rule(ScoreModKind(k)) ? 1 : 0;
  return n;
}

// A mod's math is its case in the switches below, which have no default: a
// kind without its case is a compile error (the host pass's -Wswitch, an
// error here), not a mod that silently keeps nothing.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
#endif

// ---- mask_mods --------------------------------------------------------------------
// One mask_mod with its arguments (a, b: see each kind). Plain data, so that a
// kernel takes it by value; `doc` points at int32 document ids [B][doc_len]
// (the same ids for queries and keys), `bits` at a tensor mask's words, on the
// side that evaluates it. A tensor mask is bit-packed as dmattn's
// (DmaMaskFormat::kBits): bit k % 32 of 32-bit word k / 32 of its row, 1 =
// keep, rows of 2·ceil(Nk / 64) words; an eighth of a byte mask's traffic.
struct MaskMod {
  MaskModKind kind = MaskModKind::kNone;
  int a = 0, b = 0;     // sliding_window: left, right; block_diagonal / mini_causal: the block;
                        // prefix_lm: the prefix length; dilated: the window, the stride
  int off = 0;          // Nk − Nq (causal, sliding_window)
  FastDivmod by_a, by_b;  // division by a and by b (parse_mask_mod sets them with a and b)
  const int32_t* doc = nullptr;
  int doc_len = 0;
  BroadcastOperand bits;  // kTensor: uint32 words

  ATTNLAB_HOST_DEVICE bool operator()(int batch, int head, int q, int k) const {
    switch (kind) {
      case MaskModKind::kNone: return true;
      case MaskModKind::kCausal: return k <= q + off;
      case MaskModKind::kSlidingWindow: return k >= q + off - a && k <= q + off + b;
      case MaskModKind::kBlockDiagonal: return by_a.div(q) == by_a.div(k);
      case MaskModKind::kMiniCausal: return by_a.mod(q) >= by_a.mod(k);
      case MaskModKind::kPrefixLm: return (q < a && k < a) || q >= k;
      case MaskModKind::kDilatedWindow: return q >= k && q - k < a && by_b.mod(q - k) == 0;
      case MaskModKind::kDocument: return doc[int64_t(batch) * doc_len + q] == doc[int64_t(batch) * doc_len + k];
      case MaskModKind::kTensor:
        return (static_cast<const uint32_t*>(bits.data)[bits.row_offset(batch, head, q) + (k >> 5)] >> (k & 31) &
                1u) != 0u;
    }
    return false;
  }
};

// ---- score_mods -------------------------------------------------------------------
// s' for the scaled score s: rel_bias s + |q − k|; alibi s − slope_h·|q − k|
// with slope_h = 2^(−8(h+1)/H) (ALiBi's geometric slopes, Press et al. 2022);
// softcap C·tanh(s / C); bias s + bias[b, h, q, k] (a tensor in the input
// dtype, read at the pair clamped into Nq x Nk: a ragged tile's pairs past
// the ends are evaluated, then dropped). And ds'/ds (the backward's chain
// rule): 1, 1, 1 − tanh²(s / C), 1.
struct ScoreMod {
  ScoreModKind kind = ScoreModKind::kNone;
  float cap = 0.f;  // softcap's C
  int heads = 1;    // alibi's H
  BroadcastOperand bias;  // kBias: the input dtype's elements
  bool bias_bf16 = false;
  int nq = 1, nk = 1;  // kBias: the problem's Nq, Nk (the clamp)
  // dBias = dS' (the gradient of s', before the chain rule), fp32, in the
  // layout of `dbias`'s strides; atomically added where several pairs of the
  // problem share an element (a broadcast dimension), else stored. Null: none.
  float* dbias = nullptr;
  BroadcastOperand dbias_at;  // strides only
  bool dbias_add = false;

  ATTNLAB_HOST_DEVICE float bias_at(int batch, int head, int q, int k) const {
    q = q < nq ? q : nq - 1;
    k = k < nk ? k : nk - 1;
    const int64_t at = bias.row_offset(batch, head, q) + k;
    return bias_bf16 ? element_to_float(static_cast<const __nv_bfloat16*>(bias.data)[at])
                     : element_to_float(static_cast<const __half*>(bias.data)[at]);
  }

  ATTNLAB_HOST_DEVICE float alibi_slope(int head) const { return exp2f(-8.f * float(head + 1) / float(heads)); }
  ATTNLAB_HOST_DEVICE float operator()(float s, int batch, int head, int q, int k) const {
    switch (kind) {
      case ScoreModKind::kNone: return s;
      case ScoreModKind::kRelBias: return s + float(q > k ? q - k : k - q);
      case ScoreModKind::kAlibi: return s - alibi_slope(head) * float(q > k ? q - k : k - q);
      case ScoreModKind::kSoftcap: return apply_softcap(s, cap);
      case ScoreModKind::kBias: return s + bias_at(batch, head, q, k);
    }
    return s;
  }
  // d s' / d s at the score s (before the mod): 1 but where has_chain_rule.
  static_assert(chain_rule_count() == 1 && has_chain_rule(ScoreModKind::kSoftcap),
                "grad and grad_from_output know softcap's derivative alone: give the new score_mod's here");
  ATTNLAB_HOST_DEVICE float grad(float s) const {
    if (kind != ScoreModKind::kSoftcap) return 1.f;
    return softcap_grad(s, cap);
  }
  // The same derivative written through the modded score s' = mod(s) (softcap:
  // tanh(s / C) = s' / C), for a backward that holds s' (from P and the LSE)
  // rather than s.
  ATTNLAB_HOST_DEVICE float grad_from_output(float s_mod) const {
    if (kind != ScoreModKind::kSoftcap) return 1.f;
    return softcap_grad_from_output(s_mod, cap);
  }
};

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

// Whether the pair (q, k) stays: inside the sequences (q < Nq, k < Nk) and
// kept by the mask_mod, which sees the indices clamped into the sequences (a
// document mask_mod's ids end there; a kernel walks a tile only when Nq, Nk >=
// 1). So it is evaluated on every pair without a branch: written as
// `q < Nq && k < Nk && mod(...)`, the short-circuit left a branch around each
// pair of a tile, and the key's part of a periodic mask_mod (k / a, k % a)
// was computed again for each of a lane's two rows; evaluated unconditionally,
// the compiler selects instead of branching and computes each key's part once.
ATTNLAB_HOST_DEVICE inline bool keeps_pair(const MaskMod& mod, int batch, int head, int q, int k, int Nq, int Nk) {
#if defined(__CUDA_ARCH__)
  const bool kept = mod(batch, head, min(q, Nq - 1), min(k, Nk - 1));
#else
  const bool kept = mod(batch, head, std::min(q, Nq - 1), std::min(k, Nk - 1));
#endif
  return kept & (q < Nq) & (k < Nk);
}

// block_diagonal's partners of an index x of one side (a query, or a key): the
// other side's indices in x's block [a·⌊x/a⌋, a·⌊x/a⌋ + a), cut at that side's
// length; none when x is past its own side's length. One division per fixed
// index, then two compares per pair (apply_mods.cuh, bwd_mods.cuh).
struct BlockPartners {
  int lo, hi;
  ATTNLAB_HOST_DEVICE bool keeps(int y) const { return y >= lo && y < hi; }
};
ATTNLAB_HOST_DEVICE inline BlockPartners block_partners(const MaskMod& mod, int x, int x_len, int other_len) {
  const int lo = mod.by_a.div(x) * mod.a, room = other_len - lo;  // room < a: the block is cut
  return {lo, x < x_len ? lo + (room < mod.a ? room : mod.a) : lo};
}

// "NAME[:ARGS]" as the harness and Python take them, e.g. "sliding_window:128,128",
// "block_diagonal:128", "softcap:30"; on a bad spec `why` says what is wrong and
// the result is kNone. Nq, Nk set the bottom-right offset; H the ALiBi slopes.
MaskMod parse_mask_mod(const std::string& spec, int Nq, int Nk, std::string& why);
ScoreMod parse_score_mod(const std::string& spec, int H, std::string& why);
// The specs those parse, for messages; with_tensor: also the ones that read a
// tensor the caller supplies (tensor, bias), which the harness cannot.
std::string mask_mod_names(bool with_tensor);
std::string score_mod_names(bool with_tensor);
// Whether the mods read a tensor per pair (a tensor mask_mod, a bias
// score_mod): the kernels' kTensorMods instances (apply_mods.cuh).
ATTNLAB_HOST_DEVICE inline bool has_tensor_mods(const MaskMod& mask, const ScoreMod& score) {
  return is_tensor_mod(mask.kind) || is_tensor_mod(score.kind);
}

// "" when every tensor the mods read is attached (document's ids, a tensor
// mask's words, a bias), else what is missing. The kernels refuse to launch
// without them.
std::string mods_missing_tensors(const MaskMod& mask, const ScoreMod& score);
// mods_missing_tensors, then whether the bias fits the problem p (its Nq, Nk
// and dtype) and dBias's stores are not shared by several pairs (a broadcast
// layout must add: dbias_add). "" when the kernels can run them.
std::string mods_unfit(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score);
std::string mask_mod_name(const MaskMod& m);
std::string score_mod_name(const ScoreMod& s);

}  // namespace attnlab
