// attnlab: the block-sparse forward's epilogue — O_i / l_i and the LSE of each
// row, stored by store_output (common/row_fragments.cuh), as rung 12 stores
// them: LSE in natural log, O in the input dtype, rows past Nq not written.
// The one difference is the unit of the running max m_i: raw scores without a
// score_mod (LSE = scale·m + log l, rung 12's), the score_mod's scaled output
// with one (LSE = m + log l). A row that saw no key (no listed tile, or every
// pair masked) has l = 0: O = 0, LSE = -inf (online_softmax_finalize).
// FlashAttention-3's CollectiveEpilogue (hopper/epilogue_fwd.hpp) in that role.
#pragma once

#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "host/attn_problem.h"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A compute warpgroup's 64 rows of the query tile at q_start; score_scale as
// the mainloop used it (blocksparse_compute).
template <typename T, int kTilesO>
__device__ __forceinline__ void blocksparse_store(float (&O)[kTilesO][4], RowStats& stats, const AttnProblem& p,
                                                  float score_scale, int head, int q_start, T* __restrict__ o,
                                                  float* __restrict__ lse) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
  const int row0 = q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // row of c0, c1
  AttnProblem scores = p;
  scores.scale = score_scale;  // the unit of m_i, which is all store_output reads the scale for
  store_output<T>(O, stats, scores, head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
