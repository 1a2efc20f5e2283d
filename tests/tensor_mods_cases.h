// The tensor mods' shared test pieces (tests/cpu/test_block_mask.cpp on host
// words, tests/gpu/test_blocksparse_fwd.cpp and test_blocksparse_bwd.cpp
// against the kernels): the broadcast shape of a tensor mask_mod's words and
// of a bias score_mod's elements (a BroadcastOperand), random keep bits in
// dmattn's packing, and the mods with their tensors attached. Host code only.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "blocksparse/mods.h"
#include "dmattn/dmattn.h"
#include "host/attn_problem.h"

namespace attnlab::tensor_mods_cases {

// The shape of a case's tensor mask_mod words and bias: [B, H, Nq, ·], or
// broadcast [1, H, 1, ·] or [B, 1, Nq, ·].
enum class Form { kFull, kHeadsKeys, kBatchQueries };
inline const char* form_name(Form f) {
  return f == Form::kFull ? "[B,H,Nq,Nk]" : f == Form::kHeadsKeys ? "[1,H,1,Nk]" : "[B,1,Nq,Nk]";
}

// A tensor operand's shape ({B|1}, {H|1}, {Nq|1}, ...) and its dense strides
// (0 along a size-1 dimension) for rows of `row` elements.
struct PairShape {
  int b, h, q;
  BroadcastOperand strides(int64_t row) const {
    BroadcastOperand t;
    t.set_shape(b, h, q, int(row), h);
    return t;
  }
  int64_t rows() const { return int64_t(b) * h * q; }
  // The row of (batch, head, query) in the dense [b][h][q] order.
  int64_t at(int batch, int head, int query) const {
    return (int64_t(b == 1 ? 0 : batch) * h + (h == 1 ? 0 : head)) * q + (q == 1 ? 0 : query);
  }
};

// The shape of form f for a problem of B batches, H heads, Nq queries.
inline PairShape pair_shape(Form f, int B, int H, int Nq) {
  return {f == Form::kHeadsKeys ? 1 : B, f == Form::kBatchQueries ? 1 : H, f == Form::kHeadsKeys ? 1 : Nq};
}

// Random keep bits in dmattn's packing (rows of dma_mask_bit_row_words(Nk)
// words, bit k % 32 of word k / 32), each 128 x 128 tile of a row group all
// dropped, all kept or random, so that the block masks have empty, full and
// partial blocks; the padding bits past Nk set (no key may read them).
inline std::vector<uint32_t> random_mask_bits(std::mt19937_64& rng, const PairShape& s, int Nq, int Nk) {
  const int64_t row_words = dma_mask_bit_row_words(Nk);
  const int q_len = s.q == 1 ? 1 : Nq, q_tiles = (q_len + 127) / 128, k_tiles = (Nk + 127) / 128;
  std::vector<uint32_t> words(size_t(s.rows() * row_words), 0u);
  for (int64_t bh = 0; bh < int64_t(s.b) * s.h; ++bh) {
    std::vector<int> kind(size_t(q_tiles) * k_tiles);  // 0 dropped, 1 kept, 2 random
    for (int& x : kind) x = int(rng() % 3);
    for (int q = 0; q < q_len; ++q) {
      uint32_t* row = words.data() + (bh * q_len + q) * row_words;
      for (int k = 0; k < Nk; ++k) {
        const int tile = kind[size_t(q / 128) * k_tiles + k / 128];
        if (tile == 1 || (tile == 2 && rng() % 2 == 0)) row[k / 32] |= 1u << (k % 32);
      }
      for (int64_t k = Nk; k < 32 * row_words; ++k) row[k / 32] |= 1u << (k % 32);
    }
  }
  return words;
}

// The mods with their tensors attached (host or device copies): the mask's
// words, the bias in the input dtype read in Nq x Nk.
inline void attach(MaskMod& mask, ScoreMod& score, const PairShape& s, const AttnProblem& p, const void* bits,
                   const void* bias) {
  if (mask.kind == MaskModKind::kTensor) {
    mask.bits = s.strides(dma_mask_bit_row_words(p.Nk));
    mask.bits.data = bits;
  }
  if (score.kind == ScoreModKind::kBias) {
    score.bias = s.strides(p.Nk);
    score.bias.data = bias;
    score.bias_bf16 = p.dtype == DType::kBFloat16;
    score.nq = p.Nq, score.nk = p.Nk;
  }
}

}  // namespace attnlab::tensor_mods_cases
