#include "reference/checked_run.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>

namespace attnlab {

std::string cuda_error_text(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err);
}

template <typename Buffers>
std::string launch_error_text(const VariantOf<Buffers>& v, cudaError_t err) {
  if (v.last_error) {  // a peer's: torch's words
    const std::string detail = v.last_error();
    if (!detail.empty()) return detail;
  }
  return cudaGetErrorString(err);
}
template std::string launch_error_text(const VariantOf<AttnBuffers>&, cudaError_t);
template std::string launch_error_text(const VariantOf<AttnGradBuffers>&, cudaError_t);

namespace {

// x[0], x[1] and x[n - 1] of a 16-bit tensor, as the table shows them.
void read_first_values(const void* x, int64_t n, DType dtype, float out[3]) {
  uint16_t raw[3] = {0, 0, 0};
  cudaMemcpy(&raw[0], x, sizeof(uint16_t) * (n >= 2 ? 2 : 1), cudaMemcpyDeviceToHost);
  cudaMemcpy(&raw[2], static_cast<const uint16_t*>(x) + (n - 1), sizeof(uint16_t), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 3; ++i) {
    if (dtype == DType::kBFloat16) {
      __nv_bfloat16_raw r{raw[i]};
      out[i] = __bfloat162float(__nv_bfloat16(r));
    } else {
      __half_raw r{raw[i]};
      out[i] = __half2float(__half(r));
    }
  }
}

// Poisons what a forward or a backward variant writes (NaN: unwritten
// elements are caught), runs it once on `b` and waits for it.
cudaError_t poison(const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) { return poison_outputs(p, b, s); }
cudaError_t poison(const AttnProblem& p, const AttnGradBuffers& g, cudaStream_t s) { return poison_gradients(p, g, s); }
template <typename Buffers>
cudaError_t run_poisoned(const VariantOf<Buffers>& v, const AttnProblem& p, const Buffers& b, cudaStream_t stream) {
  cudaError_t e = poison(p, b, stream);
  if (e == cudaSuccess) e = v.launch(p, b, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  return e;
}
}  // namespace

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
                           cudaStream_t stream, ReferenceData* ref, const ForwardReference& reference) {
  const AttnBuffers b = bufs.attn();
  // Three independent streams of numbers from one seed.
  cudaError_t e = fill_random_normal(const_cast<void*>(b.q), p.q_elems(), p.dtype, seed * 3 + 0, stream);
  if (e == cudaSuccess) e = fill_random_normal(const_cast<void*>(b.k), p.k_elems(), p.dtype, seed * 3 + 1, stream);
  if (e == cudaSuccess) e = fill_random_normal(const_cast<void*>(b.v), p.v_elems(), p.dtype, seed * 3 + 2, stream);
  if (e != cudaSuccess) return cuda_error_text("filling inputs", e);
  if (!with_reference) return "";

  if (reference) {
    if (std::string err = reference(p, b, bufs.o_ref, bufs.lse_ref, stream); !err.empty()) return err;
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
    e = run_poisoned(unfused, p, b, stream);
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
  if (cudaError_t e = run_poisoned(v, p, b, stream); e != cudaSuccess) {
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
  read_first_values(b.o, p.o_elems(), p.dtype, out.first_values);
  return out;
}

// ---- the backward ---------------------------------------------------------------

GradBuffers::~GradBuffers() {
  for (void* p : owned_) cudaFree(p);
}

std::string GradBuffers::allocate(const AttnProblem& p, bool with_reference, size_t wanted_workspace) {
  // The forward's buffers (with its fp32 reference: the backward's O and LSE come from it).
  if (std::string e = fwd.allocate(p, true, wanted_workspace, wanted_workspace, 0); !e.empty()) return e;
  auto alloc = [&](size_t bytes, void** out, const char* what) -> std::string {
    if (cudaMalloc(out, bytes) != cudaSuccess) {
      cudaGetLastError();  // allocation failures are not sticky
      char buf[160];
      std::snprintf(buf, sizeof buf, "out of GPU memory allocating %.2f GiB for %s of %s",
                    double(bytes) / double(1ull << 30), what, p.shape_string().c_str());
      return buf;
    }
    owned_.push_back(*out);
    return "";
  };
  const size_t e16 = kInputElementBytes;
  const int64_t elems[kGrads] = {p.q_elems(), p.k_elems(), p.v_elems()};
  std::string err = alloc(size_t(p.o_elems()) * e16, &dout, "dO");
  if (err.empty()) err = alloc(size_t(elems[0]) * e16, &dq, "dQ");
  if (err.empty()) err = alloc(size_t(elems[1]) * e16, &dk, "dK");
  if (err.empty()) err = alloc(size_t(elems[2]) * e16, &dv, "dV");
  for (int g = 0; g < kGrads && with_reference && err.empty(); ++g) {
    err = alloc(size_t(elems[g]) * sizeof(float), reinterpret_cast<void**>(&ref[g]), "the reference gradients");
    if (err.empty())
      err = alloc(size_t(elems[g]) * sizeof(float), reinterpret_cast<void**>(&lp[g]),
                  "the same-precision gradients");
  }
  return err;
}

AttnGradBuffers GradBuffers::grad() const {
  const AttnBuffers f = fwd.attn();
  AttnGradBuffers g;
  g.q = f.q;
  g.k = f.k;
  g.v = f.v;
  g.o = f.o;
  g.lse = f.lse;
  g.dout = dout;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  g.workspace = f.workspace;
  g.workspace_bytes = f.workspace_bytes;
  return g;
}

std::string prepare_backward_inputs(const AttnProblem& p, GradBuffers& bufs, uint64_t seed, bool with_reference,
                                    cudaStream_t stream, GradReference* ref, const BackwardReferences* refs) {
  if (std::string e = prepare_inputs(p, bufs.fwd, seed, false, stream, nullptr); !e.empty()) return e;
  const AttnBuffers f = bufs.fwd.attn();
  // The references: the given ones, or the dense ones of reference.h.
  const auto forward = [&](float* o, float* lse) {
    return refs ? refs->forward(f, o, lse, stream) : reference_attention_fp32(p, f.q, f.k, f.v, o, lse, stream);
  };
  const auto backward = [&](float* const (&g)[kGrads], bool low_precision) {
    return refs ? refs->backward(f, bufs.dout, g[0], g[1], g[2], low_precision, stream)
                : reference_attention_backward_fp32(p, f.q, f.k, f.v, bufs.dout, g[0], g[1], g[2], low_precision,
                                                    nullptr, 0, stream);
  };
  // dO from a fourth stream of numbers (the complement of the seed: far from seed·3 + 0..2 of any nearby seed).
  cudaError_t e = fill_random_normal(bufs.dout, p.o_elems(), p.dtype, ~seed, stream);
  if (e != cudaSuccess) return cuda_error_text("filling dO", e);
  e = forward(bufs.fwd.o_ref, bufs.fwd.lse_ref);
  if (e == cudaSuccess) e = convert_fp32_to_input_dtype(bufs.fwd.o_ref, f.o, p.o_elems(), p.dtype, stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(f.lse, bufs.fwd.lse_ref, size_t(p.lse_elems()) * sizeof(float), cudaMemcpyDeviceToDevice,
                        stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("fp32 reference forward", e);
  if (!with_reference) return "";

  e = backward(bufs.ref, false);
  if (e == cudaSuccess) e = backward(bufs.lp, true);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return cuda_error_text("fp32 reference backward", e);
  const int64_t elems[kGrads] = {p.q_elems(), p.k_elems(), p.v_elems()};
  for (int g = 0; g < kGrads; ++g) {
    ref->ref[g] = bufs.ref[g];
    const ErrorStats s = compare_output_fp32(bufs.lp[g], bufs.ref[g], elems[g], stream);
    ref->baseline_err[g] = s.nonfinite == 0 ? s.max_abs_err : -1;
    ref->rounding_err[g] = output_rounding_error(bufs.ref[g], elems[g], p.dtype, stream);
  }
  return "";
}

int GradCheck::worst() const {
  int w = 0;
  for (int g = 1; g < kGrads; ++g)
    if (grad[g].err * grad[w].tol > grad[w].err * grad[g].tol) w = g;  // err / tol, without dividing by 0
  return w;
}

std::string GradCheck::summary() const {
  std::string s = pass ? "PASS" : "FAIL";
  for (int g = 0; g < kGrads; ++g) {
    const CheckResult& c = grad[g];
    char buf[96];
    if (c.nonfinite != 0)
      std::snprintf(buf, sizeof buf, "%s %s %lld NaN/Inf/unwritten", g ? "," : "", kGradNames[g],
                    static_cast<long long>(c.nonfinite));
    else
      std::snprintf(buf, sizeof buf, "%s %s %.2e %s %.2e", g ? "," : "", kGradNames[g], c.err,
                    c.err <= c.tol ? "<=" : ">", c.tol);
    s += buf;
  }
  return s;
}

GradCheck check_gradients(const AttnProblem& p, const AttnGradBuffers& g, const GradReference& ref,
                          cudaStream_t stream) {
  const void* grads[kGrads] = {g.dq, g.dk, g.dv};
  const int64_t elems[kGrads] = {p.q_elems(), p.k_elems(), p.v_elems()};
  GradCheck c;
  c.pass = true;
  for (int i = 0; i < kGrads; ++i) {
    const ErrorStats s = compare_output(grads[i], p.dtype, ref.ref[i], elems[i], stream);
    c.grad[i] = judge(s, ErrorStats{}, ref.baseline_err[i], ref.rounding_err[i]);  // no LSE to judge
    c.pass = c.pass && c.grad[i].pass;
  }
  return c;
}

cudaError_t poison_gradients(const AttnProblem& p, const AttnGradBuffers& g, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(g.dq, 0xFF, size_t(p.q_elems()) * kInputElementBytes, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(g.dk, 0xFF, size_t(p.k_elems()) * kInputElementBytes, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(g.dv, 0xFF, size_t(p.v_elems()) * kInputElementBytes, stream);
  return e;
}

BwdRunOutcome run_and_check_backward(const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs,
                                     const GradReference* ref, cudaStream_t stream) {
  BwdRunOutcome out;
  const AttnGradBuffers g = bufs.grad();
  if (cudaError_t e = run_poisoned(v, p, g, stream); e != cudaSuccess) {
    out.error = launch_error_text(v, e);
    return out;
  }
  if (ref) {
    out.check = check_gradients(p, g, *ref, stream);
    out.checked = true;
  }
  read_first_values(g.dq, p.q_elems(), p.dtype, out.first_values);
  return out;
}

namespace {
// dQ, dK, dV as bytes, for the bitwise comparison.
std::vector<uint8_t> gradient_bytes(const AttnProblem& p, const AttnGradBuffers& g) {
  const size_t q = size_t(p.q_elems()) * kInputElementBytes, k = size_t(p.k_elems()) * kInputElementBytes;
  const size_t v = size_t(p.v_elems()) * kInputElementBytes;
  std::vector<uint8_t> h(q + k + v);
  cudaMemcpy(h.data(), g.dq, q, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data() + q, g.dk, k, cudaMemcpyDeviceToHost);
  cudaMemcpy(h.data() + q + k, g.dv, v, cudaMemcpyDeviceToHost);
  return h;
}
}  // namespace

std::string check_bitwise_repeatable(const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs, int runs,
                                     cudaStream_t stream, bool* identical) {
  const AttnGradBuffers g = bufs.grad();
  const std::vector<uint8_t> first = gradient_bytes(p, g);
  *identical = true;
  for (int r = 0; r < runs; ++r) {
    if (cudaError_t e = run_poisoned(v, p, g, stream); e != cudaSuccess) return launch_error_text(v, e);
    *identical = *identical && gradient_bytes(p, g) == first;
  }
  return "";
}

}  // namespace attnlab
