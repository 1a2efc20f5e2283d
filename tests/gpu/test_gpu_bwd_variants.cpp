// GPU tests (ctest -L gpu) of the backward: every registered BwdVariant, both
// dtypes, causal and not, odd sizes and Nq != Nk, GQA, every head dim a
// variant claims and D != Dv, each of dQ, dK, dV against the fp32 reference
// backward by the forward's rule (reference/checked_run.h: check_gradients); the
// deterministic variants bit for bit over repeated runs; rows that see no key
// (causal, Nq > Nk) with dQ rows of zero. Fresh inputs for every problem.
// Also: the fp32 reference backward against the CPU double one (in one piece
// and in row blocks of a short workspace), and negative controls showing the
// check does fail on unwritten or wrong gradients.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_testing.h"
#include "host/variant.h"
#include "reference/checked_run.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

std::vector<double> to_host_double(const void* dev, int64_t n, DType dtype) {
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  cudaMemcpy(raw.data(), dev, size_t(n) * 2, cudaMemcpyDeviceToHost);
  std::vector<double> out(static_cast<size_t>(n));
  for (size_t i = 0; i < raw.size(); ++i) out[i] = from_bits(raw[i], dtype);
  return out;
}

std::vector<float> to_host_float(const float* dev, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  cudaMemcpy(out.data(), dev, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost);
  return out;
}

AttnProblem make(int B, int H, int nq, int nk, int d, int dv, DType dtype, bool causal, int Hkv = 0) {
  AttnProblem p;
  p.B = B;
  p.H = H;
  p.Hkv = Hkv;
  p.Nq = nq;
  p.Nk = nk;
  p.D = d;
  p.Dv = dv;
  p.dtype = dtype;
  p.causal = causal;
  p.scale = default_scale(d);
  return p;
}

// The workspace every variant that runs p asks for (the largest).
size_t wanted_workspace(const AttnProblem& p) {
  size_t wanted = 0;
  for (const BwdVariant& v : all_bwd_variants())
    if (v.unsupported_reason(p).empty()) wanted = std::max(wanted, v.workspace_bytes(p));
  return wanted;
}

bool alloc_and_prepare(const AttnProblem& p, GradBuffers& bufs, uint64_t seed, cudaStream_t s, GradReference* ref) {
  std::string e = bufs.allocate(p, true, wanted_workspace(p));
  if (e.empty()) e = prepare_backward_inputs(p, bufs, seed, true, s, ref);
  if (!e.empty()) std::printf("setup error for %s: %s\n", p.shape_string().c_str(), e.c_str());
  return e.empty();
}

// max |gpu - cpu| over max(1, max |cpu|).
double relative_err(const std::vector<float>& gpu, const std::vector<double>& cpu) {
  double err = 0, scale = 1;
  for (size_t i = 0; i < cpu.size(); ++i) {
    err = std::max(err, std::isfinite(gpu[i]) ? std::fabs(gpu[i] - cpu[i]) : INFINITY);
    scale = std::max(scale, std::fabs(cpu[i]));
  }
  return err / scale;
}

