#include "reference/masked_reference_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace attnlab {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The raw and capped scores of row (b, h, i): s = scale·q·k + bias, t = capped s
// (-inf where not visible).
void row_scores(const MaskedProblem& p, const MaskedInputs& in, int b, int h, int i, std::vector<double>& s,
                std::vector<double>& t) {
  const int hk = h / (p.H / p.Hkv);
  const double* q = in.q.data() + ((int64_t(b) * p.H + h) * p.Nq + i) * p.D;
  s.assign(size_t(p.Nk), 0.0);
  t.assign(size_t(p.Nk), kNegInf);
  for (int j = 0; j < p.Nk; ++j) {
    if (!p.visible(b, h, i, j, in.mask)) continue;
    const double* k = in.k.data() + ((int64_t(b) * p.Hkv + hk) * p.Nk + j) * p.D;
    double dot = 0;
    for (int d = 0; d < p.D; ++d) dot += q[d] * k[d];
    s[size_t(j)] = p.scale * dot + (p.has_bias ? in.bias[size_t(p.offset(p.bias_shape, b, h, i, j))] : 0.0);
    t[size_t(j)] = p.softcap > 0 ? p.softcap * std::tanh(s[size_t(j)] / p.softcap) : s[size_t(j)];
  }
}

// Softmax of t in place (all -inf -> all 0); returns the log-sum-exp.
double softmax_inplace(std::vector<double>& t) {
  const double m = *std::max_element(t.begin(), t.end());
  if (m == kNegInf) {
    std::fill(t.begin(), t.end(), 0.0);
    return kNegInf;
  }
  double l = 0;
  for (double& x : t) l += (x = std::exp(x - m));
  for (double& x : t) x /= l;
  return m + std::log(l);
}

}  // namespace

int64_t MaskedProblem::offset(const BroadcastShape& shape, int b, int h, int i, int j) const {
  const int bb = shape.b == 1 ? 0 : b;
  const int hh = shape.h == 1 ? 0 : (shape.h == H ? h : h / (H / Hkv));
  const int ii = shape.q == 1 ? 0 : i;
  return ((int64_t(bb) * shape.h + hh) * shape.q + ii) * shape.k + j;
}

bool MaskedProblem::visible(int b, int h, int i, int j, const std::vector<uint8_t>& mask) const {
  if (causal && int64_t(j) > int64_t(i) + (int64_t(Nk) - Nq)) return false;
  return !has_mask || mask[size_t(offset(mask_shape, b, h, i, j))] != 0;
}

void masked_attention_forward_cpu(const MaskedProblem& p, const MaskedInputs& in, std::vector<double>& o,
                                  std::vector<double>& lse) {
  o.assign(size_t(int64_t(p.B) * p.H * p.Nq * p.Dv), 0.0);
  lse.assign(size_t(int64_t(p.B) * p.H * p.Nq), kNegInf);
  std::vector<double> s, t;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int hk = h / (p.H / p.Hkv);
      for (int i = 0; i < p.Nq; ++i) {
        row_scores(p, in, b, h, i, s, t);
        const int64_t row = (int64_t(b) * p.H + h) * p.Nq + i;
        lse[size_t(row)] = softmax_inplace(t);
        for (int j = 0; j < p.Nk; ++j) {
          if (t[size_t(j)] == 0.0) continue;
          const double* v = in.v.data() + ((int64_t(b) * p.Hkv + hk) * p.Nk + j) * p.Dv;
          for (int d = 0; d < p.Dv; ++d) o[size_t(row * p.Dv + d)] += t[size_t(j)] * v[d];
        }
      }
    }
}

