// The GPU reference of attention under a mask_mod and a score_mod
// (kernels/reference/mods_reference.h, what flash_attn_mma --mask-mod checks
// against) against the CPU double reference, and count_kept_pairs against a
// count on the CPU:
//   fp32 path:            max|O - O_cpu| <= 1e-4 + 2^-20·max|LSE| (a score of
//                         magnitude |s| carries fp32's rounding, 2^-24·|s|, into P),
//                         |LSE - LSE_cpu| <= 1e-4·max(1, |LSE|), rows without keys
//                         O = 0, LSE = -inf exactly;
//   same-precision path:  max|O_low - O_low_cpu| <= 2 units in the last place of
//                         the dtype at max|O| + the same fp32 term (the two sum
//                         S and P·V in other orders before the roundings);
//   pairs:                equal.
// Cases: every mask_mod of tests/block_mask_cases.h and every score_mod over
// ragged lengths (1, 17, 113 x 203, 239 x 1, 799 x 3, 300 x 2100: two chunks
// of keys), both dtypes, MHA / GQA / MQA, D = Dv and 192/128. -v: one line per case.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../block_mask_cases.h"
#include "blocksparse/mods.h"
#include "gpu_testing.h"
#include "reference/mods_reference.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

bool verbose = false;

struct Case {
  std::string mask, score;
  int Nq, Nk, D, Dv;
  DType dtype;
  int B, H, Hkv;
};

