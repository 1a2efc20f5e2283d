// The block-sparse backward (kernels/blocksparse/blocksparse_bwd.h) against a
// CPU double-precision reference backward that applies the mask_mod and the
// score_mod pair by pair, on fresh normal inputs per case: O and LSE from the
// same reference's forward (O rounded to the dtype, as a forward stores it),
// dO random; dQ, dK, dV poisoned with NaN before the launch, then each held on
// its own to the project's rule (kernels/reference/reference.h, judge):
// max|g - g_ref| <= 2·(the same-precision unfused error) + 2·(rounding of g_ref
// to the dtype), nothing NaN or unwritten. The same-precision path is computed
// here as an unfused fp16/bf16 backward would (reference_backward.cu's
// low_precision): S, P, dP, dS rounded to the dtype where it stores them, fp32
// sums, the gradients rounded. Exactly zero: dQ rows that see no key, dK and dV
// rows of keys that no query sees. A bias score_mod's gradient dBias (fp32,
// from zeros) is held to the same rule on its own against dS' (the gradient
// of s', before the chain rule) summed over the bias's broadcast dimensions:
// in double, and in the same precision from the dtype's dS (fp32 sums, then
// rounded to the dtype).
// Cases: every mask_mod over lengths 1, 17, 113 x 203, 239 x 1, 799 x 3,
// 300 x 1000, rotating the score_mods, head dims, dtypes, block sizes (128 x 128,
// 256 x 256, 128 x 256, 256 x 128) and MHA / GQA / MQA, every third one
// deterministic; causal with Nq != Nk, whole key blocks no query sees, every
// score_mod in both dtypes, lists broadcast over B and H; D = 256; the deterministic
// mode bitwise identical over 5 more runs (dBias too where it is stored, not
// added); the mods that read tensors — a tensor mask_mod (random keep bits in
// dmattn's packing, the padding bits set) and a bias score_mod (random, in the
// input dtype) whose dBias is stored ([B, H, Nq, Nk]) or added (broadcast),
// ragged, GQA, D = 256, both dtypes, each also refused without its tensors;
// the refusals; and a negative control (the kernel given another score_mod
// must fail). Options: gpu_testing.h's CaseArgs (-v, --only TEXT).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../block_mask_cases.h"
#include "../tensor_mods_cases.h"
#include "blocksparse_cases.h"
#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/blocksparse_bwd.h"
#include "blocksparse/mods.h"
#include "dmattn/dmattn.h"
#include "gpu_testing.h"
#include "host/device.h"
#include "reference/mods_reference.h"
#include "reference/reference.h"

using namespace attnlab;
using namespace attnlab::testing;
using namespace attnlab::tensor_mods_cases;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kDeterminismRuns = 5;
bool verbose = false;  // -v: one line per case, passing or not
CaseArgs args;

// The mods with their tensors attached (tensor_mods_cases.h's attach) and,
// where given, dBias in the bias's shape, added where that shape is broadcast.
void attach(MaskMod& mask, ScoreMod& score, const PairShape& s, const AttnProblem& p, const void* bits,
            const void* bias, float* dbias) {
  tensor_mods_cases::attach(mask, score, s, p, bits, bias);
  if (score.kind == ScoreModKind::kBias) {
    score.dbias = dbias;
    score.dbias_at = s.strides(p.Nk);
    score.dbias_add = (s.b == 1 && p.B > 1) || (s.h == 1 && p.H > 1) || (s.q == 1 && p.Nq > 1);
  }
}

struct Case {
  std::string mask, score;
  int Nq, Nk, D, Dv;
  DType dtype;
  int block_q, block_kv;
  int B, H, Hkv;
  bool deterministic = false;
  bool broadcast_lists = false;   // one list per key block for every (b, h)
  std::string kernel_score = "";  // a negative control: the kernel runs this score_mod, and must fail
  Form form = Form::kFull;        // the tensor mask_mod's words, the bias and dBias

  bool reads_tensors() const { return mask == "tensor" || score == "bias"; }
  std::string name() const {
    char buf[260];
    std::snprintf(buf, sizeof buf, "%s + %s, %dx%d, D=%d/%d, %s, blocks %dx%d, B=%d H=%d Hkv=%d%s%s%s%s", mask.c_str(),
                  score.c_str(), Nq, Nk, D, Dv, dtype_name(dtype), block_q, block_kv, B, H, Hkv,
                  deterministic ? ", deterministic" : "", broadcast_lists ? ", lists broadcast" : "",
                  reads_tensors() ? ", tensors " : "", reads_tensors() ? form_name(form) : "");
    return buf;
  }
};

