// attnlab: step 1 of the dynamic-mask forward's tile kernel — which key tiles
// any row of a block's query tile sees, before any K, V or bias traffic
// (docs/dmattn_forward.md, "a skip list, then a flash loop"): the tile bits
// of the mask pre-pass (dmattn_tiles.cuh) or of the block's own scan of its
// rows (DmaMaskScan::kInKernel, dmattn_mask_scan.cuh), compacted into an
// ascending list in shared memory, so that the tile loop (fwd_mainloop.cuh)
// prefetches the next *active* tile.
#pragma once

#include <cstdint>

#include "dmattn/dmattn.h"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/dmattn_tiles.cuh"
#include "dmattn/fwd_config.cuh"

namespace attnlab {
namespace {

// The block's active tiles as the tile loop walks them: with a mask the
// list (ascending) and the all-ones bits; without one every tile of
// [begin, begin + count), all ones. (References to the kernel's values, as
// fwd_mainloop.cuh's DmaFwdOperands.)
struct DmaActiveTiles {
  const DynamicMaskProblem& p;
  const uint16_t* const& list;
  const uint32_t* const& all_ones;
  const int &begin, &count;
  const bool& listed;  // a mask: list and all_ones apply
  __device__ __forceinline__ int at(int i) const { return p.mask.data != nullptr ? int(list[i]) : begin + i; }
  __device__ __forceinline__ bool full(int tile) const {
    return !listed || (all_ones[tile / 32] >> (tile % 32) & 1u);
  }
};

// With a mask: the active tiles of [tile_begin, tile_end) of query tile
// m_block (batch b, head h) into `active` (ascending), the all-ones bits into
// `full_bitmap` (`bitmap`: the any bits, scratch); returns how many.
// scan_in_kernel: the block reads its rows of the mask itself, and where
// summary_out is given one block per summary row stores the bits it found.
template <typename Cfg, bool kMaskBits>
__device__ __forceinline__ int dma_fwd_list_active_tiles(const DynamicMaskProblem& p, const MaskSummary& summary,
                                                         int b, int h, int m_block, int tile_begin, int tile_end,
                                                         bool scan_in_kernel, uint32_t* __restrict__ summary_out,
                                                         uint16_t* active, uint32_t* bitmap, uint32_t* full_bitmap,
                                                         int warp, int lane) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc;
  __shared__ int n_active_shared;
  // Bits of [tile_begin, tile_end) only: a word may hold tiles of the split
  // before or after this one.
  auto in_range = [&](int w) {
    const int lo = max(0, tile_begin - 32 * w), hi = min(32, tile_end - 32 * w);
    return hi <= lo ? 0u : (hi == 32 ? ~0u : (1u << hi) - 1u) & ~((1u << lo) - 1u);
  };
  if (scan_in_kernel) {
    // Read this query tile's rows of the mask here (dmattn_mask_scan.cuh):
    // warp w takes rows w, w + 4, ...; kScanRowBatch x 4 loads of 16 bytes
    // per lane in flight. Words are OR-ed / AND-ed across the warps.
    for (int w = threadIdx.x; w < dma_bitmap_words(tile_end); w += Cfg::kThreads) {
      bitmap[w] = 0u;
      full_bitmap[w] = ~0u;
    }
    __syncthreads();
    const mask_scan::TileRows rows = mask_scan::tile_rows(p, p.mask.b == 1 ? 0 : b,
                                                          p.mask.h == 1 ? 0 : h / p.mask.head_group, m_block);
    const int key_end = min(rows.key_end, tile_end * Bc);
    if constexpr (kMaskBits)
      mask_scan::scan_words_bits<Cfg::kWarps, Cfg::kScanBitRowBatch>(rows.bits(), p.mask.stride_q, rows.rows, p.Nk,
                                                                     key_end, tile_begin / 32, bitmap, full_bitmap);
    else
      mask_scan::scan_words<Cfg::kWarps, Cfg::kScanRowBatch>(rows.row0, p.mask.stride_q, rows.rows, p.Nk, key_end,
                                                             tile_begin / 32, mask_scan::mask_vector_loads(p),
                                                             bitmap, full_bitmap);
    __syncthreads();
    // The scan's bits are the pre-pass's bits of this summary row (the same
    // scan_word over the same keys: with one split the block's key_end is
    // the row's causal end, or Nk), so one block per row stores them for
    // the backward (dma_forward_mask_summary), which then reads the mask
    // no second time: the row's first batch and head, and for a
    // query-broadcast mask the last query tile (it sees every key). Words
    // past key_end get 0, as from the pre-pass. Each thread stores the
    // words it then restricts below (same thread, same word: no race).
    const bool summary_writer =
        summary_out != nullptr && (p.mask.b != 1 || b == 0) &&
        (p.mask.h == 1 ? h == 0 : h % p.mask.head_group == 0) &&
        (p.mask.q != 1 || m_block == (p.Nq + Br - 1) / Br - 1);
    if (summary_writer) {
      const int64_t srow = summary.row(p, b, h, m_block);
      uint32_t* any_out = summary_out + srow;
      uint32_t* all_out = summary_out + (summary.all - summary.any) + srow;
      for (int w = threadIdx.x; w < summary.words; w += Cfg::kThreads) {
        const bool read = w * 32 * Bc < key_end;
        any_out[w] = read ? bitmap[w] : 0u;
        all_out[w] = read ? full_bitmap[w] : 0u;
      }
    }
    for (int w = threadIdx.x; w < dma_bitmap_words(tile_end); w += Cfg::kThreads) bitmap[w] &= in_range(w);
  } else {
    const int64_t srow = summary.row(p, b, h, m_block);
    for (int w = threadIdx.x; w < dma_bitmap_words(tile_end); w += Cfg::kThreads) {
      const uint32_t range = in_range(w);
      bitmap[w] = range != 0u ? __ldg(summary.any + srow + w) & range : 0u;
      full_bitmap[w] = range != 0u ? __ldg(summary.all + srow + w) : 0u;
    }
  }
  __syncthreads();
  if (warp == 0) {  // compaction in tile order: deterministic, ascending
    int base = 0;
    for (int w = tile_begin / 32; w < dma_bitmap_words(tile_end); ++w) {
      const uint32_t bits = bitmap[w];
      if (bits >> lane & 1u) active[base + __popc(bits & ((1u << lane) - 1u))] = uint16_t(w * 32 + lane);
      base += __popc(bits);
    }
    if (lane == 0) n_active_shared = base;
  }
  __syncthreads();
  return n_active_shared;
}

}  // namespace
}  // namespace attnlab
