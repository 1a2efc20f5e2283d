// attnlab: the fp32 reference backward (reference.h) — the unfused backward on
// cuBLAS fp32 GEMMs, one KV head's query rows stacked per GEMM:
//   S  = scale · Q·Kᵀ                 [rows, Nk]   GEMM
//   P  = softmax(S), masked keys 0    in place     one block per row
//   dP = dO·Vᵀ                        [rows, Nk]   GEMM
//   dS = P ∘ (dP − rowsum(P ∘ dP))    in place     one block per row
//   dV (+)= Pᵀ·dO,  dK (+)= scale · dSᵀ·Q,  dQ = scale · dS·K   GEMMs
// Under a mask_mod and a score_mod (mods_reference.h), P = softmax(score_mod(S))
// over the pairs the mask_mod keeps, and dS is multiplied by ds'/ds, which the
// softmax step stores per pair in a third buffer G (softcap; the other
// score_mods have ds'/ds = 1 and no G).
// The H / Hkv query heads of a KV head are neighbours in Q, dO and dQ, so the
// stacked rows of one KV head are contiguous there, and the GEMMs of dK and dV
// sum over its query heads. S/P and dP/dS live in the workspace for as many
// rows as it holds: whole KV heads in one strided-batched GEMM, or blocks of
// one KV head's rows, dK and dV then accumulated over the blocks (beta = 1).
// With low_precision, what an unfused fp16/bf16 backward stores is rounded to
// the input dtype (S, P, dP, dS, and the gradients); the inputs already are.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include "common/block_reduce.cuh"
#include "blocksparse/mods.h"
#include "reference/cublas_handle.h"
#include "reference/dtype_cast.cuh"
#include "reference/mods_reference.h"
#include "reference/reference.h"

namespace attnlab {
namespace {

constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int64_t kMaxBatch = 65535;    // KV heads per strided-batched GEMM
constexpr int64_t kAlignFloats = 64;    // 256-byte offsets inside the workspace


template <typename T>
__global__ void to_fp32_kernel(const T* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = to_float<T>(x[i]);
}

template <typename T>
__global__ void from_fp32_kernel(const float* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(x[i]);
}

template <typename T>
__global__ void round_in_place_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = round_to<T>(x[i]);
}

// The mods of one run: none (the dense reference, p's causal flag) or a
// mask_mod and a score_mod; with_grad when ds'/ds is not 1 (the G buffer).
struct RowMods {
  bool on = false;
  MaskMod mask;
  ScoreMod score;
  bool with_grad() const { return on && has_chain_rule(score.kind); }
};

// S -> P in place for the rows of one chunk: `rows` stacked rows per KV head
// (from stacked row r0 of each, the chunk's first KV head kv0), one block per
// row. Stacked row r is query row r % Nq of query head r / Nq of its KV head's
// group. Without mods, keys past visible_keys are masked (P = 0); with them,
// s' = score_mod(S) where the mask_mod keeps the pair, and G = ds'/ds there.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
softmax_rows_kernel(float* S, float* G, AttnProblem p, int64_t rows, int64_t r0, int64_t kv0, RowMods mods,
                    bool low_precision) {
  __shared__ float scratch[kRowWarps];
  const int64_t b = blockIdx.x;
  const int64_t r = r0 + b % rows, i = r % p.Nq;
  const int group = p.H / p.kv_heads();
  const int64_t kv = kv0 + b / rows;
  const int batch = int(kv / p.kv_heads()), head = int(kv % p.kv_heads()) * group + int(r / p.Nq);
  float* s = S + b * p.Nk;
  float* g = G ? G + b * p.Nk : nullptr;
  const int64_t n = mods.on ? p.Nk : visible_keys(i, p);
  const auto rnd = [low_precision](float x) { return low_precision ? round_to<T>(x) : x; };
  // The row's scores as the softmax takes them: −inf where a mask drops the pair.
  for (int64_t j = threadIdx.x; j < n; j += kRowThreads) {
    float x = rnd(s[j]);
    if (mods.on) {
      const bool keep = mods.mask(batch, head, int(i), int(j));
      if (g) g[j] = keep ? mods.score.grad(x) : 0.f;
      x = keep ? rnd(mods.score(x, batch, head, int(i), int(j))) : -INFINITY;
    }
    s[j] = x;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kRowThreads) m = fmaxf(m, s[j]);
  m = block_allreduce<kRowWarps>(m, scratch, true);
  float l = 0.f;
  if (m != -INFINITY)
    for (int64_t j = threadIdx.x; j < n; j += kRowThreads) l += expf(s[j] - m);
  l = block_allreduce<kRowWarps>(l, scratch, false);
  const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: P = 0
  for (int64_t j = threadIdx.x; j < p.Nk; j += kRowThreads)
    s[j] = j < n && s[j] != -INFINITY ? rnd(expf(s[j] - m) * inv_l) : 0.f;
}

// dP -> dS in place, one block per row: dS = P ∘ (dP − Σ_j P ∘ dP), times
// ds'/ds where G holds it.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
softmax_grad_rows_kernel(const float* P, float* dP, const float* G, int64_t nk, bool low_precision) {
  __shared__ float scratch[kRowWarps];
  const float* pr = P + int64_t(blockIdx.x) * nk;
  float* dp = dP + int64_t(blockIdx.x) * nk;
  const float* g = G ? G + int64_t(blockIdx.x) * nk : nullptr;
  const auto rnd = [low_precision](float x) { return low_precision ? round_to<T>(x) : x; };
  float d = 0.f;
  for (int64_t j = threadIdx.x; j < nk; j += kRowThreads) d += pr[j] * rnd(dp[j]);
  d = block_allreduce<kRowWarps>(d, scratch, false);
  for (int64_t j = threadIdx.x; j < nk; j += kRowThreads) {
    const float ds = rnd(pr[j] * (rnd(dp[j]) - d));
    dp[j] = g ? rnd(ds * g[j]) : ds;
  }
}

int grid_for(int64_t n) { return int(std::max<int64_t>(1, std::min<int64_t>(4096, (n + 255) / 256))); }

template <typename T>
cudaError_t to_fp32(const void* x, float* y, int64_t n, cudaStream_t stream) {
  to_fp32_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<const T*>(x), y, n);
  return cudaGetLastError();
}

