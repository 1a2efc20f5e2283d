// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the forward's tile scheduler (rung 12, the block-sparse forward):
// the order in which a kernel's blocks take their (query tile, head) work
// items, its plan on the host (plan_fwd_schedule: the grid, the workspace,
// what the kernel takes), and, in hopper/fwd_scheduler.cuh, its device side
// (each round's work piece, and the dynamic order's hand-off in shared
// memory). Host and device code; its CPU test is tests/cpu/test_fwd_scheduler.cpp.
// Items are numbered in the order they should start; a grid of one block per
// item starts them in that order (blockIdx.x), a persistent grid deals them
// out round by round (next()). A kernel names its policy (FwdPolicy):
//   head by head (equal items: rung 12 non-causal): the query tiles of one
//     head together, so that its K and V are read from DRAM about once and
//     then from L2;
//   longest first (unequal items: rung 12 causal, a block mask's lists): LPT,
//     longest processing time first, as FlashAttention-3's scheduler orders
//     causal work: a query tile near the bottom of the mask reads every key,
//     one near the top almost none. Going head by head, the last head's long
//     tiles would start late and run on alone at the end. So the heads go in
//     sections of equal size (as few as keep each one's K and V within half
//     the L2), and inside a section tile row m of every head comes before row
//     m - 1 of any: the short tiles fill the tail.
// Longest first, a persistent grid takes the items in that order from a global
// counter, one block per SM (FlashAttention-3's dynamic persistent scheduler),
// so that the next tile's Q and K load under the last one's epilogue.
// Head by head, the items are equal, and a last round that fills only part of
// the grid would leave the rest of the SMs idle (344 tiles on 132 SMs: 2.6
// rounds run as 3). So the items of that round are split along the keys
// (stream-K, Osama et al. 2023; CUTLASS's stream-K GEMM scheduler): their key
// tiles are dealt evenly over every block, and the block holding an item's
// last key tile merges the others' partial results (common/kv_split.cuh).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/kv_split.cuh"
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/env_switch.h"

namespace attnlab {

// The forward's scheduling policies; each kernel names the one its work needs.
enum class FwdPolicy {
  kHeadByHead,    // equal items, head by head; a persistent grid splits its last round along the keys
  kLongestFirst,  // unequal items, longest first in L2 sections; a persistent grid takes them from a counter
};

// One block's share of one work item: its key tiles [kv_begin, kv_end).
// kv_end = kAllKeys: every key tile the item has.
struct WorkPiece {
  static constexpr int kAllKeys = 1 << 30;
  int item = -1;  // -1: the block has no more work
  int kv_begin = 0, kv_end = kAllKeys;
};

struct TileOrder {
  int m_blocks = 1;  // query tiles per head
  int heads = 1;     // B·H
  int section = 1;   // longest first: heads per section; 0: head by head
  int items = 1;     // m_blocks · heads (make_tile_order: 0 when that exceeds kMaxItems)
  static constexpr int kMaxItems = (1 << 30);  // rounds of a persistent grid stay in int
  // The split of the last round (plan_kv_split; split_units = 0: none). Items
  // [0, whole_items) go whole, whole_items / blocks rounds of them; the key
  // tiles ("units") of items [whole_items, items), kv_tiles per item, are
  // numbered item by item and block b takes units [begin(b), begin(b + 1)).
  int kv_tiles = 0;
  int whole_items = 0;
  int split_units = 0;
  // Longest first on a persistent grid: round 0 takes item blockIdx.x, later rounds
  // the next item of a global counter (the kernel's producer fetches it), so
  // that a block which finishes early takes the next longest tile.
  bool dynamic = false;

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

