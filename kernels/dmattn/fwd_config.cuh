// attnlab: the dynamic-mask forward's tile configuration (DmaConfig) and its
// shared-memory sizes — what the tile kernel (fwd_kernel.cuh), the host's
// planning (dmattn_fwd_plan.cu) and its launch (dmattn_fwd.cu) share. The
// table these constants are checked against is the header of dmattn_fwd.cu.
// (File-local namespace: each including file gets its own copy, and the
// kernels' symbols stay those of dmattn_fwd.cu.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "dmattn/dmattn.h"
#include "host/rung_host.cuh"

namespace attnlab {
namespace {


// kWgmma: the Hopper core (sm_90a): S = Q·Kᵀ and O += P·V as warpgroup MMAs
// (rung 07's instructions: Q and K read by wgmma straight from shared memory,
// P from registers; no ldmatrix, and the half of Hopper's tensor rate that
// mma.sync cannot reach), tiles in wgmma's 128-byte swizzle (dense rows,
// 1024-byte aligned: + 1024 bytes of slack). Otherwise mma.sync as rung 02, rows
// padded by 8 halves. The 4 warps are one warpgroup either way, and the
// accumulator layout is the same, so everything between the two matrix
// products is one code.
template <int kHeadDim_, bool kWgmma_ = false>
struct DmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kBr = kDmaBr, kBc = kDmaBc;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = 2;
  static constexpr int kRowStride = kWgmma ? kHeadDim : kHeadDim + 8;  // elements per stored row
  static constexpr int kTileBytes = (kBr + 2 * kStages * kBc) * kRowStride * 2 + (kWgmma ? 1024 : 0);
  // Warp layout: each warp owns 16 rows (one m16 row tile) and all 64 keys of
  // the tile. Two row tiles per warp (every K and V fragment read from shared
  // memory feeding two MMAs, as in rung 02's D = 128 tiles, with warp pairs
  // splitting the keys and merging by LSE) are slower, with more registers
  // (docs/experiments.md).
  static constexpr int kMTiles = 1;
  // Keys per S slice: all 64 at once, or two slices of 32 at D >= 192 (S and O
  // must fit in the registers together).
  // (wgmma: all 64; its B operand is not re-read per row tile, so the
  // registers of a second slice go to nothing else.)
  static constexpr int kSubCols = kHeadDim < 192 || kWgmma ? 64 : 32;
  static constexpr int kSubTiles = kBc / kSubCols;
  static constexpr int kTilesS = kSubCols / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  // Blocks per SM the register count must allow: four for the wgmma core at
  // D = 64 (41 KiB of shared memory each; 128 registers, 4 bytes spilled),
  // else whatever fits (shared memory decides). Four are faster than three
  // (161 registers) on dense, causal and biased shapes; a scan-bound one-wave
  // sparse shape pays the smaller scan batch below.
  static constexpr int kMinBlocksPerSm = kWgmma && kHeadDim == 64 ? 4 : 1;
  // The in-kernel mask scan (DmaMaskScan::kInKernel): rows of 16-byte loads
  // per lane in flight (x 4 loads each): 16 KiB per warp, 128 KiB per SM with
  // two blocks, as the pre-pass kernel keeps in flight. At four blocks per SM
  // 4 rows (8 spill inside scan_words at 128 registers, and run slower).
  static constexpr int kScanRowBatch = kMinBlocksPerSm >= 4 ? 4 : 8;
  // A bit-packed mask: a warp's 16 rows of a word in flight at once, one
  // 8-byte load per lane and row (a warp load: 256 bytes of one row).
  static constexpr int kScanBitRowBatch = kBr / kWarps;
  static_assert(kBr == 16 * kMTiles * kWarps, "the warps split the rows");
  static_assert(!kWgmma || (kSubTiles == 1 && kWarps == 4), "wgmma: one warpgroup, all 64 keys at once");
};

// Bytes after the tiles: the active-tile list (uint16) and the bitmap.
__host__ __device__ inline int dma_list_bytes(int n_tiles) { return ((n_tiles * 2 + 15) / 16) * 16; }
__host__ __device__ inline int dma_bitmap_words(int n_tiles) { return (n_tiles + 31) / 32; }
inline size_t dma_smem_bytes(int tile_bytes, int Nk) {
  const int n_tiles = (Nk + kDmaBc - 1) / kDmaBc;
  return size_t(tile_bytes) + dma_list_bytes(n_tiles) + 2 * 4 * size_t(dma_bitmap_words(n_tiles));
}

// The head dims of the two cores (D = Dv): wgmma 64 and 128 only (D = 256: S,
// P and O of 64 keys exceed 255 registers by a few).
using DmaHeadDims = EqualHeadDims<32, 64, 96, 128, 192, 256>;
using DmaWgmmaHeadDims = EqualHeadDims<64, 128>;

}  // namespace
}  // namespace attnlab