// The references of one problem: the forward's O (rounded, the kernel's input)
// and LSE, the double backward, the same-precision one, and which keys some
// query sees; with a bias score_mod, dBias in its shape.
struct References {
  std::vector<uint16_t> o_bits;
  std::vector<float> lse;
  std::vector<double> dq, dk, dv;           // double
  std::vector<double> dq_lp, dk_lp, dv_lp;  // same precision, rounded to the dtype
  std::vector<int> key_seen;                // [B·Hkv·Nk]
  std::vector<double> dbias, dbias_lp;      // [rows of the bias's shape][Nk]: double; same precision, rounded
};

// One (b, h): its rows of O, LSE, dQ, and its contributions to dK, dV and
// (with a bias score_mod) dBias: dS' of each pair, [Nq][Nk].
struct HeadPart {
  std::vector<double> dk, dv, ds;
  std::vector<float> dk_lp, dv_lp, ds_lp;
  std::vector<int> seen;
};

void reference_head(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score, int b, int h,
                    const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                    const std::vector<double>& dout, References& r, std::vector<float>& dq_acc, HeadPart& part) {
  const int64_t head = int64_t(b) * p.H + h, kvh = p.kv_head(head);
  const DType t = p.dtype;
  part.dk.assign(size_t(p.Nk) * p.D, 0.0);
  part.dv.assign(size_t(p.Nk) * p.Dv, 0.0);
  part.dk_lp.assign(size_t(p.Nk) * p.D, 0.f);
  part.dv_lp.assign(size_t(p.Nk) * p.Dv, 0.f);
  part.seen.assign(size_t(p.Nk), 0);
  const bool bias = score.kind == ScoreModKind::kBias;
  part.ds.assign(bias ? size_t(p.Nq) * p.Nk : 0, 0.0);  // dS' = 0 where the pair is dropped
  part.ds_lp.assign(part.ds.size(), 0.f);
  std::vector<double> s_pre(size_t(p.Nk)), s_mod(size_t(p.Nk)), P(size_t(p.Nk)), dP(size_t(p.Nk));
  std::vector<float> s_lp_pre(size_t(p.Nk)), s_lp(size_t(p.Nk)), P_lp(size_t(p.Nk)), dP_lp(size_t(p.Nk));
  std::vector<double> o(size_t(p.Dv));
  std::vector<int> kept;
  for (int i = 0; i < p.Nq; ++i) {
    const int64_t row = head * p.Nq + i;
    const double* qi = q.data() + row * p.D;
    const double* doi = dout.data() + row * p.Dv;
    kept.clear();
    double m = kNegInf;
    float m_lp = -INFINITY;
    for (int j = 0; j < p.Nk; ++j) {
      if (!mask(b, h, i, j)) continue;
      const double* kj = k.data() + (kvh * p.Nk + j) * p.D;
      double dot = 0;
      float dot_lp = 0.f;
      for (int d = 0; d < p.D; ++d) {
        dot += qi[d] * kj[d];
        dot_lp += float(qi[d]) * float(kj[d]);
      }
      s_pre[size_t(j)] = double(p.scale) * dot;
      s_mod[size_t(j)] = score_mod_double(score, s_pre[size_t(j)], b, h, i, j);
      s_lp_pre[size_t(j)] = p.scale * dot_lp;
      s_lp[size_t(j)] = float(round_to(score(s_lp_pre[size_t(j)], b, h, i, j), t));  // S stored in the dtype
      m = std::max(m, s_mod[size_t(j)]);
      m_lp = std::max(m_lp, s_lp[size_t(j)]);
      kept.push_back(j);
      ++part.seen[size_t(j)];
    }
    uint16_t* o_row = r.o_bits.data() + row * p.Dv;
    if (kept.empty()) {  // O = 0, LSE = -inf; no gradient
      for (int d = 0; d < p.Dv; ++d) o_row[d] = to_bits(0.0, t);
      r.lse[size_t(row)] = -INFINITY;
      continue;
    }
    double l = 0;
    float l_lp = 0.f;
    for (int j : kept) {
      l += std::exp(s_mod[size_t(j)] - m);
      l_lp += std::exp(s_lp[size_t(j)] - m_lp);
    }
    const double lse = m + std::log(l);
    r.lse[size_t(row)] = float(lse);
    std::fill(o.begin(), o.end(), 0.0);
    double delta = 0;
    float delta_lp = 0.f;
    for (int j : kept) {
      const double* vj = v.data() + (kvh * p.Nk + j) * p.Dv;
      P[size_t(j)] = std::exp(s_mod[size_t(j)] - lse);
      P_lp[size_t(j)] = float(round_to(std::exp(s_lp[size_t(j)] - m_lp) / l_lp, t));
      double dp = 0;
      float dp_lp = 0.f;
      for (int d = 0; d < p.Dv; ++d) {
        o[size_t(d)] += P[size_t(j)] * vj[d];
        dp += doi[d] * vj[d];
        dp_lp += float(doi[d]) * float(vj[d]);
      }
      dP[size_t(j)] = dp;
      dP_lp[size_t(j)] = float(round_to(dp_lp, t));
      delta += P[size_t(j)] * dp;
      delta_lp += P_lp[size_t(j)] * dP_lp[size_t(j)];
    }
    for (int d = 0; d < p.Dv; ++d) o_row[d] = to_bits(o[size_t(d)], t);
    double* dqi = r.dq.data() + row * p.D;
    float* dqi_lp = dq_acc.data() + row * p.D;
    for (int j : kept) {
      const double* kj = k.data() + (kvh * p.Nk + j) * p.D;
      const double dS = P[size_t(j)] * (dP[size_t(j)] - delta) * score_mod_grad_double(score, s_pre[size_t(j)]);
      const float dS_lp =
          float(round_to(P_lp[size_t(j)] * (dP_lp[size_t(j)] - delta_lp) * score.grad(s_lp_pre[size_t(j)]), t));
      if (bias) {  // dS', before the chain rule (ds'/ds = 1 for a bias: the same values)
        part.ds[size_t(i) * p.Nk + j] = P[size_t(j)] * (dP[size_t(j)] - delta);
        part.ds_lp[size_t(i) * p.Nk + j] = float(round_to(P_lp[size_t(j)] * (dP_lp[size_t(j)] - delta_lp), t));
      }
      double* dkj = part.dk.data() + size_t(j) * p.D;
      float* dkj_lp = part.dk_lp.data() + size_t(j) * p.D;
      for (int d = 0; d < p.D; ++d) {
        dqi[d] += double(p.scale) * dS * kj[d];
        dqi_lp[d] += p.scale * dS_lp * float(kj[d]);
        dkj[d] += double(p.scale) * dS * qi[d];
        dkj_lp[d] += p.scale * dS_lp * float(qi[d]);
      }
      double* dvj = part.dv.data() + size_t(j) * p.Dv;
      float* dvj_lp = part.dv_lp.data() + size_t(j) * p.Dv;
      for (int d = 0; d < p.Dv; ++d) {
        dvj[d] += P[size_t(j)] * doi[d];
        dvj_lp[d] += P_lp[size_t(j)] * float(doi[d]);
      }
    }
  }
}

