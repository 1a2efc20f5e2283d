// attnlab: the order in which a rung's blocks take their (query tile, head)
// work items — rung 12's tile scheduler. Items are numbered in the order they
// should start; a grid of one block per item starts them in that order
// (blockIdx.x), a persistent grid deals them out round by round (next()):
//   non-causal: head by head, the query tiles of one head together, so that
//     its K and V are read from DRAM about once and then from L2;
//   causal: the longest tiles first (LPT, longest processing time first, as
//     FlashAttention-3's scheduler orders causal work): a query tile near the
//     bottom of the mask reads every key, one near the top almost none. Going
//     head by head, the last head's long tiles would start late and run on
//     alone at the end. So the heads go in sections of equal size (as few as
//     keep each one's K and V within half the L2), and inside a section tile
//     row m of every head comes before row m - 1 of any: the short tiles fill
//     the tail.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "host/attn_problem.h"
#include "host/env_switch.h"

namespace attnlab {

struct TileOrder {
  int m_blocks = 1;  // query tiles per head
  int heads = 1;     // B·H
  int section = 1;   // causal: heads per section; 0: head by head
  int items = 1;     // m_blocks · heads (make_tile_order: 0 when that exceeds kMaxItems)
  static constexpr int kMaxItems = (1 << 30);  // rounds of a persistent grid stay in int

  // The item block `block` of a grid of `blocks` computes in round `round`, -1
  // when it has none left. A grid of one block per item has one round; a
  // persistent grid deals round r's items [r·blocks, (r + 1)·blocks) in snake
  // order (block b takes the b-th in even rounds, the b-th from the end in odd
  // ones), so that, items being longest first, every block gets long and short
  // ones alike.
  __host__ __device__ __forceinline__ int next(int block, int blocks, int round) const {
    const int linear = round * blocks + (round % 2 == 0 ? block : blocks - 1 - block);
    return linear < items ? linear : -1;
  }

  // Work item `linear` (the block's index in launch order) -> its query tile and head.
  __host__ __device__ __forceinline__ void item(int linear, int& m_block, int& head) const {
    if (section == 0) {
      head = linear / m_blocks;
      m_block = m_blocks - 1 - linear % m_blocks;
      return;
    }
    const int per_section = section * m_blocks;
    const int first = linear / per_section * section;    // the section's first head
    const int n = heads - first < section ? heads - first : section;  // heads in this section (the last may have fewer)
    const int r = linear % per_section;
    head = first + r % n;
    m_block = m_blocks - 1 - r / n;
  }
};

// The device's L2 size in bytes (0 when there is no device to ask).
inline size_t device_l2_bytes() {
  static const size_t bytes = [] {
    int device = 0, value = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
                   cudaDeviceGetAttribute(&value, cudaDevAttrL2CacheSize, device) == cudaSuccess
               ? size_t(value)
               : size_t(0);
  }();
  return bytes;
}

// The order of problem p's work items for query tiles of kBr rows.
inline TileOrder make_tile_order(const AttnProblem& p, int Br) {
  TileOrder t;
  t.m_blocks = (p.Nq + Br - 1) / Br;
  t.heads = int(p.heads());
  const int64_t items = int64_t(t.m_blocks) * t.heads;
  t.items = items <= TileOrder::kMaxItems ? int(items) : 0;
  // ATTNLAB_NO_LPT=1: causal work head by head too, to measure what the order buys.
  static const bool head_by_head = env_switch_on("ATTNLAB_NO_LPT");
  if (p.causal && !head_by_head) {
    // K and V of one query head (a KV head shared by H / Hkv query heads counts once per query head: a bound).
    const double kv_bytes = double(p.Nk) * (p.D + p.Dv) * kInputElementBytes;
    const double budget = 0.5 * double(device_l2_bytes() > 0 ? device_l2_bytes() : (50u << 20));
    // Sections of equal size: a short last section (say 1 head of 8) would
    // start its long tiles last, which is what the order is there to avoid.
    const int most = int(std::clamp(budget / kv_bytes, 1.0, double(t.heads)));
    const int sections = (t.heads + most - 1) / most;
    t.section = (t.heads + sections - 1) / sections;
  } else {
    t.section = 0;
  }
  return t;
}

}  // namespace attnlab
