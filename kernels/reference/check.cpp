// attnlab: the correctness rule (see reference.h), and the CPU reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "reference/reference.h"

namespace attnlab {

double lse_tolerance_rounded_scores(DType dtype, double max_abs_lse_ref) {
  const double unit_roundoff = dtype == DType::kFloat16 ? 0x1p-11 : 0x1p-8;
  return kLseTolerance + 2.0 * unit_roundoff * max_abs_lse_ref;
}

CheckResult judge(const ErrorStats& out, const ErrorStats& lse, double baseline_err, double rounding_err,
                  double lse_tol) {
  CheckResult r;
  r.lse_tol = lse_tol;
  r.err = out.max_abs_err;
  r.lse_err = lse.max_abs_err;
  r.nonfinite = out.nonfinite + lse.nonfinite;
  // FlashAttention's tests: error <= 2x the same-precision unfused error, plus
  // twice the rounding error of the reference itself as the absolute floor.
  r.tol = baseline_err >= 0 ? 2.0 * baseline_err + 2.0 * rounding_err : kNoBaselineFactor * rounding_err;
  r.pass = out.nonfinite == 0 && lse.nonfinite == 0 && r.err <= r.tol && r.lse_err <= r.lse_tol;
  return r;
}

std::string CheckResult::summary() const {
  char buf[160];
  if (nonfinite != 0)
    std::snprintf(buf, sizeof buf, "%s %lld NaN/Inf/unwritten, err %.2e (tol %.2e), lse %.2e", pass ? "PASS" : "FAIL",
                  static_cast<long long>(nonfinite), err, tol, lse_err);
  else if (lse_tol == kLseTolerance)
    std::snprintf(buf, sizeof buf, "%s err %.2e %s %.2e, lse %.2e", pass ? "PASS" : "FAIL", err,
                  err <= tol ? "<=" : ">", tol, lse_err);
  else  // a peer's own LSE bound: shown
    std::snprintf(buf, sizeof buf, "%s err %.2e %s %.2e, lse %.2e %s %.2e", pass ? "PASS" : "FAIL", err,
                  err <= tol ? "<=" : ">", tol, lse_err, lse_err <= lse_tol ? "<=" : ">", lse_tol);
  return buf;
}

namespace {
// Row i of one head's softmax in double: P[0..n) = softmax(scale·Q_i·K_jᵀ) over
// its n visible keys (n > 0); returns the row's LSE.
double softmax_row(const AttnProblem& p, const double* Qi, const double* K, int64_t n, std::vector<double>& P) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int d = 0; d < p.D; ++d) dot += Qi[d] * K[j * p.D + d];
    P[size_t(j)] = dot * double(p.scale);
    m = std::max(m, P[size_t(j)]);
  }
  double l = 0;
  for (int64_t j = 0; j < n; ++j) l += std::exp(P[size_t(j)] - m);
  for (int64_t j = 0; j < n; ++j) P[size_t(j)] = std::exp(P[size_t(j)] - m) / l;
  return m + std::log(l);
}
}  // namespace

void reference_attention_cpu(const AttnProblem& p, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, std::vector<double>& o, std::vector<double>& lse) {
  o.assign(size_t(p.o_elems()), 0.0);
  lse.assign(size_t(p.lse_elems()), -std::numeric_limits<double>::infinity());
  std::vector<double> P(size_t(p.Nk));
  for (int64_t head = 0; head < p.heads(); ++head) {
    const double* Q = q.data() + head * p.Nq * p.D;
    const double* K = k.data() + p.kv_head(head) * p.Nk * p.D;
    const double* V = v.data() + p.kv_head(head) * p.Nk * p.Dv;
    for (int64_t i = 0; i < p.Nq; ++i) {
      const int64_t n = visible_keys(i, p);
      if (n == 0) continue;  // O row stays 0, LSE -inf
      lse[size_t(head * p.Nq + i)] = softmax_row(p, Q + i * p.D, K, n, P);
      double* O = o.data() + (head * p.Nq + i) * p.Dv;
      for (int64_t j = 0; j < n; ++j)
        for (int d = 0; d < p.Dv; ++d) O[d] += P[size_t(j)] * V[j * p.Dv + d];
    }
  }
}

void reference_attention_backward_cpu(const AttnProblem& p, const std::vector<double>& q,
                                      const std::vector<double>& k, const std::vector<double>& v,
                                      const std::vector<double>& dout, std::vector<double>& dq,
                                      std::vector<double>& dk, std::vector<double>& dv) {
  dq.assign(size_t(p.q_elems()), 0.0);
  dk.assign(size_t(p.k_elems()), 0.0);
  dv.assign(size_t(p.v_elems()), 0.0);
  std::vector<double> P(size_t(p.Nk)), dP(size_t(p.Nk));
  for (int64_t head = 0; head < p.heads(); ++head) {
    const double* Q = q.data() + head * p.Nq * p.D;
    const double* dO = dout.data() + head * p.Nq * p.Dv;
    const double* K = k.data() + p.kv_head(head) * p.Nk * p.D;
    const double* V = v.data() + p.kv_head(head) * p.Nk * p.Dv;
    double* dQ = dq.data() + head * p.Nq * p.D;
    double* dK = dk.data() + p.kv_head(head) * p.Nk * p.D;
    double* dV = dv.data() + p.kv_head(head) * p.Nk * p.Dv;
    for (int64_t i = 0; i < p.Nq; ++i) {
      const int64_t n = visible_keys(i, p);
      if (n == 0) continue;  // P = 0: no gradient
      softmax_row(p, Q + i * p.D, K, n, P);
      double rowsum = 0;  // Σ_j P_ij · dP_ij
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < p.Dv; ++d) dot += dO[i * p.Dv + d] * V[j * p.Dv + d];
        dP[size_t(j)] = dot;
        rowsum += P[size_t(j)] * dot;
      }
      for (int64_t j = 0; j < n; ++j) {
        const double ds = P[size_t(j)] * (dP[size_t(j)] - rowsum) * double(p.scale);  // scale · dS_ij
        for (int d = 0; d < p.D; ++d) {
          dQ[i * p.D + d] += ds * K[j * p.D + d];
          dK[j * p.D + d] += ds * Q[i * p.D + d];
        }
        for (int d = 0; d < p.Dv; ++d) dV[j * p.Dv + d] += P[size_t(j)] * dO[i * p.Dv + d];
      }
    }
  }
}

}  // namespace attnlab
