// attnlab: the mask pre-pass of the dynamic-mask kernels — one "any" and one
// "all" bit per 64x64 tile of the mask (see dmattn_tiles.cuh for why).
//
// It is a pure streaming read (at L = 32K, causal: 512 MiB for a 16 KiB
// result), so the layout of the loads is what matters. The scan of one word
// is mask_scan::scan_word (dmattn_mask_scan.cuh), which the forward also runs
// inside its own blocks (DmaMaskScan::kInKernel); this file is its grid.
// Items: (words of 32 key tiles, query tiles, mask batch x mask head); a block
// of 8 warps summarises one word of one query tile: 64 rows x 2048 bytes, one
// block per item, or (streamed, below) a persistent grid of one block per SM
// that walks the items in the forward's order and flags each word as it is
// done.
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

int summary_q_tiles(const DynamicMaskProblem& p) { return p.mask.q == 1 ? 1 : (p.Nq + kDmaBr - 1) / kDmaBr; }
int summary_words(const DynamicMaskProblem& p) { return ((p.Nk + kDmaBc - 1) / kDmaBc + 31) / 32; }

// One item = one word of one query tile of one mask (batch, head): 64 rows x
// 2048 bytes. Items are numbered in the forward's block order: query tiles
// j = 0, 1, ... in dma_query_tile_order (zigzag), then mask (batch, head),
// then word — so the rows the first forward blocks need are read first.
struct Item {
  int z, m, word;
  mask_scan::TileRows rows;
  int64_t out;  // index of its words in any / all / ready
  __device__ __forceinline__ Item(const DynamicMaskProblem& p, const MaskSummary& s, int item) {
    word = item % s.words;
    const int row = item / s.words, zs = p.mask.b * p.mask.h;
    z = row % zs;
    m = dma_query_tile_order(row / zs, s.q_tiles, /*zigzag=*/true);
    rows = mask_scan::tile_rows(p, z / p.mask.h, z % p.mask.h, m);
    out = (int64_t(z) * s.q_tiles + m) * s.words + word;
  }
  __device__ __forceinline__ bool read() const { return word * 32 * kDmaBc < rows.key_end; }  // else all 0
};

// The warps' bits of one item combined and written by thread 0 (then, given
// `ready`, its flag, released after both words). warp_any / warp_all: lane 0
// of each warp has stored its bits; `read` false: the item is all zeros.
template <int kWarps>
__device__ __forceinline__ void write_item(const uint32_t* warp_any, const uint32_t* warp_all, bool read, int64_t at,
                                           uint32_t* any_out, uint32_t* all_out, uint32_t* ready, uint32_t seq) {
  if (threadIdx.x != 0) return;
  uint32_t a = 0u, l = read ? ~0u : 0u;
  if (read) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      a |= warp_any[w];
      l &= warp_all[w];
    }
  }
  any_out[at] = a;
  all_out[at] = l;
  if (ready != nullptr) store_release_gpu(ready + at, seq);
}

// One block per item. `vec`: mask_scan::mask_vector_loads(p).
__global__ void __launch_bounds__(32 * kSummaryWarps, 2)
mask_summary_kernel(const DynamicMaskProblem p, MaskSummary s, uint32_t* any_out, uint32_t* all_out, bool vec) {
  // The attention kernel that reads these bits may start launching now (it
  // waits for this whole grid, griddepcontrol.wait, before it reads anything):
  // its blocks take the SMs this grid's last wave leaves, instead of the
  // launch starting after the last block has finished.
  griddep_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Item it(p, s, blockIdx.x);
  __shared__ uint32_t any_bits[kSummaryWarps], all_bits[kSummaryWarps];
  if (it.read()) {  // block-uniform; else two zero words, no loads, no barrier
    uint32_t my_any, my_all;
    mask_scan::scan_word<kSummaryWarps, kRowBatch>(it.rows.row0, p.mask.stride_q, it.rows.rows, p.Nk,
                                                   it.rows.key_end, it.word, vec, warp, lane, my_any, my_all);
    if (lane == 0) {
      any_bits[warp] = my_any;
      all_bits[warp] = my_all;
    }
    __syncthreads();
  }
  write_item<kSummaryWarps>(any_bits, all_bits, it.read(), it.out, any_out, all_out, nullptr, 0u);
}

// ---- the streamed pre-pass ---------------------------------------------------
// A persistent grid, one block of 16 warps per SM, that walks the items in
// order (block b: items b, b + gridDim.x, ...) and publishes each word's ready
// flag. Its loads in flight live in shared memory, not registers: every lane
// copies its own 16-byte pieces with cp.async into a ring of kStreamStages
// stages (one stage = one row of a warp's 4, two of its 4 chunks: 16 KiB per
// block; 8 stages = one whole item, 128 KiB, in flight), reads back only what
// it copied itself (no barrier), folds the piece into its chunk sums and
// refills the slot with the stage 8 ahead — the next item's, so the stream
// does not drain between items. 128 KiB of shared memory and <= 64 registers
// x 512 threads leave an SM room for one attention block (<= 192 registers x
// 128 threads, 83 KiB) beside it: forward blocks launched behind this grid
// run while it streams. (The register version, two blocks of 16 loads per
// lane, needs ~100 registers; capped at 64, 8 loads per lane, it reached only
// 3.1 TB/s, 173 us for the L = 32K mask against 123 us.) `vec` masks only.
constexpr int kStreamWarps = 16;
constexpr int kStreamThreads = 32 * kStreamWarps;
constexpr int kStreamRowsPerWarp = kDmaBr / kStreamWarps;              // 4
constexpr int kStreamChunksPerStage = 2;                               // of mask_scan::kChunks = 4
constexpr int kStagesPerItem = kStreamRowsPerWarp * mask_scan::kChunks / kStreamChunksPerStage;  // 8
constexpr int kStreamStages = kStagesPerItem;                          // the ring: one item in flight
constexpr int kStreamSmemBytes = kStreamStages * kStreamChunksPerStage * kStreamThreads * 16;  // 131072
static_assert(kStreamSmemBytes == 128 * 1024, "header: 128 KiB of loads in flight");