// Every (b, h) on its own thread group, the contributions to dK, dV (and
// dBias, into the bias's shape `bias_shape`) summed in head order.
void references(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score, const PairShape& bias_shape,
                const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                const std::vector<double>& dout, References& r) {
  r.o_bits.assign(size_t(p.o_elems()), 0);
  r.lse.assign(size_t(p.lse_elems()), 0.f);
  r.dq.assign(size_t(p.q_elems()), 0.0);
  r.dk.assign(size_t(p.k_elems()), 0.0);
  r.dv.assign(size_t(p.v_elems()), 0.0);
  std::vector<float> dq_acc(size_t(p.q_elems()), 0.f), dk_acc(size_t(p.k_elems()), 0.f),
      dv_acc(size_t(p.v_elems()), 0.f);
  r.key_seen.assign(size_t(int64_t(p.B) * p.kv_heads() * p.Nk), 0);
  const bool bias = score.kind == ScoreModKind::kBias;
  r.dbias.assign(bias ? size_t(bias_shape.rows() * p.Nk) : 0, 0.0);
  std::vector<float> dbias_acc(r.dbias.size(), 0.f);
  const BroadcastOperand dbias_at = bias_shape.strides(p.Nk);
  const int heads = p.B * p.H;
  std::vector<HeadPart> parts(static_cast<size_t>(heads));
  const int workers = int(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int x = w; x < heads; x += workers)
        reference_head(p, mask, score, x / p.H, x % p.H, q, k, v, dout, r, dq_acc, parts[size_t(x)]);
    });
  for (std::thread& th : pool) th.join();
  for (int x = 0; x < heads; ++x) {
    const int64_t kvh = p.kv_head(x);
    const HeadPart& part = parts[size_t(x)];
    for (size_t e = 0; e < part.dk.size(); ++e) {
      r.dk[size_t(kvh * p.Nk * p.D) + e] += part.dk[e];
      dk_acc[size_t(kvh * p.Nk * p.D) + e] += part.dk_lp[e];
    }
    for (size_t e = 0; e < part.dv.size(); ++e) {
      r.dv[size_t(kvh * p.Nk * p.Dv) + e] += part.dv[e];
      dv_acc[size_t(kvh * p.Nk * p.Dv) + e] += part.dv_lp[e];
    }
    for (int j = 0; j < p.Nk; ++j) r.key_seen[size_t(kvh * p.Nk + j)] += part.seen[size_t(j)];
    for (int i = 0; bias && i < p.Nq; ++i) {
      const int64_t row = dbias_at.row_offset(x / p.H, x % p.H, i);
      for (int j = 0; j < p.Nk; ++j) {
        r.dbias[size_t(row + j)] += part.ds[size_t(i) * p.Nk + j];
        dbias_acc[size_t(row + j)] += part.ds_lp[size_t(i) * p.Nk + j];
      }
    }
  }
  auto rounded = [&](const std::vector<float>& acc) {
    std::vector<double> out(acc.size());
    for (size_t e = 0; e < acc.size(); ++e) out[e] = round_to(acc[e], p.dtype);
    return out;
  };
  r.dq_lp = rounded(dq_acc);
  r.dk_lp = rounded(dk_acc);
  r.dv_lp = rounded(dv_acc);
  r.dbias_lp = rounded(dbias_acc);
}

