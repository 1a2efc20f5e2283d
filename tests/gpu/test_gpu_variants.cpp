// GPU tests (ctest -L gpu): every registered variant, both dtypes, causal and
// not, odd sizes and Nq != Nk, every head dim a variant claims, GQA and MQA,
// against the fp32 reference with the project's one check rule. Fresh inputs
// for every problem.
// Also: the fp32 GPU reference against the CPU double reference, and negative
// controls showing the check does fail on unwritten or wrong outputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
  for (size_t i = 0; i < raw.size(); ++i) {
    if (dtype == DType::kFloat16) out[i] = __half2float(__half(__half_raw{raw[i]}));
    else out[i] = __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{raw[i]}));
  }
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

bool alloc_and_prepare(const AttnProblem& p, ProblemBuffers& bufs, uint64_t seed, cudaStream_t s, ReferenceData* ref) {
  // The unfused baseline's S for every head (in whole KV heads), or more if a
  // variant wants more (rung 11's P̃).
  const size_t granule = unfused_workspace_granule(p);
  size_t wanted = make_unfused_baseline().workspace_bytes(p);
  for (const Variant& v : all_variants())
    if (v.unsupported_reason(p).empty()) wanted = std::max(wanted, v.workspace_bytes(p));
  std::string e = bufs.allocate(p, true, wanted, granule, granule);
  if (e.empty()) e = prepare_inputs(p, bufs, seed, true, s, ref);
  if (!e.empty()) std::printf("setup error for %s: %s\n", p.shape_string().c_str(), e.c_str());
  return e.empty();
}

// The fp32 GPU reference agrees with the CPU double reference.
void reference_matches_cpu(cudaStream_t s, uint64_t& seed) {
  for (bool causal : {false, true})
    for (auto [nq, nk, hkv] : {std::array{37, 53, 0}, std::array{53, 37, 0}, std::array{1, 1, 0},
                               std::array{70, 1500, 0}, std::array{37, 53, 2}, std::array{53, 37, 1}}) {
      const AttnProblem p = make(2, 4, nq, nk, 40, 24, DType::kBFloat16, causal, hkv);
      ProblemBuffers bufs;
      ReferenceData ref;
      if (!alloc_and_prepare(p, bufs, ++seed, s, &ref)) { record(false, "reference setup"); continue; }
      const AttnBuffers b = bufs.attn();
      std::vector<double> o, lse;
      reference_attention_cpu(p, to_host_double(b.q, p.q_elems(), p.dtype), to_host_double(b.k, p.k_elems(), p.dtype),
                              to_host_double(b.v, p.v_elems(), p.dtype), o, lse);
      std::vector<float> o_gpu(o.size()), lse_gpu(lse.size());
      cudaMemcpy(o_gpu.data(), bufs.o_ref, o_gpu.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(lse_gpu.data(), bufs.lse_ref, lse_gpu.size() * 4, cudaMemcpyDeviceToHost);
      double err = 0, lse_err = 0;
      bool inf_ok = true;
      for (size_t i = 0; i < o.size(); ++i) err = std::max(err, std::fabs(o[i] - o_gpu[i]));
      for (size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(lse[i])) inf_ok = inf_ok && std::isinf(lse_gpu[i]) && lse_gpu[i] < 0;
        else lse_err = std::max(lse_err, std::fabs(lse[i] - lse_gpu[i]));
      }
      char what[160];
      std::snprintf(what, sizeof what, "fp32 reference vs CPU, %s: O err %.2e, LSE err %.2e", p.shape_string().c_str(),
                    err, lse_err);
      record(err < 1e-5 && lse_err < 1e-5 && inf_ok, what);
    }
}

// The check must be able to fail: untouched (poisoned) outputs and a wrong
// answer (the output for other inputs) are both rejected.
void check_can_fail(cudaStream_t s, uint64_t& seed) {
  const AttnProblem p = make(1, 2, 129, 129, 64, 64, DType::kFloat16, false);
  ProblemBuffers bufs;
  ReferenceData ref;
  if (!alloc_and_prepare(p, bufs, ++seed, s, &ref)) { record(false, "negative control setup"); return; }
  const AttnBuffers b = bufs.attn();
  poison_outputs(p, b, s);
  record(!check_outputs(p, b.o, b.lse, ref, s).pass, "poisoned output must FAIL the check");
  // Correct output for other inputs: finite everywhere, and wrong.
  ProblemBuffers other;
  ReferenceData other_ref;
  if (!alloc_and_prepare(p, other, ++seed, s, &other_ref)) return;
  static const Variant unfused = make_unfused_baseline();
  const AttnBuffers ob = other.attn();
  unfused.launch(p, ob, s);
  cudaStreamSynchronize(s);
  record(!check_outputs(p, ob.o, ob.lse, ref, s).pass, "another input's output must FAIL the check");
}

int variant_runs = 0;  // variant launches checked, over all shapes

// Runs one variant on the problem (told its workspace has at most
// workspace_cap bytes) and records the verdict under its name, the shape and
// `label`; false after an error that left the GPU unusable.
bool run_and_record(const Variant& v, const AttnProblem& p, const ProblemBuffers& bufs, const ReferenceData& ref,
                    cudaStream_t s, const std::string& label = "", size_t workspace_cap = SIZE_MAX) {
  ++variant_runs;
  const RunOutcome r = run_and_check(v, p, bufs, &ref, s, workspace_cap);
  record(r.error.empty() && r.checked && r.check.pass,
         v.name + " " + p.shape_string() + label + ": " + (r.error.empty() ? r.check.summary() : r.error));
  return gpu_still_usable(r.error);
}

}  // namespace

