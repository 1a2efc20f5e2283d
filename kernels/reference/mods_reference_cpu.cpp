// attnlab: the CPU reference of attention under a mask_mod and a score_mod
// (mods_reference.h), in double, with the same-precision path beside it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/mods_reference.h"

namespace attnlab {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// x rounded to the input dtype (round to nearest even).
double round_to(double x, DType t) {
  if (t == DType::kFloat16) return __half2float(__float2half_rn(float(x)));
  return __bfloat162float(__float2bfloat16_rn(float(x)));
}

}  // namespace

// mods.h's score_mods in double: a case for each kind (a compile error without
// one, as in mods.h).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
#endif
double score_mod_double(const ScoreMod& m, double s, int b, int h, int q, int k) {
  const double dist = std::fabs(double(q) - double(k));
  switch (m.kind) {
    case ScoreModKind::kNone: return s;
    case ScoreModKind::kRelBias: return s + dist;
    case ScoreModKind::kAlibi: return s - std::exp2(-8.0 * (h + 1) / m.heads) * dist;
    case ScoreModKind::kSoftcap: return m.cap * std::tanh(s / m.cap);
    case ScoreModKind::kBias: return s + double(m.bias_at(b, h, q, k));
  }
  return s;
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

double score_mod_grad_double(const ScoreMod& m, double s) {
  static_assert(chain_rule_count() == 1 && has_chain_rule(ScoreModKind::kSoftcap),
                "score_mod_grad_double knows softcap's derivative alone: give the new score_mod's here");
  if (m.kind != ScoreModKind::kSoftcap) return 1.0;
  const double th = std::tanh(s / m.cap);
  return 1.0 - th * th;
}

void mods_attention_cpu(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score,
                        const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                        std::vector<double>& o_ref, std::vector<double>& lse_ref, std::vector<double>& o_low) {
  o_ref.assign(size_t(p.o_elems()), 0.0);
  o_low.assign(size_t(p.o_elems()), 0.0);
  lse_ref.assign(size_t(p.lse_elems()), kNegInf);
  std::vector<double> s_ref(size_t(p.Nk));
  std::vector<float> s_low(size_t(p.Nk)), o_acc(size_t(p.Dv));
  std::vector<int> kept;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int64_t head = int64_t(b) * p.H + h, kvh = p.kv_head(head);
      for (int i = 0; i < p.Nq; ++i) {
        const double* qi = q.data() + (head * p.Nq + i) * p.D;
        kept.clear();
        double m = kNegInf;
        float m_low = -INFINITY;
        for (int j = 0; j < p.Nk; ++j) {
          if (!mask(b, h, i, j)) continue;
          const double* kj = k.data() + (kvh * p.Nk + j) * p.D;
          double dot = 0;
          float dot_low = 0.f;
          for (int d = 0; d < p.D; ++d) {
            dot += qi[d] * kj[d];
            dot_low += float(qi[d]) * float(kj[d]);
          }
          s_ref[size_t(j)] = score_mod_double(score, double(p.scale) * dot, b, h, i, j);
          s_low[size_t(j)] = score(p.scale * dot_low, b, h, i, j);
          m = std::max(m, s_ref[size_t(j)]);
          m_low = std::max(m_low, s_low[size_t(j)]);
          kept.push_back(j);
        }
        if (kept.empty()) continue;  // O = 0, LSE = -inf
        double l = 0;
        float l_low = 0.f;
        for (int j : kept) {
          l += std::exp(s_ref[size_t(j)] - m);
          l_low += std::exp(s_low[size_t(j)] - m_low);
        }
        const int64_t row = head * p.Nq + i;
        lse_ref[size_t(row)] = m + std::log(l);
        double* o = o_ref.data() + row * p.Dv;
        std::fill(o_acc.begin(), o_acc.end(), 0.f);
        for (int j : kept) {
          const double* vj = v.data() + (kvh * p.Nk + j) * p.Dv;
          const double P = std::exp(s_ref[size_t(j)] - m) / l;
          const float P_low = float(round_to(std::exp(s_low[size_t(j)] - m_low) / l_low, p.dtype));
          for (int d = 0; d < p.Dv; ++d) {
            o[d] += P * vj[d];
            o_acc[size_t(d)] += P_low * float(vj[d]);
          }
        }
        for (int d = 0; d < p.Dv; ++d) o_low[size_t(row * p.Dv + d)] = round_to(o_acc[size_t(d)], p.dtype);
      }
    }
}

}  // namespace attnlab
