#include "attn_problem.h"

#include <sstream>

namespace attnlab {

std::string AttnProblem::shape_string() const {
  std::ostringstream s;
  s << "B=" << B << ", H=" << H << ", ";
  if (Nq == Nk) s << "N=" << Nq;
  else s << "Nq=" << Nq << ", Nk=" << Nk;
  s << ", D=" << D;
  if (Dv != D) s << ", Dv=" << Dv;
  s << ", " << dtype_name(dtype) << (causal ? ", causal" : "");
  return s.str();
}

int64_t unmasked_pairs_per_head(const AttnProblem& p) {
  if (!p.causal) return int64_t(p.Nq) * p.Nk;
  // Rows see min(Nk, max(0, i + Nk - Nq + 1)) keys: a ramp that may start below 0
  // and saturate at Nk. Summing row by row is O(Nq) and obviously right.
  int64_t pairs = 0;
  for (int64_t i = 0; i < p.Nq; ++i) pairs += visible_keys(i, p);
  return pairs;
}

double forward_flops(const AttnProblem& p) {
  return 2.0 * double(p.heads()) * double(p.D + p.Dv) * double(unmasked_pairs_per_head(p));
}

double backward_flops(const AttnProblem& p) {
  return 2.0 * double(p.heads()) * double(3 * p.D + 2 * p.Dv) * double(unmasked_pairs_per_head(p));
}

}  // namespace attnlab
