// GPU test (ctest -L gpu): the backward kernel of dynamic-mask attention
// (dma_backward, kernels/dmattn/dmattn_bwd.cu) against the fp32 GPU reference
// backward (dma_reference_backward_fp32, checked against the CPU double
// reference by test_dmattn_backward_reference): dQ, dK, dV and dBias
// separately, fresh random inputs, outputs poisoned with NaN, every head dim the
// kernel takes, GQA, broadcast mask and bias, softcap, causal with Nq != Nk,
// fully masked rows, both dtypes.
// Interim pass rule, until a same-precision unfused backward exists to measure
// the baseline error against: max |g - g_ref| <= c · max(1, max |g_ref|) with
// c = 1e-2 (fp16) or 4e-2 (bf16); a wrong term or transpose gives O(1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/dmattn/dmattn.h"
#include "../../kernels/reference/masked_reference_cpu.h"

using namespace attnlab;

namespace {

int passed = 0, failed = 0;
void record(bool ok, const std::string& what) {
  if (ok) ++passed;
  else {
    ++failed;
    std::printf("FAIL %s\n", what.c_str());
  }
}

uint16_t to_bits(double x, DType t) {
  if (t == DType::kFloat16) return __half_raw(__float2half(float(x))).x;
  return __nv_bfloat16_raw(__float2bfloat16(float(x))).x;
}
double from_bits(uint16_t b, DType t) {
  if (t == DType::kFloat16) return __half2float(__half(__half_raw{b}));
  return __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{b}));
}

void random_tensor(std::mt19937_64& rng, int64_t n, DType t, double sd, std::vector<uint16_t>& bits,
                   std::vector<double>& vals) {
  std::normal_distribution<double> dist(0.0, sd);
  bits.resize(size_t(n));
  vals.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    bits[size_t(i)] = to_bits(dist(rng), t);
    vals[size_t(i)] = from_bits(bits[size_t(i)], t);
  }
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* dev = nullptr;
  cudaMalloc(&dev, std::max<size_t>(1, host.size() * sizeof(T)));
  cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return dev;
}

