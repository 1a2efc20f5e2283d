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

#include "dmattn_cases.h"
#include "gpu_testing.h"

using namespace attnlab;
using namespace attnlab::testing;

namespace {

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

void run_case(const MaskedCase& c, uint64_t seed) {
  MaskedCaseInputs x(c, seed);
  const DynamicMaskProblem& p = x.p;
  void* const d_bias = x.d_bias;
  MaskedGrads g;
  masked_attention_backward_cpu(x.mp, x.in, x.dout, g);

  void* d_q = upload(x.qb);
  void* d_k = upload(x.kb);
  void* d_v = upload(x.vb);
  void* d_do = upload(x.db);
  float *d_dq = nullptr, *d_dk = nullptr, *d_dv = nullptr, *d_dbias = nullptr;
  cudaMalloc(&d_dq, g.dq.size() * sizeof(float));
  cudaMalloc(&d_dk, g.dk.size() * sizeof(float));
  cudaMalloc(&d_dv, g.dv.size() * sizeof(float));
  cudaMalloc(&d_dbias, std::max<size_t>(1, g.dbias.size()) * sizeof(float));
  cudaMemset(d_dq, 0xFF, g.dq.size() * sizeof(float));  // NaN: the function must zero and write everything
  cudaError_t e = dma_reference_backward_fp32(p, d_q, d_k, d_v, d_do, d_dq, d_dk, d_dv, d_bias ? d_dbias : nullptr, 0);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  const std::string name = c.name();
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
                    static_cast<void*>(d_dbias)})
    if (ptr) cudaFree(ptr);
}

}  // namespace

int main() {
  if (!have_gpu()) return kSkipped;
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
  return finish();
}
