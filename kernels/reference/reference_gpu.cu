// attnlab: the fp32 GPU reference, the input generator and the comparisons.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#include <algorithm>

#include "common/block_reduce.cuh"
#include "reference/dtype_cast.cuh"
#include "reference/reference.h"

namespace attnlab {
namespace {

constexpr int kRefThreads = 256;
constexpr int kRefWarps = kRefThreads / 32;
constexpr int kRefChunk = 1024;                                        // keys per pass
constexpr int kRefColsPerThread = kMaxReferenceHeadDim / kRefThreads;  // O columns a thread owns


// One block per query row (grid: Nq, H, B).
template <typename T>
__global__ void __launch_bounds__(kRefThreads)
reference_kernel(const T* q, const T* k, const T* v, float* o, float* lse, AttnProblem p) {
  __shared__ float q_row[kMaxReferenceHeadDim];
  __shared__ float s[kRefChunk];  // scores, then probabilities, of one chunk
  __shared__ float scratch[kRefWarps];
  const int64_t i = blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const T* Q = q + (head * p.Nq + i) * p.D;
  const T* K = k + p.kv_head(head) * p.Nk * p.D;  // GQA: the KV head this query head reads
  const T* V = v + p.kv_head(head) * p.Nk * p.Dv;
  for (int d = threadIdx.x; d < p.D; d += kRefThreads) q_row[d] = to_float(Q[d]);
  const int64_t n_keys = visible_keys(i, p);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float m = -INFINITY, l = 0.f, acc[kRefColsPerThread] = {};
  __syncthreads();
  for (int64_t c0 = 0; c0 < n_keys; c0 += kRefChunk) {
    const int n = n_keys - c0 < kRefChunk ? int(n_keys - c0) : kRefChunk;
    for (int jj = warp; jj < n; jj += kRefWarps) {  // one warp per key: lanes split D
      const T* Kj = K + (c0 + jj) * p.D;
      float dot = 0.f;
      for (int d = lane; d < p.D; d += 32) dot += q_row[d] * to_float(Kj[d]);
      for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (lane == 0) s[jj] = dot * p.scale;
    }
    __syncthreads();
    float chunk_max = -INFINITY;
    for (int jj = threadIdx.x; jj < n; jj += kRefThreads) chunk_max = fmaxf(chunk_max, s[jj]);
    const float m_new = fmaxf(m, block_allreduce<kRefWarps>(chunk_max, scratch, true));
    const float alpha = expf(m - m_new);  // 0 on the first chunk (m = -inf)
    float chunk_sum = 0.f;
    for (int jj = threadIdx.x; jj < n; jj += kRefThreads) {
      s[jj] = expf(s[jj] - m_new);
      chunk_sum += s[jj];
    }
    l = l * alpha + block_allreduce<kRefWarps>(chunk_sum, scratch, false);  // also orders the s[] writes
    for (int c = 0; c < kRefColsPerThread; ++c) {
      const int d = threadIdx.x + c * kRefThreads;
      if (d >= p.Dv) break;
      float sum = 0.f;
      for (int jj = 0; jj < n; ++jj) sum += s[jj] * to_float(V[(c0 + jj) * p.Dv + d]);
      acc[c] = acc[c] * alpha + sum;
    }
    m = m_new;
    __syncthreads();
  }
  float* O = o + (head * p.Nq + i) * p.Dv;
  for (int c = 0; c < kRefColsPerThread; ++c) {
    const int d = threadIdx.x + c * kRefThreads;
    if (d < p.Dv) O[d] = l > 0.f ? acc[c] / l : 0.f;
  }
  if (threadIdx.x == 0) lse[head * p.Nq + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void fill_normal_kernel(T* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x2545F4914F6CDD1Dull + uint64_t(i));
    // Box-Muller on two 24-bit uniforms in (0, 1].
    const float u1 = (float((r >> 40) & 0xFFFFFF) + 1.f) / 16777216.f;
    const float u2 = float((r >> 8) & 0xFFFFFF) / 16777216.f;
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    if constexpr (std::is_same<T, half>::value) x[i] = __float2half_rn(z);
    else x[i] = __float2bfloat16_rn(z);
  }
}

// Device-side accumulators of the comparison kernels.
struct CompareAccum {
  unsigned int max_err_bits;  // non-negative floats order like their bit patterns
  unsigned long long nonfinite;
};

template <typename T>
__global__ void compare_output_kernel(const T* out, const float* ref, int64_t n, CompareAccum* acc) {
  float local_max = 0.f;
  unsigned long long local_bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_float(out[i]);
    if (!isfinite(x)) ++local_bad;
    else local_max = fmaxf(local_max, fabsf(x - ref[i]));
  }
  for (int off = 16; off > 0; off /= 2) {
    local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, off));
    local_bad += __shfl_xor_sync(0xffffffffu, local_bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    if (local_bad) atomicAdd(&acc->nonfinite, local_bad);
    atomicMax(&acc->max_err_bits, __float_as_uint(local_max));
  }
}

__global__ void compare_lse_kernel(const float* lse, const float* ref, int64_t n, CompareAccum* acc) {
  float local_max = 0.f;
  unsigned long long local_bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = lse[i], r = ref[i];
    if (isinf(r) && r < 0) local_bad += (x == r) ? 0 : 1;  // an empty row must say -inf
    else if (!isfinite(x)) ++local_bad;
    else local_max = fmaxf(local_max, fabsf(x - r));
  }
  for (int off = 16; off > 0; off /= 2) {
    local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, off));
    local_bad += __shfl_xor_sync(0xffffffffu, local_bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    if (local_bad) atomicAdd(&acc->nonfinite, local_bad);
    atomicMax(&acc->max_err_bits, __float_as_uint(local_max));
  }
}

