// attnlab: the online softmax of FlashAttention-2, on mma.m16n8k16 fragments.
//
// A warp owns 16 query rows. Lane (g = lane/4, t = lane%4) holds, in every 16x8
// accumulator tile, columns 2t and 2t+1 of rows g (c0, c1) and g+8 (c2, c3). So a
// row is spread over the 4 lanes of a quad, and row reductions are two shuffles.
//
// Per KV tile j, for each row (paper, Algorithm 1, lines 8-10):
//   m_new = max(m_i, rowmax(S_j))
//   P_j   = exp(S_j - m_new)
//   l_i   = exp(m_i - m_new) · l_i + rowsum(P_j)
//   O_i   = exp(m_i - m_new) · O_i + P_j · V_j
// Scores stay raw (unscaled); `scale_log2 = scale · log2(e)` folds the softmax
// scale into one FFMA before exp2. l_i is kept per lane (a partial row sum) and
// reduced across the quad once, at the end.
#pragma once

#include <cmath>

#include "common/ptx.cuh"

namespace attnlab {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float quad_allreduce_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_allreduce_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The exp2 domain's shift of a row whose running max is m: P = exp2(S·scale_log2
// − shift), the shift rounded on its own (never fused into an FMA; 0 for a row
// that has seen only masked keys, so that exp2(-inf - -inf) is never NaN).
// The rescale factor exp(m_old − m_new) must then be taken between the same
// rounded shifts, rescale_factor's: it is exactly 1 while the max holds. An
// FMA's exact m_old·scale_log2 − shift(m_new) is off by the shift's rounding
// instead, and the running sum drifts by that factor on every tile: 64 tiles
// of a long row moved its LSE by 8 ulps, and by 3e-3 for scores near 8000
// (rel_bias over 8192 keys), where half an ulp of the shift is 5e-4.
__device__ __forceinline__ float softmax_shift(float m, float scale_log2) {
  return m == -INFINITY ? 0.f : __fmul_rn(m, scale_log2);
}
// exp(m_old − m_new) for the shift of m_new: 0 when m_old = -inf.
__device__ __forceinline__ float rescale_factor(float m_old, float shift_new, float scale_log2) {
  return exp2_approx(__fmul_rn(m_old, scale_log2) - shift_new);
}

// Running statistics of the two rows (g and g+8) a lane touches.
struct RowStats {
  float m[2] = {-INFINITY, -INFINITY};  // running max of raw scores
  float l[2] = {0.f, 0.f};              // this lane's share of the running sum
};

// S: [kTilesS][4] raw scores of one KV tile (masked entries = -inf), turned into
// P = exp(scale·(S - m_new)) in place; the running statistics are updated and
// alpha[r] = exp(m_old - m_new) is returned for the caller to rescale O with.
// Split from the rescale so that a kernel can do this while the tensor cores
// still accumulate into O (rung 07's +overlap and the kernels built like it).
template <int kTilesS>
__device__ __forceinline__ void online_softmax_scores(float (&S)[kTilesS][4], RowStats& st, float scale_log2,
                                                      float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // r = 0: row g (c0, c1); r = 1: row g+8 (c2, c3)
    float tile_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) tile_max = fmaxf(tile_max, fmaxf(S[n][2 * r], S[n][2 * r + 1]));
    const float m_new = fmaxf(st.m[r], quad_allreduce_max(tile_max));
    const float base = softmax_shift(m_new, scale_log2);
    alpha[r] = rescale_factor(st.m[r], base, scale_log2);  // exp(m_i - m_new)
    st.m[r] = m_new;
    float row_sum = 0.f;
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      S[n][2 * r] = exp2_approx(fmaf(S[n][2 * r], scale_log2, -base));
      S[n][2 * r + 1] = exp2_approx(fmaf(S[n][2 * r + 1], scale_log2, -base));
      row_sum += S[n][2 * r] + S[n][2 * r + 1];
    }
    st.l[r] = st.l[r] * alpha[r] + row_sum;
  }
}

// O *= alpha, row by row (c0, c1: row g; c2, c3: row g+8).
template <int kTilesO>
__device__ __forceinline__ void rescale_output(float (&O)[kTilesO][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < kTilesO; ++n) {
    O[n][0] *= alpha[0];
    O[n][1] *= alpha[0];
    O[n][2] *= alpha[1];
    O[n][3] *= alpha[1];
  }
}

// Both: P from S, statistics updated, O rescaled.
template <int kTilesS, int kTilesO>
__device__ __forceinline__ void online_softmax_update(float (&S)[kTilesS][4], float (&O)[kTilesO][4],
                                                      RowStats& st, float scale_log2) {
  float alpha[2];
  online_softmax_scores(S, st, scale_log2, alpha);
  rescale_output(O, alpha);
}

// O_i /= l_i, and the natural-log LSE of each row: scale·m + log(l).
// A row that saw no key gets O = 0 and LSE = -inf.
template <int kTilesO>
__device__ __forceinline__ void online_softmax_finalize(float (&O)[kTilesO][4], RowStats& st, float scale,
                                                        float (&lse)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_allreduce_sum(st.l[r]);
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    lse[r] = l > 0.f ? st.m[r] * scale + logf(l) : -INFINITY;
#pragma unroll
    for (int n = 0; n < kTilesO; ++n) {
      O[n][2 * r] *= inv_l;
      O[n][2 * r + 1] *= inv_l;
    }
  }
}

}  // namespace attnlab
