// attnlab: the mask pre-pass of the dynamic-mask kernels — one "any" and one
// "all" bit per 64x64 tile of the mask (see dmattn_tiles.cuh for why).
//
// It is a pure streaming read (at L = 32K, causal: 512 MiB for a 16 KiB
// result), so the layout of the loads is what matters. The scan of one word
// is mask_scan::scan_word (dmattn_mask_scan.cuh), which the forward also runs
// inside its own blocks (DmaMaskScan::kInKernel); this file is its grid.
// Grid: (words of 32 key tiles, query tiles, mask batch x mask head); a block
// of 8 warps summarises one word of one query tile: 64 rows x 2048 bytes.
// Warp w takes rows w, w+8, ..., w+56; every load instruction of a warp reads
// 512 contiguous bytes of one row (lane L: bytes 16L..16L+15 of the 512-byte
// chunk, i.e. key tile L/4 of the chunk's 8), four chunks per row. So each
// warp instruction reads four whole 128-byte lines of one row, and the blocks
// next in launch order (the next words) read the rest of the same rows
// (lanes 4r..4r+3 reading row r of one tile would make every warp load touch
// 8 rows 32 KiB apart, 64 bytes each, far from the memory bandwidth).
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
// so it need not take L1 lines. Docs: docs/dmattn_masks.md; measured
// alternatives: docs/experiments.md.
// Run: build/flash_attn_mma --B 1 --H 2 --Hkv 1 --N 32768 --D 128 --causal --mask topk --window 1024 --bias --dma-mask-scan prepass
#include <cuda_runtime.h>

#include <algorithm>

#include "common/ptx.cuh"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace {

// (Blocks of 4 warps, which fit on an SM beside two wgmma forward blocks, are
// no faster, alone or in the pipelined pre-pass.)
constexpr int kSummaryWarps = 8;
constexpr int kRowBatch = 4;  // rows whose loads are in flight together: 16 loads per lane
constexpr int kBitRowBatch = 8;  // bit-packed mask: 8 rows of 8 bytes per lane, a warp's whole share
static_assert(kSummaryWarps == 8 && kDmaBr % kSummaryWarps == 0, "header: 8 warps share a word's 64 rows");
static_assert(kRowBatch * mask_scan::kChunks == 16, "header: 16 loads per lane in flight (4 rows x 4 chunks)");
static_assert(kBitRowBatch == kDmaBr / kSummaryWarps, "a bit-packed mask: a warp's rows in one batch");

int summary_q_tiles(const DynamicMaskProblem& p) { return p.mask.q == 1 ? 1 : (p.Nq + kDmaBr - 1) / kDmaBr; }
int summary_words(const DynamicMaskProblem& p) { return ((p.Nk + kDmaBc - 1) / kDmaBc + 31) / 32; }

// `vec`: mask_scan::mask_vector_loads(p).
__global__ void __launch_bounds__(32 * kSummaryWarps, 2)
mask_summary_kernel(const DynamicMaskProblem p, MaskSummary s, uint32_t* any_out, uint32_t* all_out, bool vec,
                    int m_first) {
  // The attention kernel that reads these bits may start launching now (it
  // waits for this whole grid, griddepcontrol.wait, before it reads anything):
  // its blocks take the SMs this grid's last wave leaves, instead of the
  // launch starting after the last block has finished.
  griddep_launch_dependents();
  const int word = blockIdx.x, m = m_first + int(blockIdx.y);  // m_first: the pipelined pre-pass's chunk
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const mask_scan::TileRows t = mask_scan::tile_rows(p, blockIdx.z / p.mask.h, blockIdx.z % p.mask.h, m);
  const int64_t at = (int64_t(blockIdx.z) * s.q_tiles + m) * s.words + word;
  if (word * 32 * kDmaBc >= t.key_end) {  // block-uniform: nothing of this word is read
    if (threadIdx.x == 0) {
      any_out[at] = 0u;
      all_out[at] = 0u;
    }
    return;
  }
  uint32_t my_any, my_all;
  if (p.mask_format == DmaMaskFormat::kBits)  // 64 rows x 256 bytes: one batch of 8 rows per warp
    mask_scan::scan_word_bits<kSummaryWarps, kBitRowBatch>(t.bits(), p.mask.stride_q, t.rows, p.Nk, t.key_end, word,
                                                           warp, lane, my_any, my_all);
  else
    mask_scan::scan_word<kSummaryWarps, kRowBatch>(t.row0, p.mask.stride_q, t.rows, p.Nk, t.key_end, word, vec, warp,
                                                   lane, my_any, my_all);
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

MaskSummary dma_mask_summary_view(const DynamicMaskProblem& p, uint32_t* storage) {
  MaskSummary s;
  if (p.mask.data == nullptr || storage == nullptr) return s;
  s.q_tiles = summary_q_tiles(p);
  s.words = summary_words(p);
  const size_t half = dma_mask_summary_bytes(p) / 2 / sizeof(uint32_t);
  s.any = storage;
  s.all = storage + half;
  return s;
}

cudaError_t dma_summarize_mask_tiles(const DynamicMaskProblem& p, uint32_t* storage, int m_begin, int m_end,
                                     cudaStream_t stream) {
  if (p.mask.data == nullptr) return cudaSuccess;
  if (storage == nullptr || int64_t(p.mask.b) * p.mask.h > 65535 || summary_q_tiles(p) > 65535)
    return cudaErrorInvalidValue;
  const MaskSummary s = dma_mask_summary_view(p, storage);
  m_begin = std::max(0, m_begin);
  m_end = std::min(m_end, s.q_tiles);
  if (m_end <= m_begin) return cudaSuccess;
  const bool vec = mask_scan::mask_vector_loads(p);
  const dim3 grid(unsigned(s.words), unsigned(m_end - m_begin), unsigned(p.mask.b * p.mask.h));
  mask_summary_kernel<<<grid, 32 * kSummaryWarps, 0, stream>>>(p, s, storage, storage + (s.all - s.any), vec,
                                                                m_begin);
  return cudaGetLastError();
}

cudaError_t dma_summarize_mask(const DynamicMaskProblem& p, uint32_t* storage, MaskSummary* out,
                               cudaStream_t stream) {
  *out = MaskSummary{};
  if (p.mask.data == nullptr) return cudaSuccess;
  const cudaError_t err = dma_summarize_mask_tiles(p, storage, 0, summary_q_tiles(p), stream);
  if (err == cudaSuccess) *out = dma_mask_summary_view(p, storage);
  return err;
}

cudaError_t dma_build_mask_summary(const DynamicMaskProblem& p, uint32_t* storage, cudaStream_t stream) {
  if (p.mask.data != nullptr && storage == nullptr) return cudaErrorInvalidValue;
  MaskSummary view;
  return dma_summarize_mask(p, storage, &view, stream);
}

}  // namespace attnlab