int64_t aligned(int64_t floats) { return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Floats of the fp32 copies of Q, K, V, dO at the start of the workspace.
int64_t fixed_floats(const AttnProblem& p) {
  return aligned(p.q_elems()) + aligned(p.k_elems()) + aligned(p.v_elems()) + aligned(p.o_elems());
}

// Row-major C[m, n] = A·B is column-major Cᵀ = Bᵀ·Aᵀ: every call below is
// written in cuBLAS's column-major terms, each matrix named by its row-major
// shape in the comment above it.
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                    int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  return cublasGemmStridedBatchedEx(h, ta, tb, int(m), int(n), int(k), &alpha, A, CUDA_R_32F, int(lda), stride_a, B,
                                    CUDA_R_32F, int(ldb), stride_b, &beta, C, CUDA_R_32F, int(ldc), stride_c,
                                    int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

template <typename T>
cudaError_t backward(const AttnProblem& p, const RowMods& mods, const void* q, const void* k, const void* v,
                     const void* dout, float* dq, float* dk, float* dv, bool lp, float* ws, int64_t row_capacity,
                     cudaStream_t stream) {
  cublasHandle_t h = reference_cublas_handle();
  if (!h || cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  const int64_t D = p.D, Dv = p.Dv, Nk = p.Nk;
  float* q32 = ws;
  float* k32 = q32 + aligned(p.q_elems());
  float* v32 = k32 + aligned(p.k_elems());
  float* do32 = v32 + aligned(p.v_elems());
  float* S = do32 + aligned(p.o_elems());            // S, then P: [chunk rows, Nk]
  float* dP = S + aligned(row_capacity * Nk);        // dP, then dS: [chunk rows, Nk]
  float* G = mods.with_grad() ? dP + aligned(row_capacity * Nk) : nullptr;  // ds'/ds: [chunk rows, Nk]
  cudaError_t e = to_fp32<T>(q, q32, p.q_elems(), stream);
  if (e == cudaSuccess) e = to_fp32<T>(k, k32, p.k_elems(), stream);
  if (e == cudaSuccess) e = to_fp32<T>(v, v32, p.v_elems(), stream);
  if (e == cudaSuccess) e = to_fp32<T>(dout, do32, p.o_elems(), stream);
  if (e != cudaSuccess) return e;

  // A chunk: `nkv` KV heads of `rows` stacked rows each, from stacked row r0.
  const int64_t group_rows = int64_t(p.H / p.kv_heads()) * p.Nq;  // the stacked rows of one KV head
  const int64_t kv_total = int64_t(p.B) * p.kv_heads();
  int64_t kv_per_chunk = 1, rows = std::min(row_capacity, group_rows);
  if (row_capacity >= group_rows)
    kv_per_chunk = std::min({kv_total, row_capacity / group_rows, kMaxBatch, int64_t(INT32_MAX) / group_rows});
  const float scale = p.scale;
  for (int64_t kv0 = 0; kv0 < kv_total; kv0 += kv_per_chunk) {
    const int64_t nkv = std::min(kv_per_chunk, kv_total - kv0);
    for (int64_t r0 = 0; r0 < group_rows; r0 += rows) {
      const int64_t R = std::min(rows, group_rows - r0);
      const int64_t first_row = kv0 * group_rows + r0;  // in Q, dO, dQ as [B·H·Nq] rows
      const float* Qc = q32 + first_row * D;
      const float* dOc = do32 + first_row * Dv;
      float* dQc = dq + first_row * D;
      const float* Kc = k32 + kv0 * Nk * D;
      const float* Vc = v32 + kv0 * Nk * Dv;
      float* dKc = dk + kv0 * Nk * D;
      float* dVc = dv + kv0 * Nk * Dv;
      const int64_t sQ = group_rows * D, sdO = group_rows * Dv, sK = Nk * D, sV = Nk * Dv, sS = R * Nk;
      const float beta_kv = r0 == 0 ? 0.f : 1.f;  // dK, dV accumulate over a KV head's row blocks
      const unsigned row_blocks = unsigned(nkv * R);
      // S[R, Nk] = scale · Q[R, D] · K[Nk, D]ᵀ
      cublasStatus_t st = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, Nk, R, D, scale, Kc, D, sK, Qc, D, sQ, 0.f, S, Nk, sS, nkv);
      if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
      softmax_rows_kernel<T><<<row_blocks, kRowThreads, 0, stream>>>(S, G, p, R, r0, kv0, mods, lp);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
      // dP[R, Nk] = dO[R, Dv] · V[Nk, Dv]ᵀ
      st = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, Nk, R, Dv, 1.f, Vc, Dv, sV, dOc, Dv, sdO, 0.f, dP, Nk, sS, nkv);
      if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
      softmax_grad_rows_kernel<T><<<row_blocks, kRowThreads, 0, stream>>>(S, dP, G, Nk, lp);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
      // dV[Nk, Dv] (+)= P[R, Nk]ᵀ · dO[R, Dv]
      st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, Dv, Nk, R, 1.f, dOc, Dv, sdO, S, Nk, sS, beta_kv, dVc, Dv, sV, nkv);
      if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
      // dK[Nk, D] (+)= scale · dS[R, Nk]ᵀ · Q[R, D]
      st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, D, Nk, R, scale, Qc, D, sQ, dP, Nk, sS, beta_kv, dKc, D, sK, nkv);
      if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
      // dQ[R, D] = scale · dS[R, Nk] · K[Nk, D]
      st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, D, R, Nk, scale, Kc, D, sK, dP, Nk, sS, 0.f, dQc, D, sQ, nkv);
      if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
    }
  }
  if (lp)  // an unfused backward stores its gradients in the input dtype
    for (auto [x, n] : {std::pair{dq, p.q_elems()}, std::pair{dk, p.k_elems()}, std::pair{dv, p.v_elems()}}) {
      round_in_place_kernel<T><<<grid_for(n), 256, 0, stream>>>(x, n);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
  return cudaSuccess;
}