void masked_attention_backward_cpu(const MaskedProblem& p, const MaskedInputs& in, const std::vector<double>& dout,
                                   MaskedGrads& g) {
  g.dq.assign(in.q.size(), 0.0);
  g.dk.assign(in.k.size(), 0.0);
  g.dv.assign(in.v.size(), 0.0);
  g.dbias.assign(p.has_bias ? size_t(p.bias_shape.elems()) : 0, 0.0);
  std::vector<double> s, P, dp;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int hk = h / (p.H / p.Hkv);
      for (int i = 0; i < p.Nq; ++i) {
        row_scores(p, in, b, h, i, s, P);
        softmax_inplace(P);
        const int64_t row = (int64_t(b) * p.H + h) * p.Nq + i;
        const double* dO = dout.data() + row * p.Dv;
        const double* q = in.q.data() + row * p.D;
        // dP_j = dO·v_j;  dT_j = P_j (dP_j - Σ_l P_l dP_l)
        dp.assign(size_t(p.Nk), 0.0);
        double p_dot_dp = 0;
        for (int j = 0; j < p.Nk; ++j) {
          if (P[size_t(j)] == 0.0) continue;
          const int64_t kv = (int64_t(b) * p.Hkv + hk) * p.Nk + j;
          const double* v = in.v.data() + kv * p.Dv;
          for (int d = 0; d < p.Dv; ++d) {
            dp[size_t(j)] += dO[d] * v[d];
            g.dv[size_t(kv * p.Dv + d)] += P[size_t(j)] * dO[d];
          }
          p_dot_dp += P[size_t(j)] * dp[size_t(j)];
        }
        for (int j = 0; j < p.Nk; ++j) {
          if (P[size_t(j)] == 0.0) continue;
          double ds = P[size_t(j)] * (dp[size_t(j)] - p_dot_dp);
          if (p.softcap > 0) {
            const double th = std::tanh(s[size_t(j)] / p.softcap);
            ds *= 1.0 - th * th;  // d/ds c·tanh(s/c)
          }
          const int64_t kv = (int64_t(b) * p.Hkv + hk) * p.Nk + j;
          const double* k = in.k.data() + kv * p.D;
          for (int d = 0; d < p.D; ++d) {
            g.dq[size_t(row * p.D + d)] += p.scale * ds * k[d];
            g.dk[size_t(kv * p.D + d)] += p.scale * ds * q[d];
          }
          if (p.has_bias) g.dbias[size_t(p.offset(p.bias_shape, b, h, i, j))] += ds;
        }
      }
    }
}

std::vector<uint8_t> build_topk_mask_cpu(const MaskedProblem& p, const std::vector<double>& bias, int window,
                                         int block_size) {
  const BroadcastShape& bs = p.bias_shape;
  std::vector<uint8_t> mask(size_t(int64_t(bs.b) * bs.h * p.Nq * p.Nk), 0);
  std::vector<int> allowed;
  for (int b = 0; b < bs.b; ++b)
    for (int h = 0; h < bs.h; ++h)
      for (int i = 0; i < p.Nq; ++i) {
        uint8_t* row = mask.data() + ((int64_t(b) * bs.h + h) * p.Nq + i) * p.Nk;
        const double* brow = bias.data() + ((int64_t(b) * bs.h + h) * bs.q + (bs.q == 1 ? 0 : i)) * p.Nk;
        allowed.clear();
        for (int j = 0; j < p.Nk; ++j)
          if (!p.causal || int64_t(j) <= int64_t(i) + (int64_t(p.Nk) - p.Nq)) allowed.push_back(j);
        const size_t keep = std::min(allowed.size(), size_t(std::max(window, 0)));
        std::stable_sort(allowed.begin(), allowed.end(), [&](int a, int c) { return brow[a] > brow[c]; });
        for (size_t n = 0; n < keep; ++n) row[allowed[n]] = 1;
        if (block_size <= 0) continue;
        for (int j0 = 0; j0 < p.Nk; j0 += block_size) {
          const int j1 = std::min(p.Nk, j0 + block_size);
          const int kept = int(std::accumulate(row + j0, row + j1, 0));
          const bool majority = 2 * kept > j1 - j0;
          for (int j = j0; j < j1; ++j) {
            const bool causal_ok = !p.causal || int64_t(j) <= int64_t(i) + (int64_t(p.Nk) - p.Nq);
            row[j] = majority && causal_ok ? 1 : 0;
          }
        }
      }
  return mask;
}

int64_t masked_unmasked_pairs(const MaskedProblem& p, const std::vector<uint8_t>& mask) {
  int64_t pairs = 0;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < p.Nq; ++i)
        for (int j = 0; j < p.Nk; ++j) pairs += p.visible(b, h, i, j, mask) ? 1 : 0;
  return pairs;
}

std::vector<uint32_t> pack_mask_bits_cpu(const std::vector<uint8_t>& mask, int64_t rows, int Nk) {
  const int64_t row_words = 2 * ((int64_t(Nk) + 63) / 64);
  std::vector<uint32_t> bits(size_t(rows * row_words), 0u);
  for (int64_t r = 0; r < rows; ++r)
    for (int k = 0; k < Nk; ++k)
      if (mask[size_t(r * Nk + k)] != 0) bits[size_t(r * row_words + k / 32)] |= 1u << (k % 32);
  return bits;
}

}  // namespace attnlab