template <typename T>
__global__ void rounding_error_kernel(const float* ref, int64_t n, CompareAccum* acc) {
  float local_max = 0.f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    T shifted;
    if constexpr (std::is_same<T, half>::value) shifted = __float2half_rn(ref[i] + 0.3f);
    else shifted = __float2bfloat16_rn(ref[i] + 0.3f);
    local_max = fmaxf(local_max, fabsf(to_float(shifted) - 0.3f - ref[i]));
  }
  for (int off = 16; off > 0; off /= 2) local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, off));
  if (threadIdx.x % 32 == 0) atomicMax(&acc->max_err_bits, __float_as_uint(local_max));
}

constexpr int kReduceBlocks = 1024, kReduceThreads = 256;

// Runs `launch(acc)` on a zeroed accumulator and reads it back (synchronous).
template <typename Launch>
ErrorStats run_compare(cudaStream_t stream, Launch launch) {
  static CompareAccum* acc = nullptr;  // one small buffer for the process
  ErrorStats stats;
  if (!acc && cudaMalloc(&acc, sizeof(CompareAccum)) != cudaSuccess) {
    stats.nonfinite = -1;
    return stats;
  }
  cudaMemsetAsync(acc, 0, sizeof(CompareAccum), stream);
  launch(acc);
  CompareAccum host{};
  cudaMemcpyAsync(&host, acc, sizeof(host), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  float max_err;
  memcpy(&max_err, &host.max_err_bits, sizeof(float));
  stats.max_abs_err = max_err;
  stats.nonfinite = int64_t(host.nonfinite);
  return stats;
}

}  // namespace

cudaError_t reference_attention_fp32(const AttnProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                                     float* lse_ref, cudaStream_t stream) {
  if (p.D > kMaxReferenceHeadDim || p.Dv > kMaxReferenceHeadDim) return cudaErrorInvalidValue;
  const dim3 grid(p.Nq, p.H, p.B);
  if (p.dtype == DType::kFloat16)
    reference_kernel<half><<<grid, kRefThreads, 0, stream>>>(static_cast<const half*>(q), static_cast<const half*>(k),
                                                             static_cast<const half*>(v), o_ref, lse_ref, p);
  else
    reference_kernel<__nv_bfloat16><<<grid, kRefThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
        static_cast<const __nv_bfloat16*>(v), o_ref, lse_ref, p);
  return cudaGetLastError();
}

cudaError_t fill_random_normal(void* x, int64_t n, DType dtype, uint64_t seed, cudaStream_t stream) {
  const int blocks = int(std::min<int64_t>(4096, (n + 255) / 256));
  if (dtype == DType::kFloat16) fill_normal_kernel<<<blocks, 256, 0, stream>>>(static_cast<half*>(x), n, seed);
  else fill_normal_kernel<<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(x), n, seed);
  return cudaGetLastError();
}

ErrorStats compare_output(const void* out, DType dtype, const float* ref, int64_t n, cudaStream_t stream) {
  return run_compare(stream, [&](CompareAccum* acc) {
    if (dtype == DType::kFloat16)
      compare_output_kernel<<<kReduceBlocks, kReduceThreads, 0, stream>>>(static_cast<const half*>(out), ref, n, acc);
    else
      compare_output_kernel<<<kReduceBlocks, kReduceThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(out),
                                                                            ref, n, acc);
  });
}

ErrorStats compare_output_fp32(const float* out, const float* ref, int64_t n, cudaStream_t stream) {
  return run_compare(stream, [&](CompareAccum* acc) {
    compare_output_kernel<<<kReduceBlocks, kReduceThreads, 0, stream>>>(out, ref, n, acc);
  });
}

ErrorStats compare_lse(const float* lse, const float* lse_ref, int64_t n, cudaStream_t stream) {
  return run_compare(stream, [&](CompareAccum* acc) {
    compare_lse_kernel<<<kReduceBlocks, kReduceThreads, 0, stream>>>(lse, lse_ref, n, acc);
  });
}

double output_rounding_error(const float* ref, int64_t n, DType dtype, cudaStream_t stream) {
  return run_compare(stream, [&](CompareAccum* acc) {
           if (dtype == DType::kFloat16)
             rounding_error_kernel<half><<<kReduceBlocks, kReduceThreads, 0, stream>>>(ref, n, acc);
           else
             rounding_error_kernel<__nv_bfloat16><<<kReduceBlocks, kReduceThreads, 0, stream>>>(ref, n, acc);
         })
      .max_abs_err;
}

cudaError_t poison_outputs(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(b.o, 0xFF, size_t(p.o_elems()) * kInputElementBytes, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(b.lse, 0xFF, size_t(p.lse_elems()) * sizeof(float), stream);
  return err;
}

CheckResult check_outputs(const AttnProblem& p, const void* o, const float* lse, const ReferenceData& ref,
                          cudaStream_t stream, double lse_tol) {
  const ErrorStats out = compare_output(o, p.dtype, ref.o_ref, p.o_elems(), stream);
  const ErrorStats l = lse ? compare_lse(lse, ref.lse_ref, p.lse_elems(), stream) : ErrorStats{};
  return judge(out, l, ref.baseline_err, ref.rounding_err, lse_tol);
}

double max_abs_finite_lse(const float* lse_ref, int64_t n, cudaStream_t stream) {
  std::vector<float> h(static_cast<size_t>(n));
  if (cudaMemcpyAsync(h.data(), lse_ref, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return 0.0;  // the kLseTolerance floor alone
  double m = 0.0;
  for (float x : h)
    if (std::isfinite(x)) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace attnlab
