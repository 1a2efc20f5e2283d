// attnlab: which query tiles the dynamic-mask backward's blocks walk — the
// first query tile a key tile can see, and the chunk plan that decides after
// the mask pass whether the query chunks stay (dma_backward_resolve_chunks,
// dmattn_bwd.cu, says how many are launched).
#pragma once

#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace {

// The backward's chunk plan, 64-bit words (dma_bwd_chunk_plan_kernel below).
enum : int { kPlanBusiest = 0, kPlanTotal, kPlanDone, kPlanLiveChunks, kPlanWords };

// The first query tile that can see a key of the key tile starting at kv0:
// q >= kv0 - (Nk - Nq) under the causal rule (bottom-right aligned). The
// chunk plan counts exactly the slots the main kernel walks from it.
__device__ __forceinline__ int first_query_tile(const DynamicMaskProblem& p, int kv0) {
  return (p.causal ? max(0, kv0 - (p.Nk - p.Nq)) : 0) / kDmaBr;
}

// The backward's chunk plan (automatic count, with a mask, where the key
// tiles alone give every SM 4 blocks: dma_backward_plans_chunks). Block (j,
// hk, b) counts the active slots of key tile j — the query tiles m >= m_first(j)
// of the group's query heads whose 64x64 tile the mask pass marked active —
// into plan[kPlanBusiest] (maximum) and plan[kPlanTotal] (sum); the last block
// to finish (plan[kPlanDone]) writes the decision, plan[kPlanLiveChunks]: 1
// when the busiest key tile holds at most 5/4 of the mean (a dense mask, not
// causal: every key tile the same work, the chunks only cost — K, V loaded
// once per chunk, dK and dV through fp32 atomics, a zeroing and a sum pass),
// else the launched count (causal, dense or sparse: the busiest key tile holds
// about twice the mean or more — the work the chunks spread). The plan is
// zeroed by the host. One block per key tile, its threads over the slots.
__global__ void __launch_bounds__(128)
dma_bwd_chunk_plan_kernel(const DynamicMaskProblem p, const MaskSummary summary, int chunks,
                          unsigned long long* plan) {
  const int j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = p.H / p.Hkv;
  const int m_first = first_query_tile(p, j * kDmaBc);
  const int n_m = max(0, (p.Nq + kDmaBr - 1) / kDmaBr - m_first);
  unsigned int count = 0;
  for (int s = threadIdx.x; s < n_m * group; s += blockDim.x)
    count += summary.tile_any(p, b, hk * group + s / n_m, m_first + s % n_m, j) ? 1u : 0u;
  for (int off = 16; off > 0; off /= 2) count += __shfl_xor_sync(0xffffffffu, count, off);
  __shared__ unsigned int warp_counts[4];
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned long long total =
      (unsigned long long)warp_counts[0] + warp_counts[1] + warp_counts[2] + warp_counts[3];
  if (total > 0) {
    atomicMax(plan + kPlanBusiest, total);
    atomicAdd(plan + kPlanTotal, total);
  }
  // The last block decides (threadfence reduction, CUDA programming guide):
  // every block's sums are visible before its count is.
  __threadfence();
  const unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(plan + kPlanDone, 1ull) != blocks - 1) return;
  __threadfence();
  const unsigned long long busiest = atomicAdd(plan + kPlanBusiest, 0ull), all = atomicAdd(plan + kPlanTotal, 0ull);
  plan[kPlanLiveChunks] = 4 * busiest * blocks <= 5 * all ? 1ull : (unsigned long long)chunks;
}

}  // namespace
}  // namespace attnlab
