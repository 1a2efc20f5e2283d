// attnlab: what the harness and the GPU tests share — owning the device
// buffers of one problem, preparing inputs and the reference, running a variant
// once and checking it, and timing it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "host/attn_problem.h"
#include "host/variant.h"
#include "reference/reference.h"

namespace attnlab {

// An error that ends the run: one line for stderr and the process exit code.
// Built from a function's "" (no error) or its message.
struct RunError {
  std::string message;
  int code = kExitFailed;
  RunError() = default;
  RunError(std::string m, int c = kExitFailed) : message(std::move(m)), code(c) {}
  bool failed() const { return !message.empty(); }
};

// Device allocations freed on scope exit.
struct DeviceArena {
  std::vector<void*> ptrs;
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  std::string alloc(size_t count, T** out, const char* what) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16)) != cudaSuccess) {
      cudaGetLastError();
      char buf[128];
      std::snprintf(buf, sizeof buf, "out of GPU memory allocating %.2f GiB for %s", double(count * sizeof(T)) / (1 << 30),
                    what);
      return buf;
    }
    ptrs.push_back(p);
    *out = static_cast<T*>(p);
    return "";
  }
};

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

// Fills Q, K, V with fresh standard-normal values from `seed`; with
// `with_reference`, computes O_ref/LSE_ref (attnlab's fp32 GPU reference, or
// torch's fp32 math SDPA with `torch_reference`) and the unfused baseline's
// error. Returns "" or a one-line error.
std::string prepare_inputs(const AttnProblem& p, ProblemBuffers& bufs, uint64_t seed, bool with_reference,
                           cudaStream_t stream, ReferenceData* ref, bool torch_reference = false);

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

struct Timing {
  double median_ms = 0, min_ms = 0;
};
// `warmup` untimed calls of `call` (which enqueues work on `stream` and returns
// "" or a one-line error), then `iters` calls, each after an L2 flush (a write
// of `flush_bytes` to `flush`) and a queued GPU delay (host/gpu_delay.h: the
// call's host-side dispatch happens under it), between two CUDA events; the
// median is what gets reported.
std::string time_calls(const std::function<std::string()>& call, int warmup, int iters, void* flush,
                       size_t flush_bytes, cudaStream_t stream, Timing* out);
// time_calls of several calls at once, interleaved (time_calls is this with
// one call): each is warmed up, then round r times call 0, 1, 2, ... once each,
// so that every call's iterations spread over the same stretch of time and
// meet the same clocks (the card's clock follows its power limit: timed one
// after another, the last rows of a shape ran up to 6 % slower). errors[i] is
// call i's first error ("" if none); a failed call is left out of the later
// rounds.
void time_calls_interleaved(const std::vector<std::function<std::string()>>& calls, int warmup, int iters,
                            void* flush, size_t flush_bytes, cudaStream_t stream, std::vector<Timing>* out,
                            std::vector<std::string>* errors);
// A variant's launch (launch_timed where it has one) on buffers `b` (a
// ProblemBuffers' attn() or a GradBuffers' grad()) as a call for the timers.
template <typename Buffers>
std::function<std::string()> variant_call(const VariantOf<Buffers>& v, const AttnProblem& p, const Buffers& b,
                                          cudaStream_t stream);

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

// "" when rows can be appended to the results CSV at `path`, else one line
// saying why not ("cannot write --csv /no/such/dir/x.csv: No such file or
// directory"; a file whose header is not these rows' columns). Opens the file
// for appending and closes it again, removing it when it did not exist
// before; the harness asks before anything runs. `extra_columns`: columns
// after the schema's, e.g. ",mask,score" (the block-sparse rows').
std::string results_csv_error(const std::string& path, const std::string& extra_columns = "");
// Appends `rows` (CSV lines, each ending in '\n') to the results CSV at
// `path`, after the header row (the schema docs/results.md describes, then
// `extra_columns`) when the file is new or empty. Returns "" or one line
// saying what was lost.
std::string append_results_csv(const std::string& path, const std::string& rows,
                               const std::string& extra_columns = "");

// A CSV field: commas, quotes and newlines become ';'.
std::string csv_field(std::string s);

// "<what>: <cuda message>" for a CUDA error.
std::string cuda_error_text(const char* what, cudaError_t err);
// The line of exit 3 when `what` failed with `err` (cudaSuccess: no device was
// found): what is missing, plainly, then CUDA's own words. driver_version and
// runtime_version are cudaDriverGetVersion's (0: no driver) and
// cudaRuntimeGetVersion's, e.g. 12040; CUDA's words for a missing driver,
// "driver version is insufficient", would suggest an upgrade.
std::string no_gpu_text(const char* what, cudaError_t err, int driver_version, int runtime_version);
// The variant's own message for a failed launch if it has one, else CUDA's.
template <typename Buffers>
std::string launch_error_text(const VariantOf<Buffers>& v, cudaError_t err);

}  // namespace attnlab