void run_case(const Case& c, std::mt19937_64& rng) {
  char what[200];
  std::snprintf(what, sizeof what, "%s + %s, %dx%d, D=%d/%d, %s, B=%d H=%d Hkv=%d", c.mask.c_str(), c.score.c_str(),
                c.Nq, c.Nk, c.D, c.Dv, dtype_name(c.dtype), c.B, c.H, c.Hkv);
  AttnProblem p;
  p.B = c.B, p.H = c.H, p.Hkv = c.Hkv, p.Nq = c.Nq, p.Nk = c.Nk, p.D = c.D, p.Dv = c.Dv, p.dtype = c.dtype;
  p.scale = default_scale(c.D);
  std::string why;
  const MaskMod mask = parse_mask_mod(c.mask, c.Nq, c.Nk, why);
  const ScoreMod score = parse_score_mod(c.score, c.H, why);
  if (!why.empty()) {
    record(false, std::string(what) + ": " + why);
    return;
  }
  std::vector<uint16_t> qb, kb, vb;
  std::vector<double> q, k, v;
  random_tensor(rng, p.q_elems(), p.dtype, 1.0, qb, q);
  random_tensor(rng, p.k_elems(), p.dtype, 1.0, kb, k);
  random_tensor(rng, p.v_elems(), p.dtype, 1.0, vb, v);
  const int L = std::max(c.Nq, c.Nk);
  std::mt19937 doc_rng{static_cast<unsigned>(rng())};
  const std::vector<int32_t> doc = block_mask_cases::random_docs(c.B, L, doc_rng);

  void *dq = upload(qb), *dk = upload(kb), *dv = upload(vb);
  int32_t* d_doc = upload(doc);
  float *o = nullptr, *lse = nullptr, *o_low = nullptr, *lse_low = nullptr;
  unsigned long long* pairs = nullptr;
  cudaMalloc(&o, size_t(p.o_elems()) * 4);
  cudaMalloc(&lse, size_t(p.lse_elems()) * 4);
  cudaMalloc(&o_low, size_t(p.o_elems()) * 4);
  cudaMalloc(&lse_low, size_t(p.lse_elems()) * 4);
  cudaMalloc(&pairs, sizeof *pairs);
  MaskMod dev_mask = mask, host_mask = mask;
  if (mask.kind == MaskModKind::kDocument) {
    dev_mask.doc = d_doc, dev_mask.doc_len = L;
    host_mask.doc = doc.data(), host_mask.doc_len = L;
  }
  cudaMemset(pairs, 0, sizeof *pairs);
  cudaError_t err = mods_attention_fp32(p, dev_mask, score, dq, dk, dv, o, lse, false, nullptr);
  if (err == cudaSuccess) err = mods_attention_fp32(p, dev_mask, score, dq, dk, dv, o_low, lse_low, true, nullptr);
  if (err == cudaSuccess) err = count_kept_pairs(dev_mask, p.B, p.H, p.Nq, p.Nk, pairs, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  std::vector<float> o_gpu(size_t(p.o_elems())), lse_gpu(size_t(p.lse_elems())), o_low_gpu(size_t(p.o_elems()));
  unsigned long long pairs_gpu = 0;
  cudaMemcpy(o_gpu.data(), o, o_gpu.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(lse_gpu.data(), lse, lse_gpu.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o_low_gpu.data(), o_low, o_low_gpu.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(&pairs_gpu, pairs, sizeof pairs_gpu, cudaMemcpyDeviceToHost);
  for (void* ptr : {dq, dk, dv, static_cast<void*>(d_doc), static_cast<void*>(o), static_cast<void*>(lse),
                    static_cast<void*>(o_low), static_cast<void*>(lse_low), static_cast<void*>(pairs)})
    cudaFree(ptr);
  if (err != cudaSuccess) {
    record(false, std::string(what) + ": " + cudaGetErrorString(err));
    return;
  }

  std::vector<double> o_ref, lse_ref, o_low_ref;
  mods_attention_cpu(p, host_mask, score, q, k, v, o_ref, lse_ref, o_low_ref);
  double o_err = 0, lse_err = 0, low_err = 0, o_max = 0, lse_max = 0;
  int64_t bad = 0, pairs_cpu = 0;
  for (size_t i = 0; i < o_ref.size(); ++i) {
    if (!std::isfinite(o_gpu[i]) || !std::isfinite(o_low_gpu[i])) ++bad;
    o_err = std::max(o_err, std::fabs(o_gpu[i] - o_ref[i]));
    low_err = std::max(low_err, std::fabs(o_low_gpu[i] - o_low_ref[i]));
    o_max = std::max(o_max, std::fabs(o_ref[i]));
  }
  for (size_t r = 0; r < lse_ref.size(); ++r) {
    if (std::isinf(lse_ref[r])) bad += lse_gpu[r] == -INFINITY ? 0 : 1;
    else if (!std::isfinite(lse_gpu[r])) ++bad;
    else lse_err = std::max(lse_err, std::fabs(lse_gpu[r] - lse_ref[r]) / std::max(1.0, std::fabs(lse_ref[r])));
    if (std::isfinite(lse_ref[r])) lse_max = std::max(lse_max, std::fabs(lse_ref[r]));
  }
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < p.Nq; ++i)
        for (int j = 0; j < p.Nk; ++j) pairs_cpu += host_mask(b, h, i, j) ? 1 : 0;
  const double ulp = std::ldexp(1.0, c.dtype == DType::kFloat16 ? -10 : -7);
  const double fp32_term = std::ldexp(lse_max, -20);
  const double o_tol = 1e-4 + fp32_term, low_tol = 2 * ulp * std::max(o_max, 1e-3) + fp32_term;
  const bool ok = bad == 0 && o_err <= o_tol && lse_err <= 1e-4 && low_err <= low_tol &&
                  int64_t(pairs_gpu) == pairs_cpu;
  char line[400];
  std::snprintf(line, sizeof line, "%s: O %.1e (tol %.1e), LSE %.1e, O_low %.1e (tol %.1e), %lld non-finite, pairs %llu / %lld",
                what, o_err, o_tol, lse_err, low_err, low_tol, static_cast<long long>(bad), pairs_gpu,
                static_cast<long long>(pairs_cpu));
  if (verbose) std::printf("%s %s\n", ok ? "pass" : "fail", line);
  record(ok, line);
}

}  // namespace

int main(int argc, char** argv) {
  verbose = argc > 1 && std::string(argv[1]) == "-v";
  if (!have_gpu()) return kSkipped;
  struct Shape {
    int Nq, Nk;
  };
  const Shape shapes[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {300, 2100}};
  const char* scores[] = {"none", "rel_bias", "alibi", "softcap:2"};
  const int dims[][2] = {{64, 64}, {128, 128}, {192, 128}};
  const int heads[][3] = {{2, 2, 2}, {1, 4, 2}, {1, 3, 1}};  // B, H, Hkv: MHA, GQA, MQA
  std::mt19937_64 rng(20240901);
  int n = 0;
  for (const char* mask : block_mask_cases::kMaskModSpecs)
    for (const Shape& s : shapes) {
      const int* d = dims[n % 3];
      const int* hd = heads[(n / 2) % 3];
      run_case({mask, scores[n % 4], s.Nq, s.Nk, d[0], d[1], (n / 4) % 2 ? DType::kBFloat16 : DType::kFloat16,
                hd[0], hd[1], hd[2]},
               rng);
      ++n;
    }
  return finish();
}