// dBias (fp32) against its double reference and the same-precision one, as
// compare_output holds a 16-bit gradient: the rounding floor is the dtype's
// (the bias's, which an unfused backward would return).
struct DBiasComparison {
  ErrorStats stats;
  double baseline_err = 0, rounding_err = 0;
};
DBiasComparison compare_dbias(const std::vector<float>& got, const std::vector<double>& ref,
                              const std::vector<double>& low, DType t) {
  DBiasComparison c;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    if (!std::isfinite(got[i])) ++c.stats.nonfinite;
    else c.stats.max_abs_err = std::max(c.stats.max_abs_err, std::fabs(double(got[i]) - ref[i]));
    c.baseline_err = std::max(c.baseline_err, std::fabs(low[i] - ref[i]));
    const float rf = float(ref[i]);
    c.rounding_err = std::max(c.rounding_err, double(std::fabs(float(round_to(rf + 0.3f, t)) - 0.3f - rf)));
  }
  return c;
}

template <typename T>
void upload_to(void* dev, const std::vector<T>& host) {
  cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
}

// dQ, dK, dV as raw bits.
struct Grads {
  std::vector<uint16_t> g[3];
};
Grads download(const AttnGradBuffers& b, const AttnProblem& p) {
  Grads out;
  void* src[3] = {b.dq, b.dk, b.dv};
  const int64_t n[3] = {p.q_elems(), p.k_elems(), p.v_elems()};
  for (int i = 0; i < 3; ++i) {
    out.g[i].resize(size_t(n[i]));
    cudaMemcpy(out.g[i].data(), src[i], size_t(n[i]) * 2, cudaMemcpyDeviceToHost);
  }
  return out;
}

// Poisons the gradients (NaN in both dtypes), zeroes dBias (`dbias_elems`
// floats at score.dbias, the caller's part), runs the kernel, waits.
cudaError_t run_once(const AttnProblem& p, const AttnGradBuffers& b, const BlockMaskView& view, const MaskMod& mask,
                     const ScoreMod& score, bool deterministic, size_t dbias_elems) {
  cudaMemset(b.dq, 0xff, size_t(p.q_elems()) * 2);
  cudaMemset(b.dk, 0xff, size_t(p.k_elems()) * 2);
  cudaMemset(b.dv, 0xff, size_t(p.v_elems()) * 2);
  if (score.dbias != nullptr) cudaMemset(score.dbias, 0, dbias_elems * 4);
  cudaError_t err = blocksparse_bwd(p, b, view, mask, score, deterministic, nullptr);
  return err == cudaSuccess ? cudaDeviceSynchronize() : err;
}

