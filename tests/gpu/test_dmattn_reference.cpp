// GPU test of the dynamic-mask references: dma_reference_fp32 (exact
// and low-precision) and dma_build_topk_mask against the CPU double reference
// (kernels/reference/masked_reference_cpu.h) — GQA, broadcast masks and biases,
// softcap, causal with Nq != Nk (rows that see no key), ties and ±0 in the bias,
// windows of 0..Nk+, block smoothing of several sizes, a 32K-key row, and rows
// longer than shared memory holds (150K .. 2M keys: the builder then reads the
// keys from global memory), with the builder's time at Nq=1 Nk=512K and
// Nq=Nk=32K (under a second each).
// Standalone: prints "N passed, M failed", exit code 0 when all pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dmattn/dmattn.h"
#include "reference/masked_reference_cpu.h"
#include "gpu_testing.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

// 16-bit values: the bits for the device, their exact values for the CPU.
struct Tensor16 {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};

// Standard normal values; with `coarse`, rounded to multiples of 0.5 (many
// ties, both signs of zero).
Tensor16 random16(int64_t n, DType t, std::mt19937& rng, bool coarse = false) {
  std::normal_distribution<float> dist(0.f, 1.f);
  Tensor16 x;
  x.bits.resize(size_t(n));
  x.values.resize(size_t(n));
  for (int64_t e = 0; e < n; ++e) {
    float v = dist(rng);
    if (coarse) v = std::round(v * 2.f) / 2.f;  // std::round keeps the sign of a zero
    x.bits[size_t(e)] = to_bits(v, t);
    x.values[size_t(e)] = from_bits(x.bits[size_t(e)], t);
  }
  return x;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

struct Operand {
  int b = 0, h = 0, q = 0;  // b == 0: absent
};

struct Case {
  int B, H, Hkv, Nq, Nk, D;
  bool causal;
  float softcap;
  Operand mask, bias;
};

// One forward problem on both references, in exact and low-precision mode.
void forward_case(const Case& c, DType dtype, std::mt19937& rng) {
  DynamicMaskProblem p;
  p.B = c.B, p.H = c.H, p.Hkv = c.Hkv, p.Nq = c.Nq, p.Nk = c.Nk, p.D = c.D;
  p.dtype = dtype;
  p.causal = c.causal;
  p.scale = 1.f / std::sqrt(float(c.D));
  p.softcap = c.softcap;
  MaskedProblem m;
  m.B = c.B, m.H = c.H, m.Hkv = c.Hkv, m.Nq = c.Nq, m.Nk = c.Nk, m.D = c.D, m.Dv = c.D;
  m.causal = c.causal;
  m.scale = p.scale;
  m.softcap = c.softcap;

  const Tensor16 q = random16(int64_t(c.B) * c.H * c.Nq * c.D, dtype, rng);
  const Tensor16 k = random16(int64_t(c.B) * c.Hkv * c.Nk * c.D, dtype, rng);
  const Tensor16 v = random16(int64_t(c.B) * c.Hkv * c.Nk * c.D, dtype, rng);
  MaskedInputs in{q.values, k.values, v.values, {}, {}};
  uint8_t* d_mask = nullptr;
  uint16_t* d_bias = nullptr;
  if (c.mask.b) {
    p.mask.set_shape(c.mask.b, c.mask.h, c.mask.q, c.Nk, c.H);
    m.has_mask = true;
    m.mask_shape = {c.mask.b, c.mask.h, c.mask.q, c.Nk};
    std::bernoulli_distribution keep(0.5);
    in.mask.resize(size_t(m.mask_shape.elems()));
    for (auto& x : in.mask) x = keep(rng) ? 1 : 0;
    for (int j = 0; j < c.Nk; ++j) in.mask[size_t(j)] = 0;  // the first mask row hides every key
    p.mask.data = d_mask = upload(in.mask);
  }
  Tensor16 bias;
  if (c.bias.b) {
    p.bias.set_shape(c.bias.b, c.bias.h, c.bias.q, c.Nk, c.H);
    m.has_bias = true;
    m.bias_shape = {c.bias.b, c.bias.h, c.bias.q, c.Nk};
    bias = random16(m.bias_shape.elems(), dtype, rng);
    in.bias = bias.values;
    p.bias.data = d_bias = upload(bias.bits);
  }
  std::vector<double> o, lse;
  masked_attention_forward_cpu(m, in, o, lse);

  uint16_t *d_q = upload(q.bits), *d_k = upload(k.bits), *d_v = upload(v.bits);
  float *d_o = nullptr, *d_lse = nullptr;
  cudaMalloc(&d_o, o.size() * sizeof(float));
  cudaMalloc(&d_lse, lse.size() * sizeof(float));
  for (bool low : {false, true}) {
    const cudaError_t err = dma_reference_fp32(p, d_q, d_k, d_v, d_o, d_lse, low, nullptr);
    const cudaError_t sync = cudaDeviceSynchronize();
    const std::string what = p.shape_string() + (low ? " low-precision" : " fp32");
    if (err != cudaSuccess || sync != cudaSuccess) {
      record(false, what + ": " + cudaGetErrorString(err != cudaSuccess ? err : sync));
      continue;
    }
    const auto o_gpu = download(d_o, o.size());
    const auto lse_gpu = download(d_lse, lse.size());
    double o_err = 0, lse_err = 0;
    bool empty_rows_ok = true;
    for (size_t e = 0; e < o.size(); ++e) o_err = std::max(o_err, std::fabs(o_gpu[e] - o[e]));
    for (size_t r = 0; r < lse.size(); ++r) {
      if (std::isinf(lse[r])) empty_rows_ok &= std::isinf(lse_gpu[r]) && lse_gpu[r] < 0;
      else lse_err = std::max(lse_err, std::fabs(lse_gpu[r] - lse[r]));
    }
    const double tol = low ? (dtype == DType::kFloat16 ? 2e-2 : 6e-2) : 2e-5;  // low: loose, rounding of S and P
    const bool ok = o_err <= tol && lse_err <= tol && empty_rows_ok && !std::isnan(o_err + lse_err);
    if (!ok)
      std::printf("  %s: O err %.3e, LSE err %.3e, empty rows %s\n", what.c_str(), o_err, lse_err,
                  empty_rows_ok ? "ok" : "WRONG");
    record(ok, what);
  }
  cudaFree(d_q), cudaFree(d_k), cudaFree(d_v), cudaFree(d_o), cudaFree(d_lse), cudaFree(d_mask), cudaFree(d_bias);
}

// The top-W mask of one bias on the GPU equals build_topk_mask_cpu, bit for bit.
void topk_case(int Nq, int Nk, bool causal, Operand bs, int window, int block_size, bool coarse, DType dtype,
               std::mt19937& rng) {
  DynamicMaskProblem p;
  p.B = bs.b, p.H = 4, p.Hkv = 2, p.Nq = Nq, p.Nk = Nk, p.dtype = dtype, p.causal = causal;
  p.bias.set_shape(bs.b, bs.h, bs.q, Nk, p.H);
  MaskedProblem m;
  m.B = p.B, m.H = p.H, m.Hkv = p.Hkv, m.Nq = Nq, m.Nk = Nk, m.causal = causal;
  m.has_bias = true;
  m.bias_shape = {bs.b, bs.h, bs.q, Nk};
  const Tensor16 bias = random16(m.bias_shape.elems(), dtype, rng, coarse);
  const std::vector<uint8_t> want = build_topk_mask_cpu(m, bias.values, window, block_size);

  uint16_t* d_bias = upload(bias.bits);
  uint8_t* d_out = nullptr;
  cudaMalloc(&d_out, want.size());
  cudaMemset(d_out, 0xAB, want.size());
  p.bias.data = d_bias;
  const cudaError_t err = dma_build_topk_mask(p, window, block_size, d_out, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  const std::string what = "topk Nq=" + std::to_string(Nq) + " Nk=" + std::to_string(Nk) +
                           (causal ? " causal" : "") + " bias " + p.bias.shape_string(Nk) + " window " +
                           std::to_string(window) + " block " + std::to_string(block_size) +
                           (coarse ? " ties" : "") + " " + dtype_name(dtype);
  if (err != cudaSuccess || sync != cudaSuccess) {
    record(false, what + ": " + cudaGetErrorString(err != cudaSuccess ? err : sync));
  } else {
    const auto got = download(d_out, want.size());
    int64_t diff = 0;
    for (size_t e = 0; e < want.size(); ++e) diff += got[e] != want[e] ? 1 : 0;
    if (diff) std::printf("  %s: %lld of %zu differ\n", what.c_str(), (long long)diff, want.size());
    record(diff == 0, what);
  }
  cudaFree(d_bias), cudaFree(d_out);
}

// The builder's time on one large problem (bias (1, 1, 1, Nk), causal, W=1024),
// not checked against the CPU: it must stay well under a second.
void topk_speed(int Nq, int Nk, int block_size) {
  DynamicMaskProblem p;
  p.B = 1, p.H = 2, p.Hkv = 1, p.Nq = Nq, p.Nk = Nk, p.dtype = DType::kFloat16, p.causal = true;
  p.bias.set_shape(1, 1, 1, Nk, p.H);
  std::mt19937 rng(777);
  const Tensor16 bias = random16(Nk, p.dtype, rng);
  uint16_t* d_bias = upload(bias.bits);
  uint8_t* d_out = nullptr;
  const std::string what = "topk speed Nq=" + std::to_string(Nq) + " Nk=" + std::to_string(Nk) + " block " +
                           std::to_string(block_size);
  if (!d_bias || cudaMalloc(&d_out, size_t(Nq) * Nk) != cudaSuccess) {
    record(false, what + ": out of memory");
    cudaFree(d_bias);
    return;
  }
  p.bias.data = d_bias;
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  cudaError_t err = dma_build_topk_mask(p, 1024, block_size, d_out, nullptr);  // warm-up
  cudaEventRecord(start);
  if (err == cudaSuccess) err = dma_build_topk_mask(p, 1024, block_size, d_out, nullptr);
  cudaEventRecord(stop);
  const cudaError_t sync = cudaDeviceSynchronize();
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  if (err != cudaSuccess || sync != cudaSuccess) {
    record(false, what + ": " + cudaGetErrorString(err != cudaSuccess ? err : sync));
  } else {
    std::printf("  %s: %.2f ms\n", what.c_str(), ms);
    record(ms < 1000.f, what + " under a second");
  }
  cudaEventDestroy(start), cudaEventDestroy(stop);
  cudaFree(d_bias), cudaFree(d_out);
}

}  // namespace

int main() {
  if (!have_gpu()) return kSkipped;
  std::mt19937 rng(12345);
  const Case cases[] = {
      {1, 1, 1, 1, 1, 16, false, 0.f, {}, {}},
      {2, 4, 2, 37, 53, 40, false, 0.f, {}, {}},
      {2, 4, 2, 37, 53, 40, true, 0.f, {}, {}},
      {2, 4, 2, 53, 37, 64, true, 0.f, {1, 2, 53}, {2, 4, 1}},  // causal rows with no key
      {2, 4, 4, 70, 300, 128, false, 5.f, {2, 1, 1}, {1, 4, 70}},
      {1, 6, 2, 33, 1500, 96, true, 30.f, {1, 6, 33}, {1, 2, 33}},
      {2, 2, 1, 16, 4100, 256, false, 0.f, {2, 2, 16}, {2, 1, 1}},
      {1, 2, 2, 8, 64, 1024, false, 2.f, {}, {1, 1, 8}},
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const Case& c : cases) forward_case(c, dtype, rng);

  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (bool causal : {false, true})
      for (bool coarse : {false, true})
        for (auto [nq, nk] : {std::pair{37, 53}, std::pair{53, 37}, std::pair{64, 256}})
          for (int window : {-3, 0, 1, 7, nk / 2, nk, nk + 5})
            for (int block : {0, 1, 5, 16, 64, 100})
              topk_case(nq, nk, causal, {2, 2, nq}, window, block, coarse, dtype, rng);
  topk_case(40, 300, true, {1, 4, 1}, 50, 32, true, DType::kBFloat16, rng);  // one bias row for every query
  topk_case(3, 32768, true, {1, 1, 3}, 2048, 64, true, DType::kFloat16, rng);
  topk_case(3, 32768, false, {1, 2, 3}, 4096, 0, false, DType::kBFloat16, rng);

  // Rows longer than shared memory holds (~116K 16-bit keys on an H200): the keys
  // are re-read from the bias in global memory on every pass. "ties": a bias of
  // multiples of 0.5, so the W-th largest value is shared by thousands of keys.
  for (int nk : {200000, 524288})
    for (bool causal : {false, true})
      for (int block : {0, 64})
        for (bool coarse : {false, true})
          topk_case(1, nk, causal, {1, 1, 1}, 1024, block, coarse, causal ? DType::kBFloat16 : DType::kFloat16, rng);
  for (Operand bs : {Operand{1, 1, 1}, Operand{1, 1, 3}})  // one bias row for all queries; one per query
    for (int block : {0, 5, 64})
      for (bool coarse : {false, true})
        topk_case(3, 150001, true, bs, 1024, block, coarse, DType::kFloat16, rng);
  for (int window : {0, 1, 75000, 149999, 150006})  // none, one, half, all but 0/1/2 keys per row, all
    topk_case(3, 150001, true, {1, 1, 3}, window, 100, true, DType::kBFloat16, rng);
  topk_case(2, 130000, false, {2, 2, 2}, 65000, 64, false, DType::kFloat16, rng);  // half kept: blocks survive
  topk_case(2, 130000, true, {2, 2, 2}, 90000, 7, true, DType::kBFloat16, rng);
  topk_case(1, (1 << 21) + 3, true, {1, 1, 1}, 4096, 0, true, DType::kFloat16, rng);
  topk_case(1, 1 << 21, false, {1, 1, 1}, 1 << 20, 64, false, DType::kBFloat16, rng);

  topk_speed(1, 524288, 0);
  topk_speed(1, 524288, 64);
  topk_speed(32768, 32768, 64);

  // Out-of-range requests are refused, not run.
  DynamicMaskProblem big;
  big.Nk = dma_reference_max_nk() + 1;
  record(dma_reference_fp32(big, nullptr, nullptr, nullptr, nullptr, nullptr, false, nullptr) == cudaErrorInvalidValue,
         "reference refuses Nk > dma_reference_max_nk()");
  DynamicMaskProblem no_bias;
  record(dma_build_topk_mask(no_bias, 4, 0, nullptr, nullptr) == cudaErrorInvalidValue, "topk refuses a missing bias");

  std::printf("dma_reference_max_nk() = %d\n", dma_reference_max_nk());
  return finish();
}
