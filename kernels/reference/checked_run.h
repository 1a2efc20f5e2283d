// attnlab: one variant run once on one problem and checked — the device
// buffers of the problem, its inputs and references, the run into poisoned
// outputs and the verdict of the check rule (reference.h), forward and
// backward. The harness (bench/) and the GPU tests (tests/gpu/) share it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "host/attn_problem.h"
#include "host/variant.h"
#include "reference/reference.h"

namespace attnlab {

// "<what>: <cuda message>" for a CUDA error.
std::string cuda_error_text(const char* what, cudaError_t err);

// The variant's own message for a failed launch if it has one, else CUDA's.
template <typename Buffers>
std::string launch_error_text(const VariantOf<Buffers>& v, cudaError_t err);

// Device buffers of one problem. Nothing is allocated after construction, so
// no allocation ever lands in a timed region.
class ProblemBuffers {
 public:
  ProblemBuffers() = default;
  ProblemBuffers(const ProblemBuffers&) = delete;
  ProblemBuffers& operator=(const ProblemBuffers&) = delete;
  ~ProblemBuffers();

  // Allocates q, k, v, o, lse; o_ref and lse_ref when `with_reference`; a
  // scratch workspace of up to `wanted_workspace` bytes (at least
  // `min_workspace`, in multiples of `workspace_granule`); and an L2-flush
  // buffer. Returns "" or a one-line error naming what did not fit.
  std::string allocate(const AttnProblem& p, bool with_reference, size_t wanted_workspace, size_t min_workspace,
                       size_t workspace_granule);

  AttnBuffers attn() const;
  float* o_ref = nullptr;
  float* lse_ref = nullptr;
  void* flush = nullptr;  // written before every timed launch to evict L2
  size_t flush_bytes = 0;

 private:
  std::vector<void*> owned_;
  void *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *o_ = nullptr, *workspace_ = nullptr;
  float* lse_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// O_ref and LSE_ref (fp32) of the inputs in `in`, computed another way than
// reference.h's (the harness's --reference torch); "" or a one-line error.
using ForwardReference = std::function<std::string(const AttnProblem& p, const AttnBuffers& in, float* o_ref,
                                                   float* lse_ref, cudaStream_t stream)>;

// Fills Q, K, V with fresh standard-normal values from `seed`; with
// `with_reference`, computes O_ref/LSE_ref (attnlab's fp32 GPU reference, or
// `reference` where one is given) and the unfused baseline's error. Returns ""
// or a one-line error.
std::string prepare_inputs(const AttnProblem& p, ProblemBuffers& bufs, uint64_t seed, bool with_reference,
                           cudaStream_t stream, ReferenceData* ref, const ForwardReference& reference = nullptr);

struct RunOutcome {
  std::string error;     // a CUDA error, one line ("" when it ran)
  bool checked = false;  // `check` holds a verdict
  CheckResult check;
  float first_values[3] = {0, 0, 0};  // O[0], O[1], O[last]
};

// Poisons the outputs, runs the variant once and, given a reference, checks it.
// workspace_cap: the variant is told its workspace has at most this many bytes
// (a test of a variant that works in rounds when its workspace is short).
RunOutcome run_and_check(const Variant& v, const AttnProblem& p, const ProblemBuffers& bufs, const ReferenceData* ref,
                         cudaStream_t stream, size_t workspace_cap = SIZE_MAX);

// ---- the backward ---------------------------------------------------------------
// Device buffers of one backward problem: the forward's (ProblemBuffers: Q, K,
// V, O, LSE, the fp32 reference O and LSE, the workspace, the L2 flush), dO,
// dQ, dK, dV and, with references, the fp32 gradients of the reference
// backward and of the same-precision unfused one. After allocate(), only the
// reference backward allocates (its scratch, in prepare_backward_inputs,
// freed before anything is timed).
class GradBuffers {
 public:
  GradBuffers() = default;
  GradBuffers(const GradBuffers&) = delete;
  GradBuffers& operator=(const GradBuffers&) = delete;
  ~GradBuffers();

