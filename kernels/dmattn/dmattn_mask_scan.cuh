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
// Load layout (see dmattn_mask_summary.cu for the measurements behind it):
// warp w takes rows w, w + kWarps, ...; every load instruction of a warp reads
// 512 contiguous bytes of one row (lane L: bytes 16L..16L+15 of the chunk, so
// key tile L/4 of the chunk's 8), four chunks per row; kRowBatch rows x 4
// chunks of loads are in flight per lane before any is looked at.
#pragma once

#include <cstdint>

#include "dmattn_tiles.cuh"

namespace attnlab {
namespace mask_scan {

constexpr int kChunkBytes = 512;                    // one warp load: 32 lanes x 16 bytes
constexpr int kChunks = 32 * kDmaBc / kChunkBytes;  // chunks per row of a word (4)
static_assert(kDmaBr == 64 && kDmaBc == 64, "a lane's 16 bytes lie in one 64-key tile, 4 lanes per tile");

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

// A lane's share of one word (key tiles 32 word .. 32 word + 31) of a query
// tile: its 16-byte piece of chunk c covers keys w0 + 512c + 16 lane + [0, 16),
// in key tile 32 word + 8c + lane / 4 (lanes 4t..4t+3 of chunk c hold tile
// 8c + t). needed(c): that tile starts before key_end (else it is not read and
// its bits stay 0); valid(c): the piece's bytes before Nk (0..16), 0 where not
// needed; whole(): bit c set where the piece is 16 valid bytes. Computed where
// used rather than kept in arrays: registers go to the loads in flight.
struct WordPieces {
  int w0, lane, key_end, Nk;
  __device__ __forceinline__ WordPieces(int word, int lane_, int key_end_, int Nk_)
      : w0(word * 32 * kDmaBc), lane(lane_), key_end(key_end_), Nk(Nk_) {}
  __device__ __forceinline__ int piece(int c) const { return w0 + c * kChunkBytes + lane * 16; }
  __device__ __forceinline__ bool needed(int c) const { return (piece(c) & ~(kDmaBc - 1)) < key_end; }
  __device__ __forceinline__ int valid(int c) const { return needed(c) ? max(0, min(16, Nk - piece(c))) : 0; }
  __device__ __forceinline__ uint32_t whole() const {
    uint32_t w = 0u;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) w |= valid(c) == 16 ? 1u << c : 0u;
    return w;
  }
};

// One 16-byte piece into a chunk's OR of bytes and OR of has-zero-byte tests.
__device__ __forceinline__ void fold_piece(const uint4& v, uint32_t& ored, uint32_t& zeros) {
  ored |= v.x | v.y | v.z | v.w;
  zeros |= zero_byte(v.x) | zero_byte(v.y) | zero_byte(v.z) | zero_byte(v.w);
}

// A chunk's per-lane sums into the word's tile bits (whole warp): any (some
// byte read is nonzero) and not_all (some byte read is zero).
__device__ __forceinline__ void fold_chunk(int c, uint32_t ored, uint32_t zeros, uint32_t& any, uint32_t& not_all) {
  uint32_t a = __ballot_sync(0xffffffffu, ored != 0u);
  uint32_t z = __ballot_sync(0xffffffffu, zeros != 0u);
  a |= a >> 1;
  a |= a >> 2;
  z |= z >> 1;
  z |= z >> 2;
  any |= gather_nibble_bits(a) << (8 * c);
  not_all |= gather_nibble_bits(z) << (8 * c);
}

// The pieces the 16-byte loads do not take — all of them without `vec`, else
// the one that straddles Nk (only in the ragged last tile, Nk % 64 != 0) —
// byte by byte over this warp's rows (warp, warp + kWarps, ...), folded into
// any / not_all (whole warp: chunk-uniform branches around the ballots).
template <int kWarps>
__device__ __forceinline__ void fold_partial_pieces(const WordPieces& wp, const uint8_t* row0, int64_t stride_q,
                                                    int rows, bool vec, int warp, uint32_t& any, uint32_t& not_all) {
  const uint32_t whole = wp.whole();
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int n = vec && (whole >> c & 1u) ? 0 : wp.valid(c);
    if (!__any_sync(0xffffffffu, n != 0)) continue;
    uint32_t ored = 0u, zeros = 0u;
    for (int r = warp; r < rows; r += kWarps) {
      const uint8_t* piece = row0 + int64_t(r) * stride_q + c * kChunkBytes;
      for (int i = 0; i < n; ++i) {
        const uint32_t v = __ldg(piece + i);
        ored |= v;
        zeros |= v == 0u;
      }
    }
    fold_chunk(c, ored, zeros, any, not_all);
  }
}

