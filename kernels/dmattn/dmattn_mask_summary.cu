// attnlab: the mask pre-pass of the dynamic-mask kernels — one "any" and one
// "all" bit per 64x64 tile of the mask (see dmattn_tiles.cuh for why).
//
// It is a pure streaming read (at L = 32K, causal: 512 MiB for a 16 KiB
// result), so the layout of the loads is what matters. The scan of one word
// is mask_scan::scan_word (dmattn_mask_scan.cuh), which the forward also runs
// inside its own blocks (DmaMaskScan::kInKernel); this file is its grid.
// Items: (words of 32 key tiles, query tiles, mask batch x mask head); a block
// of 8 warps summarises one word of one query tile: 64 rows x 2048 bytes, one
// block per item, or (streamed) a persistent grid of two blocks per SM that
// walks the items in the forward's order and flags each word as it is done.
// Warp w takes rows w, w+8, ..., w+56; every load instruction of a warp reads
// 512 contiguous bytes of one row (lane L: bytes 16L..16L+15 of the 512-byte
// chunk, i.e. key tile L/4 of the chunk's 8), four chunks per row. So each
// warp instruction reads four whole 128-byte lines of one row, and the blocks
// next in launch order (the next words) read the rest of the same rows. An
// earlier version had lanes 4r..4r+3 read row r of one tile: every warp load
// touched 8 rows 32 KiB apart, 64 bytes each, and reached ~2.6 TB/s on H200.
// A lane keeps 16 loads (4 rows x 4 chunks, 8 KiB per warp) in flight before
// it looks at any of them, folds them per chunk into an OR (any byte nonzero)
// and a has-zero-byte test, and the warp turns those into tile bits with two
// ballots per chunk (4 lanes per tile); lane 0 of each warp leaves its two
// words in shared memory and thread 0 combines the 8 warps. ~100
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
#include <atomic>

#include "../common/ptx.cuh"
#include "dmattn_mask_scan.cuh"
#include "dmattn_tiles.cuh"

namespace attnlab {
namespace {

constexpr int kSummaryWarps = 8;
constexpr int kRowBatch = 4;  // rows whose loads are in flight together: 16 loads per lane
// Streamed (persistent) pre-pass: 8 loads per lane, within 80 registers (two
// blocks: 64 KiB in flight per SM), so that an attention block fits beside.
constexpr int kRowBatchStreamed = 2;

int summary_q_tiles(const DynamicMaskProblem& p) { return p.mask.q == 1 ? 1 : (p.Nq + kDmaBr - 1) / kDmaBr; }
int summary_words(const DynamicMaskProblem& p) { return ((p.Nk + kDmaBc - 1) / kDmaBc + 31) / 32; }

// One item = one word of one query tile of one mask (batch, head): 64 rows x
// 2048 bytes. Items are numbered in the forward's block order: query tiles
// j = 0, 1, ... in dma_query_tile_order (zigzag), then mask (batch, head),
// then word — so the rows the first forward blocks need are read first.
__device__ __forceinline__ void summary_item(const DynamicMaskProblem& p, const MaskSummary& s, int item, int& z,
                                             int& m, int& word) {
  word = item % s.words;
  const int row = item / s.words;
  const int zs = p.mask.b * p.mask.h;
  z = row % zs;
  m = dma_query_tile_order(row / zs, s.q_tiles, /*zigzag=*/true);
}

// `vec`: mask_scan::mask_vector_loads(p). kStreamed: a persistent grid (each
// block takes items blockIdx.x, + gridDim.x, ...) that publishes a ready flag
// per word (MaskSummary::ready) with a release store after the word's bits;
// two blocks per SM of at most 80 registers (64 with kRowBatchStreamed) leave
// 24576 registers, one attention block of <= 192 registers x 128 threads,
// beside them. Otherwise one block per item (the grid covers them).
template <bool kStreamed>
__global__ void __launch_bounds__(32 * kSummaryWarps, kStreamed ? 3 : 2)
mask_summary_kernel(const DynamicMaskProblem p, MaskSummary s, uint32_t* any_out, uint32_t* all_out,
                    uint32_t* ready_out, bool vec, int n_items) {
  // The attention kernel that reads these bits may start launching now: it
  // waits for this whole grid (griddepcontrol.wait) before it reads anything,
  // or, streamed, for the ready flags of its own words. Either way its blocks
  // launch only once every block of this grid runs, so the flags they wait
  // for are being produced.
  griddep_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ uint32_t any_bits[2][kSummaryWarps], all_bits[2][kSummaryWarps];  // by item parity
  int parity = 0;
  for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
    int z, m, word;
    summary_item(p, s, item, z, m, word);
    const mask_scan::TileRows t = mask_scan::tile_rows(p, z / p.mask.h, z % p.mask.h, m);
    // Where the item's words go (computed where needed: registers go to the
    // scan's loads in flight).
    auto output_index = [&] {
      summary_item(p, s, item, z, m, word);
      return (int64_t(z) * s.q_tiles + m) * s.words + word;
    };
    if (word * 32 * kDmaBc >= t.key_end) {  // block-uniform: nothing of this word is read
      if (threadIdx.x == 0) {
        const int64_t at = output_index();
        any_out[at] = 0u;
        all_out[at] = 0u;
        if (kStreamed) store_release_gpu(ready_out + at, s.seq);
      }
      continue;
    }
    uint32_t my_any, my_all;
    mask_scan::scan_word<kSummaryWarps, kStreamed ? kRowBatchStreamed : kRowBatch>(t.row0, p.mask.stride_q, t.rows, p.Nk, t.key_end, word, vec, warp,
                                                   lane, my_any, my_all);
    if (lane == 0) {
      any_bits[parity][warp] = my_any;
      all_bits[parity][warp] = my_all;
    }
    __syncthreads();  // (the buffer of this parity is rewritten two items on, after another barrier)
    if (threadIdx.x == 0) {
      const int64_t at = output_index();
      uint32_t a = 0, l = ~0u;
#pragma unroll
      for (int w = 0; w < kSummaryWarps; ++w) {
        a |= any_bits[parity][w];
        l &= all_bits[parity][w];
      }
      any_out[at] = a;
      all_out[at] = l;
      if (kStreamed) store_release_gpu(ready_out + at, s.seq);  // after both words (release)
    }
    parity ^= 1;
  }
}

}  // namespace

