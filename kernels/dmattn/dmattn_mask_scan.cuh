// attnlab: the device side of the dynamic-mask skip test — reading one
// "word" (32 key tiles = 2048 keys) of a 64-row query tile of the mask and
// turning it into 32 "any" bits and 32 "all" bits (dmattn_tiles.cuh says what
// they mean). Two callers, one code:
//   - the pre-pass kernel (dmattn_mask_summary.cu), 8 warps per word, which
//     writes the bits to global memory for the backward and the forward;
//   - the forward kernel's in-kernel scan (dmattn_fwd.cu, DmaMaskScan), 4 warps
//     walking the words of its own query tile, so the mask is read while other
//     blocks on the SM compute instead of in a pass before any of them starts.
//
// Load layout (dmattn_mask_summary.cu says why; docs/dmattn_masks.md):
// warp w takes rows w, w + kWarps, ...; every load instruction of a warp reads
// 512 contiguous bytes of one row (lane L: bytes 16L..16L+15 of the chunk, so
// key tile L/4 of the chunk's 8), four chunks per row; kRowBatch rows x 4
// chunks of loads are in flight per lane before any is looked at.
#pragma once

#include <cstdint>

#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace mask_scan {

constexpr int kChunkBytes = 512;                    // one warp load: 32 lanes x 16 bytes
constexpr int kChunks = 32 * kDmaBc / kChunkBytes;  // chunks per row of a word (4)
static_assert(kDmaBr == 64 && kDmaBc == 64, "a lane's 16 bytes lie in one 64-key tile, 4 lanes per tile");
static_assert(kChunkBytes == 32 * 16 && kChunks == 4, "header: 512-byte warp loads, four chunks per row of a word");

// Nonzero when some byte of the 4-byte word is zero (the classic has-zero-byte
// test, "Bit Twiddling Hacks", S. Anderson; exact as a yes/no answer).
__device__ __forceinline__ uint32_t zero_byte(uint32_t x) { return (x - 0x01010101u) & ~x & 0x80808080u; }

// A streamed 16-byte load (read-only path, no L1 allocation: every byte is
// read once) under a guard, zeros where `pred` is false. The predicate lives
// inside the asm, as in CUTLASS's cutlass::arch::global_load
// (cutlass/arch/memory.h), so the loads issue back to back with no branch
// between them and none is speculated.
__device__ __forceinline__ uint4 load_stream(const uint8_t* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n"
      "  .reg .pred g;\n"
      "  setp.ne.b32 g, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @g ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(int(pred)));
  return v;
}

// Bits 0, 4, ..., 28 of x moved to bits 0..7.
__device__ __forceinline__ uint32_t gather_nibble_bits(uint32_t x) {
  x &= 0x11111111u;
  x = (x | x >> 3) & 0x03030303u;
  x = (x | x >> 6) & 0x000f000fu;
  return (x | x >> 12) & 0xffu;
}

