// The CPU double-precision reference: hand-computed cases, causal alignment and a
// finite-difference check of its own softmax.
#include <cmath>
#include <limits>
#include <random>

#include "reference/reference.h"
#include "testing.h"

using namespace attnlab;

namespace {

AttnProblem make(int nq, int nk, int d, int dv, bool causal, float scale) {
  AttnProblem p;
  p.Nq = nq;
  p.Nk = nk;
  p.D = d;
  p.Dv = dv;
  p.causal = causal;
  p.scale = scale;
  return p;
}

std::vector<double> random_vec(size_t n, std::mt19937& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

}  // namespace

TEST_CASE(two_keys_by_hand) {
  // s = [0, ln 3] -> p = [1/4, 3/4]; O = 2/4 + 6·3/4 = 5; LSE = ln 4.
  const AttnProblem p = make(1, 2, 1, 1, false, 1.0f);
  std::vector<double> o, lse;
  reference_attention_cpu(p, {1.0}, {0.0, std::log(3.0)}, {2.0, 6.0}, o, lse);
  EXPECT_NEAR(o[0], 5.0, 1e-12);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-12);
}

TEST_CASE(scale_multiplies_scores) {
  // scale 0.5 on q·k = [0, 2 ln 3] gives the same softmax as above.
  const AttnProblem p = make(1, 2, 1, 1, false, 0.5f);
  std::vector<double> o, lse;
  reference_attention_cpu(p, {2.0}, {0.0, std::log(3.0)}, {2.0, 6.0}, o, lse);
  EXPECT_NEAR(o[0], 5.0, 1e-6);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-6);
}

TEST_CASE(equal_scores_average_v_with_dv_not_d) {
  // Identical keys: every weight is 1/3, O is the mean of V's rows (Dv = 2, D = 3).
  const AttnProblem p = make(1, 3, 3, 2, false, 0.7f);
  std::vector<double> o, lse;
  const std::vector<double> k = {1, 2, 3, 1, 2, 3, 1, 2, 3};
  reference_attention_cpu(p, {0.5, -1.0, 2.0}, k, {1, 10, 2, 20, 6, 60}, o, lse);
  EXPECT_NEAR(o[0], 3.0, 1e-12);
  EXPECT_NEAR(o[1], 30.0, 1e-12);
  const double s = 0.7f * (0.5 - 2.0 + 6.0);
  EXPECT_NEAR(lse[0], s + std::log(3.0), 1e-6);
}

TEST_CASE(causal_square_first_row_sees_one_key) {
  const AttnProblem p = make(2, 2, 1, 1, true, 1.0f);
  std::vector<double> o, lse;
  reference_attention_cpu(p, {1.0, 1.0}, {0.25, 5.0}, {7.0, -3.0}, o, lse);
  EXPECT_NEAR(o[0], 7.0, 1e-12);    // row 0 sees key 0 only
  EXPECT_NEAR(lse[0], 0.25, 1e-12);
  EXPECT_TRUE(o[1] < 0.0);          // row 1 sees both, key 1 dominates
}

TEST_CASE(causal_more_queries_than_keys_is_bottom_right_aligned) {
  // Nq = 3, Nk = 1: query i sees key j iff j <= i - 2, so rows 0 and 1 see nothing.
  const AttnProblem p = make(3, 1, 1, 1, true, 1.0f);
  std::vector<double> o, lse;
  reference_attention_cpu(p, {1, 2, 3}, {0.5}, {4.0}, o, lse);
  EXPECT_EQ(o[0], 0.0);
  EXPECT_EQ(o[1], 0.0);
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  EXPECT_TRUE(std::isinf(lse[1]) && lse[1] < 0);
  EXPECT_NEAR(o[2], 4.0, 1e-12);
  EXPECT_NEAR(lse[2], 1.5, 1e-12);
}

TEST_CASE(causal_fewer_queries_than_keys_sees_the_prefix) {
  // Nq = 1, Nk = 3: the single query is the last one, it sees all three keys.
  const AttnProblem causal = make(1, 3, 2, 1, true, 1.0f);
  const AttnProblem full = make(1, 3, 2, 1, false, 1.0f);
  std::mt19937 rng(7);
  const auto q = random_vec(2, rng), k = random_vec(6, rng), v = random_vec(3, rng);
  std::vector<double> o1, l1, o2, l2;
  reference_attention_cpu(causal, q, k, v, o1, l1);
  reference_attention_cpu(full, q, k, v, o2, l2);
  EXPECT_NEAR(o1[0], o2[0], 1e-14);
  EXPECT_NEAR(l1[0], l2[0], 1e-14);
  // Nq = 2, Nk = 4: row 0 sees keys 0..2, so changing key 3 must not move it.
  const AttnProblem p = make(2, 4, 1, 1, true, 1.0f);
  std::vector<double> oa, la, ob, lb;
  reference_attention_cpu(p, {1, 1}, {0.1, 0.2, 0.3, 0.4}, {1, 2, 3, 4}, oa, la);
  reference_attention_cpu(p, {1, 1}, {0.1, 0.2, 0.3, 9.0}, {1, 2, 3, 40}, ob, lb);
  EXPECT_NEAR(oa[0], ob[0], 1e-15);
  EXPECT_TRUE(std::fabs(oa[1] - ob[1]) > 1.0);
}