size_t dma_mask_summary_bytes(const DynamicMaskProblem& p) {
  if (p.mask.data == nullptr) return 0;
  return 3 * sizeof(uint32_t) * size_t(p.mask.b) * p.mask.h * summary_q_tiles(p) * summary_words(p);
}

cudaError_t dma_summarize_mask(const DynamicMaskProblem& p, uint32_t* storage, MaskSummary* out, cudaStream_t stream,
                               bool streamed) {
  *out = MaskSummary{};
  if (p.mask.data == nullptr) return cudaSuccess;
  if (storage == nullptr) return cudaErrorInvalidValue;
  MaskSummary s;
  s.q_tiles = summary_q_tiles(p);
  s.words = summary_words(p);
  const size_t third = dma_mask_summary_bytes(p) / 3 / sizeof(uint32_t);
  uint32_t* any = storage;
  uint32_t* all = storage + third;
  uint32_t* ready = storage + 2 * third;
  const bool vec = mask_scan::mask_vector_loads(p);
  if (third > 2147483647) return cudaErrorInvalidValue;
  const int items = int(third);
  cudaError_t err;
  if (streamed) {
    // A number no earlier call used (0 skipped): flags left in the workspace
    // by earlier calls never read as ready.
    static std::atomic<uint32_t> next_seq{1};
    s.seq = next_seq.fetch_add(1);
    if (s.seq == 0) s.seq = next_seq.fetch_add(1);
    s.ready = ready;
    int device = 0, sms = 132;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const int blocks = std::min(items, 2 * sms);
    mask_summary_kernel<true><<<unsigned(blocks), 32 * kSummaryWarps, 0, stream>>>(p, s, any, all, ready, vec, items);
    err = cudaGetLastError();
  } else {
    mask_summary_kernel<false><<<unsigned(items), 32 * kSummaryWarps, 0, stream>>>(p, s, any, all, nullptr, vec, items);
    err = cudaGetLastError();
  }
  s.any = any;
  s.all = all;
  *out = s;
  return err;
}

}  // namespace attnlab