// Runs one case and records it; false when the GPU is no longer usable.
bool run_case(const Case& c, std::mt19937_64& rng) {
  const std::string what = c.name();
  AttnProblem p;
  p.B = c.B, p.H = c.H, p.Hkv = c.Hkv, p.Nq = c.Nq, p.Nk = c.Nk, p.D = c.D, p.Dv = c.Dv, p.dtype = c.dtype;
  p.scale = default_scale(c.D);
  std::string why;
  MaskMod mask = parse_mask_mod(c.mask, c.Nq, c.Nk, why);
  ScoreMod score = parse_score_mod(c.score, c.H, why);
  ScoreMod kernel_score = c.kernel_score.empty() ? score : parse_score_mod(c.kernel_score, c.H, why);
  if (!why.empty()) {
    record(false, what + ": " + why);
    return true;
  }
  std::vector<uint16_t> qb, kb, vb, dob;
  std::vector<double> q, k, v, dout;
  random_tensor(rng, p.q_elems(), p.dtype, 1.0, qb, q);
  random_tensor(rng, p.k_elems(), p.dtype, 1.0, kb, k);
  random_tensor(rng, p.v_elems(), p.dtype, 1.0, vb, v);
  random_tensor(rng, p.o_elems(), p.dtype, 1.0, dob, dout);
  const PairShape tensor_shape = pair_shape(c.form, c.B, c.H, c.Nq);
  const ModTensors tensors =
      draw_mod_tensors(rng, p, tensor_shape, mask.kind == MaskModKind::kTensor,
                       score.kind == ScoreModKind::kBias || kernel_score.kind == ScoreModKind::kBias);
  MaskMod host_mask = mask;
  if (mask.kind == MaskModKind::kDocument) host_mask.doc = tensors.doc.data(), host_mask.doc_len = tensors.doc_len;
  attach(host_mask, score, tensor_shape, p, tensors.bits.data(), tensors.bias_bits.data(), nullptr);
  References ref;
  references(p, host_mask, score, tensor_shape, q, k, v, dout, ref);

  DeviceBuffers dev;
  const int lists_B = c.broadcast_lists ? 1 : c.B, lists_H = c.broadcast_lists ? 1 : c.H;
  const size_t mask_bytes = block_mask_device_bytes(lists_B, lists_H, c.Nq, c.Nk, c.block_q, c.block_kv);
  void* mask_base = dev.alloc<void>(mask_bytes);
  void* d_q = dev.alloc<void>(qb.size() * 2);
  void* d_k = dev.alloc<void>(kb.size() * 2);
  void* d_v = dev.alloc<void>(vb.size() * 2);
  void* d_o = dev.alloc<void>(ref.o_bits.size() * 2);
  void* d_do = dev.alloc<void>(dob.size() * 2);
  float* d_lse = dev.alloc<float>(ref.lse.size() * 4);
  void* d_dq = dev.alloc<void>(qb.size() * 2);
  void* d_dk = dev.alloc<void>(kb.size() * 2);
  void* d_dv = dev.alloc<void>(vb.size() * 2);
  int32_t* d_doc = dev.alloc<int32_t>(tensors.doc.size() * 4);
  uint32_t* d_bits = dev.alloc<uint32_t>(tensors.bits.size() * 4);
  void* d_bias = dev.alloc<void>(tensors.bias_bits.size() * 2);
  const size_t dbias_elems = tensors.bias_bits.size();  // dBias in the bias's shape
  float* d_dbias = dev.alloc<float>(dbias_elems * 4);
  if (!mask_base || !d_q || !d_k || !d_v || !d_o || !d_do || !d_lse || !d_dq || !d_dk || !d_dv || !d_doc || !d_bits ||
      !d_bias || !d_dbias) {
    record(false, what + ": out of device memory");
    return true;
  }
  upload_to(d_q, qb), upload_to(d_k, kb), upload_to(d_v, vb), upload_to(d_o, ref.o_bits), upload_to(d_do, dob);
  upload_to(d_lse, ref.lse), upload_to(d_doc, tensors.doc), upload_to(d_bits, tensors.bits);
  upload_to(d_bias, tensors.bias_bits);
  cudaMemset(mask_base, 0xff, mask_bytes);
  MaskMod dev_mask = mask;
  if (mask.kind == MaskModKind::kDocument) dev_mask.doc = d_doc, dev_mask.doc_len = tensors.doc_len;
  const MaskMod bare_mask = dev_mask;  // before the tensors are attached
  const ScoreMod bare_score = kernel_score;
  attach(dev_mask, kernel_score, tensor_shape, p, d_bits, d_bias, d_dbias);
  const BlockMaskView view = block_mask_view(mask_base, lists_B, lists_H, c.Nq, c.Nk, c.block_q, c.block_kv);
  cudaError_t err = build_block_mask_from_mod(dev_mask, view, nullptr);
  if (const std::string refused = blocksparse_bwd_unsupported(p, view); !refused.empty()) {
    record(false, what + ": unsupported: " + refused);
    return true;
  }
  const size_t ws_bytes = blocksparse_bwd_workspace_bytes(p, view);
  void* d_ws = dev.alloc<void>(ws_bytes);
  if (!d_ws) {
    record(false, what + ": out of device memory (workspace)");
    return true;
  }
  AttnGradBuffers b;
  b.q = d_q, b.k = d_k, b.v = d_v, b.o = d_o, b.lse = d_lse, b.dout = d_do;
  b.dq = d_dq, b.dk = d_dk, b.dv = d_dv, b.workspace = d_ws, b.workspace_bytes = ws_bytes;
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err == cudaSuccess && c.reads_tensors()) {  // without its tensors, refused before any launch
    const cudaError_t refused = blocksparse_bwd(p, b, view, bare_mask, bare_score, c.deterministic, nullptr);
    record(refused == cudaErrorInvalidValue, what + ": without its tensors must be refused, got " +
                                                 cudaGetErrorString(refused));
    if (refused != cudaErrorInvalidValue) return gpu_still_usable(cudaGetErrorString(refused));
  }
  if (err == cudaSuccess) err = run_once(p, b, view, dev_mask, kernel_score, c.deterministic, dbias_elems);
  if (err != cudaSuccess) {
    record(false, what + ": " + cudaGetErrorString(err));
    return gpu_still_usable(cudaGetErrorString(err));
  }
  const Grads got = download(b, p);
  std::vector<float> dbias(kernel_score.dbias != nullptr ? dbias_elems : 0);
  cudaMemcpy(dbias.data(), d_dbias, dbias.size() * 4, cudaMemcpyDeviceToHost);

  // Each gradient on its own, by the project's rule.
  const std::vector<double>* refs[3] = {&ref.dq, &ref.dk, &ref.dv};
  const std::vector<double>* lps[3] = {&ref.dq_lp, &ref.dk_lp, &ref.dv_lp};
  const char* names[3] = {"dQ", "dK", "dV"};
  bool pass = true;
  std::string summary;
  for (int gi = 0; gi < 3; ++gi) {
    const OutputComparison cmp = compare_output(got.g[gi], *refs[gi], *lps[gi], p.dtype);
    const CheckResult cr = judge(cmp.stats, ErrorStats{}, cmp.baseline_err, cmp.rounding_err);
    pass = pass && cr.pass;
    summary += std::string(gi ? "; " : "") + names[gi] + " " + cr.summary();
  }
  if (score.kind == ScoreModKind::kBias) {  // dBias (fp32) on its own, by the same rule
    const DBiasComparison cmp = compare_dbias(dbias, ref.dbias, ref.dbias_lp, p.dtype);
    const CheckResult cr = judge(cmp.stats, ErrorStats{}, cmp.baseline_err, cmp.rounding_err);
    pass = pass && cr.pass && dbias.size() == ref.dbias.size();
    summary += std::string("; dBias ") + (dbias.size() == ref.dbias.size() ? cr.summary() : "not written");
  }
  // Exactly zero: dQ rows that see no key, dK and dV rows of keys that no query sees.
  int64_t zero_rows_wrong = 0;
  for (int64_t row = 0; row < p.lse_elems(); ++row)
    if (ref.lse[size_t(row)] == -INFINITY)
      for (int d = 0; d < p.D; ++d)
        if (from_bits(got.g[0][size_t(row * p.D + d)], p.dtype) != 0.0) {
          ++zero_rows_wrong;
          break;
        }
  for (int64_t key = 0; key < int64_t(ref.key_seen.size()); ++key)
    if (ref.key_seen[size_t(key)] == 0) {
      bool zero = true;
      for (int d = 0; d < p.D; ++d) zero = zero && from_bits(got.g[1][size_t(key * p.D + d)], p.dtype) == 0.0;
      for (int d = 0; d < p.Dv; ++d) zero = zero && from_bits(got.g[2][size_t(key * p.Dv + d)], p.dtype) == 0.0;
      if (!zero) ++zero_rows_wrong;
    }
  char extra[96] = "";
  if (zero_rows_wrong > 0)
    std::snprintf(extra, sizeof extra, ", %lld rows without keys (or keys without queries) not 0",
                  static_cast<long long>(zero_rows_wrong));
  pass = pass && zero_rows_wrong == 0;
  if (verbose) std::printf("%s %s: %s%s\n", pass ? "pass" : "fail", what.c_str(), summary.c_str(), extra);
  if (!c.kernel_score.empty()) {
    record(!pass, what + " with the kernel's score_mod " + c.kernel_score + " must FAIL");
    return true;
  }
  record(pass, what + ": " + summary + extra);

  if (c.deterministic) {  // bitwise identical over more runs, each into poisoned gradients
    bool identical = true;
    // dBias stored (not added: float atomics sum in any order) bitwise identical as well.
    const bool dbias_fixed = kernel_score.dbias != nullptr && !kernel_score.dbias_add;
    for (int run = 0; run < kDeterminismRuns && err == cudaSuccess; ++run) {
      err = run_once(p, b, view, dev_mask, kernel_score, true, dbias_elems);
      const Grads again = download(b, p);
      for (int gi = 0; gi < 3; ++gi) identical = identical && again.g[gi] == got.g[gi];
      if (dbias_fixed) {
        std::vector<float> dbias_again(dbias.size());
        cudaMemcpy(dbias_again.data(), d_dbias, dbias.size() * 4, cudaMemcpyDeviceToHost);
        identical = identical && std::memcmp(dbias_again.data(), dbias.data(), dbias.size() * 4) == 0;
      }
    }
    record(err == cudaSuccess && identical, what + ": bitwise identical over " + std::to_string(1 + kDeterminismRuns) +
                                                " runs" + (err == cudaSuccess ? "" : std::string(": ") + cudaGetErrorString(err)));
    if (err != cudaSuccess) return gpu_still_usable(cudaGetErrorString(err));
  }
  return true;
}