// The fp32 reference backward agrees with the CPU double one, computed in one
// piece (prepare_backward_inputs' own workspace) and in blocks of 7 rows (dK,
// dV accumulated over a KV head's blocks); the same-precision one differs, a little.
void reference_matches_cpu(cudaStream_t s, uint64_t& seed) {
  for (bool causal : {false, true})
    for (auto [nq, nk, hkv] : {std::array{37, 53, 0}, std::array{53, 37, 0}, std::array{1, 1, 0},
                               std::array{70, 700, 0}, std::array{37, 53, 2}, std::array{53, 37, 1}}) {
      const AttnProblem p = make(2, 4, nq, nk, 40, 24, DType::kBFloat16, causal, hkv);
      GradBuffers bufs;
      GradReference ref;
      if (!alloc_and_prepare(p, bufs, ++seed, s, &ref)) {
        record(false, "reference backward setup");
        continue;
      }
      const AttnGradBuffers g = bufs.grad();
      std::vector<double> dq, dk, dv;
      reference_attention_backward_cpu(p, to_host_double(g.q, p.q_elems(), p.dtype),
                                       to_host_double(g.k, p.k_elems(), p.dtype),
                                       to_host_double(g.v, p.v_elems(), p.dtype),
                                       to_host_double(g.dout, p.o_elems(), p.dtype), dq, dk, dv);
      const std::vector<double>* cpu[kGrads] = {&dq, &dk, &dv};
      const int64_t elems[kGrads] = {p.q_elems(), p.k_elems(), p.v_elems()};
      double err = 0;
      for (int i = 0; i < kGrads; ++i) err = std::max(err, relative_err(to_host_float(bufs.ref[i], elems[i]), *cpu[i]));
      // In row blocks: a workspace of 7 rows.
      std::vector<float*> blocks(kGrads, nullptr);
      for (int i = 0; i < kGrads; ++i) cudaMalloc(&blocks[i], size_t(elems[i]) * sizeof(float));
      void* ws = nullptr;
      const size_t ws_bytes = reference_backward_workspace_bytes(p, 7);
      cudaMalloc(&ws, ws_bytes);
      cudaError_t e = reference_attention_backward_fp32(p, g.q, g.k, g.v, g.dout, blocks[0], blocks[1], blocks[2],
                                                        false, ws, ws_bytes, s);
      if (e == cudaSuccess) e = cudaStreamSynchronize(s);
      double block_err = 0;
      for (int i = 0; i < kGrads; ++i)
        block_err = std::max(block_err, relative_err(to_host_float(blocks[i], elems[i]), *cpu[i]));
      for (float* b : blocks) cudaFree(b);
      cudaFree(ws);
      char what[224];
      std::snprintf(what, sizeof what,
                    "fp32 reference backward vs CPU, %s: rel err %.2e, in 7-row blocks %.2e (%s); same-precision "
                    "err dQ %.2e dK %.2e dV %.2e",
                    p.shape_string().c_str(), err, block_err, cudaGetErrorString(e), ref.baseline_err[0],
                    ref.baseline_err[1], ref.baseline_err[2]);
      bool lp_ok = true;  // rounded to bf16 somewhere, so not exact, yet close
      for (int i = 0; i < kGrads; ++i) lp_ok = lp_ok && ref.baseline_err[i] >= 0 && ref.baseline_err[i] < 0.5;
      record(e == cudaSuccess && err < 1e-4 && block_err < 1e-4 && lp_ok, what);
    }
}

// The check must be able to fail: untouched (poisoned) gradients, and the
// gradients of other inputs, are both rejected.
void check_can_fail(cudaStream_t s, uint64_t& seed) {
  const AttnProblem p = make(1, 2, 129, 129, 64, 64, DType::kFloat16, false);
  GradBuffers bufs;
  GradReference ref;
  if (!alloc_and_prepare(p, bufs, ++seed, s, &ref)) {
    record(false, "negative control setup");
    return;
  }
  const AttnGradBuffers g = bufs.grad();
  poison_gradients(p, g, s);
  record(!check_gradients(p, g, ref, s).pass, "poisoned gradients must FAIL the check");
  // The fp32 reference's gradients of other inputs, rounded: finite and wrong.
  GradBuffers other;
  GradReference other_ref;
  if (!alloc_and_prepare(p, other, ++seed, s, &other_ref)) return;
  const void* grads[kGrads] = {g.dq, g.dk, g.dv};
  const int64_t elems[kGrads] = {p.q_elems(), p.k_elems(), p.v_elems()};
  for (int i = 0; i < kGrads; ++i)
    convert_fp32_to_input_dtype(other.ref[i], const_cast<void*>(grads[i]), elems[i], p.dtype, s);
  cudaStreamSynchronize(s);
  record(!check_gradients(p, g, ref, s).pass, "another input's gradients must FAIL the check");
  // ... and the right ones, rounded, pass: the rule is not too tight for a correct answer.
  for (int i = 0; i < kGrads; ++i)
    convert_fp32_to_input_dtype(bufs.ref[i], const_cast<void*>(grads[i]), elems[i], p.dtype, s);
  cudaStreamSynchronize(s);
  record(check_gradients(p, g, ref, s).pass, "the reference's own gradients, rounded, must PASS the check");
}

// Rows that see no key (causal, Nq > Nk: the first Nq - Nk of every head)
// must have dQ rows of exactly zero.
bool masked_rows_are_zero(const AttnProblem& p, const AttnGradBuffers& g) {
  if (!p.causal || p.Nq <= p.Nk) return true;
  const std::vector<double> dq = to_host_double(g.dq, p.q_elems(), p.dtype);
  for (int64_t head = 0; head < p.heads(); ++head)
    for (int64_t i = 0; i < p.Nq - p.Nk; ++i)
      for (int d = 0; d < p.D; ++d)
        if (dq[size_t((head * p.Nq + i) * p.D + d)] != 0.0) return false;
  return true;
}

