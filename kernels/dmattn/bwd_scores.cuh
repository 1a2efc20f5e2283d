// attnlab: one score of the dynamic-mask backward, recomputed from Sᵀ — its
// visibility (bounds, causal rule, mask), its logit (scale, bias, softcap)
// and P — for the main kernel and the deterministic dQ kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "dmattn/dmattn.h"

namespace attnlab {
namespace {

template <typename T>
__device__ __forceinline__ float as_float(T x);
template <>
__device__ __forceinline__ float as_float<half>(half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float as_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// One score of the backward, recomputed: visible (in range, causal, mask —
// the mask byte or bit read only when the tile is not all ones), the logit
// scale·s + bias and its softcap, P = exp(logit - LSE) (0 where not visible),
// and the softcap's derivative dcap = 1 - tanh² for dS.
struct ScoreProb {
  float p, dcap;
  bool visible;
};
// `bias_given`: the caller has loaded this score's bias element already
// (`bias_value`, the same element converted the same way: the same float).
// kMaskBits: the mask is bit-packed (DmaMaskFormat::kBits; the kernels'
// template flag: one kernel for both formats cost 4-7 registers, and spills
// on the mma.sync core at D = 128).
template <typename T, bool kMaskBits>
__device__ __forceinline__ ScoreProb score_prob(const DynamicMaskProblem& p, int b, int h, int qi, int key, float s,
                                                float lse, bool mask_full, bool bias_given = false,
                                                float bias_value = 0.f) {
  bool visible = key < p.Nk && qi < p.Nq && (!p.causal || key <= qi + (p.Nk - p.Nq));
  if (visible && !mask_full) {
    if constexpr (kMaskBits)  // the byte of the row (little-endian words) that holds the key's bit
      visible = (__ldg(static_cast<const uint8_t*>(p.mask.data) + 4 * p.mask.row_offset(b, h, qi) +
                       (unsigned(key) >> 3)) >> (key & 7) & 1u) != 0u;
    else
      visible = __ldg(static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, qi) + key) != 0;
  }
  float x = s * p.scale;
  if (p.bias.data != nullptr && visible)
    x += bias_given ? bias_value
                    : as_float(__ldg(static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, qi) + key));
  float dcap = 1.f;
  if (p.softcap > 0.f) {
    const float th = tanhf(x / p.softcap);
    x = p.softcap * th;
    dcap = 1.f - th * th;
  }
  return {visible ? exp2_approx((x - lse) * kLog2e) : 0.f, dcap, visible};
}

}  // namespace
}  // namespace attnlab