// The buffers of [rows, Nk] floats: S/P and dP/dS, and G under a score_mod with ds'/ds != 1.
int row_buffers(const RowMods& mods) { return mods.with_grad() ? 3 : 2; }

size_t workspace_bytes_for(const AttnProblem& p, int buffers, int64_t rows) {
  // Each buffer's padding up to the next one's aligned start counted once, as row_capacity below assumes.
  return size_t(fixed_floats(p) + buffers * (rows * int64_t(p.Nk) + kAlignFloats)) * sizeof(float);
}

cudaError_t run_backward(const AttnProblem& p, const RowMods& mods, const void* q, const void* k, const void* v,
                         const void* dout, float* dq, float* dk, float* dv, bool low_precision, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
  const int buffers = row_buffers(mods);
  const int64_t all_rows = p.heads() * p.Nq;
  void* owned = nullptr;
  if (workspace == nullptr) {
    // As many rows as fit in 3/4 of the free memory, halved until the allocation succeeds.
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) return e;
    int64_t rows = std::min<int64_t>(all_rows, INT32_MAX);
    while (rows > 1 && workspace_bytes_for(p, buffers, rows) > free_bytes / 4 * 3) rows = (rows + 1) / 2;
    for (;;) {
      workspace_bytes = workspace_bytes_for(p, buffers, rows);
      if (cudaMalloc(&owned, workspace_bytes) == cudaSuccess) break;
      cudaGetLastError();  // an allocation failure is not sticky
      if (rows == 1) return cudaErrorMemoryAllocation;
      rows = (rows + 1) / 2;
    }
    workspace = owned;
  }
  const int64_t fixed_bytes = fixed_floats(p) * int64_t(sizeof(float));
  const int64_t row_bytes = buffers * int64_t(p.Nk) * int64_t(sizeof(float));
  // Whole rows of each buffer after the fixed part (each buffer's tail padding is at most kAlignFloats floats).
  const int64_t spare = int64_t(workspace_bytes) - fixed_bytes - buffers * kAlignFloats * int64_t(sizeof(float));
  const int64_t row_capacity = std::min<int64_t>({spare > 0 ? spare / row_bytes : 0, all_rows, INT32_MAX});
  cudaError_t e = cudaErrorMemoryAllocation;
  if (row_capacity >= 1) {
    float* ws = static_cast<float*>(workspace);
    e = p.dtype == DType::kFloat16
            ? backward<half>(p, mods, q, k, v, dout, dq, dk, dv, low_precision, ws, row_capacity, stream)
            : backward<__nv_bfloat16>(p, mods, q, k, v, dout, dq, dk, dv, low_precision, ws, row_capacity, stream);
  }
  if (owned) {
    const cudaError_t f = cudaFree(owned);  // (waits for the work above)
    if (e == cudaSuccess) e = f;
  }
  return e;
}

}  // namespace

