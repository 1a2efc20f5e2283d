// GPU test (ctest -L gpu): the fp32 GPU reference backward of dynamic-mask
// attention (dma_reference_backward_fp32) against the CPU double reference
// (masked_attention_backward_cpu, itself checked by finite differences in the
// CPU tests). The GPU reference is what the fast backward kernel will be judged
// against, so it is checked first: dQ, dK, dV and dBias separately, GQA, every
// head mapping of mask and bias, broadcast over queries, softcap, causal with
// Nq != Nk (rows that see no key), fully masked rows, both dtypes.
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

// max |gpu - cpu| <= 1e-4 · max(1, max |cpu|): fp32 against double on small sizes.
void compare(const std::string& what, const float* dev, const std::vector<double>& ref) {
  std::vector<float> got(ref.size());
  cudaMemcpy(got.data(), dev, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
  double err = 0, scale = 1;
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) ++bad;
    else err = std::max(err, std::fabs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, " err %.2e (scale %.2e, nonfinite %lld)", err, scale, (long long)bad);
  record(bad == 0 && err <= 1e-4 * scale, what + buf);
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
  MaskedGrads g;
  masked_attention_backward_cpu(mp, in, dout, g);

  void* d_q = upload(qb);
  void* d_k = upload(kb);
  void* d_v = upload(vb);
  void* d_do = upload(db);
  float *d_dq = nullptr, *d_dk = nullptr, *d_dv = nullptr, *d_dbias = nullptr;
  cudaMalloc(&d_dq, g.dq.size() * sizeof(float));
  cudaMalloc(&d_dk, g.dk.size() * sizeof(float));
  cudaMalloc(&d_dv, g.dv.size() * sizeof(float));
  cudaMalloc(&d_dbias, std::max<size_t>(1, g.dbias.size()) * sizeof(float));
  cudaMemset(d_dq, 0xFF, g.dq.size() * sizeof(float));  // NaN: the function must zero and write everything
  cudaError_t e = dma_reference_backward_fp32(p, d_q, d_k, d_v, d_do, d_dq, d_dk, d_dv, d_bias ? d_dbias : nullptr, 0);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  char name[200];
  std::snprintf(name, sizeof name, "B=%d H=%d Hkv=%d Nq=%d Nk=%d D=%d %s%s%s mask(%d,%d,%d) bias(%d,%d,%d)%s", c.B,
                c.H, c.Hkv, c.Nq, c.Nk, c.D, c.dtype == DType::kFloat16 ? "fp16" : "bf16", c.causal ? " causal" : "",
                c.softcap > 0 ? " softcap" : "", c.mb, c.mh, c.mq, c.bb, c.bh, c.bq, c.zero_rows ? " zero-rows" : "");
  if (e != cudaSuccess) {
    record(false, std::string("CUDA error ") + cudaGetErrorString(e) + ": " + name);
    cudaGetLastError();
  } else {
    compare(std::string("dQ ") + name, d_dq, g.dq);
    compare(std::string("dK ") + name, d_dk, g.dk);
    compare(std::string("dV ") + name, d_dv, g.dv);
    if (d_bias) compare(std::string("dBias ") + name, d_dbias, g.dbias);
  }
  for (void* ptr : {d_q, d_k, d_v, d_do, static_cast<void*>(d_dq), static_cast<void*>(d_dk), static_cast<void*>(d_dv),
                    static_cast<void*>(d_dbias), d_bias, static_cast<void*>(d_mask)})
    if (ptr) cudaFree(ptr);
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA GPU found; GPU tests need one\n0 passed, 1 failed\n");
    return 1;
  }
  uint64_t seed = 777;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (bool causal : {false, true}) {
      // GQA; mask per KV head and query; bias per KV head broadcast over queries (flash-dmattn's shape)
      run_case({1, 4, 2, 37, 53, 64, dt, causal, 0.f, 1, -1, 37, 1, -1, 1, false}, ++seed);
      // Nq > Nk (causal: the first rows see no key); bias per query head and query; mask over batch broadcast
      run_case({2, 2, 2, 53, 37, 32, dt, causal, 0.f, 1, 0, 53, 2, 0, 53, false}, ++seed);
      // MQA, softcap, fully masked rows, mask per query head
      run_case({1, 4, 1, 40, 70, 128, dt, causal, 20.f, 1, 0, 40, 1, 1, 1, true}, ++seed);
      // no mask, bias broadcast over everything but keys
      run_case({2, 2, 1, 17, 129, 96, dt, causal, 0.f, 0, 0, 0, 1, 1, 1, false}, ++seed);
      // neither mask nor bias
      run_case({1, 2, 2, 33, 65, 256, dt, causal, 0.f, 0, 0, 0, 0, 0, 0, false}, ++seed);
    }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
