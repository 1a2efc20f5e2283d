// The CPU reference of dynamic-mask attention: forward against the
// plain reference, mask/bias/softcap/GQA semantics, the backward by finite
// differences, dBias reduction to its broadcast shape, and the top-W mask builder.
#include <cmath>
#include <random>

#include "reference/masked_reference_cpu.h"
#include "reference/reference.h"
#include "testing.h"

using namespace attnlab;

namespace {

std::vector<double> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

MaskedInputs random_inputs(const MaskedProblem& p, std::mt19937& rng) {
  MaskedInputs in;
  in.q = randn(size_t(int64_t(p.B) * p.H * p.Nq * p.D), rng);
  in.k = randn(size_t(int64_t(p.B) * p.Hkv * p.Nk * p.D), rng);
  in.v = randn(size_t(int64_t(p.B) * p.Hkv * p.Nk * p.Dv), rng);
  if (p.has_bias) in.bias = randn(size_t(p.bias_shape.elems()), rng);
  if (p.has_mask) {
    std::bernoulli_distribution keep(0.6);
    in.mask.resize(size_t(p.mask_shape.elems()));
    for (auto& m : in.mask) m = keep(rng) ? 1 : 0;
  }
  return in;
}

double loss(const MaskedProblem& p, const MaskedInputs& in, const std::vector<double>& dout) {
  std::vector<double> o, lse;
  masked_attention_forward_cpu(p, in, o, lse);
  double l = 0;
  for (size_t i = 0; i < o.size(); ++i) l += o[i] * dout[i];
  return l;
}

// Central differences of L = Σ O·dO against the analytic gradient, on every element.
void check_gradient(const MaskedProblem& p, MaskedInputs in, const std::vector<double>& dout,
                    std::vector<double> MaskedInputs::*field, const std::vector<double>& analytic, const char* name) {
  const double h = 1e-5;
  double worst = 0;
  for (size_t e = 0; e < (in.*field).size(); ++e) {
    const double x = (in.*field)[e];
    (in.*field)[e] = x + h;
    const double up = loss(p, in, dout);
    (in.*field)[e] = x - h;
    const double down = loss(p, in, dout);
    (in.*field)[e] = x;
    worst = std::max(worst, std::fabs((up - down) / (2 * h) - analytic[e]));
  }
  if (!(worst < 1e-6)) std::printf("  %s: worst gradient error %.3e\n", name, worst);
  EXPECT_TRUE(worst < 1e-6);
}

}  // namespace

TEST_CASE(masked_forward_without_mask_or_bias_is_plain_attention) {
  std::mt19937 rng(1);
  MaskedProblem p;
  p.B = 2, p.H = 2, p.Hkv = 2, p.Nq = 5, p.Nk = 7, p.D = 8, p.Dv = 4, p.causal = true, p.scale = 0.3;
  const MaskedInputs in = random_inputs(p, rng);
  std::vector<double> o1, l1, o2, l2;
  AttnProblem plain;
  plain.B = 2, plain.H = 2, plain.Nq = 5, plain.Nk = 7, plain.D = 8, plain.Dv = 4, plain.causal = true;
  plain.scale = 0.3f;
  MaskedProblem same = p;
  same.scale = double(plain.scale);  // the plain reference takes a float scale
  masked_attention_forward_cpu(same, in, o1, l1);
  reference_attention_cpu(plain, in.q, in.k, in.v, o2, l2);
  for (size_t i = 0; i < o1.size(); ++i) EXPECT_NEAR(o1[i], o2[i], 1e-12);
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l2[i], 1e-12);
}

