// kernels/host/: host-side glue; the device primitives are in kernels/common/.
#include "host/attn_problem.h"
#include "host/broadcast_operand.h"


namespace attnlab {

std::string AttnProblem::shape_string() const {
  std::string s = "B=" + std::to_string(B) + ", H=" + std::to_string(H) + ", ";
  if (gqa()) s += "Hkv=" + std::to_string(kv_heads()) + ", ";
  s += Nq == Nk ? "N=" + std::to_string(Nq) : "Nq=" + std::to_string(Nq) + ", Nk=" + std::to_string(Nk);
  s += ", D=" + std::to_string(D);
  if (Dv != D) s += ", Dv=" + std::to_string(Dv);
  return s + ", " + dtype_name(dtype) + (causal ? ", causal" : "");
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

// Dense strides of a ({B|1}, {H|Hkv|1}, {Nq|1}, Nk) operand: a size-1 dimension
// gets stride 0, so indexing with the full (b, h / head_group, i) reads the
// broadcast element. Nothing is validated here (the launchers do).
void BroadcastOperand::set_shape(int b_, int h_, int q_, int Nk, int H) {
  b = b_;
  h = h_;
  q = q_;
  stride_q = q > 1 ? int64_t(Nk) : 0;
  stride_h = h > 1 ? int64_t(q) * Nk : 0;
  stride_b = b > 1 ? int64_t(h) * q * Nk : 0;
  head_group = h > 1 ? H / h : 1;  // h == H: 1; h == Hkv: H / Hkv
}

std::string BroadcastOperand::shape_string(int Nk) const {
  return "(" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(q) + ", " + std::to_string(Nk) +
         ")";
}

}  // namespace attnlab