// (__launch_bounds__ minimum 2 blocks: caps the registers at 64; shared
// memory allows one block per SM.)
__global__ void __launch_bounds__(kStreamThreads, 2)
mask_summary_streamed_kernel(const DynamicMaskProblem p, MaskSummary s, uint32_t* any_out, uint32_t* all_out,
                             uint32_t* ready_out, int n_items) {
  griddep_launch_dependents();  // see mask_summary_kernel; the forward then waits on the flags
  extern __shared__ uint4 ring[];  // [stage][chunk of the stage][thread]: lane-private slots, no conflicts
  __shared__ uint32_t warp_any[2][kStreamWarps], warp_all[2][kStreamWarps];  // by item parity
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto slot = [&](int stage, int cc) -> uint4* { return ring + (stage * kStreamChunksPerStage + cc) * kStreamThreads + threadIdx.x; };
  // Copies of stage `st` of the i-th item of this block (nothing past the
  // last item or for an item not read), as one cp.async group.
  auto issue = [&](int i, int st) {
    const int item = blockIdx.x + i * gridDim.x;
    if (item < n_items) {
      const Item it(p, s, item);
      if (it.read()) {
        const mask_scan::WordPieces wp(it.word, lane, it.rows.key_end, p.Nk);
        const uint32_t whole = wp.whole();
        const int r = warp + kStreamWarps * (st / 2);
        const uint8_t* row = it.rows.row0 + int64_t(r) * p.mask.stride_q + wp.w0 + lane * 16;
#pragma unroll
        for (int cc = 0; cc < kStreamChunksPerStage; ++cc) {
          const int c = (st % 2) * kStreamChunksPerStage + cc;
          const bool take = r < it.rows.rows && (whole >> c & 1u);
          cp_async_16(slot(st, cc), take ? row + c * mask_scan::kChunkBytes : it.rows.row0, take);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int st = 0; st < kStagesPerItem; ++st) issue(0, st);
  int parity = 0;
  for (int i = 0; blockIdx.x + i * gridDim.x < n_items; ++i, parity ^= 1) {
    const Item it(p, s, blockIdx.x + i * gridDim.x);
    const mask_scan::WordPieces wp(it.word, lane, it.rows.key_end, p.Nk);
    const uint32_t whole = wp.whole();
    uint32_t ored[mask_scan::kChunks] = {}, zeros[mask_scan::kChunks] = {};
#pragma unroll
    for (int st = 0; st < kStagesPerItem; ++st) {
      cp_async_wait<kStreamStages - 1>();  // this lane's copies of stage st have landed
      const int r = warp + kStreamWarps * (st / 2);
#pragma unroll
      for (int cc = 0; cc < kStreamChunksPerStage; ++cc) {
        const int c = (st % 2) * kStreamChunksPerStage + cc;
        if (it.read() && r < it.rows.rows && (whole >> c & 1u)) mask_scan::fold_piece(*slot(st, cc), ored[c], zeros[c]);
      }
      issue(i + 1, st);  // the slot is free again: the same stage of this block's next item
    }
    uint32_t any = 0u, not_all = 0u;
    if (it.read()) {  // block-uniform
#pragma unroll
      for (int c = 0; c < mask_scan::kChunks; ++c) mask_scan::fold_chunk(c, ored[c], zeros[c], any, not_all);
      mask_scan::fold_partial_pieces<kStreamWarps>(wp, it.rows.row0 + wp.w0 + lane * 16, p.mask.stride_q,
                                                   it.rows.rows, /*vec=*/true, warp, any, not_all);
      const uint32_t all = mask_scan::all_bits(wp, not_all);  // ballots: the whole warp
      if (lane == 0) {
        warp_any[parity][warp] = any;
        warp_all[parity][warp] = all;
      }
    }
    __syncthreads();  // every item: this parity's buffer is rewritten two items on, after the next barrier
    write_item<kStreamWarps>(warp_any[parity], warp_all[parity], it.read(), it.out, any_out, all_out, ready_out, s.seq);
  }
  cp_async_wait<0>();
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
  if (streamed && vec) {
    // A number no earlier call used (0 skipped): flags left in the workspace
    // by earlier calls never read as ready.
    static std::atomic<uint32_t> next_seq{1};
    s.seq = next_seq.fetch_add(1);
    if (s.seq == 0) s.seq = next_seq.fetch_add(1);
    s.ready = ready;
    int device = 0, sms = 132;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    err = cudaFuncSetAttribute(mask_summary_streamed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kStreamSmemBytes);
    if (err != cudaSuccess) return err;
    mask_summary_streamed_kernel<<<unsigned(std::min(items, sms)), kStreamThreads, kStreamSmemBytes, stream>>>(
        p, s, any, all, ready, items);
    err = cudaGetLastError();
  } else {
    mask_summary_kernel<<<unsigned(items), 32 * kSummaryWarps, 0, stream>>>(p, s, any, all, vec);
    err = cudaGetLastError();
  }
  s.any = any;
  s.all = all;
  *out = s;
  return err;
}

}  // namespace attnlab