// The bits of key tiles 32 word .. 32 word + 31 over this warp's rows of a
// query tile: `any` (OR over the rows read) and `all` (AND; a tile not read
// has all = 0), the same in every lane. `tile_row0`: the mask byte of the
// tile's first row at key 0; `rows`: its rows (< 64 at the ragged end, 1 for a
// query-broadcast mask); keys at or past `key_end` (<= Nk) are not read and
// their tiles get 0 bits. `vec`: base and row stride are multiples of 16
// bytes, so every 16-byte piece that starts at a key multiple of 16 is one
// aligned load; otherwise (and for the piece straddling Nk) byte loads.
template <int kWarps, int kRowBatch>
__device__ __forceinline__ void scan_word(const uint8_t* tile_row0, int64_t stride_q, int rows, int Nk, int key_end,
                                          int word, bool vec, int warp, int lane, uint32_t& any, uint32_t& all) {
  constexpr int kRowsPerWarp = kDmaBr / kWarps;
  static_assert(kDmaBr % kWarps == 0 && kRowsPerWarp % kRowBatch == 0, "rows split evenly into batches");
  const int w0 = word * 32 * kDmaBc;  // first key of the word
  // This lane's 16-byte piece of chunk c: keys w0 + 512c + 16 lane + [0, 16),
  // in key tile 32 word + 8c + lane / 4. `valid`: its bytes before Nk (0..16),
  // 0 where the tile starts at or past key_end (not read, its bits stay 0).
  int valid[kChunks];
  bool needed[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int piece = w0 + c * kChunkBytes + lane * 16;
    const int k0 = piece & ~(kDmaBc - 1);
    needed[c] = k0 < key_end;
    valid[c] = needed[c] ? max(0, min(16, Nk - piece)) : 0;
  }
  const uint8_t* row0 = tile_row0 + w0 + lane * 16;
  // Per chunk: OR of every byte read (any), OR of the has-zero-byte tests (not all).
  uint32_t ored[kChunks] = {}, zeros[kChunks] = {};
  if (vec) {
    const int64_t step = int64_t(kWarps) * stride_q;
    const uint8_t* row = row0 + int64_t(warp) * stride_q;
#pragma unroll 1
    for (int b = 0; b < kRowsPerWarp; b += kRowBatch) {
      if (warp + kWarps * b >= rows) break;  // warp-uniform: no row of this batch or later exists
      uint4 x[kRowBatch][kChunks];
#pragma unroll
      for (int j = 0; j < kRowBatch; ++j, row += step) {
        const int r = warp + kWarps * (b + j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) x[j][c] = load_stream(row + c * kChunkBytes, r < rows && valid[c] == 16);
      }
#pragma unroll
      for (int j = 0; j < kRowBatch; ++j) {
        const int r = warp + kWarps * (b + j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (r < rows && valid[c] == 16) {  // rows past the tile, pieces not read: neutral
            const uint4 v = x[j][c];
            ored[c] |= v.x | v.y | v.z | v.w;
            zeros[c] |= zero_byte(v.x) | zero_byte(v.y) | zero_byte(v.z) | zero_byte(v.w);
          }
      }
    }
  }
  // Pieces the vector loads did not take: all of them without `vec`, else the
  // one piece that straddles Nk (only in the ragged last tile, Nk % 64 != 0).
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int n = vec && valid[c] == 16 ? 0 : valid[c];
    if (n == 0) continue;
    for (int j = 0; j < kRowsPerWarp; ++j) {
      const int r = warp + kWarps * j;
      if (r >= rows) break;
      const uint8_t* piece = row0 + int64_t(r) * stride_q + c * kChunkBytes;
      for (int i = 0; i < n; ++i) {
        const uint32_t v = __ldg(piece + i);
        ored[c] |= v;
        zeros[c] |= v == 0u;
      }
    }
  }
  // Tile bits: lanes 4t..4t+3 of chunk c hold tile 8c + t of the word.
  any = 0u;
  all = 0u;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    uint32_t a = __ballot_sync(0xffffffffu, ored[c] != 0u);
    uint32_t l = __ballot_sync(0xffffffffu, needed[c] && zeros[c] == 0u);
    a |= a >> 1;
    a |= a >> 2;
    l &= l >> 1;
    l &= l >> 2;
    any |= gather_nibble_bits(a) << (8 * c);
    all |= gather_nibble_bits(l) << (8 * c);
  }
}

// The same bits from a bit-packed mask (DmaMaskFormat::kBits): lane L takes
// key tile 32 word + L, one 8-byte load per row (a warp load: 256 contiguous
// bytes of one row), kRowBatch rows in flight; any = OR of the tile's bits
// over the warp's rows, all = every bit of keys < Nk set in every row. The
// bits past Nk (the ragged tile's padding) are masked off first, so either
// format gives the same words for the same mask. `tile_row0`: the row's
// first word (8-byte aligned: dmattn.h's layout); `stride_q` in words.
template <int kWarps, int kRowBatch>
__device__ __forceinline__ void scan_word_bits(const uint32_t* tile_row0, int64_t stride_q, int rows, int Nk,
                                               int key_end, int word, int warp, int lane, uint32_t& any,
                                               uint32_t& all) {
  constexpr int kRowsPerWarp = kDmaBr / kWarps;
  static_assert(kDmaBr % kWarps == 0 && kRowsPerWarp % kRowBatch == 0, "rows split evenly into batches");
  const int tile = 32 * word + lane, k0 = tile * kDmaBc;
  const bool needed = k0 < key_end;
  const int left = Nk - k0;  // keys of this tile before Nk
  const uint64_t valid = !needed ? 0ull : left >= 64 ? ~0ull : (uint64_t(1) << left) - 1ull;
  const uint32_t* lane_row0 = tile_row0 + 2 * int64_t(tile);
  uint64_t ored = 0ull, anded = ~0ull;
  const int64_t step = int64_t(kWarps) * stride_q;
  const uint32_t* row = lane_row0 + int64_t(warp) * stride_q;
#pragma unroll 1
  for (int b = 0; b < kRowsPerWarp; b += kRowBatch) {
    if (warp + kWarps * b >= rows) break;  // warp-uniform
    uint2 x[kRowBatch];
#pragma unroll
    for (int j = 0; j < kRowBatch; ++j, row += step) {
      const bool pred = needed && warp + kWarps * (b + j) < rows;
      asm volatile(
          "{\n"
          "  .reg .pred g;\n"
          "  setp.ne.b32 g, %3, 0;\n"
          "  mov.b32 %0, 0;\n"
          "  mov.b32 %1, 0;\n"
          "  @g ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n"
          "}\n"
          : "=r"(x[j].x), "=r"(x[j].y)
          : "l"(row), "r"(int(pred)));
    }
#pragma unroll
    for (int j = 0; j < kRowBatch; ++j)
      if (warp + kWarps * (b + j) < rows) {
        const uint64_t v = (uint64_t(x[j].y) << 32 | x[j].x) & valid;
        ored |= v;
        anded &= v | ~valid;
      }
  }
  any = __ballot_sync(0xffffffffu, ored != 0ull);
  all = __ballot_sync(0xffffffffu, needed && anded == ~0ull);
}

