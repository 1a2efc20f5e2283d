// attnlab: the unfused baseline — what attention costs without fusion.
//   S = scale · Q·Kᵀ     cuBLAS, stored in the input dtype   [heads, Nq, Nk]
//   P = softmax(S)       one block per row, in place, LSE on the side
//   O = P · V            cuBLAS
// GQA: the H / Hkv query heads that share a KV head are neighbours in Q, so
// one GEMM per KV head takes all of them as (H / Hkv)·Nq rows.
// Its error against the fp32 reference is also the yardstick of the check rule.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "common/block_reduce.cuh"
#include "host/rung_host.cuh"
#include "reference/cublas_handle.h"
#include "reference/reference.h"

namespace attnlab {
namespace {

constexpr int kSoftmaxThreads = 256;

template <typename T> __device__ __forceinline__ float load_f(const T* p);
template <> __device__ __forceinline__ float load_f<half>(const half* p) { return __half2float(*p); }
template <> __device__ __forceinline__ float load_f<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ half from_f<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float row_allreduce(float x, bool is_max) {
  __shared__ float scratch[kSoftmaxThreads / 32];
  return block_allreduce<kSoftmaxThreads / 32>(x, scratch, is_max);
}

// S rows of `first_head`.. in place -> P; one block per (head, query row).
template <typename T>
__global__ void softmax_rows_kernel(T* S, float* lse, AttnProblem p, int64_t first_head) {
  const int64_t row = blockIdx.x;  // within this chunk of heads
  const int64_t i = row % p.Nq;
  T* s = S + row * p.Nk;
  const int64_t n = visible_keys(i, p);  // keys >= n are masked
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kSoftmaxThreads) m = fmaxf(m, load_f(s + j));
  m = row_allreduce(m, true);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += kSoftmaxThreads) sum += expf(load_f(s + j) - m);
  sum = row_allreduce(sum, false);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int64_t j = threadIdx.x; j < p.Nk; j += kSoftmaxThreads)
    s[j] = from_f<T>(j < n ? expf(load_f(s + j) - m) * inv : 0.f);
  if (threadIdx.x == 0) lse[first_head * p.Nq + row] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

// Query heads per KV head: the rows of one GEMM are that many heads of Nq rows.
int64_t group_size(const AttnProblem& p) { return p.H / p.kv_heads(); }

cudaError_t launch_unfused(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  // As many KV heads as the workspace holds the S of, and few enough that the
  // softmax grid (one block per row) stays under 2^31 blocks.
  const int64_t g = group_size(p);
  const int64_t rows = g * p.Nq;  // the query rows of one KV head
  const int64_t kv_per_chunk =
      std::min<int64_t>({int64_t(p.B) * p.kv_heads(), int64_t(b.workspace_bytes / unfused_workspace_granule(p)),
                         int64_t(INT32_MAX) / rows});
  if (kv_per_chunk < 1) return cudaErrorMemoryAllocation;
  cublasHandle_t h = reference_cublas_handle();
  if (!h || cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  const cudaDataType_t type = p.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  const float alpha_qk = p.scale, alpha_pv = 1.f, beta = 0.f;
  const char* q = static_cast<const char*>(b.q);
  const char* k = static_cast<const char*>(b.k);
  const char* v = static_cast<const char*>(b.v);
  char* o = static_cast<char*>(b.o);
  void* S = b.workspace;
  constexpr int64_t e = kInputElementBytes;
  for (int64_t kv0 = 0; kv0 < int64_t(p.B) * p.kv_heads(); kv0 += kv_per_chunk) {
    const int batch = int(std::min<int64_t>(kv_per_chunk, int64_t(p.B) * p.kv_heads() - kv0));
    const int64_t h0 = kv0 * g;  // first query head of the chunk: KV head kv0's first
    // Row-major S[rows, Nk] = Q·Kᵀ is column-major Sᵀ[Nk, rows] = K·Qᵀ (K and Q as D x N column-major).
    cublasStatus_t st = cublasGemmStridedBatchedEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, p.Nk, int(rows), p.D, &alpha_qk, k + kv0 * p.Nk * p.D * e, type, p.D,
        int64_t(p.Nk) * p.D, q + h0 * p.Nq * p.D * e, type, p.D, rows * p.D, &beta, S, type, p.Nk, rows * p.Nk,
        batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    // S of the chunk is [batch·g heads, Nq, Nk], as without GQA.
    const unsigned blocks = unsigned(int64_t(batch) * rows);
    if (p.dtype == DType::kFloat16)
      softmax_rows_kernel<half><<<blocks, kSoftmaxThreads, 0, stream>>>(static_cast<half*>(S), b.lse, p, h0);
    else
      softmax_rows_kernel<__nv_bfloat16><<<blocks, kSoftmaxThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(S),
                                                                                  b.lse, p, h0);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
    // Row-major O[rows, Dv] = P·V is column-major Oᵀ[Dv, rows] = Vᵀ·Pᵀ.
    st = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, p.Dv, int(rows), p.Nk, &alpha_pv,
                                    v + kv0 * p.Nk * p.Dv * e, type, p.Dv, int64_t(p.Nk) * p.Dv, S, type, p.Nk,
                                    rows * p.Nk, &beta, o + h0 * p.Nq * p.Dv * e, type, p.Dv, rows * p.Dv, batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  }
  return cudaSuccess;
}

}  // namespace

size_t unfused_workspace_granule(const AttnProblem& p) {
  return size_t(group_size(p)) * p.Nq * p.Nk * kInputElementBytes;
}

Variant make_unfused_baseline() {
  Variant v;
  v.name = "unfused";
  v.rung = "reference/unfused_attention";
  v.unsupported_reason = [](const AttnProblem& p) -> std::string {
    if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
    if (group_size(p) * p.Nq > INT32_MAX) return "(H / Hkv)·Nq rows exceed one cuBLAS GEMM";
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && unfused_workspace_granule(p) > free_bytes / 2)
      return std::string(p.gqa() ? "one KV head's" : "one head's") + " S needs " +
             std::to_string(unfused_workspace_granule(p) >> 20) + " MiB";
    return "";
  };
  // Ideally every head at once; the harness may hand over less (whole KV heads).
  v.workspace_bytes = [](const AttnProblem& p) { return unfused_workspace_granule(p) * size_t(p.B) * p.kv_heads(); };
  v.launch = launch_unfused;
  v.is_peer = true;
  v.rounds_scores_to_input_dtype = true;
  v.describe = [] { return std::string("cuBLAS Q·Kᵀ -> softmax kernel -> cuBLAS P·V, S in the input dtype"); };
  return v;
}

}  // namespace attnlab