int variant_runs = 0;  // variant launches checked, over all shapes

// Runs one variant on the problem and records the verdict (and, for a
// deterministic one, the bitwise repeat); false after an error that left the GPU unusable.
bool run_and_record(const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs, const GradReference& ref,
                    cudaStream_t s) {
  ++variant_runs;
  const BwdRunOutcome r = run_and_check_backward(v, p, bufs, &ref, s);
  const std::string what = v.name + " " + p.shape_string();
  record(r.error.empty() && r.checked && r.check.pass, what + ": " + (r.error.empty() ? r.check.summary() : r.error));
  if (r.error.empty()) {
    record(masked_rows_are_zero(p, bufs.grad()), what + ": dQ rows that see no key must be 0");
    if (v.deterministic) {
      bool identical = false;
      const std::string e = check_bitwise_repeatable(v, p, bufs, kDeterminismRuns, s, &identical);
      record(e.empty() && identical, what + ": bitwise identical over " + std::to_string(1 + kDeterminismRuns) +
                                         " runs" + (e.empty() ? "" : ": " + e));
    }
  }
  return gpu_still_usable(r.error);
}

}  // namespace

// Usage: test_gpu_bwd_variants [GLOB]  — only variants whose name matches GLOB
// (e.g. 'bwd-ws*'); all of them by default.
int main(int argc, char** argv) {
  if (!have_gpu()) return kSkipped;
  const std::string only = argc > 1 ? argv[1] : "*";
  auto selected = [&](const BwdVariant& v) { return glob_match(only, v.name); };
  cudaStream_t s;
  cudaStreamCreate(&s);
  uint64_t seed = 20261207;

  reference_matches_cpu(s, seed);
  check_can_fail(s, seed);

  // Every selected variant that takes p, on fresh inputs; false after a fatal GPU error.
  auto run_all = [&](const AttnProblem& p) {
    bool any = false;
    for (const BwdVariant& v : all_bwd_variants()) any = any || (selected(v) && v.unsupported_reason(p).empty());
    if (!any) return true;
    GradBuffers bufs;
    GradReference ref;
    if (!alloc_and_prepare(p, bufs, ++seed, s, &ref)) {
      record(false, "setup " + p.shape_string());
      return true;
    }
    for (const BwdVariant& v : all_bwd_variants()) {
      if (!selected(v) || !v.unsupported_reason(p).empty()) continue;
      if (!run_and_record(v, p, bufs, ref, s)) return false;
    }
    return true;
  };

  // Odd sizes, Nq != Nk both ways (causal with Nq > Nk: rows that see no key).
  const std::pair<int, int> sizes[] = {{1, 1},     {17, 17},   {127, 127}, {129, 129},
                                       {1000, 1000}, {300, 1000}, {1000, 300}};
  const std::pair<int, int> head_dims[] = {{32, 32}, {64, 64}, {96, 96}, {128, 128}, {256, 256}, {192, 128}};
  for (auto [nq, nk] : sizes)
    for (auto [d, dv] : head_dims)
      for (int hkv : {4, 2})  // MHA, and GQA with two query heads per KV head
        for (DType dtype : {DType::kFloat16, DType::kBFloat16})
          for (bool causal : {false, true})
            if (!run_all(make(2, 4, nq, nk, d, dv, dtype, causal, hkv))) return 1;
  // MQA, and a longer causal row block walk, at the common head dims.
  for (auto [nq, nk] : {std::pair{129, 300}, std::pair{300, 129}, std::pair{2048, 2048}})
    for (int d : {64, 128, 256})
      for (DType dtype : {DType::kFloat16, DType::kBFloat16})
        for (bool causal : {false, true})
          if (!run_all(make(1, 4, nq, nk, d, d, dtype, causal, 1))) return 1;

  // A glob that selects no variant, or only variants that refuse every shape
  // (e.g. one switched off), would otherwise pass on the reference checks alone.
  bool any_named = false;
  for (const BwdVariant& v : all_bwd_variants()) any_named = any_named || selected(v);
  if (any_named || only != "*")
    record(variant_runs > 0, "backward variants matching '" + only + "' ran " + std::to_string(variant_runs) +
                                 " checks");
  else
    std::printf("no backward variant is registered: only the reference and the check were tested\n");
  return finish();
}