// Usage: test_gpu_variants [GLOB]  — only variants whose name matches GLOB
// (e.g. 'wgmma*'); all of them by default.
int main(int argc, char** argv) {
  if (!have_gpu()) return kSkipped;
  const std::string only = argc > 1 ? argv[1] : "*";
  auto selected = [&](const Variant& v) { return glob_match(only, v.name); };
  cudaStream_t s;
  cudaStreamCreate(&s);
  uint64_t seed = 20261129;

  reference_matches_cpu(s, seed);
  check_can_fail(s, seed);

  // Fresh inputs and the reference for p when a selected variant that
  // `wanted` accepts runs it; false when none does, or after a recorded setup failure.
  auto set_up = [&](const AttnProblem& p, auto&& wanted, ProblemBuffers& bufs, ReferenceData& ref) {
    bool any = false;
    for (const Variant& v : all_variants()) any = any || (selected(v) && v.unsupported_reason(p).empty() && wanted(v));
    if (!any) return false;
    if (!alloc_and_prepare(p, bufs, ++seed, s, &ref)) {
      record(false, "setup " + p.shape_string());
      return false;
    }
    return true;
  };

  const std::pair<int, int> sizes[] = {{1, 1},     {17, 17},   {127, 127}, {129, 129},  {1000, 1000}, {4096, 4096},
                                       {17, 1000}, {1000, 17}, {129, 4096}, {4096, 129}, {1, 4096},
                                       {512, 600}};  // causal: neighbouring row blocks walk different key counts
  // 320..1024: only the tiling rungs (05, 06) take them; the 4096-long sizes
  // are skipped there to keep the run short (the fp32 reference dominates).
  // Every selected variant that takes p, on fresh inputs; false after a fatal GPU error.
  auto run_all = [&](const AttnProblem& p) {
    ProblemBuffers bufs;
    ReferenceData ref;
    if (!set_up(p, [](const Variant&) { return true; }, bufs, ref)) return true;
    for (const Variant& v : all_variants()) {
      if (!selected(v) || !v.unsupported_reason(p).empty()) continue;
      if (!run_and_record(v, p, bufs, ref, s)) return false;
    }
    return true;
  };

  const int head_dims[] = {32, 64, 96, 128, 256, 320, 512, 768, 1024};
  for (auto [nq, nk] : sizes)
    for (int d : head_dims)
      for (DType dtype : {DType::kFloat16, DType::kBFloat16})
        for (bool causal : {false, true}) {
          const bool big = nq >= 4096 || nk >= 4096;
          if (big && d >= 512) continue;
          if (!run_all(make(big ? 1 : 2, big ? 2 : 3, nq, nk, d, d, dtype, causal))) return 1;
        }

  // GQA (H = 4 on 2 KV heads) and MQA (on 1): every variant that takes the
  // shape, at odd Nq != Nk and head dims that reach every rung.
  for (int hkv : {2, 1})
    for (auto [nq, nk] : {std::pair{17, 1000}, std::pair{129, 300}})
      for (int d : {64, 128, 512, 1024})
        for (DType dtype : {DType::kFloat16, DType::kBFloat16})
          for (bool causal : {false, true})
            if (!run_all(make(2, 4, nq, nk, d, d, dtype, causal, hkv))) return 1;

  // D != Dv (DeepSeek V3's 192 / 128, and 128 / 64), with and without GQA:
  // every variant that takes the pair (the others say so in their rows).
  for (auto [d, dv] : {std::pair{192, 128}, std::pair{128, 64}})
    for (auto [nq, nk] : {std::pair{1, 1}, std::pair{17, 1000}, std::pair{1000, 17}, std::pair{129, 300}})
      for (int hkv : {4, 1})
        for (DType dtype : {DType::kFloat16, DType::kBFloat16})
          for (bool causal : {false, true})
            if (!run_all(make(2, 4, nq, nk, d, dv, dtype, causal, hkv))) return 1;

  // A variant with a workspace (rung 11's P̃) runs in rounds when it is given
  // less than it asks for: 1/3, 1/7 and 7/48 of it, at shapes whose rounds
  // hold an even number of row blocks (rung 11's pass 1 pairs them into
  // clusters), an odd number, and one.
  for (auto [b, h, nq, nk] : {std::array{2, 3, 1000, 1000}, std::array{1, 3, 512, 600}, std::array{1, 1, 1000, 17}})
    for (int d : {256, 1024})
      for (DType dtype : {DType::kFloat16, DType::kBFloat16})
        for (bool causal : {false, true}) {
          const AttnProblem p = make(b, h, nq, nk, d, d, dtype, causal);
          ProblemBuffers bufs;
          ReferenceData ref;
          if (!set_up(p, [&](const Variant& v) { return v.workspace_bytes(p) > 0; }, bufs, ref)) continue;
          for (const Variant& v : all_variants()) {
            if (!selected(v) || !v.unsupported_reason(p).empty()) continue;
            const size_t full = v.workspace_bytes(p);
            if (full == 0) continue;
            // 7/48: rounds of 7 row blocks at 48 row blocks (odd: pass 1 runs unpaired).
            for (auto [num, den] : {std::pair{1, 3}, std::pair{1, 7}, std::pair{7, 48}}) {
              const std::string label =
                  " in rounds (" + std::to_string(num) + "/" + std::to_string(den) + " of its workspace)";
              if (!run_and_record(v, p, bufs, ref, s, label, full / size_t(den) * size_t(num))) return 1;
            }
          }
        }
  // A glob that selects no variant, or only variants that refuse every shape
  // (e.g. one switched off), would otherwise pass on the reference checks alone.
  record(variant_runs > 0, "variants matching '" + only + "' ran " + std::to_string(variant_runs) + " checks");
  return finish();
}