TEST_CASE(lse_gradient_matches_own_softmax_by_finite_differences) {
  // d LSE_i / d q_i = scale · Σ_j p_ij k_j. With V = K that sum is O_i itself,
  // so central differences of the reference's LSE must reproduce scale · O.
  std::mt19937 rng(11);
  const AttnProblem p = make(3, 5, 4, 4, false, 0.6f);
  auto q = random_vec(12, rng);
  const auto k = random_vec(20, rng);
  std::vector<double> o, lse;
  reference_attention_cpu(p, q, k, k, o, lse);
  const double h = 1e-5;
  for (int i = 0; i < p.Nq; ++i) {
    for (int d = 0; d < p.D; ++d) {
      std::vector<double> o_plus, lse_plus, o_minus, lse_minus;
      q[i * p.D + d] += h;
      reference_attention_cpu(p, q, k, k, o_plus, lse_plus);
      q[i * p.D + d] -= 2 * h;
      reference_attention_cpu(p, q, k, k, o_minus, lse_minus);
      q[i * p.D + d] += h;
      const double numeric = (lse_plus[i] - lse_minus[i]) / (2 * h);
      EXPECT_NEAR(numeric, double(p.scale) * o[i * p.Dv + d], 1e-7);
    }
  }
}

TEST_CASE(heads_are_independent) {
  std::mt19937 rng(3);
  AttnProblem p = make(4, 6, 8, 8, true, 0.35f);
  p.B = 2;
  p.H = 3;
  const auto q = random_vec(size_t(p.q_elems()), rng), k = random_vec(size_t(p.k_elems()), rng),
             v = random_vec(size_t(p.v_elems()), rng);
  std::vector<double> o, lse;
  reference_attention_cpu(p, q, k, v, o, lse);
  AttnProblem one = p;
  one.B = one.H = 1;
  const int64_t h = 4;  // batch 1, head 1
  std::vector<double> q1(q.begin() + h * 32, q.begin() + h * 32 + 32), k1(k.begin() + h * 48, k.begin() + h * 48 + 48),
      v1(v.begin() + h * 48, v.begin() + h * 48 + 48), o1, l1;
  reference_attention_cpu(one, q1, k1, v1, o1, l1);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(o[size_t(h * 32 + i)], o1[size_t(i)], 1e-15);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(lse[size_t(h * 4 + i)], l1[size_t(i)], 1e-15);
}

TEST_CASE(kv_head_of_each_query_head) {
  AttnProblem p;
  p.B = 2;
  p.H = 6;
  EXPECT_EQ(p.kv_head(7), int64_t(7));  // Hkv = 0: every head its own
  EXPECT_TRUE(!p.gqa());
  p.Hkv = 2;  // query heads 0-2 read KV head 0, 3-5 KV head 1, in each batch
  EXPECT_TRUE(p.gqa());
  EXPECT_EQ(p.kv_head(0), int64_t(0));
  EXPECT_EQ(p.kv_head(2), int64_t(0));
  EXPECT_EQ(p.kv_head(3), int64_t(1));
  EXPECT_EQ(p.kv_head(6 + 4), int64_t(2 + 1));  // batch 1, head 4
  p.Hkv = 1;  // MQA: one KV head per batch
  EXPECT_EQ(p.kv_head(5), int64_t(0));
  EXPECT_EQ(p.kv_head(6 + 5), int64_t(1));
  EXPECT_EQ(p.k_elems(), int64_t(2) * 1 * p.Nk * p.D);
}

TEST_CASE(gqa_equals_attention_on_repeated_kv_heads) {
  // H = 4 on Hkv = 2 KV heads is ordinary attention with each KV head
  // repeated for its two query heads (K and V rows of [B, H, Nk, D]).
  std::mt19937 rng(5);
  for (int hkv : {2, 1})
    for (bool causal : {false, true}) {
      AttnProblem gqa = make(5, 7, 8, 6, causal, 0.4f);
      gqa.B = 2;
      gqa.H = 4;
      gqa.Hkv = hkv;
      AttnProblem mha = gqa;
      mha.Hkv = 0;
      const auto q = random_vec(size_t(gqa.q_elems()), rng), k = random_vec(size_t(gqa.k_elems()), rng),
                 v = random_vec(size_t(gqa.v_elems()), rng);
      std::vector<double> k_rep, v_rep;  // [B, H, Nk, *]
      for (int64_t head = 0; head < mha.heads(); ++head) {
        const int64_t kv = head / mha.H * hkv + head % mha.H / (mha.H / hkv);
        k_rep.insert(k_rep.end(), k.begin() + kv * 7 * 8, k.begin() + (kv + 1) * 7 * 8);
        v_rep.insert(v_rep.end(), v.begin() + kv * 7 * 6, v.begin() + (kv + 1) * 7 * 6);
      }
      std::vector<double> o1, l1, o2, l2;
      reference_attention_cpu(gqa, q, k, v, o1, l1);
      reference_attention_cpu(mha, q, k_rep, v_rep, o2, l2);
      EXPECT_EQ(o1.size(), o2.size());
      for (size_t i = 0; i < o1.size(); ++i) EXPECT_NEAR(o1[i], o2[i], 1e-15);
      for (size_t i = 0; i < l1.size(); ++i)
        EXPECT_TRUE(l1[i] == l2[i] || std::fabs(l1[i] - l2[i]) < 1e-15);
    }
}
