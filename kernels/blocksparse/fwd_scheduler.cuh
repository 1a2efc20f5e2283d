// attnlab: the block-sparse forward's tile scheduler — which block computes
// which (query tile, head), in what order: the forward scheduler's longest-first
// policy (hopper/fwd_scheduler.h, rung 12's causal order): the bottom query
// tiles of every head first, the heads in L2-sized sections. That is longest first
// (LPT, as FlashAttention-3 orders causal work) for the mask_mods whose lists
// grow with the query index (causal, prefix_lm, a document mask's later
// documents) and harmless for the others, whose tiles are about equal.
// With a workspace for its counter, a persistent grid of one block per SM
// takes the items in that order from the counter (rung 12's dynamic order,
// FlashAttention-3's dynamic persistent scheduler): the producer fetches the
// next item and hands it over, so the next tile's Q and first K load under
// this one's last P·V and epilogue, and a block whose tiles were short takes
// the next item at once. Without one, a block per item, which the hardware
// starts as blocks finish. A true LPT over any block mask would sort the items
// by their listed tile counts (a pass over kv_count and full_count first).
#pragma once

#include "hopper/fwd_scheduler.h"
#include "host/attn_problem.h"

namespace attnlab {

// The policy of the block-sparse forward's schedule (plan_fwd_schedule).
constexpr FwdPolicy kBlockSparsePolicy = FwdPolicy::kLongestFirst;

// Item `item`'s query tile (first row) and head (b·H + h).
__device__ __forceinline__ void blocksparse_item(const TileOrder& order, int item, int& q_start, int& head, int Br) {
  int m_block;
  order.item(item, m_block, head);
  q_start = m_block * Br;
}

}  // namespace attnlab
