// attnlab: cooperative global -> shared tile copies with cp.async.
#pragma once

#include "common/ptx.cuh"
#include "common/smem_layout.cuh"

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

// The same as a rolled loop: for kernels whose accumulators already fill the
// register file (e.g. rung 08), where the unrolled copy's precomputed addresses —
// loop-invariant, so hoisted out of the KV loop — would spill.
template <int kRows, int kCols, typename Layout, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async_rolled(T* smem, const T* gmem, int64_t gmem_stride, int rows_valid) {
  constexpr int kChunksPerRow = kCols * int(sizeof(T)) / 16;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll 1
  for (int c = int(threadIdx.x); c < kChunks; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * (16 / int(sizeof(T)));
    const bool valid = row < rows_valid;
    cp_async_16(smem + Layout::offset(row, col), valid ? gmem + row * gmem_stride + col : gmem, valid);
  }
}

// The same, for padded rows of kSmemStride elements.
template <int kRows, int kCols, int kSmemStride, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t gmem_stride, int rows_valid) {
  load_tile_async<kRows, kCols, StridedRows<kSmemStride>, kThreads>(smem, gmem, gmem_stride, rows_valid);
}

// Copies a [kRows, kCols] window of a row-major global matrix (row stride `ld`
// elements) into shared memory (row stride kStride). Rows >= rows_valid and
// columns >= cols_valid are zero-filled, never read: ragged KV tiles and the
// columns of a head-dim bucket past the real D contribute zeros to every MMA.
template <int kRows, int kCols, int kStride, int kThreads, typename T>
__device__ __forceinline__ void load_slice_async(T* smem, const T* gmem, int64_t ld, int rows_valid, int cols_valid) {
  static_assert(sizeof(T) == 2 && kCols % 8 == 0 && kStride % 8 == 0, "16-byte chunks of 16-bit elements");
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kRowStep = kThreads / kChunksPerRow;  // rows covered by one pass of the block
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowStep == 0, "whole rows per pass, whole passes");
  // A thread keeps one column and walks down the rows: one running pointer
  // each side instead of a precomputed address per chunk (registers are short).
  const int col = (int(threadIdx.x) % kChunksPerRow) * 8;
  int row = int(threadIdx.x) / kChunksPerRow;
  const bool col_ok = col < cols_valid;
  T* dst = smem + row * kStride + col;
  const T* src = gmem + row * ld + col;
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const bool valid = col_ok && row < rows_valid;
    cp_async_16(dst, valid ? src : gmem, valid);
    row += kRowStep;
    dst += kRowStep * kStride;
    src += kRowStep * ld;
  }
}

}  // namespace attnlab