std::vector<Case> all_cases() {
  struct Shape {
    int Nq, Nk;
  };
  const Shape shapes[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {300, 1000}};
  const char* scores[] = {"none", "rel_bias", "alibi", "softcap:2"};
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}};
  const int blocks[][2] = {{128, 128}, {256, 256}, {128, 256}, {256, 128}};
  const int heads[][3] = {{2, 2, 2}, {1, 4, 2}, {1, 3, 1}};  // B, H, Hkv: MHA, GQA, MQA
  std::vector<Case> cases;
  int n = 0;
  for (const char* mask : block_mask_cases::kMaskModSpecs)
    for (const Shape& s : shapes) {
      const int* d = dims[n % 3];
      const int* blk = blocks[(n / 3) % 4];
      const int* hd = heads[(n / 2) % 3];
      Case c{mask, scores[n % 4], s.Nq, s.Nk, d[0], d[1], (n / 4) % 2 ? DType::kBFloat16 : DType::kFloat16,
             blk[0], blk[1], hd[0], hd[1], hd[2]};
      c.deterministic = n % 3 == 1;
      cases.push_back(c);
      ++n;
    }
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    // Causal with Nq != Nk both ways; with Nq > Nk the first rows see no key (dQ = 0).
    cases.push_back({"causal", "none", 1000, 300, 128, 128, t, 128, 128, 2, 2, 2});
    cases.push_back({"causal", "alibi", 1000, 300, 64, 64, t, 256, 256, 1, 4, 1, true});
    cases.push_back({"causal", "rel_bias", 300, 1000, 192, 128, t, 128, 128, 1, 4, 2});
    // Whole key blocks that no query sees (dK = dV = 0 written), and rows without keys.
    cases.push_back({"sliding_window:64,32", "softcap:2", 130, 520, 64, 64, t, 128, 128, 1, 2, 2, true});
    cases.push_back({"sliding_window:64,32", "none", 520, 130, 128, 128, t, 128, 128, 1, 2, 1});
  }
  // Every score_mod in both dtypes on one mask with partial and full blocks, every head dim.
  for (int i = 0; i < 4; ++i)
    for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
      const int* d = dims[(i + (t == DType::kBFloat16)) % 3];
      cases.push_back({"prefix_lm:150", scores[i], 333, 455, d[0], d[1], t, 128, 128, 1, 2, 1, i % 2 == 1});
    }
  // Key blocks of three tiles, query blocks of several (kv and q subtiling, ragged last blocks).
  cases.push_back({"causal", "none", 700, 900, 64, 64, DType::kFloat16, 384, 384, 1, 2, 2, true});
  cases.push_back({"document", "rel_bias", 700, 700, 128, 128, DType::kBFloat16, 256, 384, 2, 2, 1, true});
  // One list per key block for every batch and head.
  cases.push_back({"causal", "none", 300, 1000, 64, 64, DType::kFloat16, 128, 128, 2, 2, 1, false, true});
  cases.push_back({"block_diagonal:100", "alibi", 511, 511, 128, 128, DType::kBFloat16, 256, 256, 2, 2, 2, true, true});
  // Long walks: many query tiles per key tile, the ring's phases wrapping; deterministic turns over GQA.
  cases.push_back({"none", "none", 2048, 256, 128, 128, DType::kBFloat16, 128, 128, 1, 4, 2, true});
  cases.push_back({"causal", "softcap:2", 1024, 1024, 64, 64, DType::kFloat16, 256, 256, 1, 2, 1, true});
  // D = 256 (rung 15's two chains, 64-key tiles: two per key block): every
  // score_mod, partial and full blocks, rows and keys that see nothing, GQA and
  // MQA, block sizes 128 and 256, deterministic or not.
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    cases.push_back({"causal", "alibi", 700, 300, 256, 256, t, 128, 128, 1, 4, 2});
    cases.push_back({"sliding_window:64,32", "softcap:2", 130, 520, 256, 256, t, 128, 128, 1, 2, 2, true});
  }
  cases.push_back({"mini_causal:37", "rel_bias", 333, 455, 256, 256, DType::kFloat16, 128, 128, 1, 2, 1, true});
  cases.push_back({"document", "none", 600, 600, 256, 256, DType::kBFloat16, 256, 256, 2, 2, 1});
  cases.push_back({"dilated_sliding_window:256,2", "none", 500, 700, 256, 256, DType::kBFloat16, 128, 256, 1, 3, 1});
  cases.push_back({"none", "rel_bias", 17, 17, 256, 256, DType::kFloat16, 128, 128, 1, 2, 2});
  cases.push_back({"causal", "softcap:2", 1, 1, 256, 256, DType::kBFloat16, 128, 128, 1, 2, 1, true});
  // The mods that read tensors: a tensor mask_mod and a bias score_mod, full
  // ([B, H, Nq, Nk]: dBias stored, deterministic runs bitwise identical) and
  // broadcast (dBias added), ragged (17, 113 x 203, 333 x 455), Nq != Nk with
  // rows that see no key and keys no query sees, GQA and MQA, D = 256 (rung
  // 15's two chains record dS' in the dS chain), both dtypes.
  auto in_form = [](Case c, Form f) {
    c.form = f;
    return c;
  };
  cases.push_back({"tensor", "none", 113, 203, 128, 128, DType::kFloat16, 128, 128, 2, 2, 2, true});
  cases.push_back(in_form({"tensor", "bias", 17, 17, 64, 64, DType::kBFloat16, 128, 128, 1, 4, 2}, Form::kHeadsKeys));
  cases.push_back({"none", "bias", 300, 1000, 192, 128, DType::kBFloat16, 128, 256, 2, 2, 2, true});
  cases.push_back(
      in_form({"causal", "bias", 1000, 300, 128, 128, DType::kFloat16, 256, 256, 1, 4, 1}, Form::kHeadsKeys));
  cases.push_back({"tensor", "bias", 333, 455, 256, 256, DType::kFloat16, 128, 128, 1, 2, 2, true});
  cases.push_back(in_form({"sliding_window:64,32", "bias", 520, 130, 64, 64, DType::kBFloat16, 128, 128, 2, 2, 1},
                          Form::kBatchQueries));
  // The check can fail: the kernel given another score_mod than the reference.
  Case wrong{"causal", "none", 300, 1000, 128, 128, DType::kBFloat16, 128, 128, 1, 2, 2};
  wrong.kernel_score = "alibi";
  cases.push_back(wrong);
  return cases;
}

