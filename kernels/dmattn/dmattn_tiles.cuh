// attnlab: the skip test of both dynamic-mask kernels (forward, backward) —
// which 64x64 tiles of the mask have any 1, and which are all ones.
//
// A pre-pass kernel (dma_summarize_mask, dmattn_mask_summary.cu) reads the
// mask once at full memory bandwidth and writes two bitmaps, one bit per
// (mask batch, mask head, query tile, key tile):
//   any: some (query, key) of the tile attends — the tile must be computed;
//   all: every byte is 1 — the kernel may skip the per-element mask reads.
// The attention kernels then test a tile with one word load instead of
// scanning its 4 KiB of mask themselves. Why a separate pass: a kernel that
// scans inside its tile loop waits on one dependent round trip per tile (at
// L = 32K, 512 tiles per query tile), and every query head that shares the
// mask (GQA, broadcast) scans it again; the pre-pass has every tile's loads
// in flight at once and reads a shared mask once. (The forward's in-kernel
// scan, DmaMaskScan::kInKernel, computes the same bits in its blocks and,
// with one split, stores them in this same layout for the backward.)
// Ragged tiles are clipped to Nq and Nk; query tiles past the causal
// diagonal's reach are never read (their bits stay 0: no kernel asks).
// The mask formats and both scans: docs/dmattn_masks.md.
#pragma once

#include <cstdint>

#include "dmattn/dmattn.h"

namespace attnlab {

struct MaskSummary {
  const uint32_t* any = nullptr;  // nullptr: no mask (every tile active, all ones)
  const uint32_t* all = nullptr;
  int q_tiles = 1;  // summary rows per mask head: 1 when the mask is broadcast over queries
  int words = 1;    // 32-bit words per row: ceil(key tiles / 32)

  // Word index of (batch b, query head h, query tile m) for key tiles 32w..32w+31.
  __host__ __device__ int64_t row(const DynamicMaskProblem& p, int b, int h, int m) const {
    const int mb = p.mask.b == 1 ? 0 : b;
    const int mh = p.mask.h == 1 ? 0 : h / p.mask.head_group;
    const int mq = p.mask.q == 1 ? 0 : m;
    return ((int64_t(mb) * p.mask.h + mh) * q_tiles + mq) * words;
  }
  __device__ bool tile_any(const DynamicMaskProblem& p, int b, int h, int m, int n) const {
    return any == nullptr || (__ldg(any + row(p, b, h, m) + n / 32) >> (n % 32) & 1u);
  }
  __device__ bool tile_all(const DynamicMaskProblem& p, int b, int h, int m, int n) const {
    return all == nullptr || (__ldg(all + row(p, b, h, m) + n / 32) >> (n % 32) & 1u);
  }
};

// Bytes of the two bitmaps (0 without a mask).
size_t dma_mask_summary_bytes(const DynamicMaskProblem& p);
// Split-KV: split `split` of `splits` takes key tiles [begin, end) of a range
// of n_range tiles — equal parts, the last ones possibly short or empty. One
// rule for the tile kernel and the gather kernel, whose partials one combine
// merges.
struct SplitTiles {
  int begin, end;
};
__host__ __device__ inline SplitTiles dma_split_tiles(int n_range, int splits, int split) {
  const int per_split = (n_range + splits - 1) / splits;
  const int begin = split * per_split < n_range ? split * per_split : n_range;
  return {begin, begin + per_split < n_range ? begin + per_split : n_range};
}

// Writes both bitmaps into `storage` (dma_mask_summary_bytes(p) bytes, 4-byte
// aligned) and returns the view; a problem without a mask gets an empty view.
cudaError_t dma_summarize_mask(const DynamicMaskProblem& p, uint32_t* storage, MaskSummary* out,
                               cudaStream_t stream);
// The pieces of dma_summarize_mask, for the forward's pipelined pre-pass
// (DmaMaskScan::kPipelined): the view of `storage` (nothing launched), and
// the pre-pass over query tiles [m_begin, m_end) of every mask head only.
MaskSummary dma_mask_summary_view(const DynamicMaskProblem& p, uint32_t* storage);
cudaError_t dma_summarize_mask_tiles(const DynamicMaskProblem& p, uint32_t* storage, int m_begin, int m_end,
                                     cudaStream_t stream);

}  // namespace attnlab
