// attnlab: the skip test both dynamic-mask kernels (forward, backward) run on a
// 64x64 tile of the mask before loading anything else for it.
#pragma once

#include <cstdint>

#include "dmattn.h"

namespace attnlab {

// True when no byte of the 4-byte word is zero (the classic has-zero-byte test).
__device__ __forceinline__ bool no_zero_byte(uint32_t x) { return ((x - 0x01010101u) & ~x & 0x80808080u) == 0; }

// The mask of rows [q0, q0+64) x keys [k0, k0+64), clipped to Nq and Nk: does
// any byte say "attend" (*any), and do all of them (*all: then the kernel skips
// the per-element mask reads of this tile)? The whole warp calls it and gets
// the same answers. One row when the mask is broadcast over queries.
__device__ __forceinline__ void warp_scan_tile(const DynamicMaskProblem& p, int b, int h, int q0, int k0, int lane,
                                               bool* any_out, bool* all_out) {
  const uint8_t* m = static_cast<const uint8_t*>(p.mask.data);
  const int rows = p.mask.stride_q == 0 ? 1 : min(kDmaBr, p.Nq - q0);
  const int keys = min(kDmaBc, p.Nk - k0);
  bool any = false, all = true;
  for (int r = lane; r < rows; r += 32) {
    const uint8_t* row = m + p.mask.row_offset(b, h, q0 + r) + k0;
    if (keys == kDmaBc && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
      const uint4* v4 = reinterpret_cast<const uint4*>(row);
      uint4 x[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) x[c] = __ldg(v4 + c);  // four 16-byte loads in flight
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        any = any || ((x[c].x | x[c].y | x[c].z | x[c].w) != 0);
        all = all && no_zero_byte(x[c].x) && no_zero_byte(x[c].y) && no_zero_byte(x[c].z) && no_zero_byte(x[c].w);
      }
    } else {
      for (int c = 0; c < keys; ++c) {
        const bool on = __ldg(row + c) != 0;
        any = any || on;
        all = all && on;
      }
    }
  }
  *any_out = __any_sync(0xffffffffu, any);
  *all_out = __all_sync(0xffffffffu, all);
}

// The same "any" answer for one tile, computed by a whole block of kThreads
// threads that split the tile's rows (one read of each mask byte, not one per
// warp), ending in __syncthreads_or: every thread of the block must call it.
template <int kThreads>
__device__ __forceinline__ bool block_tile_any(const DynamicMaskProblem& p, int b, int h, int q0, int k0) {
  const uint8_t* m = static_cast<const uint8_t*>(p.mask.data);
  const int rows = p.mask.stride_q == 0 ? 1 : min(kDmaBr, p.Nq - q0);
  const int keys = min(kDmaBc, p.Nk - k0);
  constexpr int kPerRow = kThreads / kDmaBr >= 1 ? kThreads / kDmaBr : 1;  // threads sharing a row
  static_assert(kDmaBc % (16 * kPerRow) == 0, "each thread takes whole 16-byte chunks of a row");
  constexpr int kBytes = kDmaBc / kPerRow;
  bool any = false;
  const int part = int(threadIdx.x) % kPerRow;
  for (int r = int(threadIdx.x) / kPerRow; r < rows; r += kThreads / kPerRow) {
    const uint8_t* row = m + p.mask.row_offset(b, h, q0 + r) + k0;
    if (keys == kDmaBc && (reinterpret_cast<uintptr_t>(row) & 15) == 0) {
      const uint4* v4 = reinterpret_cast<const uint4*>(row + part * kBytes);
#pragma unroll
      for (int c = 0; c < kBytes / 16; ++c) {
        const uint4 x = __ldg(v4 + c);
        any = any || ((x.x | x.y | x.z | x.w) != 0);
      }
    } else {
      for (int c = part * kBytes; c < min(keys, (part + 1) * kBytes); ++c) any = any || (__ldg(row + c) != 0);
    }
  }
  return __syncthreads_or(any) != 0;
}

}  // namespace attnlab