size_t reference_backward_workspace_bytes(const AttnProblem& p, int64_t rows) {
  return workspace_bytes_for(p, 2, rows);
}

cudaError_t reference_attention_backward_fp32(const AttnProblem& p, const void* q, const void* k, const void* v,
                                              const void* dout, float* dq, float* dk, float* dv, bool low_precision,
                                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return run_backward(p, RowMods{}, q, k, v, dout, dq, dk, dv, low_precision, workspace, workspace_bytes, stream);
}

cudaError_t mods_attention_backward_fp32(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score,
                                         const void* q, const void* k, const void* v, const void* dout, float* dq,
                                         float* dk, float* dv, bool low_precision, cudaStream_t stream) {
  if (p.causal) return cudaErrorInvalidValue;  // causality is the mask_mod's
  RowMods mods;
  mods.on = true;
  mods.mask = mask;
  mods.score = score;
  return run_backward(p, mods, q, k, v, dout, dq, dk, dv, low_precision, nullptr, 0, stream);
}

cudaError_t convert_fp32_to_input_dtype(const float* x, void* out, int64_t n, DType dtype, cudaStream_t stream) {
  if (dtype == DType::kFloat16)
    from_fp32_kernel<<<grid_for(n), 256, 0, stream>>>(x, static_cast<half*>(out), n);
  else
    from_fp32_kernel<<<grid_for(n), 256, 0, stream>>>(x, static_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

}  // namespace attnlab
