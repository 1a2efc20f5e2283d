// attnlab: the mask pre-pass of the dynamic-mask kernels — one "any" and one
// "all" bit per 64x64 tile of the mask (see dmattn_tiles.cuh for why).
//
// It is a pure streaming read (at L = 32K, causal: 512 MiB for a 16 KiB
// result), so the layout of the loads is what matters.
// Grid: (words of 32 key tiles, query tiles, mask batch x mask head); a block
// of 8 warps summarises one word of one query tile: 64 rows x 2048 bytes.
// Warp w takes rows w, w+8, ..., w+56; every load instruction of a warp reads
// 512 contiguous bytes of one row (lane L: bytes 16L..16L+15 of the 512-byte
// chunk, i.e. key tile L/4 of the chunk's 8), four chunks per row. So each
// warp instruction reads four whole 128-byte lines of one row, and the blocks
// next in launch order (the next words) read the rest of the same rows. An
// earlier version had lanes 4r..4r+3 read row r of one tile: every warp load
// touched 8 rows 32 KiB apart, 64 bytes each, and reached ~2.6 TB/s on H200.
// A lane keeps 16 loads (4 rows x 4 chunks, 8 KiB per warp) in flight before
// it looks at any of them, folds them into an OR (any byte nonzero) and a
// has-zero-byte accumulator per chunk, and the warp turns those into tile bits
// with two ballots per chunk (4 lanes per tile); lane 0 of each warp leaves its
// two words in shared memory and thread 0 combines the 8 warps. ~100
// registers: 2 blocks (16 warps, 128 KiB of loads in flight) per SM; holding
// all 32 loads at once would cost ~140 registers and one block per SM, with
// nothing in flight while a block ends and the next one starts.
// Causal: tiles past the last key any row of the query tile sees are never
// read and get 0 bits; a block whose whole word is past it writes two zero
// words and leaves (no loads, no barrier), so the grid keeps its simple shape
// and every word of the output is written.
// Ragged edges: rows past Nq add nothing (neither any nor "not all"); of the
// last tile only keys < Nk count, the 16-byte piece that straddles Nk read
// byte by byte. Without 16-byte alignment (`vec` false: base or a stride not
// a multiple of 16, e.g. a dense mask with Nk % 16 != 0) every piece is read
// byte by byte: correct, not fast.
// Loads are ld.global.nc.L1::no_allocate (PTX ISA, "ld.global.nc", the
// .level1::eviction_priority qualifiers, sm_70+): every byte is read once,
// so it need not take L1 lines.
#include <cuda_runtime.h>

#include <algorithm>

#include "../common/ptx.cuh"
#include "dmattn_tiles.cuh"

namespace attnlab {
namespace {

constexpr int kSummaryWarps = 8;
constexpr int kChunkBytes = 512;                      // one warp load: 32 lanes x 16 bytes
constexpr int kChunks = 32 * kDmaBc / kChunkBytes;    // chunks per row of a word (4)
constexpr int kRowsPerWarp = kDmaBr / kSummaryWarps;  // 8
constexpr int kRowBatch = 4;                          // rows whose loads are in flight together
static_assert(kDmaBr == 64 && kDmaBc == 64, "a lane's 16 bytes lie in one 64-key tile, 4 lanes per tile");
static_assert(kRowsPerWarp % kRowBatch == 0, "");

// Nonzero when some byte of the 4-byte word is zero (the classic has-zero-byte
// test, "Bit Twiddling Hacks", S. Anderson; exact as a yes/no answer).
__device__ __forceinline__ uint32_t zero_byte(uint32_t x) { return (x - 0x01010101u) & ~x & 0x80808080u; }

// A streamed 16-byte load (read-only path, no L1 allocation) under a guard,
// zeros where `pred` is false. The predicate lives inside the asm, as in
// CUTLASS's cutlass::arch::global_load (cutlass/arch/memory.h), so the loads
// issue back to back with no branch between them and none is speculated.
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

int summary_q_tiles(const DynamicMaskProblem& p) { return p.mask.q == 1 ? 1 : (p.Nq + kDmaBr - 1) / kDmaBr; }
int summary_words(const DynamicMaskProblem& p) { return ((p.Nk + kDmaBc - 1) / kDmaBc + 31) / 32; }

// `vec`: base and strides are multiples of 16, so every 16-byte piece of a row
// that starts at a key multiple of 16 is a 16-byte aligned load.
__global__ void __launch_bounds__(32 * kSummaryWarps, 2)
mask_summary_kernel(const DynamicMaskProblem p, MaskSummary s, uint32_t* any_out, uint32_t* all_out, bool vec) {
  // The attention kernel that reads these bits may start launching now (it
  // waits for this whole grid, griddepcontrol.wait, before it reads anything):
  // its blocks take the SMs this grid's last wave leaves, instead of the
  // launch starting after the last block has finished.
  griddep_launch_dependents();
  const int word = blockIdx.x, m = blockIdx.y;
  const int mb = blockIdx.z / p.mask.h, mh = blockIdx.z % p.mask.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = m * kDmaBr;
  const int rows = p.mask.q == 1 ? 1 : min(kDmaBr, p.Nq - q0);
  // Keys past the last one any row of this tile may see (causal) are never asked about.
  int key_end = p.Nk;
  if (p.causal && p.mask.q != 1) key_end = int(max(int64_t(0), min(int64_t(p.Nk), int64_t(q0 + rows - 1) + p.Nk - p.Nq + 1)));
  const int64_t at = (int64_t(blockIdx.z) * s.q_tiles + m) * s.words + word;
  const int w0 = word * 32 * kDmaBc;  // first key of the word
  if (w0 >= key_end) {  // block-uniform: nothing of this word is read
    if (threadIdx.x == 0) {
      any_out[at] = 0u;
      all_out[at] = 0u;
    }
    return;
  }

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
    valid[c] = needed[c] ? max(0, min(16, p.Nk - piece)) : 0;
  }

