// kernels/varlen/: attention over a packed batch of sequences of different lengths on the
// Hopper engine (kernels/hopper/), in FlashAttention's varlen layout.
// attnlab: the variable-length kernels' prepare kernel: from cu_seqlens, on
// the device (the host never reads them, so a launch needs no synchronisation),
// the work order of varlen_schedule.h written to the workspace — the
// forward's query tiles or the backward's key tiles — and the item counter of
// the forward's persistent grid zeroed. FlashAttention-3 prepares its varlen
// scheduler the same way (flash_prepare_scheduler.cu: tile counts per
// sequence, optionally sorted); here the tiles themselves are sorted, by
// a counting sort over their key-tile counts made stable chunk by chunk with
// cub's block radix sort, so the device's order is the host's exactly.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>  // cuda::maximum

#include "host/attn_problem.h"
#include "varlen/varlen_schedule.h"

namespace attnlab {

constexpr int kVarlenPrepareThreads = 512;

#if defined(__CUDA_ARCH__)

// The sequence that holds query tile t: the last b < B with tile_start[b] <= t
// (sequences without tiles share their start with the next one).
__device__ __forceinline__ int varlen_tile_seq(const int* tile_start, int B, int t) {
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

#endif

// One block of kVarlenPrepareThreads: the order of kKind's tiles, `heads`
// items per tile (H query heads, or Hkv KV heads). p: dims, mask (its B, Nq,
// Nk unused).
template <VarlenTiles kKind, int Br, int Bc>
__global__ void __launch_bounds__(kVarlenPrepareThreads, 1)
varlen_prepare(const AttnProblem p, const int* __restrict__ cu_q, const int* __restrict__ cu_k, int B, int total_q,
               int total_k, int heads, VarlenWorkspace ws) {
#if defined(__CUDA_ARCH__)
  constexpr int kThreads = kVarlenPrepareThreads;
  constexpr int kBuckets = kVarlenTopBucket + 1;  // key-tile counts 0 .. kVarlenTopBucket
  constexpr int kBucketsPerThread = (kBuckets + kThreads - 1) / kThreads;
  static_assert(kBucketsPerThread * kThreads >= kBuckets, "every bucket has a thread");
  using Scan = cub::BlockScan<int, kThreads>;
  using Sort = cub::BlockRadixSort<unsigned, kThreads, 1, int>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Sort::TempStorage sort;
  } tmp;
  __shared__ int bucket_next[kBuckets];   // a bucket's next place in the order
  __shared__ unsigned sorted_key[kThreads];
  const int tid = threadIdx.x;
  auto seq = [&](int b) { return varlen_seq(cu_q, cu_k, b, total_q, total_k); };

  // 1. Each sequence's first tile: an exclusive sum of its tile counts, chunk by chunk.
  int n_tiles = 0;
  for (int b0 = 0; b0 <= B; b0 += kThreads) {
    const int b = b0 + tid;
    const int tiles = b < B ? varlen_tile_count(kKind, seq(b), Br, Bc) : 0;
    int start = 0, chunk = 0;
    Scan(tmp.scan).ExclusiveSum(tiles, start, chunk);
    if (b <= B) ws.tile_start[b] = n_tiles + start;
    n_tiles += chunk;
    __syncthreads();  // tmp is reused
  }

  // 2. How many tiles each cost has.
  for (int w = tid; w < kBuckets; w += kThreads) bucket_next[w] = 0;
  __syncthreads();
  auto bucket_of = [&](int t, int& b, int& m) {
    b = varlen_tile_seq(ws.tile_start, B, t);
    m = t - ws.tile_start[b];
    return varlen_tile_bucket(kKind, p, seq(b), m, Br, Bc);
  };
  for (int t = tid; t < n_tiles; t += kThreads) {
    int b, m;
    atomicAdd(&bucket_next[bucket_of(t, b, m)], 1);
  }
  __syncthreads();

  // 3. Each bucket's first place: the tiles of every larger cost come before it.
  {
    int count[kBucketsPerThread], first[kBucketsPerThread];
    for (int j = 0; j < kBucketsPerThread; ++j) {  // thread tid holds the counts kBuckets - 1 - (tid·k + j)
      const int w = kBuckets - 1 - (tid * kBucketsPerThread + j);
      count[j] = w >= 0 ? bucket_next[w] : 0;
    }
    Scan(tmp.scan).ExclusiveSum(count, first);
    __syncthreads();
    for (int j = 0; j < kBucketsPerThread; ++j) {
      const int w = kBuckets - 1 - (tid * kBucketsPerThread + j);
      if (w >= 0) bucket_next[w] = first[j];
    }
    __syncthreads();
  }

  // 4. The tiles placed, kThreads at a time in tile order: a stable sort of the
  // chunk by cost (descending) lines up the chunk's tiles of each cost in
  // tile order; each goes to its cost's next place plus its rank in that run.
  for (int t0 = 0; t0 < n_tiles; t0 += kThreads) {
    const int t = t0 + tid;
    int b = 0, m = 0;
    unsigned key[1] = {t < n_tiles ? unsigned(bucket_of(t, b, m)) + 1 : 0u};  // 0: past the last tile
    int value[1] = {t};
    Sort(tmp.sort).SortDescending(key, value);  // thread i now holds the chunk's i-th
    sorted_key[tid] = key[0];
    __syncthreads();
    int run_first = tid == 0 || sorted_key[tid - 1] != key[0] ? tid : 0;
    Scan(tmp.scan).InclusiveScan(run_first, run_first, cuda::maximum<>{});
    const bool last_of_run = tid == kThreads - 1 || sorted_key[tid + 1] != key[0];
    int place = 0;
    if (key[0] > 0) {
      place = bucket_next[key[0] - 1] + (tid - run_first);
      bucket_of(value[0], b, m);
      ws.tiles[place] = VarlenTile{b, m};
    }
    __syncthreads();  // every thread has read its count's next place
    if (key[0] > 0 && last_of_run) bucket_next[key[0] - 1] = place + 1;
    __syncthreads();
  }

  if (tid == 0) {
    *ws.counter = 0;
    *ws.n_items = n_tiles * heads;
  }
#endif
}

}  // namespace attnlab