TEST_CASE(masked_bias_shifts_scores_and_masks_remove_keys) {
  // One query, keys with q·k = 0: S = bias; bias [0, ln 3, 5] with key 2 masked
  // gives p = [1/4, 3/4, 0], LSE = ln 4.
  MaskedProblem p;
  p.Nq = 1, p.Nk = 3, p.D = 1, p.Dv = 1, p.scale = 1.0;
  p.has_bias = p.has_mask = true;
  p.bias_shape = {1, 1, 1, 3};
  p.mask_shape = {1, 1, 1, 3};
  MaskedInputs in;
  in.q = {0.0};
  in.k = {1.0, 2.0, 3.0};
  in.v = {2.0, 6.0, 100.0};
  in.bias = {0.0, std::log(3.0), 5.0};
  in.mask = {1, 1, 0};
  std::vector<double> o, lse;
  masked_attention_forward_cpu(p, in, o, lse);
  EXPECT_NEAR(o[0], 5.0, 1e-12);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-12);
}

TEST_CASE(masked_softcap_applies_tanh_after_the_bias) {
  MaskedProblem p;
  p.Nq = 1, p.Nk = 2, p.D = 1, p.Dv = 1, p.scale = 2.0, p.softcap = 1.5;
  p.has_bias = true;
  p.bias_shape = {1, 1, 1, 2};
  MaskedInputs in;
  in.q = {1.0};
  in.k = {0.5, -1.0};
  in.v = {1.0, 0.0};
  in.bias = {0.25, 0.5};
  std::vector<double> o, lse;
  masked_attention_forward_cpu(p, in, o, lse);
  const double t0 = 1.5 * std::tanh((2.0 * 0.5 + 0.25) / 1.5), t1 = 1.5 * std::tanh((2.0 * -1.0 + 0.5) / 1.5);
  EXPECT_NEAR(o[0], std::exp(t0) / (std::exp(t0) + std::exp(t1)), 1e-12);
  EXPECT_NEAR(lse[0], std::log(std::exp(t0) + std::exp(t1)), 1e-12);
}

TEST_CASE(masked_gqa_equals_repeated_kv_heads) {
  std::mt19937 rng(2);
  MaskedProblem gqa;
  gqa.B = 1, gqa.H = 4, gqa.Hkv = 2, gqa.Nq = 3, gqa.Nk = 5, gqa.D = 4, gqa.Dv = 4, gqa.scale = 0.5;
  const MaskedInputs in = random_inputs(gqa, rng);
  MaskedProblem mha = gqa;
  mha.Hkv = 4;
  MaskedInputs rep = in;
  rep.k.clear();
  rep.v.clear();
  for (int h = 0; h < 4; ++h) {  // KV head h/2 for query head h
    rep.k.insert(rep.k.end(), in.k.begin() + (h / 2) * 20, in.k.begin() + (h / 2 + 1) * 20);
    rep.v.insert(rep.v.end(), in.v.begin() + (h / 2) * 20, in.v.begin() + (h / 2 + 1) * 20);
  }
  std::vector<double> o1, l1, o2, l2;
  masked_attention_forward_cpu(gqa, in, o1, l1);
  masked_attention_forward_cpu(mha, rep, o2, l2);
  for (size_t i = 0; i < o1.size(); ++i) EXPECT_NEAR(o1[i], o2[i], 1e-14);
}

TEST_CASE(masked_fully_masked_row_is_zero_with_zero_gradients) {
  std::mt19937 rng(3);
  MaskedProblem p;
  p.Nq = 2, p.Nk = 3, p.D = 4, p.Dv = 4, p.has_mask = true, p.has_bias = true;
  p.mask_shape = {1, 1, 2, 3};
  p.bias_shape = {1, 1, 2, 3};
  MaskedInputs in = random_inputs(p, rng);
  in.mask = {0, 0, 0, 1, 0, 1};  // row 0 sees nothing
  std::vector<double> o, lse;
  masked_attention_forward_cpu(p, in, o, lse);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(o[size_t(d)], 0.0);
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  MaskedGrads g;
  masked_attention_backward_cpu(p, in, randn(o.size(), rng), g);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(g.dq[size_t(d)], 0.0);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(g.dbias[size_t(j)], 0.0);
  for (double x : g.dk) EXPECT_TRUE(std::isfinite(x));
}

