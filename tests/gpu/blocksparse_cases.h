// attnlab: what the block-sparse GPU tests (test_blocksparse_fwd.cpp,
// test_blocksparse_bwd.cpp) draw alike for a case — the tensors its mods
// read, in one order from the case's generator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "../block_mask_cases.h"
#include "../tensor_mods_cases.h"
#include "blocksparse/mods.h"
#include "gpu_testing.h"
#include "host/attn_problem.h"

namespace attnlab::testing {

// The tensors a case's mods read, on the host.
struct ModTensors {
  int doc_len = 0;
  std::vector<int32_t> doc;         // the document mask_mod's ids [B][doc_len]
  std::vector<uint32_t> bits;       // the tensor mask_mod's words
  std::vector<uint16_t> bias_bits;  // the bias, in the dtype
  std::vector<double> bias_vals;
};

// Draws, in this order: the document ids over max(Nq, Nk) (for every case,
// from a generator seeded by rng), the tensor mask_mod's words where
// `tensor_mask` (tensor_mods_cases.h's random_mask_bits), the bias (normal, in
// p's dtype) where `bias`; the words and the bias in `shape`.
inline ModTensors draw_mod_tensors(std::mt19937_64& rng, const AttnProblem& p,
                                   const tensor_mods_cases::PairShape& shape, bool tensor_mask, bool bias) {
  ModTensors t;
  t.doc_len = std::max(p.Nq, p.Nk);
  std::mt19937 doc_rng{static_cast<unsigned>(rng())};
  t.doc = block_mask_cases::random_docs(p.B, t.doc_len, doc_rng);
  if (tensor_mask) t.bits = tensor_mods_cases::random_mask_bits(rng, shape, p.Nq, p.Nk);
  if (bias) random_tensor(rng, shape.rows() * p.Nk, p.dtype, 1.0, t.bias_bits, t.bias_vals);
  return t;
}

}  // namespace attnlab::testing
