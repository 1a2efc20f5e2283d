// attnlab: the dynamic-mask backward's passes around its main kernel — Δ
// (and the zeroed dQ accumulator) before it; the fp32 accumulators' zeroing,
// and their sums in the input dtype after it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dmattn/bwd_scheduler.cuh"
#include "dmattn/bwd_scores.cuh"

namespace attnlab {
namespace {

// Δ_q = Σ_d dO[q][d] · O[q][d], and the row of dq_accum that the main kernel
// adds into set to 0 (dq_accum nullptr: the deterministic mode, which has
// none), in one pass instead of a memset and a pass: four lanes per row,
// 16-byte loads (eight elements) interleaved so that a warp's load reads 64
// contiguous bytes of each of its eight rows. Where O or dO is not 16-byte
// aligned, the warp-per-row kernel below and a memset instead.
template <typename T, int kD>
__global__ void dma_bwd_delta_vec_kernel(const T* __restrict__ o, const T* __restrict__ dout,
                                         float* __restrict__ delta, float* __restrict__ dq_accum, int64_t rows) {
  constexpr int kLanes = 4, kPieces = kD / (8 * kLanes);  // 16-byte pieces per lane
  static_assert(kD % (8 * kLanes) == 0, "head dims are multiples of 32");
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  if (row >= rows) return;  // a row's four lanes leave together
  const int l = threadIdx.x % kLanes;
  const unsigned group = 0xfu << (threadIdx.x % 32 / kLanes * kLanes);  // this row's lanes
  const uint4* o4 = reinterpret_cast<const uint4*>(o + row * kD);
  const uint4* d4 = reinterpret_cast<const uint4*>(dout + row * kD);
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kPieces; ++c) {
    const uint4 a = __ldg(o4 + c * kLanes + l), b = __ldg(d4 + c * kLanes + l);
    const T* pa = reinterpret_cast<const T*>(&a);
    const T* pb = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += as_float(pa[i]) * as_float(pb[i]);
  }
  acc += __shfl_xor_sync(group, acc, 1);
  acc += __shfl_xor_sync(group, acc, 2);
  if (l == 0) delta[row] = acc;
  if (dq_accum != nullptr) {
    float4* q4 = reinterpret_cast<float4*>(dq_accum + row * kD);
#pragma unroll
    for (int c = l; c < kD / 4; c += kLanes) q4[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// dQ in the input dtype from its fp32 accumulator: four elements per thread
// per step (one 16-byte load, one 8-byte store; n % 4 == 0, out 8-byte
// aligned), the same rounding as sum_copies_to_dtype_kernel with one copy.
template <typename T>
__global__ void f32_to_dtype_vec4_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(in)[i];
    T y[4] = {T(x.x), T(x.y), T(x.z), T(x.w)};
    reinterpret_cast<uint2*>(out)[i] = *reinterpret_cast<const uint2*>(y);
  }
}

// Δ_q = Σ_d dO[q][d] · O[q][d], one warp per row (any alignment).
template <typename T>
__global__ void dma_bwd_delta_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta,
                                     int64_t rows, int D) {
  const int64_t row = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += as_float(o[row * D + d]) * as_float(dout[row * D + d]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta[row] = acc;
}

// out[i] = scale · Σ_c in[c·n + i] over `copies` fp32 copies, in copy order (a
// fixed order: deterministic), converted to the input dtype. (scale = 1 is
// exact: the same value as no multiply.)
// skip_if_one: the backward's chunk plan (nullptr: none); a decision of one
// chunk means the kernel stored `out` itself, and this pass has nothing to do.
template <typename T>
__global__ void sum_copies_to_dtype_kernel(const float* __restrict__ in, int copies, T* __restrict__ out, int64_t n,
                                           float scale = 1.f, const unsigned long long* skip_if_one = nullptr) {
  if (skip_if_one != nullptr && skip_if_one[kPlanLiveChunks] == 1) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = in[i];
    for (int c = 1; c < copies; ++c) acc += in[int64_t(c) * n + i];
    out[i] = T(scale * acc);
  }
}

// dK, dV's fp32 accumulators zeroed where the chunks stay (plan: nullptr, or
// the chunk plan's decision above 1).
__global__ void zero_dkv_accum_kernel(float* __restrict__ a, int64_t n, const unsigned long long* __restrict__ plan) {
  if (plan != nullptr && plan[kPlanLiveChunks] == 1) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4; i += int64_t(gridDim.x) * blockDim.x)
    reinterpret_cast<float4*>(a)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace
}  // namespace attnlab
