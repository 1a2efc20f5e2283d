// attnlab: which query tiles the dynamic-mask backward's blocks walk — the
// first query tile a key tile can see, the chunk plan that decides after the
// mask pass whether the query chunks stay (dma_backward_resolve_chunks,
// dmattn_bwd.cu, says how many are launched), and the main kernel's block:
// its key tile, chunk, KV head and batch, and the (query tile, query head)
// slots it walks.
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

// The main kernel's block (dma_bwd_kernel): key tile j_tile of KV head hk of
// batch b, and chunk `chunk` of the key tile's (query tile, query head) slots.
struct DmaBwdBlock {
  int j_tile, chunk, hk, b;
  // The chunks this key tile's slots are dealt to: `chunks` as launched, or
  // the chunk plan's decision (dma_bwd_chunk_plan_kernel: 1 where the mask
  // pass found the active slots even over the key tiles). Blocks of the other
  // chunks leave at once; with one live chunk dK, dV are stored directly.
  int live_chunks;
};
// Block -> (key tile, chunk, KV head, batch). As launched: chunks of one key
// tile neighbours in grid.x (they run at the same time and share K_j, V_j
// through L2; the causal range's long columns start first). Where the plan
// drops the chunks, chunk is the slowest index of the whole grid instead,
// so that the dropped chunks' blocks come last: they leave at once, but each
// still takes an SM's one block place while it starts. Not where the chunks
// stay: chunk-major is slower there (docs/experiments.md).
__device__ __forceinline__ DmaBwdBlock dma_bwd_block(int chunks, const unsigned long long* __restrict__ chunk_plan) {
  DmaBwdBlock blk;
  blk.live_chunks = chunk_plan != nullptr ? int(chunk_plan[kPlanLiveChunks]) : chunks;
  if (blk.live_chunks == chunks) {
    blk.j_tile = blockIdx.x / chunks, blk.chunk = blockIdx.x % chunks, blk.hk = blockIdx.y, blk.b = blockIdx.z;
  } else {
    const int key_tiles = gridDim.x / chunks;
    const int64_t per_chunk = int64_t(key_tiles) * gridDim.y * gridDim.z;
    const int64_t linear = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    const int64_t rest = linear % per_chunk;
    blk.chunk = int(linear / per_chunk);
    blk.j_tile = int(rest % key_tiles), blk.hk = int(rest / key_tiles % gridDim.y);
    blk.b = int(rest / key_tiles / gridDim.y);
  }
  return blk;
}

// The slots of a block's key tile (first key kv0): with several chunks query
// tile major, s = (m - m_first)·group + hq, chunk c taking s = c, c + chunks,
// ... — interleaved, since active tiles come in runs of neighbouring query
// tiles, which a contiguous range would give to one chunk, and query tile
// major, so that the heads sharing a mask row are split too. One chunk (the
// deterministic mode's) walks head-major, s = hq·n_m + (m - m_first).
// DmaBackwardArgs::rotate_slots (the default): key tile j walks its query
// tiles from m_first + j mod n_m on, wrapping, instead of from m_first, so
// that the key tiles' blocks, which run in step, reduce their dQ into
// different query tiles at a time instead of all into the same one (faster on
// a sparse top-W mask; dense shapes unchanged).
struct DmaBwdSlots {
  int chunks, hk, group;
  int m_first;     // the first query tile that can see a key of this tile
  int n_m;         // query tiles from m_first on
  int n_slots;     // n_m · group
  int slot_major;  // s = major·slot_major + minor
  int m_rot;

  __device__ __forceinline__ DmaBwdSlots(const DynamicMaskProblem& p, const DmaBwdBlock& blk, int chunks_,
                                         int kv0, bool rotate_slots)
      : chunks(chunks_), hk(blk.hk), group(p.H / p.Hkv) {
    static_assert(kDmaBr == 64, "first_query_tile's tiles");
    m_first = first_query_tile(p, kv0);
    const int n_q_tiles = (p.Nq + kDmaBr - 1) / kDmaBr;
    n_m = max(0, n_q_tiles - m_first), n_slots = n_m * group;
    slot_major = chunks > 1 ? group : n_m;
    m_rot = rotate_slots && n_m > 0 ? blk.j_tile % n_m : 0;
  }
  // Slot s's query tile m and query head h.
  __device__ __forceinline__ void head(int s, int& m, int& h) const {
    const int major = s / slot_major, minor = s % slot_major;
    const int mi = chunks > 1 ? major : minor;
    m = m_first + (mi + m_rot < n_m ? mi + m_rot : mi + m_rot - n_m);
    h = hk * group + (chunks > 1 ? minor : major);
  }
};

}  // namespace
}  // namespace attnlab
