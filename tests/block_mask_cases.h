// The block-mask tests' shared cases (tests/cpu/test_block_mask.cpp against
// brute force, tests/gpu/test_block_mask_gpu.cpp against the CPU builders):
// every mask_mod, with arguments that make blocks of all three kinds, and
// random document ids for the `document` mask_mod.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace attnlab::block_mask_cases {

inline constexpr const char* kMaskModSpecs[] = {
    "none",          "causal",         "sliding_window:64,32", "block_diagonal:100", "mini_causal:64",
    "prefix_lm:150", "dilated_sliding_window:256,2", "document"};

// Document ids [B][L]: L cut into a few random segments.
inline std::vector<int32_t> random_docs(int B, int L, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(B) * L);
  for (int b = 0; b < B; ++b) {
    int id = 0;
    for (int i = 0; i < L; ++i) {
      if (i > 0 && rng() % 97 == 0) ++id;
      ids[size_t(b) * L + i] = id;
    }
  }
  return ids;
}

}  // namespace attnlab::block_mask_cases