// A 16-bit gradient against the fp32 reference gradient.
void compare(const std::string& what, const void* dev, const float* ref_dev, size_t n, DType t) {
  std::vector<uint16_t> got(n);
  std::vector<float> ref(n);
  cudaMemcpy(got.data(), dev, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(ref.data(), ref_dev, n * 4, cudaMemcpyDeviceToHost);
  double err = 0, scale = 1;
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = from_bits(got[i], t);
    if (!std::isfinite(x)) ++bad;
    else err = std::max(err, std::fabs(x - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  const double c = t == DType::kFloat16 ? 1e-2 : 4e-2;
  char buf[96];
  std::snprintf(buf, sizeof buf, " err %.2e (scale %.2e, nonfinite %lld)", err, scale, (long long)bad);
  record(bad == 0 && err <= c * scale, what + buf);
}

struct Case {
  int B, H, Hkv, Nq, Nk, D;
  DType dtype;
  bool causal;
  float softcap;
  int mb, mh, mq;  // mask sizes (mh: 0 = H, -1 = Hkv, 1 = 1); mb = 0: no mask
  int bb, bh, bq;  // bias sizes; bb = 0: no bias
  bool zero_rows;
};

int heads_of(int code, const Case& c) { return code == 0 ? c.H : code == -1 ? c.Hkv : 1; }

void run_case(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  DynamicMaskProblem p;
  p.B = c.B; p.H = c.H; p.Hkv = c.Hkv; p.Nq = c.Nq; p.Nk = c.Nk; p.D = c.D;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.scale = 1.0f / std::sqrt(float(c.D));
  p.softcap = c.softcap;
  MaskedProblem mp;
  mp.B = c.B; mp.H = c.H; mp.Hkv = c.Hkv; mp.Nq = c.Nq; mp.Nk = c.Nk; mp.D = mp.Dv = c.D;
  mp.causal = c.causal;
  mp.scale = p.scale;
  mp.softcap = c.softcap;

  MaskedInputs in;
  std::vector<uint16_t> qb, kb, vb, bb, db;
  std::vector<double> dout;
  random_tensor(rng, int64_t(c.B) * c.H * c.Nq * c.D, c.dtype, 1.0, qb, in.q);
  random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, c.dtype, 1.0, kb, in.k);
  random_tensor(rng, int64_t(c.B) * c.Hkv * c.Nk * c.D, c.dtype, 1.0, vb, in.v);
  random_tensor(rng, int64_t(c.B) * c.H * c.Nq * c.D, c.dtype, 1.0, db, dout);
  void* d_bias = nullptr;
  uint8_t* d_mask = nullptr;
  if (c.bb > 0) {
    mp.has_bias = true;
    mp.bias_shape = {c.bb, heads_of(c.bh, c), c.bq, c.Nk};
    random_tensor(rng, mp.bias_shape.elems(), c.dtype, 2.0, bb, in.bias);
    d_bias = upload(bb);
    p.bias.data = d_bias;
    p.bias.set_shape(c.bb, heads_of(c.bh, c), c.bq, c.Nk, c.H);
  }
  if (c.mb > 0) {
    mp.has_mask = true;
    mp.mask_shape = {c.mb, heads_of(c.mh, c), c.mq, c.Nk};
    in.mask.resize(size_t(mp.mask_shape.elems()));
    std::bernoulli_distribution keep(0.5);
    for (auto& m : in.mask) m = keep(rng) ? 1 : 0;
    if (c.zero_rows && c.mq > 1)
      for (int64_t r = 0; r < mp.mask_shape.elems() / c.Nk; r += 3)
        std::fill(in.mask.begin() + r * c.Nk, in.mask.begin() + (r + 1) * c.Nk, 0);
    d_mask = upload(in.mask);
    p.mask.data = d_mask;
    p.mask.set_shape(c.mb, heads_of(c.mh, c), c.mq, c.Nk, c.H);
  }
  const std::string why = dma_backward_unsupported(p);
  if (!why.empty()) {
    record(false, "unsupported: " + why);
    return;
  }
  const size_t q_n = size_t(c.B) * c.H * c.Nq * c.D, kv_n = size_t(c.B) * c.Hkv * c.Nk * c.D;
  const size_t rows = size_t(c.B) * c.H * c.Nq, bias_n = c.bb > 0 ? size_t(p.bias.elems(c.Nk)) : 0;
  void* d_q = upload(qb);
  void* d_k = upload(kb);
  void* d_v = upload(vb);
  void* d_do = upload(db);
  void *d_o = nullptr, *d_dq = nullptr, *d_dk = nullptr, *d_dv = nullptr, *d_db = nullptr;
  float *d_lse = nullptr, *d_ws = nullptr, *r_dq = nullptr, *r_dk = nullptr, *r_dv = nullptr, *r_db = nullptr;
  cudaMalloc(&d_o, q_n * 2);
  cudaMalloc(&d_lse, rows * 4);
  cudaMalloc(&d_dq, q_n * 2);
  cudaMalloc(&d_dk, kv_n * 2);
  cudaMalloc(&d_dv, kv_n * 2);
  cudaMalloc(&d_db, std::max<size_t>(1, bias_n) * 2);
  cudaMalloc(&r_dq, q_n * 4);
  cudaMalloc(&r_dk, kv_n * 4);
  cudaMalloc(&r_dv, kv_n * 4);
  cudaMalloc(&r_db, std::max<size_t>(1, bias_n) * 4);
  const size_t ws = dma_backward_workspace_bytes(p);
  cudaMalloc(&d_ws, ws);
  for (void* out : {d_dq, d_dk, d_dv, d_db}) cudaMemset(out, 0xFF, out == d_dq ? q_n * 2 : out == d_db ? std::max<size_t>(1, bias_n) * 2 : kv_n * 2);
  DmaForwardArgs fa;
  fa.q = d_q; fa.k = d_k; fa.v = d_v; fa.o = d_o; fa.lse = d_lse;
  DmaBackwardArgs ba;
  ba.q = d_q; ba.k = d_k; ba.v = d_v; ba.o = d_o; ba.lse = d_lse; ba.dout = d_do;
  ba.dq = d_dq; ba.dk = d_dk; ba.dv = d_dv; ba.dbias = d_bias ? d_db : nullptr;
  ba.workspace = d_ws; ba.workspace_bytes = ws;
  cudaError_t e = dma_forward(p, fa, 0);
  if (e == cudaSuccess) e = dma_backward(p, ba, 0);
  if (e == cudaSuccess)
    e = dma_reference_backward_fp32(p, d_q, d_k, d_v, d_do, r_dq, r_dk, r_dv, d_bias ? r_db : nullptr, 0);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  char name[200];
  std::snprintf(name, sizeof name, "B=%d H=%d Hkv=%d Nq=%d Nk=%d D=%d %s%s%s mask(%d,%d,%d) bias(%d,%d,%d)%s", c.B,
                c.H, c.Hkv, c.Nq, c.Nk, c.D, c.dtype == DType::kFloat16 ? "fp16" : "bf16", c.causal ? " causal" : "",
                c.softcap > 0 ? " softcap" : "", c.mb, c.mh, c.mq, c.bb, c.bh, c.bq, c.zero_rows ? " zero-rows" : "");
  if (e != cudaSuccess) {
    record(false, std::string("CUDA error ") + cudaGetErrorString(e) + ": " + name);
    cudaGetLastError();
  } else {
    compare(std::string("dQ ") + name, d_dq, r_dq, q_n, c.dtype);
    compare(std::string("dK ") + name, d_dk, r_dk, kv_n, c.dtype);
    compare(std::string("dV ") + name, d_dv, r_dv, kv_n, c.dtype);
    if (d_bias) compare(std::string("dBias ") + name, d_db, r_db, bias_n, c.dtype);
  }
  for (void* ptr : {d_o, static_cast<void*>(d_lse), d_dq, d_dk, d_dv, d_db, static_cast<void*>(d_ws),
                    static_cast<void*>(r_dq), static_cast<void*>(r_dk), static_cast<void*>(r_dv),
                    static_cast<void*>(r_db)})
    cudaFree(ptr);
  for (void* ptr : {d_q, d_k, d_v, d_do, d_bias, static_cast<void*>(d_mask)})
    if (ptr) cudaFree(ptr);
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA GPU found; GPU tests need one\n0 passed, 1 failed\n");
    return 1;
  }
  uint64_t seed = 4242;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (bool causal : {false, true}) {
      for (int D : {32, 64, 96, 128})  // flash-dmattn's shape: GQA, mask per KV head, bias (1, Hkv, 1, Nk)
        run_case({1, 4, 2, 129, 200, D, dt, causal, 0.f, 1, -1, 129, 1, -1, 1, false}, ++seed);
      run_case({2, 2, 2, 200, 70, 64, dt, causal, 0.f, 1, 0, 200, 2, 0, 200, false}, ++seed);  // Nq > Nk; per-query bias
      run_case({1, 4, 1, 100, 300, 128, dt, causal, 15.f, 1, 0, 100, 1, 1, 1, true}, ++seed);  // MQA, softcap, zero rows
      run_case({2, 2, 1, 17, 1000, 96, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed);    // no mask
      run_case({1, 2, 2, 1000, 17, 64, dt, causal, 0.f, 0, 0, 0, 0, 0, 0, false}, ++seed);    // neither
    }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
