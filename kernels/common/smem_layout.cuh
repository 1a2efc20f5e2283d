// attnlab: how a row-major [rows, kCols] tile of 16-bit elements sits in shared
// memory. Every ldmatrix/cp.async address in the split-Q parts goes through
// Layout::offset(row, col) (col a multiple of 8: one 16-byte chunk).
//
// Shared memory has 32 banks of 4 bytes. ldmatrix has 8 lanes at a time read one
// 16-byte row each: 8 rows, same columns. With rows of D halves (a multiple of
// 128 bytes) those 8 chunks all land in the same 4 banks: an 8-way conflict.
// Two cures:
//   Padded:   append 8 halves to every row, so row r starts 16·r bytes later
//             in the bank cycle (costs 16 bytes per row; what LeetCUDA does);
//   Swizzled: keep rows dense and store chunk c of row r at chunk c ^ (r % 8)
//             (an XOR swizzle, as in CUTLASS's Swizzle<3,3,3>): the 8 rows' chunks
//             land in 8 different positions of the 128-byte bank cycle.
#pragma once

namespace attnlab {

// Rows of kStride elements; row r, column c at r * kStride + c.
template <int kStride_>
struct StridedRows {
  static constexpr int kStride = kStride_;
  __device__ __forceinline__ static int offset(int row, int col) { return row * kStride + col; }
};

template <int kCols>
using PaddedRows = StridedRows<kCols + 8>;

template <int kCols>
struct SwizzledRows {
  static_assert(kCols % 64 == 0, "the XOR swizzle needs rows of a multiple of 8 chunks (64 halves)");
  static constexpr int kStride = kCols;
  __device__ __forceinline__ static int offset(int row, int col) {
    return row * kCols + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
  }
};

}  // namespace attnlab