  // The piece block `block` of `blocks` computes in round `round`. Whole items
  // first; then the block's units, at most two pieces (the end of one item,
  // the start of the next; a block's share is below one item's kv_tiles). The
  // piece that starts an item goes first: its partial result is what a lower
  // block, ending that item, waits for at the end of its own share.
  __host__ __device__ __forceinline__ WorkPiece piece(int block, int blocks, int round) const {
    WorkPiece w;
    const int whole_rounds = split_units > 0 ? whole_items / blocks : round + 1;
    if (round < whole_rounds) {
      w.item = next(block, blocks, round);
      return w;
    }
    const int lo = split_begin(block, blocks), hi = split_begin(block + 1, blocks);
    const int item_end = (lo / kv_tiles + 1) * kv_tiles;
    const int lo_end = hi < item_end ? hi : item_end;  // the piece in lo's item ends here
    const bool two = lo_end < hi;                       // and one starts the next item
    const int k = round - whole_rounds;
    if (lo == hi || k > (two ? 1 : 0)) return w;
    const int a = two && k == 0 ? lo_end : lo, b = two && k == 0 ? hi : lo_end;
    w.item = whole_items + a / kv_tiles;
    w.kv_begin = a % kv_tiles;
    w.kv_end = w.kv_begin + (b - a);
    return w;
  }
  // The first unit of block `block`'s share; split_begin(blocks, blocks) = split_units.
  __host__ __device__ __forceinline__ int split_begin(int block, int blocks) const {
    return block * split_units / blocks;  // plan_kv_split keeps split_units · blocks in int
  }
  // The block whose share holds unit u: the last b with split_begin(b) <= u
  // (blocks with an empty share have the next one's begin, and are skipped).
  __host__ __device__ __forceinline__ int split_owner(int u, int blocks) const {
    return ((u + 1) * blocks - 1) / split_units;
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

// The order of problem p's work items for query tiles of Br rows under `policy`.
inline TileOrder make_tile_order(const AttnProblem& p, int Br, FwdPolicy policy) {
  TileOrder t;
  t.m_blocks = (p.Nq + Br - 1) / Br;
  t.heads = int(p.heads());
  const int64_t items = int64_t(t.m_blocks) * t.heads;
  t.items = items <= TileOrder::kMaxItems ? int(items) : 0;
  // ATTNLAB_NO_LPT=1: longest-first work head by head too, to measure what the order buys.
  static const bool head_by_head = env_switch_on("ATTNLAB_NO_LPT");
  if (policy == FwdPolicy::kLongestFirst && !head_by_head) {
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

// Plans the split of the last round for a persistent grid of at most `sms`
// blocks on equal items of kv_tiles key tiles each; returns the grid size.
// Split only where a block's share of the last round saves it at least two
// key tiles (each piece pays one more pipeline fill, and a partial store or
// merge), and where the unit arithmetic fits in int. `allowed`: the caller
// has the workspace (kv_split.cuh) and the items are equal (head by head).
inline int plan_kv_split(TileOrder& t, int kv_tiles, int sms, bool allowed) {
  t.split_units = 0;
  if (!allowed || kv_tiles <= 0 || t.items == 0) return std::min(t.items, sms);
  const int blocks = int(std::min<int64_t>(sms, int64_t(t.items) * kv_tiles));
  const int rest = t.items % blocks;  // items of the last, partial round
  const int64_t rest_units = int64_t(rest) * kv_tiles;
  const int64_t share = (rest_units + blocks - 1) / blocks;  // the largest block share
  if (rest == 0 || kv_tiles - share < 2 || rest_units * blocks >= (int64_t(1) << 31))
    return std::min(t.items, sms);
  t.kv_tiles = kv_tiles;
  t.whole_items = t.items - rest;
  t.split_units = int(rest_units);
  return blocks;
}

// The dynamic order's item counter (an int, 16-byte aligned), at the start of
// the workspace of a kernel that takes it.
constexpr size_t kDynamicCounterBytes = 16;

// Plans a persistent grid of `sms` blocks taking t's items from a counter
// (t.dynamic; FlashAttention-3's dynamic persistent scheduler): where the
// workspace holds the counter, zeroed here on `stream`, and there are more
// items than SMs. Otherwise, or with ATTNLAB_NO_DYNAMIC=1 (to measure the one
// against the other), a block per item, which the hardware starts as blocks
// finish, and `counter` null. `blocks`: the grid size.
inline cudaError_t plan_dynamic_order(TileOrder& t, void* workspace, size_t workspace_bytes, int sms,
                                      cudaStream_t stream, int& blocks, int*& counter) {
  static const bool off = env_switch_on("ATTNLAB_NO_DYNAMIC");
  blocks = t.items;
  counter = nullptr;
  if (off || workspace == nullptr || workspace_bytes < kDynamicCounterBytes || t.items <= sms) return cudaSuccess;
  counter = static_cast<int*>(workspace);
  t.dynamic = true;
  blocks = sms;
  return cudaMemsetAsync(counter, 0, sizeof(int), stream);
}

// The tiles a plan is made for: query and key tile rows, and the split's
// partial state (the compute threads, O's n8 tiles per thread).
struct FwdTiles {
  int Br, Bc, threads, tiles_o;
};

// What a kernel on this scheduler is launched with: its order, the split's
// workspace (head by head), the counter (longest first), and the grid.
struct FwdSchedule {
  TileOrder order;
  KvSplitArgs split;
  int* counter = nullptr;
  int blocks = 0;
};

// The workspace of `policy`'s plan on `sms` SMs: the split's flags and partial
// states, or the counter.
inline size_t fwd_schedule_workspace_bytes(FwdPolicy policy, const FwdTiles& t, int sms) {
  return policy == FwdPolicy::kHeadByHead ? kv_split_workspace_bytes(sms, t.threads, t.tiles_o)
                                          : kDynamicCounterBytes;
}

// Plans problem p's schedule under `policy` for a kernel that walks one item
// per block (persistent = false: a block per item) or the items of a
// persistent grid on `sms` SMs (the policy's grid where the workspace allows
// it: the split, plan_kv_split; the counter, zeroed on `stream`,
// plan_dynamic_order). ATTNLAB_NO_KV_SPLIT=1: the last round whole, to
// measure what the split buys.
inline cudaError_t plan_fwd_schedule(const AttnProblem& p, FwdPolicy policy, const FwdTiles& t, bool persistent,
                                     void* workspace, size_t workspace_bytes, int sms, cudaStream_t stream,
                                     FwdSchedule& s) {
  s = FwdSchedule{};
  s.order = make_tile_order(p, t.Br, policy);
  s.blocks = s.order.items;
  if (!persistent) return cudaSuccess;
  if (policy == FwdPolicy::kLongestFirst)
    return plan_dynamic_order(s.order, workspace, workspace_bytes, sms, stream, s.blocks, s.counter);
  static const bool split_off = env_switch_on("ATTNLAB_NO_KV_SPLIT");
  const bool split_ok = !split_off && workspace != nullptr &&
                        workspace_bytes >= fwd_schedule_workspace_bytes(policy, t, sms);
  s.blocks = plan_kv_split(s.order, (p.Nk + t.Bc - 1) / t.Bc, sms, split_ok);
  if (s.order.split_units > 0) s.split = kv_split_args(workspace, s.blocks);
  return cudaSuccess;
}

}  // namespace attnlab