  const uint8_t* row0 = static_cast<const uint8_t*>(p.mask.data) + int64_t(mb) * p.mask.stride_b +
                        int64_t(mh) * p.mask.stride_h + int64_t(q0) * p.mask.stride_q + w0 + lane * 16;
  // Per chunk: OR of every byte read (any), OR of the has-zero-byte tests (not all).
  uint32_t ored[kChunks] = {}, zeros[kChunks] = {};
  if (vec) {
    const int64_t step = int64_t(kSummaryWarps) * p.mask.stride_q;
    const uint8_t* row = row0 + int64_t(warp) * p.mask.stride_q;
#pragma unroll 1
    for (int b = 0; b < kRowsPerWarp; b += kRowBatch) {
      uint4 x[kRowBatch][kChunks];
#pragma unroll
      for (int j = 0; j < kRowBatch; ++j, row += step) {
        const int r = warp + kSummaryWarps * (b + j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          x[j][c] = load_stream(row + c * kChunkBytes, r < rows && valid[c] == 16);
      }
#pragma unroll
      for (int j = 0; j < kRowBatch; ++j) {
        const int r = warp + kSummaryWarps * (b + j);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (r < rows && valid[c] == 16) {  // rows past Nq, pieces not read: neutral
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
      const int r = warp + kSummaryWarps * j;
      if (r >= rows) break;
      const uint8_t* piece = row0 + int64_t(r) * p.mask.stride_q + c * kChunkBytes;
      for (int i = 0; i < n; ++i) {
        const uint32_t v = __ldg(piece + i);
        ored[c] |= v;
        zeros[c] |= v == 0u;
      }
    }
  }

  // Tile bits: lanes 4t..4t+3 of chunk c hold tile 8c + t of the word.
  uint32_t my_any = 0, my_all = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    uint32_t a = __ballot_sync(0xffffffffu, ored[c] != 0u);
    uint32_t l = __ballot_sync(0xffffffffu, needed[c] && zeros[c] == 0u);
    a |= a >> 1;
    a |= a >> 2;
    l &= l >> 1;
    l &= l >> 2;
    my_any |= gather_nibble_bits(a) << (8 * c);
    my_all |= gather_nibble_bits(l) << (8 * c);
  }

  __shared__ uint32_t any_bits[kSummaryWarps], all_bits[kSummaryWarps];
  if (lane == 0) {
    any_bits[warp] = my_any;
    all_bits[warp] = my_all;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0, l = ~0u;
#pragma unroll
    for (int w = 0; w < kSummaryWarps; ++w) {
      a |= any_bits[w];
      l &= all_bits[w];
    }
    any_out[at] = a;
    all_out[at] = l;
  }
}

}  // namespace

size_t dma_mask_summary_bytes(const DynamicMaskProblem& p) {
  if (p.mask.data == nullptr) return 0;
  return 2 * sizeof(uint32_t) * size_t(p.mask.b) * p.mask.h * summary_q_tiles(p) * summary_words(p);
}

cudaError_t dma_summarize_mask(const DynamicMaskProblem& p, uint32_t* storage, MaskSummary* out,
                               cudaStream_t stream) {
  *out = MaskSummary{};
  if (p.mask.data == nullptr) return cudaSuccess;
  if (storage == nullptr || int64_t(p.mask.b) * p.mask.h > 65535 || summary_q_tiles(p) > 65535)
    return cudaErrorInvalidValue;
  MaskSummary s;
  s.q_tiles = summary_q_tiles(p);
  s.words = summary_words(p);
  const size_t half = dma_mask_summary_bytes(p) / 2 / sizeof(uint32_t);
  uint32_t* any = storage;
  uint32_t* all = storage + half;
  const auto aligned = [](int64_t x) { return x % 16 == 0; };
  const bool vec = (reinterpret_cast<uintptr_t>(p.mask.data) % 16 == 0) && aligned(p.mask.stride_b) &&
                   aligned(p.mask.stride_h) && aligned(p.mask.stride_q);
  const dim3 grid(unsigned(s.words), unsigned(s.q_tiles), unsigned(p.mask.b * p.mask.h));
  mask_summary_kernel<<<grid, 32 * kSummaryWarps, 0, stream>>>(p, s, any, all, vec);
  s.any = any;
  s.all = all;
  *out = s;
  return cudaGetLastError();
}

}  // namespace attnlab
