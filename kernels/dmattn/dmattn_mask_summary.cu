// attnlab: the mask pre-pass of the dynamic-mask kernels — one "any" and one
// "all" bit per 64x64 tile of the mask (see dmattn_tiles.cuh for why).
//
// Grid: (words of 32 key tiles, query tiles, mask batch x mask head); a block
// of 8 warps summarises one word: each warp takes 4 key tiles, and for each
// tile every lane has all of its 16-byte loads in flight before it looks at
// any of them.
#include <cuda_runtime.h>

#include <algorithm>

#include "dmattn_tiles.cuh"

namespace attnlab {
namespace {

constexpr int kSummaryWarps = 8;
constexpr int kTilesPerWarp = 32 / kSummaryWarps;
static_assert(kDmaBr == 64 && kDmaBc == 64, "a lane covers 8 x 16 bytes of a 64 x 64 tile");

// True when no byte of the 4-byte word is zero (the classic has-zero-byte test).
__device__ __forceinline__ bool no_zero_byte(uint32_t x) { return ((x - 0x01010101u) & ~x & 0x80808080u) == 0; }

int summary_q_tiles(const DynamicMaskProblem& p) { return p.mask.q == 1 ? 1 : (p.Nq + kDmaBr - 1) / kDmaBr; }
int summary_words(const DynamicMaskProblem& p) { return ((p.Nk + kDmaBc - 1) / kDmaBc + 31) / 32; }

// `vec`: every row of every full-width tile starts 16-byte aligned (base and
// strides multiples of 16), so a row is four 16-byte loads.
__global__ void __launch_bounds__(32 * kSummaryWarps)
mask_summary_kernel(const DynamicMaskProblem p, MaskSummary s, uint32_t* any_out, uint32_t* all_out, bool vec) {
  const int word = blockIdx.x, m = blockIdx.y;
  const int mb = blockIdx.z / p.mask.h, mh = blockIdx.z % p.mask.h;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint8_t* base = static_cast<const uint8_t*>(p.mask.data) + int64_t(mb) * p.mask.stride_b +
                        int64_t(mh) * p.mask.stride_h;
  const int q0 = m * kDmaBr;
  const int rows = p.mask.q == 1 ? 1 : min(kDmaBr, p.Nq - q0);
  // Keys past the last one any row of this tile may see (causal) are never asked about.
  int key_end = p.Nk;
  if (p.causal && p.mask.q != 1) key_end = int(max(int64_t(0), min(int64_t(p.Nk), int64_t(q0 + rows - 1) + p.Nk - p.Nq + 1)));

  __shared__ uint32_t any_bits[kSummaryWarps], all_bits[kSummaryWarps];
  uint32_t my_any = 0, my_all = 0;
#pragma unroll
  for (int i = 0; i < kTilesPerWarp; ++i) {
    const int tile_in_word = warp * kTilesPerWarp + i;
    const int k0 = (word * 32 + tile_in_word) * kDmaBc;
    if (k0 >= key_end) continue;  // warp-uniform
    const int keys = min(kDmaBc, p.Nk - k0);
    bool any = false, all = true;
    if (vec && keys == kDmaBc) {
      uint4 x[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) {  // 64 rows x 4 chunks: lanes 4r..4r+3 read row r
        const int idx = lane + 32 * c, r = idx / 4;
        // Rows past Nq read as all ones: neutral for both answers.
        x[c] = r < rows ? __ldg(reinterpret_cast<const uint4*>(base + int64_t(q0 + r) * p.mask.stride_q + k0) + idx % 4)
                        : make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int r = (lane + 32 * c) / 4;
        if (r < rows) any = any || ((x[c].x | x[c].y | x[c].z | x[c].w) != 0);
        all = all && no_zero_byte(x[c].x) && no_zero_byte(x[c].y) && no_zero_byte(x[c].z) && no_zero_byte(x[c].w);
      }
    } else {
      for (int r = 0; r < rows; ++r)
        for (int c = lane; c < keys; c += 32) {
          const bool on = __ldg(base + int64_t(q0 + r) * p.mask.stride_q + k0 + c) != 0;
          any = any || on;
          all = all && on;
        }
    }
    any = __any_sync(0xffffffffu, any);
    all = __all_sync(0xffffffffu, all);
    my_any |= uint32_t(any) << tile_in_word;
    my_all |= uint32_t(all) << tile_in_word;
  }
  if (lane == 0) {
    any_bits[warp] = my_any;
    all_bits[warp] = my_all;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0, l = 0;
    for (int w = 0; w < kSummaryWarps; ++w) {
      a |= any_bits[w];
      l |= all_bits[w];
    }
    const int64_t at = (int64_t(blockIdx.z) * s.q_tiles + m) * s.words + word;
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
