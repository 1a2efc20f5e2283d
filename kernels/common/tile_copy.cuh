// attnlab: cooperative global -> shared tile copies with cp.async.
#pragma once

#include "ptx.cuh"
#include "smem_layout.cuh"

namespace attnlab {

// Copies a [kRows, kCols] tile of 16-bit elements, row-major with row stride
// `gmem_stride` in global memory, into shared memory laid out by `Layout`
// (smem_layout.cuh). Rows at or beyond `rows_valid` are zero-filled, never read:
// a ragged last tile then holds zeros, so the MMAs on it stay finite and only
// the scores need masking. All kThreads threads of the block must call it.
template <int kRows, int kCols, typename Layout, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t gmem_stride, int rows_valid) {
  constexpr int kChunksPerRow = kCols * int(sizeof(T)) / 16;  // 16-byte chunks
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kCols * sizeof(T) % 16 == 0, "tile rows must be a whole number of 16-byte chunks");
  static_assert(Layout::kStride * sizeof(T) % 16 == 0, "shared rows must stay 16-byte aligned");
#pragma unroll
  for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
    const int c = i * kThreads + int(threadIdx.x);
    if (kChunks % kThreads != 0 && c >= kChunks) break;
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * (16 / int(sizeof(T)));
    const bool valid = row < rows_valid;
    const T* src = valid ? gmem + row * gmem_stride + col : gmem;
    cp_async_16(smem + Layout::offset(row, col), src, valid);
  }
}

// The same, for padded rows of kSmemStride elements.
template <int kRows, int kCols, int kSmemStride, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t gmem_stride, int rows_valid) {
  load_tile_async<kRows, kCols, StridedRows<kSmemStride>, kThreads>(smem, gmem, gmem_stride, rows_valid);
}

}  // namespace attnlab