// all: the tiles read whole (their 4 lanes needed) with no zero byte.
__device__ __forceinline__ uint32_t all_bits(const WordPieces& wp, uint32_t not_all) {
  uint32_t need = 0u;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    uint32_t l = __ballot_sync(0xffffffffu, wp.needed(c));
    l &= l >> 1;
    l &= l >> 2;
    need |= gather_nibble_bits(l) << (8 * c);
  }
  return need & ~not_all;
}

// The bits of key tiles 32 word .. 32 word + 31 over this warp's rows of a
// query tile: `any` (OR over the rows read) and `all` (AND; a tile not read
// has all = 0), the same in every lane. `tile_row0`: the mask byte of the
// tile's first row at key 0; `rows`: its rows (< 64 at the ragged end, 1 for a
// query-broadcast mask); keys at or past `key_end` (<= Nk) are not read and
// their tiles get 0 bits. `vec`: base and row stride are multiples of 16
// bytes, so every 16-byte piece that starts at a key multiple of 16 is one
// aligned load; otherwise (and for the piece straddling Nk) byte loads.
// Each batch of kRowBatch rows x 4 chunks of loads is folded into the tile
// bits at once, so only the loads in flight take registers.
template <int kWarps, int kRowBatch>
__device__ __forceinline__ void scan_word(const uint8_t* tile_row0, int64_t stride_q, int rows, int Nk, int key_end,
                                          int word, bool vec, int warp, int lane, uint32_t& any, uint32_t& all) {
  constexpr int kRowsPerWarp = kDmaBr / kWarps;
  static_assert(kDmaBr % kWarps == 0 && kRowsPerWarp % kRowBatch == 0, "rows split evenly into batches");
  const WordPieces wp(word, lane, key_end, Nk);
  const uint32_t whole = wp.whole();
  const uint8_t* row0 = tile_row0 + wp.w0 + lane * 16;
  any = 0u;
  uint32_t not_all = 0u;
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
        for (int c = 0; c < kChunks; ++c) x[j][c] = load_stream(row + c * kChunkBytes, r < rows && (whole >> c & 1u));
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        uint32_t ored = 0u, zeros = 0u;
#pragma unroll
        for (int j = 0; j < kRowBatch; ++j)  // rows past the tile, pieces not read: neutral
          if (warp + kWarps * (b + j) < rows && (whole >> c & 1u)) fold_piece(x[j][c], ored, zeros);
        fold_chunk(c, ored, zeros, any, not_all);
      }
    }
  }
  fold_partial_pieces<kWarps>(wp, row0, stride_q, rows, vec, warp, any, not_all);
  all = all_bits(wp, not_all);
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

// Where the mask rows of query tile m start, and how many there are: one row
// for a query-broadcast mask. Keys at or past the returned key_end are never
// seen by any row of the tile (causal, bottom-right aligned) and not read.
struct TileRows {
  const uint8_t* row0;
  int rows;
  int key_end;
};
__device__ __forceinline__ TileRows tile_rows(const DynamicMaskProblem& p, int mask_b, int mask_h, int m) {
  const int q0 = m * kDmaBr;
  const int rows = p.mask.q == 1 ? 1 : min(kDmaBr, p.Nq - q0);
  int key_end = p.Nk;
  if (p.causal && p.mask.q != 1)
    key_end = int(max(int64_t(0), min(int64_t(p.Nk), int64_t(q0 + rows - 1) + p.Nk - p.Nq + 1)));
  const uint8_t* row0 = static_cast<const uint8_t*>(p.mask.data) + int64_t(mask_b) * p.mask.stride_b +
                        int64_t(mask_h) * p.mask.stride_h + (p.mask.q == 1 ? 0 : int64_t(q0) * p.mask.stride_q);
  return {row0, rows, key_end};
}

// True when every 16-byte piece of the mask that starts at a key multiple of
// 16 is an aligned load (base and strides multiples of 16).
__host__ __device__ inline bool mask_vector_loads(const DynamicMaskProblem& p) {
  const auto aligned = [](int64_t x) { return x % 16 == 0; };
  return reinterpret_cast<uintptr_t>(p.mask.data) % 16 == 0 && aligned(p.mask.stride_b) &&
         aligned(p.mask.stride_h) && aligned(p.mask.stride_q);
}

}  // namespace mask_scan
}  // namespace attnlab
