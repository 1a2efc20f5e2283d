// attnlab: the block-sparse forward's tile scheduler — which block computes
// which (query tile, head), in what order. The items go in the order of rung
// 12's causal grid (hopper/fwd_scheduler.cuh): the bottom query tiles of
// every head first, the heads in L2-sized sections. That is longest first
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

#include "hopper/fwd_scheduler.cuh"
#include "host/attn_problem.h"

namespace attnlab {

// The items of problem p for query tiles of Br rows (items = 0: more than the
// order holds), one block each; blocksparse_fwd makes it dynamic (a grid of
// one block per SM) where it has a counter. p.causal plays no part in the
// block-sparse kernel itself.
inline TileOrder blocksparse_tile_order(const AttnProblem& p, int Br) {
  AttnProblem bottom_first = p;
  bottom_first.causal = true;  // only the order's choice: bottom tiles first, heads in sections
  return make_tile_order(bottom_first, Br);
}

// Item `item`'s query tile (first row) and head (b·H + h).
__device__ __forceinline__ void blocksparse_item(const TileOrder& order, int item, int& q_start, int& head, int Br) {
  int m_block;
  order.item(item, m_block, head);
  q_start = m_block * Br;
}

}  // namespace attnlab
