// attnlab: the dynamic-mask forward's split-KV merge, dma_combine_kernel,
// after either the tile kernel or the gather core.
#pragma once

#include "common/block_reduce.cuh"
#include "common/ptx.cuh"

namespace attnlab {
namespace {

// Split-KV merge, one block per output row: O = Σ_s w_s·O_s / Σ_s w_s with
// w_s = exp(LSE_s - max LSE), LSE = max + log Σ w_s (FlashAttention's
// combine_attn_seqk_parallel does the same). All-(-inf) rows: O = 0, LSE = -inf.
// The threads first share the splits (max, weights into shared memory), then
// the (split, column) pairs: kCombineThreads / D groups of D threads, each
// group summing every G-th split with 8 loads in flight, then the groups'
// sums added in group order. (A serial chain of L2 round trips, one per split,
// cost more than the splits saved.)
// 256 threads for a few splits (many rows: short blocks), 512 for many.
template <typename T, int kCombineThreads>
__global__ void __launch_bounds__(kCombineThreads)
dma_combine_kernel(const float* __restrict__ partials, T* __restrict__ o, float* __restrict__ lse, int splits,
                   int64_t rows, int D) {
  extern __shared__ float combine_smem[];  // weights [splits], then group sums [groups][D]
  float* weight = combine_smem;
  float* group_sum = combine_smem + splits;
  __shared__ float scratch[kCombineThreads / 32];
  griddep_wait();  // launched overlapped with the forward kernel that writes the partials
  const int64_t row = blockIdx.x;
  const float* part_lse = partials + int64_t(splits) * rows * D;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) m = fmaxf(m, part_lse[int64_t(s) * rows + row]);
  m = block_allreduce<kCombineThreads / 32>(m, scratch, true);
  float total = 0.f;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) {
    const float l = part_lse[int64_t(s) * rows + row];
    weight[s] = l == -INFINITY ? 0.f : expf(l - m);
    total += weight[s];
  }
  total = block_allreduce<kCombineThreads / 32>(total, scratch, false);  // ends with a barrier: weight[] visible
  const int groups = kCombineThreads / D, group = threadIdx.x / D, d = threadIdx.x % D;
  if (group < groups) {
    float acc[8] = {};
    int s = group;
    for (; s + 7 * groups < splits; s += 8 * groups)
#pragma unroll
      for (int u = 0; u < 8; ++u)
        acc[u] += weight[s + u * groups] * partials[(int64_t(s + u * groups) * rows + row) * D + d];
    for (; s < splits; s += groups) acc[0] += weight[s] * partials[(int64_t(s) * rows + row) * D + d];
    float sum = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) sum += acc[u];
    group_sum[group * D + d] = sum;
  }
  __syncthreads();
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int c = threadIdx.x; c < D; c += kCombineThreads) {
    float sum = 0.f;
    for (int g = 0; g < groups; ++g) sum += group_sum[g * D + c];
    o[row * D + c] = T(sum * inv);
  }
  if (threadIdx.x == 0) lse[row] = total > 0.f ? m + logf(total) : -INFINITY;
}

}  // namespace
}  // namespace attnlab
