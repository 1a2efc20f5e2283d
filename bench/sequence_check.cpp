#include "sequence_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace attnlab {
namespace {

// How near a verdict is to failing: its error over its bound, O or LSE,
// whichever is nearer; infinite for NaN, Inf or unwritten elements.
double share_of_bound(const CheckResult& c) {
  const double inf = std::numeric_limits<double>::infinity();
  if (c.nonfinite != 0) return inf;
  const double o = c.tol > 0 ? c.err / c.tol : (c.err > 0 ? inf : 0.0);
  const double lse = c.lse_tol > 0 ? c.lse_err / c.lse_tol : (c.lse_err > 0 ? inf : 0.0);
  return std::max(o, lse);
}

}  // namespace

std::string allocate_sequence_scratch(DeviceArena& arena, const AttnProblem& longest, size_t unfused_bytes,
                                      SequenceScratch* sc) {
  const AttnProblem& p = longest;
  const size_t q_rows = size_t(p.H) * p.Nq, kv_rows = size_t(p.kv_heads()) * p.Nk;
  for (std::string e : {arena.alloc(q_rows * p.D, &sc->q, "the unpacked Q"),
                        arena.alloc(kv_rows * p.D, &sc->k, "the unpacked K"),
                        arena.alloc(kv_rows * p.Dv, &sc->v, "the unpacked V"),
                        arena.alloc(q_rows * p.Dv, &sc->o, "the unpacked O"),
                        arena.alloc(q_rows, &sc->lse, "the unpacked LSE"),
                        arena.alloc(q_rows * p.Dv, &sc->o_ref, "the reference O"),
                        arena.alloc(q_rows, &sc->lse_ref, "the reference LSE")})
    if (!e.empty()) return e;
  uint8_t* unfused_ws = nullptr;
  if (unfused_bytes > 0 && arena.alloc(unfused_bytes, &unfused_ws, "the unfused baseline's S").empty()) {
    sc->unfused_workspace = unfused_ws;
    sc->unfused_workspace_bytes = unfused_bytes;
  }
  return "";
}

cudaError_t unpack_rows(void* dense, const void* packed, int64_t row0, int rows, int heads, int width,
                        cudaStream_t s) {
  const size_t e = kInputElementBytes, row_bytes = size_t(width) * e;
  for (int h = 0; h < heads; ++h) {
    const char* src = static_cast<const char*>(packed) + (size_t(row0) * heads + h) * row_bytes;
    char* dst = static_cast<char*>(dense) + size_t(h) * rows * row_bytes;
    if (cudaError_t err = cudaMemcpy2DAsync(dst, row_bytes, src, size_t(heads) * row_bytes, row_bytes, size_t(rows),
                                            cudaMemcpyDeviceToDevice, s);
        err != cudaSuccess)
      return err;
  }
  return cudaSuccess;
}

RunError sequence_reference(const AttnProblem& sp, const SequenceScratch& sc, cudaStream_t s, ReferenceData* ref) {
  cudaError_t e = cudaSuccess;
  if (sp.Nk > 0) {
    e = reference_attention_fp32(sp, sc.q, sc.k, sc.v, sc.o_ref, sc.lse_ref, s);
  } else {  // no key: every row's O is 0 and its LSE -inf
    const std::vector<float> no_key(size_t(sp.lse_elems()), -std::numeric_limits<float>::infinity());
    e = cudaMemsetAsync(sc.o_ref, 0, size_t(sp.o_elems()) * sizeof(float), s);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(sc.lse_ref, no_key.data(), no_key.size() * sizeof(float), cudaMemcpyHostToDevice, s);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return cuda_error_text("the reference of one sequence", e);
  ref->o_ref = sc.o_ref;
  ref->lse_ref = sc.lse_ref;
  ref->rounding_err = output_rounding_error(sc.o_ref, sp.o_elems(), sp.dtype, s);
  ref->baseline_err = -1;

  // The yardstick: the unfused baseline on this sequence, into the O scratch.
  static const Variant unfused = make_unfused_baseline();
  if (sp.Nk > 0 && sc.unfused_workspace && sc.unfused_workspace_bytes >= unfused_workspace_granule(sp) &&
      unfused.unsupported_reason(sp).empty()) {
    AttnBuffers ub;
    ub.q = sc.q;
    ub.k = sc.k;
    ub.v = sc.v;
    ub.o = sc.o;
    ub.lse = sc.lse;
    ub.workspace = sc.unfused_workspace;
    ub.workspace_bytes = sc.unfused_workspace_bytes;
    e = poison_outputs(sp, ub, s);
    if (e == cudaSuccess) e = unfused.launch(sp, ub, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return cuda_error_text("the unfused baseline on one sequence", e);
    const ErrorStats base = compare_output(sc.o, sp.dtype, sc.o_ref, sp.o_elems(), s);
    if (base.nonfinite == 0) ref->baseline_err = base.max_abs_err;
  }
  return {};
}

bool worse_verdict(const CheckResult& a, const CheckResult& b) {
  if (a.pass != b.pass) return !a.pass;
  return share_of_bound(a) > share_of_bound(b);
}

void read_first_values(const void* x, int64_t n, DType dtype, float out[3]) {
  if (n <= 0) return;
  uint16_t raw[3] = {0, 0, 0};
  cudaMemcpy(&raw[0], x, sizeof(uint16_t) * (n >= 2 ? 2 : 1), cudaMemcpyDeviceToHost);
  cudaMemcpy(&raw[2], static_cast<const uint16_t*>(x) + (n - 1), sizeof(uint16_t), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 3; ++i)
    out[i] = dtype == DType::kBFloat16 ? __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{raw[i]}))
                                       : __half2float(__half(__half_raw{raw[i]}));
}

}  // namespace attnlab
