// The exact unmasked-pair count behind every TFLOPS figure.
#include "host/attn_problem.h"
#include "testing.h"

using namespace attnlab;

namespace {
// Counts pairs straight from the mask's definition: j <= i + (Nk - Nq).
int64_t brute_force_pairs(int nq, int nk, bool causal) {
  int64_t n = 0;
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) n += (!causal || j <= i + (nk - nq)) ? 1 : 0;
  return n;
}
AttnProblem shape(int nq, int nk, bool causal) {
  AttnProblem p;
  p.Nq = nq;
  p.Nk = nk;
  p.causal = causal;
  return p;
}
}  // namespace

TEST_CASE(pairs_dense_and_square_causal) {
  EXPECT_EQ(unmasked_pairs_per_head(shape(8192, 8192, false)), int64_t(8192) * 8192);
  EXPECT_EQ(unmasked_pairs_per_head(shape(8192, 8192, true)), int64_t(8192) * 8193 / 2);
  EXPECT_EQ(unmasked_pairs_per_head(shape(1, 1, true)), 1);
}

TEST_CASE(pairs_causal_rectangles_by_hand) {
  EXPECT_EQ(unmasked_pairs_per_head(shape(2, 5, true)), 4 + 5);  // rows see 4 and 5 keys
  EXPECT_EQ(unmasked_pairs_per_head(shape(5, 2, true)), 0 + 0 + 0 + 1 + 2);
}

TEST_CASE(pairs_match_brute_force_on_odd_shapes) {
  const int sizes[] = {1, 2, 17, 64, 127, 129, 200};
  for (int nq : sizes)
    for (int nk : sizes)
      for (bool causal : {false, true})
        EXPECT_EQ(unmasked_pairs_per_head(shape(nq, nk, causal)), brute_force_pairs(nq, nk, causal));
}

TEST_CASE(flop_convention) {
  AttnProblem p = shape(8192, 8192, false);
  p.B = 1;
  p.H = 8;
  p.D = p.Dv = 64;
  const double dense = 4.0 * 8 * 8192.0 * 8192.0 * 64;
  EXPECT_NEAR(forward_flops(p), dense, 1.0);
  EXPECT_NEAR(backward_flops(p), 2.5 * dense, 1.0);
  p.causal = true;
  EXPECT_NEAR(forward_flops(p) / dense, 8193.0 / (2 * 8192.0), 1e-12);
  p.causal = false;
  p.Dv = 128;  // 2·(D+Dv) per pair
  EXPECT_NEAR(forward_flops(p), 2.0 * 8 * (64 + 128) * 8192.0 * 8192.0, 1.0);
}
