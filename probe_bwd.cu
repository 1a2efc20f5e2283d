// One-off probe: the backward rungs against the fp32 reference backward, and their time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dmattn/dmattn.h"
#include "host/variant.h"
#include "reference/reference.h"

using namespace attnlab;

namespace attnlab {
std::vector<BwdVariant> make_bwd_ws_variants();
std::vector<BwdVariant> make_bwd_mma_variants();
const std::vector<BwdVariant>& probe_variants() {
  static const std::vector<BwdVariant> v = [] {
    std::vector<BwdVariant> a = make_bwd_mma_variants(), b = make_bwd_ws_variants();
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }();
  return v;
}
size_t device_smem_optin_bytes() {
  int d = 0, bytes = 0;
  cudaGetDevice(&d);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, d);
  return size_t(bytes);
}
int device_sm_count() { return 132; }
}  // namespace attnlab

template <typename T>
__global__ void to_dtype(const float* in, T* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = T(in[i]);
}

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

struct Bufs {
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *ws;
  float *lse, *o32, *rq, *rk, *rv, *lq, *lk, *lv;
  size_t ws_bytes;
};

static int fails = 0;

void run(int B, int H, int Hkv, int Nq, int Nk, int D, DType dt, bool causal, bool timeit, const std::string& only) {
  DynamicMaskProblem dp;
  dp.B = B; dp.H = H; dp.Hkv = Hkv; dp.Nq = Nq; dp.Nk = Nk; dp.D = D; dp.dtype = dt; dp.causal = causal;
  dp.scale = 1.f / std::sqrt(float(D));
  AttnProblem p = dp.dense();
  const int64_t nq = p.q_elems(), nk = p.k_elems(), nl = p.lse_elems();
  Bufs b{};
  size_t ws = 0;
  for (const BwdVariant& v : probe_variants()) ws = std::max(ws, v.workspace_bytes(p));
  CK(cudaMalloc(&b.q, nq * 2)); CK(cudaMalloc(&b.k, nk * 2)); CK(cudaMalloc(&b.v, nk * 2));
  CK(cudaMalloc(&b.o, nq * 2)); CK(cudaMalloc(&b.dout, nq * 2)); CK(cudaMalloc(&b.dq, nq * 2));
  CK(cudaMalloc(&b.dk, nk * 2)); CK(cudaMalloc(&b.dv, nk * 2)); CK(cudaMalloc(&b.ws, ws + 256));
  CK(cudaMalloc(&b.lse, nl * 4)); CK(cudaMalloc(&b.o32, nq * 4));
  CK(cudaMalloc(&b.rq, nq * 4)); CK(cudaMalloc(&b.rk, nk * 4)); CK(cudaMalloc(&b.rv, nk * 4));
  CK(cudaMalloc(&b.lq, nq * 4)); CK(cudaMalloc(&b.lk, nk * 4)); CK(cudaMalloc(&b.lv, nk * 4));
  cudaStream_t s = 0;
  CK(fill_random_normal(b.q, nq, dt, 11, s)); CK(fill_random_normal(b.k, nk, dt, 12, s));
  CK(fill_random_normal(b.v, nk, dt, 13, s)); CK(fill_random_normal(b.dout, nq, dt, 14, s));
  CK(dma_reference_fp32(dp, b.q, b.k, b.v, b.o32, b.lse, false, s));
  if (dt == DType::kFloat16) to_dtype<half><<<unsigned((nq + 255) / 256), 256>>>(b.o32, (half*)b.o, nq);
  else to_dtype<__nv_bfloat16><<<unsigned((nq + 255) / 256), 256>>>(b.o32, (__nv_bfloat16*)b.o, nq);
  const bool check = Nk <= 20000 && !timeit;
  double base[3] = {0, 0, 0}, rnd[3];
  if (check) {
    CK(dma_reference_backward_fp32(dp, b.q, b.k, b.v, b.dout, b.rq, b.rk, b.rv, nullptr, s, false));
    CK(dma_reference_backward_fp32(dp, b.q, b.k, b.v, b.dout, b.lq, b.lk, b.lv, nullptr, s, true));
    base[0] = compare_output_fp32(b.lq, b.rq, nq, s).max_abs_err;
    base[1] = compare_output_fp32(b.lk, b.rk, nk, s).max_abs_err;
    base[2] = compare_output_fp32(b.lv, b.rv, nk, s).max_abs_err;
    rnd[0] = output_rounding_error(b.rq, nq, dt, s);
    rnd[1] = output_rounding_error(b.rk, nk, dt, s);
    rnd[2] = output_rounding_error(b.rv, nk, dt, s);
  }
  AttnGradBuffers g;
  g.q = b.q; g.k = b.k; g.v = b.v; g.o = b.o; g.lse = b.lse; g.dout = b.dout; g.dq = b.dq; g.dk = b.dk; g.dv = b.dv;
  g.workspace = b.ws; g.workspace_bytes = ws;
  for (const BwdVariant& v : probe_variants()) {
    if (!only.empty() && v.name != only) continue;
    std::string why = v.unsupported_reason(p);
    char shape[160];
    std::snprintf(shape, sizeof shape, "B%d H%d/%d %dx%d D%d %s%s", B, H, Hkv, Nq, Nk, D, dtype_name(dt),
                  causal ? " causal" : "");
    if (!why.empty()) { std::printf("%-22s %s unsupported: %s\n", v.name.c_str(), shape, why.c_str()); continue; }
    CK(cudaMemset(b.dq, 0xFF, nq * 2)); CK(cudaMemset(b.dk, 0xFF, nk * 2)); CK(cudaMemset(b.dv, 0xFF, nk * 2));
    cudaError_t e = v.launch(p, g, s);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { std::printf("%-22s %s launch error %s\n", v.name.c_str(), shape, cudaGetErrorString(e)); ++fails; std::exit(1); }
    if (check) {
      ErrorStats eq = compare_output(b.dq, dt, b.rq, nq, s), ek = compare_output(b.dk, dt, b.rk, nk, s),
                 ev = compare_output(b.dv, dt, b.rv, nk, s);
      const double errs[3] = {eq.max_abs_err, ek.max_abs_err, ev.max_abs_err};
      const int64_t nf = eq.nonfinite + ek.nonfinite + ev.nonfinite;
      bool ok = nf == 0;
      for (int i = 0; i < 3; ++i) ok = ok && errs[i] <= 2 * base[i] + 2 * rnd[i] + 1e-6;
      bool det_ok = true;
      if (v.deterministic) {
        std::vector<uint16_t> h0(nq), h1(nq);
        CK(cudaMemcpy(h0.data(), b.dq, nq * 2, cudaMemcpyDeviceToHost));
        for (int r = 0; r < 4; ++r) {
          CK(v.launch(p, g, s)); CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(h1.data(), b.dq, nq * 2, cudaMemcpyDeviceToHost));
          det_ok = det_ok && std::memcmp(h0.data(), h1.data(), nq * 2) == 0;
        }
      }
      ok = ok && det_ok;
      if (!ok) ++fails;
      std::printf("%-22s %s %s dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e nonfinite %lld%s\n", v.name.c_str(), shape,
                  ok ? "PASS" : "FAIL", errs[0], 2 * base[0] + 2 * rnd[0], errs[1], 2 * base[1] + 2 * rnd[1], errs[2],
                  2 * base[2] + 2 * rnd[2], (long long)nf, v.deterministic ? (det_ok ? " bitwise-same" : " NOT-DETERMINISTIC") : "");
    }
    if (timeit) {
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0); cudaEventCreate(&e1);
      std::vector<float> ms;
      for (int it = 0; it < 12; ++it) {
        cudaEventRecord(e0, s);
        CK(v.launch(p, g, s));
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float t; cudaEventElapsedTime(&t, e0, e1);
        if (it >= 2) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      std::printf("%-22s %s time %.3f ms  %.1f TFLOPS\n", v.name.c_str(), shape, med, backward_flops(p) / (med * 1e-3) / 1e12);
    }
  }
  for (void* x : {b.q, b.k, b.v, b.o, b.dout, b.dq, b.dk, b.dv, b.ws}) cudaFree(x);
  for (float* x : {b.lse, b.o32, b.rq, b.rk, b.rv, b.lq, b.lk, b.lv}) cudaFree(x);
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const bool times = argc > 2 && std::string(argv[2]) == "time";
  if (argc > 2 && std::string(argv[2]) == "san") {
    for (int D : {64, 128}) {
      run(2, 4, 2, 257, 383, D, DType::kFloat16, true, false, only);
      run(1, 2, 1, 300, 129, D, DType::kBFloat16, false, false, only);
    }
  } else if (!times) {
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (int D : {64, 128})
        for (bool c : {false, true}) {
          for (int N : {1, 17, 129, 1000}) run(1, 2, 2, N, N, D, dt, c, false, only);
          run(1, 2, 2, 300, 1000, D, dt, c, false, only);
          run(1, 2, 2, 1000, 300, D, dt, c, false, only);
          run(2, 4, 2, 257, 383, D, dt, c, false, only);
        }
  } else {
    for (int D : {64, 128})
      for (bool c : {false, true}) run(1, 8, 8, 8192, 8192, D, DType::kFloat16, c, true, only);
    run(4, 16, 16, 4096, 4096, 128, DType::kBFloat16, true, true, only);
  }
  std::printf("%d failed\n", fails);
  return fails ? 1 : 0;
}