// A block of kWarps warps reads its query tile's rows over the words from
// `word_begin` while a word starts before key_end, OR-ing / AND-ing each
// word's bits into any_words / all_words (shared memory, set to 0 / ~0 by the
// caller). Not inlined: its kRowBatch x 4 loads in flight would otherwise add
// their registers to the attention kernel's own count for the whole kernel
// (the dynamic-mask forward's wgmma core at D = 64: 168 -> 192 registers, one
// block per SM fewer); called once per block, the call costs nothing.
template <int kWarps, int kRowBatch>
__device__ __noinline__ void scan_words(const uint8_t* tile_row0, int64_t stride_q, int rows, int Nk, int key_end,
                                        int word_begin, bool vec, uint32_t* any_words, uint32_t* all_words) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int w = word_begin; w * 32 * kDmaBc < key_end; ++w) {
    uint32_t any, all;
    scan_word<kWarps, kRowBatch>(tile_row0, stride_q, rows, Nk, key_end, w, vec, warp, lane, any, all);
    if (lane == 0) {
      atomicOr(any_words + w, any);
      atomicAnd(all_words + w, all);
    }
  }
}
// scan_words for a bit-packed mask (stride_q in words).
template <int kWarps, int kRowBatch>
__device__ __noinline__ void scan_words_bits(const uint32_t* tile_row0, int64_t stride_q, int rows, int Nk,
                                             int key_end, int word_begin, uint32_t* any_words, uint32_t* all_words) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int w = word_begin; w * 32 * kDmaBc < key_end; ++w) {
    uint32_t any, all;
    scan_word_bits<kWarps, kRowBatch>(tile_row0, stride_q, rows, Nk, key_end, w, warp, lane, any, all);
    if (lane == 0) {
      atomicOr(any_words + w, any);
      atomicAnd(all_words + w, all);
    }
  }
}

// Where the mask rows of query tile m start, and how many there are: one row
// for a query-broadcast mask. Keys at or past the returned key_end are never
// seen by any row of the tile (causal, bottom-right aligned) and not read.
struct TileRows {
  const uint8_t* row0;  // a byte mask's first byte, or a bit-packed mask's first word (bits())
  int rows;
  int key_end;
  __device__ const uint32_t* bits() const { return reinterpret_cast<const uint32_t*>(row0); }
};
// One past the last key any row of query tile m sees under the causal rule
// (Nk without it): tile_rows's key_end for a mask with rows per query, and the
// host's measure of how much mask a tile reads (the pipelined pre-pass's
// chunk bounds).
__host__ __device__ inline int causal_key_end(const DynamicMaskProblem& p, int m) {
  if (!p.causal) return p.Nk;
  const int q0 = m * kDmaBr, rows = min(kDmaBr, p.Nq - q0);
  return int(max(int64_t(0), min(int64_t(p.Nk), int64_t(q0 + rows - 1) + p.Nk - p.Nq + 1)));
}
__device__ __forceinline__ TileRows tile_rows(const DynamicMaskProblem& p, int mask_b, int mask_h, int m) {
  const int q0 = m * kDmaBr;
  const int rows = p.mask.q == 1 ? 1 : min(kDmaBr, p.Nq - q0);
  int key_end = p.Nk;  // (a query-broadcast mask: one row serves every query tile)
  if (p.causal && p.mask.q != 1) key_end = causal_key_end(p, m);
  const int64_t at = int64_t(mask_b) * p.mask.stride_b + int64_t(mask_h) * p.mask.stride_h +
                     (p.mask.q == 1 ? 0 : int64_t(q0) * p.mask.stride_q);  // elements: bytes or words
  const uint8_t* row0 =
      static_cast<const uint8_t*>(p.mask.data) + (p.mask_format == DmaMaskFormat::kBits ? 4 * at : at);
  return {row0, rows, key_end};
}

// True when every 16-byte piece of the mask that starts at a key multiple of
// 16 is an aligned load (base and strides multiples of 16).
__host__ __device__ inline bool mask_vector_loads(const DynamicMaskProblem& p) {
  if (p.mask_format == DmaMaskFormat::kBits) return true;  // (its layout rule: dma_mask_bits_unsupported)
  const auto aligned = [](int64_t x) { return x % 16 == 0; };
  return reinterpret_cast<uintptr_t>(p.mask.data) % 16 == 0 && aligned(p.mask.stride_b) &&
         aligned(p.mask.stride_h) && aligned(p.mask.stride_q);
}

}  // namespace mask_scan
}  // namespace attnlab
