#include "runner.h"

#include "host/gpu_delay.h"
#include "torch_peers.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace attnlab {

std::string cuda_error_text(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err);
}

std::string launch_error_text(const Variant& v, cudaError_t err) {
  if (v.last_error) {
    const std::string detail = v.last_error();
    if (!detail.empty()) return detail;
  }
  return cudaGetErrorString(err);
}

ProblemBuffers::~ProblemBuffers() {
  for (void* p : owned_) cudaFree(p);
}

static std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

std::string ProblemBuffers::allocate(const AttnProblem& p, bool with_reference, size_t wanted_workspace,
                                     size_t min_workspace, size_t workspace_granule) {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_error_text("cudaGetDevice", e);
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess)
    return cuda_error_text("cudaGetDeviceProperties", e);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess)
    return cuda_error_text("cudaMemGetInfo", e);

  // Sizes in double first: an absurd shape must not overflow into a small number.
  const double e16 = double(kInputElementBytes);
  const double kv_heads = double(p.B) * p.kv_heads();
  const double need_io = e16 * (double(p.heads()) * p.Nq * p.D + kv_heads * p.Nk * (p.D + p.Dv) +
                                double(p.heads()) * p.Nq * p.Dv) +
                         4.0 * double(p.heads()) * p.Nq;
  const double need_ref = with_reference ? 4.0 * double(p.heads()) * p.Nq * (p.Dv + 1) : 0.0;
  flush_bytes = size_t(std::max(prop.l2CacheSize, 1 << 20)) * 2;
  const double margin = 256.0 * (1 << 20);  // cuBLAS and the CUDA context need some too
  const double need = need_io + need_ref + double(flush_bytes) + double(min_workspace) + margin;
  if (need > double(free_bytes))
    return "shape " + p.shape_string() + " needs " + gib(need) + " of GPU memory, " + gib(double(free_bytes)) +
           " free";

  auto alloc = [&](size_t bytes, void** out) -> std::string {
    if (bytes == 0) return "";
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // allocation failures are not sticky
      return "out of GPU memory allocating " + gib(double(bytes)) + " for " + p.shape_string();
    }
    owned_.push_back(*out);
    return "";
  };
  std::string err;
  if (err.empty()) err = alloc(size_t(p.q_elems()) * kInputElementBytes, &q_);
  if (err.empty()) err = alloc(size_t(p.k_elems()) * kInputElementBytes, &k_);
  if (err.empty()) err = alloc(size_t(p.v_elems()) * kInputElementBytes, &v_);
  if (err.empty()) err = alloc(size_t(p.o_elems()) * kInputElementBytes, &o_);
  if (err.empty()) err = alloc(size_t(p.lse_elems()) * sizeof(float), reinterpret_cast<void**>(&lse_));
  if (err.empty() && with_reference) err = alloc(size_t(p.o_elems()) * sizeof(float), reinterpret_cast<void**>(&o_ref));
  if (err.empty() && with_reference)
    err = alloc(size_t(p.lse_elems()) * sizeof(float), reinterpret_cast<void**>(&lse_ref));
  if (err.empty()) err = alloc(flush_bytes, &flush);
  if (!err.empty()) return err;

  if (wanted_workspace > 0) {
    // As much of the wanted workspace as fits, keeping the margin free.
    cudaMemGetInfo(&free_bytes, &total_bytes);
    size_t budget = free_bytes > size_t(margin) ? free_bytes - size_t(margin) : 0;
    // Whole granules (the unfused baseline's heads), rounded up so that a
    // variant wanting a little more than a whole number of them still gets it.
    size_t bytes = wanted_workspace;
    if (workspace_granule > 0) bytes += (workspace_granule - bytes % workspace_granule) % workspace_granule;
    bytes = std::min(bytes, budget);
    if (workspace_granule > 0) bytes -= bytes % workspace_granule;
    if (bytes < min_workspace) bytes = min_workspace;
    err = alloc(bytes, &workspace_);
    if (!err.empty()) return err;
    workspace_bytes_ = bytes;
  }
  return "";
}

