// attnlab: the fp32 GPU reference of attention under a mask_mod and a
// score_mod, and the exact count of the pairs a mask_mod keeps
// (mods_reference.h). Deliberately simple, as reference_gpu.cu: one block per
// query row, one warp per key (lanes split D), scores in fp32 from the 16-bit
// inputs; two passes over the keys, so that any Nk fits:
//   pass 1: per warp an online (m, l) over its keys, then the block's (m, l);
//   pass 2: P = exp(s − m) / l chunk by chunk, O += P·V.
// The same-precision path (low_precision) rounds P to the input dtype before
// P·V and O at the end, as mods_attention_cpu's o_low. Checked against the CPU
// reference by tests/gpu/test_mods_reference.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "reference/mods_reference.h"
#include "reference/dtype_cast.cuh"
#include "reference/reference.h"

namespace attnlab {
namespace {


constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 1024;                                        // keys per chunk of pass 2
constexpr int kColsPerThread = kMaxReferenceHeadDim / kThreads;     // O columns a thread owns

// s' of key j for the row in q_row (one warp; every lane gets it), or -inf
// where the mask_mod drops the pair.
template <typename T>
__device__ __forceinline__ float score_of(const float* q_row, const T* K, int j, const AttnProblem& p,
                                          const MaskMod& mask, const ScoreMod& score, int b, int h, int i, int lane) {
  if (!mask(b, h, i, j)) return -INFINITY;  // warp-uniform: the whole warp takes key j
  const T* Kj = K + int64_t(j) * p.D;
  float dot = 0.f;
  for (int d = lane; d < p.D; d += 32) dot += q_row[d] * to_float(Kj[d]);
  for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  return score(p.scale * dot, b, h, i, j);
}

// One block per query row (grid: Nq, H, B).
template <typename T>
__global__ void __launch_bounds__(kThreads)
mods_reference_kernel(const T* q, const T* k, const T* v, float* o, float* lse, AttnProblem p, MaskMod mask,
                      ScoreMod score, bool low_precision) {
  __shared__ float q_row[kMaxReferenceHeadDim];
  __shared__ float P[kChunk];  // pass 2: one chunk's probabilities (0 for a dropped key)
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t head = int64_t(b) * p.H + h, row = head * p.Nq + i;
  const T* K = k + p.kv_head(head) * p.Nk * p.D;
  const T* V = v + p.kv_head(head) * p.Nk * p.Dv;
  for (int d = threadIdx.x; d < p.D; d += kThreads) q_row[d] = to_float(q[row * p.D + d]);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();

  // Pass 1: each warp's online max and sum over its keys, then the row's.
  float m_w = -INFINITY, l_w = 0.f;
  for (int j = warp; j < p.Nk; j += kWarps) {
    const float s = score_of(q_row, K, j, p, mask, score, b, h, i, lane);
    if (s == -INFINITY) continue;
    const float m_new = fmaxf(m_w, s);
    l_w = l_w * expf(m_w - m_new) + expf(s - m_new);
    m_w = m_new;
  }
  if (lane == 0) warp_m[warp] = m_w, warp_l[warp] = l_w;
  __syncthreads();
  float m = -INFINITY, l = 0.f;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_m[w]);
  if (m != -INFINITY)
    for (int w = 0; w < kWarps; ++w) l += warp_m[w] == -INFINITY ? 0.f : warp_l[w] * expf(warp_m[w] - m);
  float* O = o + row * p.Dv;
  if (m == -INFINITY) {  // no key kept: O = 0, LSE = -inf
    for (int d = threadIdx.x; d < p.Dv; d += kThreads) O[d] = 0.f;
    if (threadIdx.x == 0) lse[row] = -INFINITY;
    return;
  }

  // Pass 2: P chunk by chunk, O += P·V.
  float acc[kColsPerThread] = {};
  for (int c0 = 0; c0 < p.Nk; c0 += kChunk) {
    const int n = p.Nk - c0 < kChunk ? p.Nk - c0 : kChunk;
    for (int jj = warp; jj < n; jj += kWarps) {
      const float s = score_of(q_row, K, c0 + jj, p, mask, score, b, h, i, lane);
      float pj = s == -INFINITY ? 0.f : expf(s - m) / l;
      if (low_precision) pj = round_to<T>(pj);
      if (lane == 0) P[jj] = pj;
    }
    __syncthreads();
    for (int jj = 0; jj < n; ++jj) {
      const float pj = P[jj];
      if (pj == 0.f) continue;  // dropped (or underflowed) key: adds nothing
      const T* Vj = V + int64_t(c0 + jj) * p.Dv;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        const int d = threadIdx.x + c * kThreads;
        if (d < p.Dv) acc[c] += pj * to_float(Vj[d]);
      }
    }
    __syncthreads();  // P is rewritten by the next chunk
  }
#pragma unroll
  for (int c = 0; c < kColsPerThread; ++c) {
    const int d = threadIdx.x + c * kThreads;
    if (d < p.Dv) O[d] = low_precision ? round_to<T>(acc[c]) : acc[c];
  }
  if (threadIdx.x == 0) lse[row] = m + logf(l);
}

// Blocks of kWarps query rows (grid: ceil(Nq / kWarps), H, B); a warp's lanes
// take the keys of its row.
__global__ void __launch_bounds__(kThreads)
count_kept_pairs_kernel(MaskMod mask, int Nq, int Nk, unsigned long long* pairs) {
  const int i = blockIdx.x * kWarps + threadIdx.x / 32, h = blockIdx.y, b = blockIdx.z;
  unsigned long long kept = 0;
  if (i < Nq)
    for (int j = threadIdx.x % 32; j < Nk; j += 32) kept += mask(b, h, i, j) ? 1 : 0;
  for (int off = 16; off > 0; off /= 2) kept += __shfl_xor_sync(0xffffffffu, kept, off);
  if (threadIdx.x % 32 == 0 && kept > 0) atomicAdd(pairs, kept);
}

}  // namespace

cudaError_t mods_attention_fp32(const AttnProblem& p, const MaskMod& mask, const ScoreMod& score, const void* q,
                                const void* k, const void* v, float* o, float* lse, bool low_precision,
                                cudaStream_t stream) {
  if (p.D > kMaxReferenceHeadDim || p.Dv > kMaxReferenceHeadDim || p.B > 65535 || p.H > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(unsigned(p.Nq), unsigned(p.H), unsigned(p.B));
  if (p.dtype == DType::kFloat16)
    mods_reference_kernel<half><<<grid, kThreads, 0, stream>>>(static_cast<const half*>(q),
                                                               static_cast<const half*>(k),
                                                               static_cast<const half*>(v), o, lse, p, mask, score,
                                                               low_precision);
  else
    mods_reference_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
        static_cast<const __nv_bfloat16*>(v), o, lse, p, mask, score, low_precision);
  return cudaGetLastError();
}

cudaError_t count_kept_pairs(const MaskMod& mask, int B, int H, int Nq, int Nk, unsigned long long* pairs,
                             cudaStream_t stream) {
  if (B < 1 || H < 1 || Nq < 1 || Nk < 1 || B > 65535 || H > 65535) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((int64_t(Nq) + kWarps - 1) / kWarps), unsigned(H), unsigned(B));
  count_kept_pairs_kernel<<<grid, kThreads, 0, stream>>>(mask, Nq, Nk, pairs);
  return cudaGetLastError();
}

}  // namespace attnlab