// Head dims 128/64, block sizes that are not multiples of the tile, p.causal,
// and a workspace that is too small are refused, and blocksparse_bwd does not launch them.
void refusals() {
  struct Refused {
    int D, Dv, block_q, block_kv;
    bool causal;
  };
  for (const Refused& r : {Refused{128, 64, 128, 128, false}, Refused{256, 256, 128, 32, false},
                           Refused{128, 128, 128, 64, false},
                           Refused{64, 64, 64, 128, false}, Refused{192, 128, 32, 128, false},
                           Refused{128, 128, 128, 128, true}}) {
    AttnProblem p;
    p.B = 1, p.H = 1, p.Nq = 300, p.Nk = 300, p.D = r.D, p.Dv = r.Dv, p.causal = r.causal;
    BlockMaskView view;
    view.B = 1, view.H = 1, view.Nq = 300, view.Nk = 300, view.block_q = r.block_q, view.block_kv = r.block_kv;
    view.m_blocks = (300 + r.block_q - 1) / r.block_q, view.n_blocks = (300 + r.block_kv - 1) / r.block_kv;
    static int32_t dummy[1];
    view.kv_count = view.kv_index = view.full_count = view.full_index = dummy;
    view.q_count = view.q_index = view.full_q_count = view.full_q_index = dummy;
    const std::string why = blocksparse_bwd_unsupported(p, view);
    char what[128];
    std::snprintf(what, sizeof what, "D=%d/%d blocks %dx%d%s must be refused", r.D, r.Dv, r.block_q, r.block_kv,
                  r.causal ? " with p.causal" : "");
    record(!why.empty() && why.find('\n') == std::string::npos, what);
    record(blocksparse_bwd(p, AttnGradBuffers{}, view, MaskMod{}, ScoreMod{}, false, nullptr) == cudaErrorInvalidValue,
           std::string(what) + " (blocksparse_bwd)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  args = parse_case_args(argc, argv);
  verbose = args.verbose;
  if (!have_gpu()) return kSkipped;
  if (const std::string why = hopper_tma_unsupported(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return kSkipped;
  }
  if (!run_cases(args, all_cases(), 20261203, run_case)) return 1;
  if (args.only.empty()) refusals();
  return finish();
}