TEST_CASE(masked_backward_matches_finite_differences) {
  // GQA, causal with Nq > Nk (fully masked rows), a random mask broadcast over
  // queries, a bias broadcast over batch and queries, softcap on.
  std::mt19937 rng(4);
  MaskedProblem p;
  p.B = 2, p.H = 4, p.Hkv = 2, p.Nq = 5, p.Nk = 4, p.D = 3, p.Dv = 2, p.causal = true, p.scale = 0.7;
  p.softcap = 2.0;
  p.has_mask = p.has_bias = true;
  p.mask_shape = {2, 4, 1, 4};
  p.bias_shape = {1, 2, 1, 4};
  const MaskedInputs in = random_inputs(p, rng);
  std::vector<double> o, lse;
  masked_attention_forward_cpu(p, in, o, lse);
  const std::vector<double> dout = randn(o.size(), rng);
  MaskedGrads g;
  masked_attention_backward_cpu(p, in, dout, g);
  check_gradient(p, in, dout, &MaskedInputs::q, g.dq, "dQ");
  check_gradient(p, in, dout, &MaskedInputs::k, g.dk, "dK");
  check_gradient(p, in, dout, &MaskedInputs::v, g.dv, "dV");
  check_gradient(p, in, dout, &MaskedInputs::bias, g.dbias, "dBias (reduced to (1, Hkv, 1, Nk))");
  EXPECT_EQ(g.dbias.size(), size_t(8));
}

TEST_CASE(topk_mask_keeps_the_largest_bias_among_causal_keys) {
  MaskedProblem p;
  p.Nq = 2, p.Nk = 4, p.causal = true;
  p.bias_shape = {1, 1, 1, 4};
  const std::vector<double> bias = {0.5, 3.0, 1.0, 9.0};
  // Row 0 sees keys 0..2 (Nk - Nq = 2): top 2 = keys 1 and 2. Row 1 sees all: keys 3 and 1.
  const auto m = build_topk_mask_cpu(p, bias, 2, 0);
  EXPECT_TRUE(m == std::vector<uint8_t>({0, 1, 1, 0, 0, 1, 0, 1}));
  // A window larger than what a row sees keeps every allowed key.
  const auto all = build_topk_mask_cpu(p, bias, 10, 0);
  EXPECT_TRUE(all == std::vector<uint8_t>({1, 1, 1, 0, 1, 1, 1, 1}));
  // Ties go to the lower key index.
  MaskedProblem flat = p;
  flat.causal = false;
  const auto tie = build_topk_mask_cpu(flat, {1.0, 1.0, 1.0, 1.0}, 1, 0);
  EXPECT_TRUE(tie == std::vector<uint8_t>({1, 0, 0, 0, 1, 0, 0, 0}));
}

TEST_CASE(topk_mask_block_smoothing_is_a_majority_vote) {
  MaskedProblem p;
  p.Nq = 1, p.Nk = 8;
  p.bias_shape = {1, 1, 1, 8};
  // Top 5 = keys 0, 1, 2, 5, 7. Blocks of 4: [0..3] has 3 of 4 -> kept whole;
  // [4..7] has 2 of 4 -> not a majority, dropped.
  const std::vector<double> bias = {9, 8, 7, 0, 1, 6, 2, 5};
  const auto m = build_topk_mask_cpu(p, bias, 5, 4);
  EXPECT_TRUE(m == std::vector<uint8_t>({1, 1, 1, 1, 0, 0, 0, 0}));
}

TEST_CASE(masked_pair_count) {
  MaskedProblem p;
  p.B = 1, p.H = 2, p.Nq = 2, p.Nk = 3, p.causal = true, p.has_mask = true;
  p.mask_shape = {1, 1, 1, 3};
  const std::vector<uint8_t> mask = {1, 0, 1};
  // Causal (offset 1): row 0 sees keys 0,1; row 1 sees 0,1,2. Mask drops key 1.
  EXPECT_EQ(masked_unmasked_pairs(p, mask), int64_t(2) * (1 + 2));
}