AttnBuffers ProblemBuffers::attn() const {
  AttnBuffers b;
  b.q = q_;
  b.k = k_;
  b.v = v_;
  b.o = o_;
  b.lse = lse_;
  b.workspace = workspace_;
  b.workspace_bytes = workspace_bytes_;
  return b;
}

std::string prepare_inputs(const AttnProblem& p, ProblemBuffers& bufs, uint64_t seed, bool with_reference,
                           cudaStream_t stream, ReferenceData* ref, bool torch_ref) {
  const AttnBuffers b = bufs.attn();
  // Three independent streams of numbers from one seed.
  cudaError_t e = fill_random_normal(const_cast<void*>(b.q), p.q_elems(), p.dtype, seed * 3 + 0, stream);
  if (e == cudaSuccess) e = fill_random_normal(const_cast<void*>(b.k), p.k_elems(), p.dtype, seed * 3 + 1, stream);
  if (e == cudaSuccess) e = fill_random_normal(const_cast<void*>(b.v), p.v_elems(), p.dtype, seed * 3 + 2, stream);
  if (e != cudaSuccess) return cuda_error_text("filling inputs", e);
  if (!with_reference) return "";

  if (torch_ref) {
    if (std::string err = torch_reference(p, b.q, b.k, b.v, bufs.o_ref, bufs.lse_ref, stream); !err.empty())
      return "torch reference: " + err;
    e = cudaStreamSynchronize(stream);
  } else {
    e = reference_attention_fp32(p, b.q, b.k, b.v, bufs.o_ref, bufs.lse_ref, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  }
  if (e != cudaSuccess) return cuda_error_text("fp32 reference", e);
  ref->o_ref = bufs.o_ref;
  ref->lse_ref = bufs.lse_ref;
  ref->rounding_err = output_rounding_error(bufs.o_ref, p.o_elems(), p.dtype, stream);
  ref->baseline_err = -1;

  static const Variant unfused = make_unfused_baseline();
  if (unfused.unsupported_reason(p).empty() && b.workspace_bytes >= unfused_workspace_granule(p)) {
    e = poison_outputs(p, b, stream);
    if (e == cudaSuccess) e = unfused.launch(p, b, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return cuda_error_text("unfused baseline", e);
    const ErrorStats s = compare_output(b.o, p.dtype, bufs.o_ref, p.o_elems(), stream);
    if (s.nonfinite == 0) ref->baseline_err = s.max_abs_err;
  }
  return "";
}

RunOutcome run_and_check(const Variant& v, const AttnProblem& p, const ProblemBuffers& bufs, const ReferenceData* ref,
                         cudaStream_t stream, size_t workspace_cap) {
  RunOutcome out;
  AttnBuffers b = bufs.attn();
  b.workspace_bytes = std::min(b.workspace_bytes, workspace_cap);
  cudaError_t e = poison_outputs(p, b, stream);
  if (e == cudaSuccess) e = v.launch(p, b, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    out.error = launch_error_text(v, e);
    return out;
  }
  if (ref) {
    const double lse_tol = v.rounds_scores_to_input_dtype
                               ? lse_tolerance_rounded_scores(p.dtype, max_abs_finite_lse(ref->lse_ref, p.lse_elems(), stream))
                               : kLseTolerance;
    out.check = check_outputs(p, b.o, v.writes_lse ? b.lse : nullptr, *ref, stream, lse_tol);
    out.checked = true;
  }
  // First two and last output values, as the table shows them.
  const int64_t n = p.o_elems();
  uint16_t raw[3] = {0, 0, 0};
  cudaMemcpy(&raw[0], b.o, sizeof(uint16_t) * (n >= 2 ? 2 : 1), cudaMemcpyDeviceToHost);
  cudaMemcpy(&raw[2], static_cast<const uint16_t*>(b.o) + (n - 1), sizeof(uint16_t), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 3; ++i) {
    if (p.dtype == DType::kBFloat16) {
      __nv_bfloat16_raw r{raw[i]};
      out.first_values[i] = __bfloat162float(__nv_bfloat16(r));
    } else {
      __half_raw r{raw[i]};
      out.first_values[i] = __half2float(__half(r));
    }
  }
  return out;
}

// The GPU's wait before each timed call (host/gpu_delay.h): longer than a
// call's host-side dispatch, so that the events see GPU time only.
constexpr unsigned kTimerDelayUs = 300;

std::function<std::string()> variant_call(const Variant& v, const AttnProblem& p, const ProblemBuffers& bufs,
                                          cudaStream_t stream) {
  const AttnBuffers b = bufs.attn();
  const auto* launch = v.launch_timed ? &v.launch_timed : &v.launch;  // v and p outlive the call
  return [&v, &p, launch, b, stream]() -> std::string {
    const cudaError_t e = (*launch)(p, b, stream);
    return e == cudaSuccess ? "" : launch_error_text(v, e);
  };
}

void time_calls_interleaved(const std::vector<std::function<std::string()>>& calls, int warmup, int iters,
                            void* flush, size_t flush_bytes, cudaStream_t stream, std::vector<Timing>* out,
                            std::vector<std::string>* errors) {
  const size_t n = calls.size();
  out->assign(n, Timing{});
  errors->assign(n, "");
  for (size_t c = 0; c < n; ++c)
    for (int i = 0; i < warmup && (*errors)[c].empty(); ++i) (*errors)[c] = calls[c]();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<std::vector<float>> ms(n);
  for (int i = 0; i < iters; ++i) {
    for (size_t c = 0; c < n; ++c) {
      if (!(*errors)[c].empty()) continue;
      cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream);  // evict L2 (not timed)
      enqueue_gpu_delay(stream, kTimerDelayUs);
      cudaEventRecord(start, stream);
      std::string err = calls[c]();
      cudaEventRecord(stop, stream);
      float t = 0.f;
      if (err.empty()) {
        cudaError_t e = cudaEventSynchronize(stop);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&t, start, stop);
        if (e != cudaSuccess) err = cuda_error_text("timing", e);
      }
      if (err.empty()) ms[c].push_back(t);
      else (*errors)[c] = err;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (size_t c = 0; c < n; ++c) {
    std::vector<float>& m = ms[c];
    if (!(*errors)[c].empty() || m.empty()) continue;
    std::sort(m.begin(), m.end());
    const size_t k = m.size();
    (*out)[c].median_ms = k % 2 ? m[k / 2] : 0.5 * (double(m[k / 2 - 1]) + m[k / 2]);
    (*out)[c].min_ms = m.front();
  }
}

std::string time_calls(const std::function<std::string()>& call, int warmup, int iters, void* flush,
                       size_t flush_bytes, cudaStream_t stream, Timing* out) {
  std::vector<Timing> timing;
  std::vector<std::string> error;
  time_calls_interleaved({call}, warmup, iters, flush, flush_bytes, stream, &timing, &error);
  *out = timing[0];
  return error[0];
}

namespace {
const char kResultsCsvHeader[] =
    "gpu,driver,cuda,commit,date,variant,kind,B,H,Nq,Nk,D,Dv,dtype,causal,time_ms,tflops,ratio_to_best_peer,"
    "status,max_err,tol,lse_err,seed,note\n";
}  // namespace

std::string results_csv_error(const std::string& path) {
  struct stat st;
  const bool existed = stat(path.c_str(), &st) == 0;
  if (existed && S_ISDIR(st.st_mode)) return "cannot write --csv " + path + ": it is a directory";
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return "cannot write --csv " + path + ": " + std::strerror(errno);
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return "";
}

std::string append_results_csv(const std::string& path, const std::string& rows) {
  std::ifstream existing(path);
  const bool need_header = !existing.good() || existing.peek() == std::ifstream::traits_type::eof();
  existing.close();
  const std::string text = need_header ? kResultsCsvHeader + rows : rows;
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return "cannot write --csv " + path + ": " + std::strerror(errno) + "; its rows are lost";
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed)
    return "writing --csv " + path + " failed: " + std::strerror(written ? errno : write_errno) +
           "; its rows are lost";
  return "";
}

std::string csv_field(std::string s) {
  for (char& c : s)
    if (c == ',' || c == '\n' || c == '"') c = ';';
  return s;
}

}  // namespace attnlab