  // The workspace: `wanted_workspace` bytes (the largest a backward row asks
  // for). Returns "" or a one-line error naming what did not fit.
  std::string allocate(const AttnProblem& p, bool with_reference, size_t wanted_workspace);
  AttnGradBuffers grad() const;

  ProblemBuffers fwd;
  void *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float* ref[3] = {nullptr, nullptr, nullptr};  // dQ, dK, dV of the fp32 reference
  float* lp[3] = {nullptr, nullptr, nullptr};   // the same of the same-precision unfused backward

 private:
  std::vector<void*> owned_;
};

// dQ, dK, dV: the three gradients every backward row is judged on, each alone.
constexpr int kGrads = 3;
constexpr const char* kGradNames[kGrads] = {"dQ", "dK", "dV"};

// What a backward row is checked against, per gradient: the fp32 reference,
// the same-precision unfused backward's error against it (< 0 when
// unavailable) and the reference's own rounding error in the dtype.
struct GradReference {
  const float* ref[kGrads] = {nullptr, nullptr, nullptr};
  double baseline_err[kGrads] = {-1, -1, -1};
  double rounding_err[kGrads] = {0, 0, 0};
};

// The references of a backward run: the fp32 forward (O, LSE from the 16-bit
// Q, K, V of `in`) and the backward (dQ, dK, dV fp32 from Q, K, V, dO; with
// low_precision, the same-precision unfused one). Unset: reference.h's dense
// ones (p's causal flag); the block-sparse mode sets mods_reference.h's.
struct BackwardReferences {
  std::function<cudaError_t(const AttnBuffers& in, float* o, float* lse, cudaStream_t)> forward;
  std::function<cudaError_t(const AttnBuffers& in, const void* dout, float* dq, float* dk, float* dv,
                            bool low_precision, cudaStream_t)>
      backward;
};

// Fills Q, K, V (as prepare_inputs) and dO from `seed`; the forward the
// backward starts from: O = the fp32 reference's O rounded to the dtype, LSE
// = its LSE; with `with_reference`, the reference gradients and the errors
// above. `refs`: the references (nullptr: the dense ones). Returns "" or a
// one-line error.
std::string prepare_backward_inputs(const AttnProblem& p, GradBuffers& bufs, uint64_t seed, bool with_reference,
                                    cudaStream_t stream, GradReference* ref,
                                    const BackwardReferences* refs = nullptr);

// dQ, dK, dV each judged by the forward's rule (judge: err <= 2 x the
// same-precision unfused error + 2 x rounding, nothing NaN or unwritten).
struct GradCheck {
  CheckResult grad[kGrads];
  bool pass = false;
  int worst() const;            // the gradient with the largest err / tol
  std::string summary() const;  // "PASS dQ 1.2e-03 <= 3.4e-03, dK ..., dV ..."
};
GradCheck check_gradients(const AttnProblem& p, const AttnGradBuffers& g, const GradReference& ref,
                          cudaStream_t stream);

struct BwdRunOutcome {
  std::string error;     // a CUDA error, one line ("" when it ran)
  bool checked = false;  // `check` holds a verdict
  GradCheck check;
  float first_values[3] = {0, 0, 0};  // dQ[0], dQ[1], dQ[last]
};

// Poisons dQ, dK, dV with NaN (0xFF bytes), so that unwritten elements are caught.
cudaError_t poison_gradients(const AttnProblem& p, const AttnGradBuffers& g, cudaStream_t stream);
// Poisons the gradients, runs the variant once and, given a reference, checks them.
BwdRunOutcome run_and_check_backward(const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs,
                                     const GradReference* ref, cudaStream_t stream);
// For a deterministic variant, after run_and_check_backward: `runs` more
// runs, each into poisoned buffers, whose dQ, dK, dV must equal, bit for bit,
// what the buffers hold now. Returns "" or a launch error; *identical says
// whether every run matched.
constexpr int kDeterminismRuns = 5;
std::string check_bitwise_repeatable(const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs, int runs,
                                     cudaStream_t stream, bool* identical);

}  // namespace attnlab
