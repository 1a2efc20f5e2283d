// The one correctness rule: error <= 2x unfused + 2x rounding, LSE within 1e-3
// (the unfused baseline, which rounds S first: plus its S rounding), nothing
// NaN or unwritten.
#include "reference/reference.h"
#include "testing.h"

using namespace attnlab;

namespace {
ErrorStats stats(double err, int64_t nonfinite = 0) {
  ErrorStats s;
  s.max_abs_err = err;
  s.nonfinite = nonfinite;
  return s;
}
}  // namespace

TEST_CASE(rule_passes_within_twice_the_baseline_plus_floor) {
  const CheckResult r = judge(stats(2.4e-3), stats(1e-5), /*baseline*/ 1e-3, /*rounding*/ 2.5e-4);
  EXPECT_NEAR(r.tol, 2e-3 + 5e-4, 1e-12);
  EXPECT_TRUE(r.pass);
  EXPECT_CONTAINS(r.summary(), "PASS");
}

TEST_CASE(rule_fails_above_the_bound) {
  const CheckResult r = judge(stats(2.6e-3), stats(1e-5), 1e-3, 2.5e-4);
  EXPECT_TRUE(!r.pass);
  EXPECT_CONTAINS(r.summary(), "FAIL");
}

TEST_CASE(rule_fails_on_nan_or_unwritten_output) {
  EXPECT_TRUE(!judge(stats(0.0, 1), stats(0.0), 1e-3, 2.5e-4).pass);
  EXPECT_TRUE(!judge(stats(0.0), stats(0.0, 3), 1e-3, 2.5e-4).pass);
  EXPECT_CONTAINS(judge(stats(0.0, 5), stats(0.0), 1e-3, 2.5e-4).summary(), "5 NaN/Inf/unwritten");
}

TEST_CASE(rule_fails_on_lse_error) {
  EXPECT_TRUE(judge(stats(1e-4), stats(9e-4), 1e-3, 2.5e-4).pass);
  EXPECT_TRUE(!judge(stats(1e-4), stats(2e-3), 1e-3, 2.5e-4).pass);
}

TEST_CASE(rule_holds_a_peer_that_rounds_scores_to_its_own_lse_bound) {
  // The unfused baseline stores S in fp16 / bf16: 1e-3 + 2·u·max|LSE_ref|.
  EXPECT_NEAR(lse_tolerance_rounded_scores(DType::kFloat16, 10.0), 1e-3 + 20.0 / 2048, 1e-15);
  EXPECT_NEAR(lse_tolerance_rounded_scores(DType::kBFloat16, 10.0), 1e-3 + 20.0 / 256, 1e-15);
  const double tol = lse_tolerance_rounded_scores(DType::kFloat16, 4.0);  // 4.9e-3
  const CheckResult r = judge(stats(1e-4), stats(1.23e-3), 1e-3, 2.5e-4, tol);
  EXPECT_TRUE(r.pass);
  EXPECT_CONTAINS(r.summary(), "lse 1.23e-03 <= 4.91e-03");
  EXPECT_TRUE(!judge(stats(1e-4), stats(5e-3), 1e-3, 2.5e-4, tol).pass);
  EXPECT_TRUE(!judge(stats(1e-4), stats(1.23e-3), 1e-3, 2.5e-4).pass);  // every other variant: 1e-3
}

TEST_CASE(rule_without_baseline_uses_rounding_only) {
  const CheckResult r = judge(stats(1e-3), stats(0.0), -1.0, 2.5e-4);
  EXPECT_NEAR(r.tol, kNoBaselineFactor * 2.5e-4, 1e-12);
  EXPECT_TRUE(r.pass);
  EXPECT_TRUE(!judge(stats(3e-3), stats(0.0), -1.0, 2.5e-4).pass);
}
