// kernels/varlen/: attention over a packed batch of sequences of different lengths on the
// Hopper engine (kernels/hopper/), in FlashAttention's varlen layout.
// attnlab: the host side of a packed batch that needs no GPU: its name, the
// checks of cu_seqlens, the pair count of the FLOP convention.
#include <string>
#include <tuple>
#include <vector>

#include "varlen/varlen.h"
#include "varlen/varlen_schedule.h"

namespace attnlab {

std::string VarlenProblem::shape_string() const {
  const AttnProblem& p = shape;
  std::string s = "varlen B=" + std::to_string(p.B) + " (total " + std::to_string(total_q);
  if (total_k != total_q) s += " / " + std::to_string(total_k);
  s += ", max " + std::to_string(p.Nq);
  if (p.Nk != p.Nq) s += " / " + std::to_string(p.Nk);
  s += "), H=" + std::to_string(p.H) + ", ";
  if (p.gqa()) s += "Hkv=" + std::to_string(p.kv_heads()) + ", ";
  s += "D=" + std::to_string(p.D);
  if (p.Dv != p.D) s += ", Dv=" + std::to_string(p.Dv);
  return s + ", " + dtype_name(p.dtype) + (p.causal ? ", causal" : "");
}

std::string varlen_lengths_invalid(const VarlenProblem& vp, const std::vector<int>& cu_q,
                                   const std::vector<int>& cu_k) {
  const int B = vp.shape.B;
  if (B < 1) return "a packed batch needs at least one sequence (B = " + std::to_string(B) + ")";
  for (const auto& [name, cu, total, max_len] :
       {std::tuple{"cu_seqlens_q", &cu_q, vp.total_q, vp.shape.Nq}, std::tuple{"cu_seqlens_k", &cu_k, vp.total_k, vp.shape.Nk}}) {
    const std::string n = name;
    if (int64_t(cu->size()) != int64_t(B) + 1)
      return n + " has " + std::to_string(cu->size()) + " offsets; B = " + std::to_string(B) + " sequences need " +
             std::to_string(B + 1);
    if ((*cu)[0] != 0) return n + "[0] is " + std::to_string((*cu)[0]) + ", not 0";
    for (int b = 0; b < B; ++b) {
      const int len = (*cu)[b + 1] - (*cu)[b];
      if (len < 0)
        return n + " decreases at sequence " + std::to_string(b) + " (" + std::to_string((*cu)[b]) + " then " +
               std::to_string((*cu)[b + 1]) + ")";
      if (len > max_len)
        return "sequence " + std::to_string(b) + " has " + std::to_string(len) + " rows in " + n +
               ", more than its max_seqlen " + std::to_string(max_len);
    }
    if ((*cu)[B] != total)
      return n + "[B] is " + std::to_string((*cu)[B]) + ", not the tensor's " + std::to_string(total) + " rows";
  }
  return "";
}

int64_t varlen_unmasked_pairs_per_head(const VarlenProblem& vp, const std::vector<int>& cu_q,
                                       const std::vector<int>& cu_k) {
  int64_t pairs = 0;
  for (int b = 0; b < vp.shape.B; ++b) {
    const VarlenSeq s = varlen_seq(cu_q.data(), cu_k.data(), b, vp.total_q, vp.total_k);
    pairs += unmasked_pairs_per_head(varlen_seq_problem(vp.shape, s));
  }
  return pairs;
}

}  // namespace attnlab
