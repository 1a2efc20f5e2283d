// ============================================================================
// Dynamic-mask attention, forward (flash-dmattn semantics) with tile skipping
// ============================================================================
// What it adds to rung 02 (split-Q, mma.sync): a per-key bias, a data-dependent
// sparse mask, grouped KV heads, softcap — and the reason a sparse mask pays:
// a 64 x 64 tile whose mask is all zero is never loaded nor multiplied.
// Per block (64 query rows of one head, 4 warps of 16 rows):
//  1. Before any K/V/bias traffic, the query tile's "any" and "all ones" bits
//     per key tile (dmattn_tiles.cuh: from the mask pre-pass, or the block's
//     own scan of its rows, DmaMaskScan::kInKernel) are compacted into a list
//     of active tiles, so that the loop prefetches the next *active* tile. A
//     block with no active tile writes O = 0, LSE = -inf and exits.
//  2. Rung 02's stage2 loop over the list (K, V of list[i+1] copied while
//     list[i] is computed); per tile, after S = Q·Kᵀ: scale, bias, softcap
//     c·tanh(S/c), -inf where the mask is 0, past Nk or past the causal
//     diagonal; the online softmax. Every choice (bias, softcap, all-ones
//     tile, aligned pairs) is uniform: no branch runs per element.
// Split-KV (few query blocks): `splits` parts of the causal range, merged by
// LSE; one query row with a mask: dma_decode_kernel gathers the active keys.
// The wgmma core (DmaConfig::kWgmma, sm_90a): both products as rung 07's
// warpgroup MMAs, K and V by TMA where aligned; accumulators in mma.sync's
// layout, so the rest is one code. Docs: docs/dmattn_forward.md,
// docs/dmattn_masks.md, docs/dmattn_decode.md.
//
// Tiles (DmaConfig, checked below): Br = Bc = 64, 4 warps, 2 K/V slots; rows
// padded by 8 halves (mma.sync) or dense in the 128-byte swizzle (wgmma).
// Shared memory, bytes (tile kernels: + list and bitmaps, 2 B + 2 bits a tile):
//   D                   32      64      96     128     192     256
//   mma.sync         25600   46080   66560   87040  128000  168960
//   wgmma                -   41984       -   82944       -       -
//   decode (gather)  37696   54080   70464   86848  119616  152384
// Keys per S slice 64 (32 on mma.sync at D >= 192); wgmma at D = 64 bounded
// for 4 blocks per SM. Registers: docs/dmattn_forward.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128, 192, 256} (wgmma: 64, 128);
// any Nq, Nk; H % Hkv == 0; mask (uint8 or bit-packed) and bias (input dtype)
// each ({B|1}, {H|Hkv|1}, {Nq|1}, Nk) through strides; softcap; causal
// (bottom-right). Writes O and LSE.
// Run: build/flash_attn_mma --B 1 --H 2 --Hkv 1 --N 8192 --D 128 --mask topk --window 1024 --bias --causal --check
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "common/block_reduce.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/dmattn_tiles.cuh"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"

namespace attnlab {
namespace {

// kWgmma: the Hopper core (sm_90a): S = Q·Kᵀ and O += P·V as warpgroup MMAs
// (rung 07's instructions: Q and K read by wgmma straight from shared memory,
// P from registers; no ldmatrix, and the half of Hopper's tensor rate that
// mma.sync cannot reach), tiles in wgmma's 128-byte swizzle (dense rows,
// 1024-byte aligned: + 1024 bytes of slack). Otherwise mma.sync as rung 02, rows
// padded by 8 halves. The 4 warps are one warpgroup either way, and the
// accumulator layout is the same, so everything between the two matrix
// products is one code.
template <int kHeadDim_, bool kWgmma_ = false>
struct DmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kBr = kDmaBr, kBc = kDmaBc;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = 2;
  static constexpr int kRowStride = kWgmma ? kHeadDim : kHeadDim + 8;  // elements per stored row
  static constexpr int kTileBytes = (kBr + 2 * kStages * kBc) * kRowStride * 2 + (kWgmma ? 1024 : 0);
  // Warp layout: each warp owns 16 rows (one m16 row tile) and all 64 keys of
  // the tile. Two row tiles per warp (every K and V fragment read from shared
  // memory feeding two MMAs, as in rung 02's D = 128 tiles, with warp pairs
  // splitting the keys and merging by LSE) are slower, with more registers
  // (docs/experiments.md).
  static constexpr int kMTiles = 1;
  // Keys per S slice: all 64 at once, or two slices of 32 at D >= 192 (S and O
  // must fit in the registers together).
  // (wgmma: all 64; its B operand is not re-read per row tile, so the
  // registers of a second slice go to nothing else.)
  static constexpr int kSubCols = kHeadDim < 192 || kWgmma ? 64 : 32;
  static constexpr int kSubTiles = kBc / kSubCols;
  static constexpr int kTilesS = kSubCols / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  // Blocks per SM the register count must allow: four for the wgmma core at
  // D = 64 (41 KiB of shared memory each; 128 registers, 4 bytes spilled),
  // else whatever fits (shared memory decides). Four are faster than three
  // (161 registers) on dense, causal and biased shapes; a scan-bound one-wave
  // sparse shape pays the smaller scan batch below.
  static constexpr int kMinBlocksPerSm = kWgmma && kHeadDim == 64 ? 4 : 1;
  // The in-kernel mask scan (DmaMaskScan::kInKernel): rows of 16-byte loads
  // per lane in flight (x 4 loads each): 16 KiB per warp, 128 KiB per SM with
  // two blocks, as the pre-pass kernel keeps in flight. At four blocks per SM
  // 4 rows (8 spill inside scan_words at 128 registers, and run slower).
  static constexpr int kScanRowBatch = kMinBlocksPerSm >= 4 ? 4 : 8;
  // A bit-packed mask: a warp's 16 rows of a word in flight at once, one
  // 8-byte load per lane and row (a warp load: 256 bytes of one row).
  static constexpr int kScanBitRowBatch = kBr / kWarps;
  static_assert(kBr == 16 * kMTiles * kWarps, "the warps split the rows");
  static_assert(!kWgmma || (kSubTiles == 1 && kWarps == 4), "wgmma: one warpgroup, all 64 keys at once");
};
static_assert(DmaConfig<32>::kTileBytes == 25600 && DmaConfig<64>::kTileBytes == 46080 &&
                  DmaConfig<96>::kTileBytes == 66560 && DmaConfig<128>::kTileBytes == 87040 &&
                  DmaConfig<192>::kTileBytes == 128000 && DmaConfig<256>::kTileBytes == 168960,
              "header: shared memory per head dim");
static_assert(DmaConfig<64, true>::kTileBytes == 41984 && DmaConfig<128, true>::kTileBytes == 82944,
              "header: shared memory per head dim, wgmma");
static_assert(DmaConfig<64>::kBr == 64 && DmaConfig<64>::kBc == 64 && DmaConfig<64>::kWarps == 4 &&
                  DmaConfig<64>::kStages == 2 && DmaConfig<64, true>::kWarps == 4 && DmaConfig<64, true>::kStages == 2,
              "header: Br = Bc = 64, 4 warps, 2 K/V slots");
static_assert(DmaConfig<128>::kSubCols == 64 && DmaConfig<192>::kSubCols == 32 && DmaConfig<256>::kSubCols == 32 &&
                  DmaConfig<128, true>::kSubCols == 64,
              "header: keys per S slice, 32 on mma.sync at D >= 192");
static_assert(DmaConfig<64, true>::kMinBlocksPerSm == 4 && DmaConfig<128, true>::kMinBlocksPerSm == 1 &&
                  DmaConfig<64>::kMinBlocksPerSm == 1,
              "header: the wgmma core at D = 64 is bounded for 4 blocks per SM");

// Bytes after the tiles: the active-tile list (uint16) and the bitmap.
__host__ __device__ inline int dma_list_bytes(int n_tiles) { return ((n_tiles * 2 + 15) / 16) * 16; }
__host__ __device__ inline int dma_bitmap_words(int n_tiles) { return (n_tiles + 31) / 32; }

// Two adjacent elements (keys k, k+1) of an operand row as one raw 32-bit
// value: 16-bit bias elements in bits 0-15 / 16-31, mask bytes in bits 0-7 /
// 8-15. `aligned` (uniform): the pair is one aligned load.
__device__ __forceinline__ uint32_t load_pair(const uint16_t* row, int k) {
  return __ldg(reinterpret_cast<const unsigned int*>(row + k));
}
__device__ __forceinline__ uint32_t load_pair(const uint8_t* row, int k) {
  return __ldg(reinterpret_cast<const unsigned short*>(row + k));
}

// The operand pairs of a lane's scores in one slice of kTilesS n8 tiles:
// bits[r][n] holds keys key0 + 8n, +1 (key0 = the slice's first key + 2t) of
// the lane's row r (rows[r]: row g, g + 8; rows past Nq point at row Nq - 1,
// their scores are never stored). No branch per element: the fast path
// (`aligned`, uniform: every key of the slice < Nk and the pairs 2- or
// 4-byte aligned) is one load per pair; otherwise each element is loaded on
// its own at a key clamped to Nk - 1 (keys >= Nk are set to -inf by
// mask_scores afterwards, whatever was loaded). `one_row` (uniform): the
// operand is broadcast over queries and, on the fast path, bits[1] is left 0
// for the caller to take bits[0] instead (a copy here would wait for the load).
template <int kTilesS, typename E>
__device__ __forceinline__ void load_pairs(uint32_t (&bits)[2][kTilesS], const E* const (&rows)[2], bool one_row,
                                           int key0, int Nk, bool aligned) {
  if (aligned) {
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) bits[0][n] = load_pair(rows[0], key0 + 8 * n);
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) bits[1][n] = one_row ? 0u : load_pair(rows[1], key0 + 8 * n);
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) {
        const int k = key0 + 8 * n;
        bits[r][n] = uint32_t(__ldg(rows[r] + min(k, Nk - 1))) |
                     (uint32_t(__ldg(rows[r] + min(k + 1, Nk - 1))) << (8 * sizeof(E)));
      }
  }
}

template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits);
template <>
__device__ __forceinline__ float2 unpack_pair<half>(uint32_t bits) {
  return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t bits) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// Zeroes `bytes` (a multiple of 4) at `dst` (4-byte aligned), 16 bytes per
// store where dst is 16-byte aligned.
template <int kThreads>
__device__ __forceinline__ void zero_fill(void* dst, size_t bytes) {
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    uint4* d = static_cast<uint4*>(dst);
    for (size_t i = threadIdx.x; i < bytes / 16; i += kThreads) d[i] = make_uint4(0u, 0u, 0u, 0u);
    for (size_t i = bytes / 16 * 4 + threadIdx.x; i < bytes / 4; i += kThreads) static_cast<uint32_t*>(dst)[i] = 0u;
  } else {
    for (size_t i = threadIdx.x; i < bytes / 4; i += kThreads) static_cast<uint32_t*>(dst)[i] = 0u;
  }
}

// kMaskBits: the mask is bit-packed (DmaMaskFormat::kBits) — its own
// instantiation, so that the byte-mask kernels keep their registers (one
// kernel for both formats spilled 84 bytes at D = 64 on the wgmma core).
template <typename Cfg, typename T, bool kMaskBits = false>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
dma_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                   float* __restrict__ lse, const DynamicMaskProblem p, const MaskSummary summary,
                   unsigned long long* counters, float* __restrict__ partials, int splits,
                   const __grid_constant__ CUtensorMap tma_k, const __grid_constant__ CUtensorMap tma_v, bool use_tma,
                   bool scan_in_kernel, uint32_t* __restrict__ summary_out, int m_first) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kRowStride;
  // Launched overlapped with the mask pre-pass (sm_90): nothing may be read
  // or written before that grid, or whatever ran before, has completed. The
  // split-KV combine after this kernel may then start launching.
  griddep_wait();
  griddep_launch_dependents();

  // Blocks of the same query rows and all H heads run next to each other (head
  // fastest), so heads that share a mask or bias (GQA, broadcast) read it from
  // L2, not DRAM. Without a mask the heaviest query tiles (causal: the last)
  // go first. With one the heavy tiles may sit anywhere — a top-W mask of a
  // query-broadcast bias puts nearly all its work in the *first* ~48 query
  // tiles (~20 active tiles each), which last-first would run after everyone
  // else — so the order zigzags from both ends: last, first, last - 1,
  // second, ... (Also with the in-kernel mask scan, whose cost grows with the
  // causal row length: longest scans first is slower.)
  // (m_first: the first query tile of this launch — the pipelined pre-pass
  // launches the forward once per chunk of query tiles.)
  const int m_block =
      m_first + dma_query_tile_order(int(blockIdx.x / p.H), gridDim.x / p.H, /*zigzag=*/p.mask.data != nullptr);
  const int h = blockIdx.x % p.H, b = blockIdx.y / splits, split = blockIdx.y % splits;
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const int warp_row = warp * 16;  // first row of the warp in the tile
  // The lane's rows: row0 (c0, c1) and row0 + 8 (c2, c3).
  const int row0 = q_start + warp_row + lane / 4;

  AttnProblem dp = p.dense();  // the dense view: sizes, causal rule (its scale is set below)

  const int64_t q_head = int64_t(b) * p.H + h;
  const int64_t kv_head = int64_t(b) * p.Hkv + h / (p.H / p.Hkv);
  const T* Kg = k + kv_head * p.Nk * D;
  const T* Vg = v + kv_head * p.Nk * D;
  const int n_range = kv_tiles_for_query_tile(dp, q_start, Br, Bc);  // causal pruning
  // Split-KV (decoding): this block takes tiles [tile_begin, tile_end) of the range.
  const SplitTiles my_tiles = dma_split_tiles(n_range, splits, split);
  const int tile_begin = my_tiles.begin, tile_end = my_tiles.end;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  if constexpr (Cfg::kWgmma) {  // tiles 1024-byte aligned: the period of the 128-byte swizzle
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  }
  T* sK = sQ + Br * kStride;
  T* sV = sK + 2 * Bc * kStride;
  uint16_t* active = reinterpret_cast<uint16_t*>(smem_raw + Cfg::kTileBytes);
  const int max_tiles = (p.Nk + Bc - 1) / Bc;
  uint32_t* bitmap = reinterpret_cast<uint32_t*>(smem_raw + Cfg::kTileBytes + dma_list_bytes(max_tiles));
  uint32_t* full_bitmap = bitmap + dma_bitmap_words(max_tiles);  // tiles whose mask is all ones
  __shared__ int n_active_shared;

  // ---- 1. which KV tiles does any row of this block see? ----------------------
  // The mask pre-pass's bits of this query tile, restricted to [tile_begin, tile_end).
  int n_active = tile_end - tile_begin;
  if (p.mask.data != nullptr) {
    // Bits of [tile_begin, tile_end) only: a word may hold tiles of the split
    // before or after this one.
    auto in_range = [&](int w) {
      const int lo = max(0, tile_begin - 32 * w), hi = min(32, tile_end - 32 * w);
      return hi <= lo ? 0u : (hi == 32 ? ~0u : (1u << hi) - 1u) & ~((1u << lo) - 1u);
    };
    if (scan_in_kernel) {
      // Read this query tile's rows of the mask here (dmattn_mask_scan.cuh):
      // warp w takes rows w, w + 4, ...; kScanRowBatch x 4 loads of 16 bytes
      // per lane in flight. Words are OR-ed / AND-ed across the warps.
      for (int w = threadIdx.x; w < dma_bitmap_words(tile_end); w += Cfg::kThreads) {
        bitmap[w] = 0u;
        full_bitmap[w] = ~0u;
      }
      __syncthreads();
      const mask_scan::TileRows rows = mask_scan::tile_rows(p, p.mask.b == 1 ? 0 : b,
                                                            p.mask.h == 1 ? 0 : h / p.mask.head_group, m_block);
      const int key_end = min(rows.key_end, tile_end * Bc);
      if constexpr (kMaskBits)
        mask_scan::scan_words_bits<Cfg::kWarps, Cfg::kScanBitRowBatch>(rows.bits(), p.mask.stride_q, rows.rows, p.Nk,
                                                                       key_end, tile_begin / 32, bitmap, full_bitmap);
      else
        mask_scan::scan_words<Cfg::kWarps, Cfg::kScanRowBatch>(rows.row0, p.mask.stride_q, rows.rows, p.Nk, key_end,
                                                               tile_begin / 32, mask_scan::mask_vector_loads(p),
                                                               bitmap, full_bitmap);
      __syncthreads();
      // The scan's bits are the pre-pass's bits of this summary row (the same
      // scan_word over the same keys: with one split the block's key_end is
      // the row's causal end, or Nk), so one block per row stores them for
      // the backward (dma_forward_mask_summary), which then reads the mask
      // no second time: the row's first batch and head, and for a
      // query-broadcast mask the last query tile (it sees every key). Words
      // past key_end get 0, as from the pre-pass. Each thread stores the
      // words it then restricts below (same thread, same word: no race).
      const bool summary_writer =
          summary_out != nullptr && (p.mask.b != 1 || b == 0) &&
          (p.mask.h == 1 ? h == 0 : h % p.mask.head_group == 0) &&
          (p.mask.q != 1 || m_block == (p.Nq + Br - 1) / Br - 1);
      if (summary_writer) {
        const int64_t srow = summary.row(p, b, h, m_block);
        uint32_t* any_out = summary_out + srow;
        uint32_t* all_out = summary_out + (summary.all - summary.any) + srow;
        for (int w = threadIdx.x; w < summary.words; w += Cfg::kThreads) {
          const bool read = w * 32 * Bc < key_end;
          any_out[w] = read ? bitmap[w] : 0u;
          all_out[w] = read ? full_bitmap[w] : 0u;
        }
      }
      for (int w = threadIdx.x; w < dma_bitmap_words(tile_end); w += Cfg::kThreads) bitmap[w] &= in_range(w);
    } else {
      const int64_t srow = summary.row(p, b, h, m_block);
      for (int w = threadIdx.x; w < dma_bitmap_words(tile_end); w += Cfg::kThreads) {
        const uint32_t range = in_range(w);
        bitmap[w] = range != 0u ? __ldg(summary.any + srow + w) & range : 0u;
        full_bitmap[w] = range != 0u ? __ldg(summary.all + srow + w) : 0u;
      }
    }
    __syncthreads();
    if (warp == 0) {  // compaction in tile order: deterministic, ascending
      int base = 0;
      for (int w = tile_begin / 32; w < dma_bitmap_words(tile_end); ++w) {
        const uint32_t bits = bitmap[w];
        if (bits >> lane & 1u) active[base + __popc(bits & ((1u << lane) - 1u))] = uint16_t(w * 32 + lane);
        base += __popc(bits);
      }
      if (lane == 0) n_active_shared = base;
    }
    __syncthreads();
    n_active = n_active_shared;
  }
  if (counters != nullptr && threadIdx.x == 0) {
    atomicAdd(counters, (unsigned long long)n_active);
    atomicAdd(counters + 1, (unsigned long long)(tile_end - tile_begin));
  }
  // No active tile: every row of the block is fully masked — O = 0, LSE =
  // -inf (a split's partial likewise), written straight away with wide
  // stores; no Q load, no barrier setup, no epilogue. (A top-W mask at
  // L = 32K leaves ~95 % of the blocks here.)
  if (n_active == 0) {
    const int n_rows = min(Br, p.Nq - q_start);
    const int64_t rows_total = int64_t(p.B) * p.H * p.Nq;
    const int64_t first = (splits == 1 ? q_head : int64_t(split) * p.B * p.H + q_head) * p.Nq + q_start;
    if (splits == 1) zero_fill<Cfg::kThreads>(o + first * D, size_t(n_rows) * D * sizeof(T));
    else zero_fill<Cfg::kThreads>(partials + first * D, size_t(n_rows) * D * sizeof(float));
    float* row_lse = splits == 1 ? lse + first : partials + int64_t(splits) * rows_total * D + first;
    for (int r = threadIdx.x; r < n_rows; r += Cfg::kThreads) row_lse[r] = -INFINITY;
    return;
  }
  auto tile_at = [&](int i) { return p.mask.data != nullptr ? int(active[i]) : tile_begin + i; };

  // ---- 2. rung 02's stage2 loop over the active tiles --------------------------
  auto load_kv = [&](int i, int tile) {
    const int slot = i % 2, rows = p.Nk - tile * Bc;
    // At D >= 192 rolled copies: unrolled, their loop-invariant addresses would
    // be hoisted out of the tile loop into registers that O needs. Below, the
    // unrolled copies of rung 02 (fewer instructions per 16-byte copy).
    if constexpr (D >= 192) {
      load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sK + slot * Bc * kStride,
                                                                        Kg + int64_t(tile) * Bc * D, D, rows);
      cp_async_commit();
      load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sV + slot * Bc * kStride,
                                                                        Vg + int64_t(tile) * Bc * D, D, rows);
    } else {
      load_tile_async<Bc, D, kStride, Cfg::kThreads>(sK + slot * Bc * kStride, Kg + int64_t(tile) * Bc * D, D, rows);
      cp_async_commit();
      load_tile_async<Bc, D, kStride, Cfg::kThreads>(sV + slot * Bc * kStride, Vg + int64_t(tile) * Bc * D, D, rows);
    }
    cp_async_commit();
  };

  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  const float softcap = p.softcap, inv_softcap = p.softcap > 0.f ? 1.f / p.softcap : 0.f;
  // Uniform facts about the operands: one row for all queries (broadcast), and
  // whether key pairs are aligned single loads (Nk even, aligned bases).
  const bool has_bias = p.bias.data != nullptr, has_mask = p.mask.data != nullptr;
  const bool bias_one_row = p.bias.stride_q == 0, mask_one_row = p.mask.stride_q == 0;
  const bool bias_pairs = p.Nk % 2 == 0 && (reinterpret_cast<uintptr_t>(p.bias.data) & 3) == 0;
  const bool mask_pairs = p.Nk % 2 == 0 && (reinterpret_cast<uintptr_t>(p.mask.data) & 1) == 0;
  constexpr bool mask_in_bits = kMaskBits;
  // Without bias and softcap S needs no rewriting: the softmax takes the scale
  // (one FFMA before exp2, as rung 02). With either, S is turned into the
  // logit first and the softmax scale is 1.
  const bool logit_pass = has_bias || softcap > 0.f;
  const float softmax_scale_log2 = logit_pass ? kLog2e : p.scale * kLog2e;
  dp.scale = logit_pass ? 1.f : p.scale;  // the LSE: dp.scale · m + log l
  // The lane's two operand rows (g, g + 8); rows past Nq read row Nq - 1.
  const int rows[2] = {min(row0, p.Nq - 1), min(row0 + 8, p.Nq - 1)};
  const uint16_t* bias_rows[2] = {nullptr, nullptr};
  const uint8_t* mask_rows[2] = {nullptr, nullptr};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (has_bias) bias_rows[r] = static_cast<const uint16_t*>(p.bias.data) + p.bias.row_offset(b, h, rows[r]);
    if (has_mask)  // (bits: the row's first word, as a byte address)
      mask_rows[r] = static_cast<const uint8_t*>(p.mask.data) + (mask_in_bits ? 4 : 1) * p.mask.row_offset(b, h, rows[r]);
  }

  // The bias of a lane's scores in the slice at kv_start, as packed 16-bit
  // pairs; issued before the MMAs so that its latency hides behind them.
  auto load_bias = [&](uint32_t (&bias_bits)[2][Cfg::kTilesS], int kv_start) {
    const bool in_range = kv_start + Cfg::kSubCols <= p.Nk;  // no key of the slice past Nk
    if (has_bias) load_pairs(bias_bits, bias_rows, bias_one_row, kv_start + 2 * t, p.Nk, in_range && bias_pairs);
  };
  // The mask of a lane's scores in the slice at kv_start, as packed byte
  // pairs (none on an all-ones tile). The wgmma core issues them with the
  // bias, before it waits for K and V; the mma.sync core after its MMAs.
  // A bit-packed mask: the slice's raw words instead, kSubCols / 32 per row in
  // mask_bits[r][0..] (one 8- or 4-byte load; the rows are padded to whole
  // tiles, so no key clamp), turned into the byte pairs by expand_mask_bits
  // once they are needed (the wgmma core loads them before its MMAs).
  auto load_mask = [&](uint32_t (&mask_bits)[2][Cfg::kTilesS], int kv_start) {
    if constexpr (mask_in_bits) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (r == 1 && mask_one_row) {  // (row 1 is row 0's: left 0, as load_pairs does)
#pragma unroll
          for (int i = 0; i < Cfg::kSubCols / 32; ++i) mask_bits[1][i] = 0u;
          break;
        }
        const uint32_t* w = reinterpret_cast<const uint32_t*>(mask_rows[r]) + kv_start / 32;
        if constexpr (Cfg::kSubCols == 64) {
          const uint2 x = __ldg(reinterpret_cast<const uint2*>(w));
          mask_bits[r][0] = x.x;
          mask_bits[r][1] = x.y;
        } else {
          mask_bits[r][0] = __ldg(w);
        }
      }
    } else {
      const bool in_range = kv_start + Cfg::kSubCols <= p.Nk;
      load_pairs(mask_bits, mask_rows, mask_one_row, kv_start + 2 * t, p.Nk, in_range && mask_pairs);
    }
  };
  // The raw words of load_mask (bit-packed mask) as the byte pairs logits()
  // tests: pair n of row r = keys 8n + 2t, +1 of the slice, bits
  // 8 (n % 4) + 2t, +1 of word n / 4, moved to bits 0 and 8. In place, the
  // words copied first; every index static (no local memory).
  auto expand_mask_bits = [&](uint32_t (&bits)[2][Cfg::kTilesS]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t words[Cfg::kSubCols / 32];
#pragma unroll
      for (int w = 0; w < Cfg::kSubCols / 32; ++w) words[w] = bits[r][w];
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n) {
        const uint32_t x = words[n / 4] >> (8 * (n % 4) + 2 * t);
        bits[r][n] = (x & 1u) | (x & 2u) << 7;
      }
    }
  };
  // ---- 3. logits: scale, bias, softcap, mask (uniform branches, none per element)
  // get_mask(bits) fills the mask pairs where the tile is not all ones: a load
  // (mma.sync core) or the pairs loaded earlier (wgmma core).
  auto logits = [&](float (&S)[Cfg::kTilesS][4], const uint32_t (&bias_bits)[2][Cfg::kTilesS], int kv_start,
                    bool mask_full, auto&& get_mask) {
    if (has_bias) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // (row 1 of a query-broadcast bias is row 0: selected here, after
          // the MMAs, not at the load, which would wait for it)
          const float2 bv = unpack_pair<T>(r == 1 && bias_one_row ? bias_bits[0][n] : bias_bits[r][n]);
          S[n][2 * r] = fmaf(S[n][2 * r], p.scale, bv.x);
          S[n][2 * r + 1] = fmaf(S[n][2 * r + 1], p.scale, bv.y);
        }
    } else if (logit_pass) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[n][e] *= p.scale;
    }
    if (softcap > 0.f) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[n][e] = softcap * tanhf(S[n][e] * inv_softcap);
    }
    if (!mask_full) {  // -inf where the mask pair is 0 (no mask on all-ones tiles)
      uint32_t mask_bits[2][Cfg::kTilesS];
      get_mask(mask_bits);
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t mv = r == 1 && mask_one_row ? mask_bits[0][n] : mask_bits[r][n];
          if ((mv & 0xffu) == 0u) S[n][2 * r] = -INFINITY;
          if ((mv & 0xff00u) == 0u) S[n][2 * r + 1] = -INFINITY;
        }
    }
    mask_scores(S, dp, kv_start, q_start, row0, row0 + 8, t);  // past Nk; causal
  };
  auto is_full = [&](int tile) { return !has_mask || (full_bitmap[tile / 32] >> (tile % 32) & 1u); };

  if constexpr (Cfg::kWgmma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // ---- 2'. the wgmma core over the active tiles --------------------------------
    // Per tile i: K, V of tile i+1 are copied while tile i is computed (two
    // slots, as the mma.sync core); S = Q·K_iᵀ (wgmma, async; the bias loads
    // in flight meanwhile); logits and softmax; O += P·V_i. Two blocks per SM
    // keep the tensor cores busy while one of them is in its softmax.
    // Slower here (one warpgroup per block; docs/experiments.md): rung
    // 07's overlap (S_i issued with P_{i-1}·V_{i-1}, the softmax under that
    // P·V), and one barrier per tile with the next copies issued after it
    // (less time in flight).
    // K and V tiles by TMA where the host could build the tensor maps
    // (use_tma, uniform: 16-byte aligned bases): one thread issues D/64 box
    // copies per matrix onto the slot's mbarrier, everyone waits on its phase
    // — no per-thread copy instructions or addresses (rung 09's loads).
    // Otherwise cp.async by every thread, as the mma.sync core.
    __shared__ alignas(8) uint64_t kv_full[2];  // slot s: phase k completes with its k-th tile
    if (use_tma) {
      if (threadIdx.x == 0) {
        mbarrier_init(&kv_full[0], 1);
        mbarrier_init(&kv_full[1], 1);
        fence_mbarrier_init();
      }
      __syncthreads();
    }
    auto load_kv_wgmma = [&](int i, int tile) {  // K, V of `tile` into slot i % 2
      T* sKs = sK + (i % 2) * Bc * kStride;
      T* sVs = sV + (i % 2) * Bc * kStride;
      if (use_tma) {
        if (threadIdx.x == 0) {
          uint64_t* bar = &kv_full[i % 2];
          mbarrier_arrive_expect_tx(bar, 2 * Bc * D * sizeof(T));  // rows past Nk arrive as zeros, counted too
#pragma unroll
          for (int c = 0; c < D / 64; ++c) {  // one box per 64-column block of Sw128Blocks<Bc>
            tma_load_3d(sKs + c * Bc * 64, &tma_k, bar, c * 64, tile * Bc, int(kv_head));
            tma_load_3d(sVs + c * Bc * 64, &tma_v, bar, c * 64, tile * Bc, int(kv_head));
          }
        }
        cp_async_commit();  // two empty groups: the cp.async accounting below stays the same
        cp_async_commit();
        return;
      }
      load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sKs, Kg + int64_t(tile) * Bc * D, D, p.Nk - tile * Bc);
      cp_async_commit();
      load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sVs, Vg + int64_t(tile) * Bc * D, D, p.Nk - tile * Bc);
      cp_async_commit();
    };
    int tile = 0;
    if (n_active > 0) {
      tile = tile_at(0);
      load_tile_async<Br, D, Sw128Blocks<Br>, Cfg::kThreads>(sQ, q + (q_head * p.Nq + q_start) * D, D, p.Nq - q_start);
      load_kv_wgmma(0, tile);  // Q joins K's group
    }
    for (int i = 0; i < n_active; ++i) {
      const int next_tile = i + 1 < n_active ? tile_at(i + 1) : 0;
      if (i + 1 < n_active) load_kv_wgmma(i + 1, next_tile);
      else { cp_async_commit(); cp_async_commit(); }
      const bool mask_full = is_full(tile);
      // Bias and mask pairs issued now: their round trips (the mask's from
      // DRAM: it is read once) overlap the wait for K and V instead of
      // following the MMAs. No faster (the chain waits on K and V, not on the
      // mask), but fewer registers (196 instead of 212 at D = 128).
      uint32_t bias_bits[2][Cfg::kTilesS], mask_bits[2][Cfg::kTilesS];
      load_bias(bias_bits, tile * Bc);
      if (!mask_full) load_mask(mask_bits, tile * Bc);
      cp_async_wait<2>();          // K_i, V_i (and Q) have landed
      if (use_tma) mbarrier_wait(&kv_full[i % 2], (i / 2) & 1);  // TMA: K_i, V_i
      fence_proxy_async_shared();  // cp.async wrote Q (and K, V): wgmma reads through the async proxy
      __syncthreads();

      float S[Cfg::kTilesS][4];
      const T* sKi = sK + (i % 2) * Bc * kStride;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)  // k-step kk: 64-column block kk/4, 32 bytes on inside it
        wgmma_ss<T, Bc>(S, make_sw128_desc(sQ + (kk / 4) * Br * 64 + (kk % 4) * 16, 0, 1024),
                        make_sw128_desc(sKi + (kk / 4) * Bc * 64 + (kk % 4) * 16, 0, 1024), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(S);

      logits(S, bias_bits, tile * Bc, mask_full, [&](uint32_t (&bits)[2][Cfg::kTilesS]) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int n = 0; n < Cfg::kTilesS; ++n) bits[r][n] = mask_bits[r][n];
        if constexpr (mask_in_bits) expand_mask_bits(bits);
      });
      float alpha[2];
      online_softmax_scores(S, stats, softmax_scale_log2, alpha);
      // O *= alpha only where a row's maximum moved (alpha = exp2(0) = 1
      // exactly otherwise: the same bits, 64 multiplications fewer per
      // thread at D = 128). Decided per warp: the branch stays uniform.
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_output(O, alpha);
      uint32_t P[Cfg::kTilesS / 2][4];
      pack_p_fragments<T>(P, S);
      const T* sVi = sV + (i % 2) * Bc * kStride;
      wgmma_fence();  // O was just rescaled by the softmax
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk)  // 16 rows of V per step; its 64-column blocks Bc·128 bytes apart
        wgmma_rs_vt<T, D>(O, P[kk], make_sw128_desc(sVi + kk * 16 * 64, Bc * 128, 1024));
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(O);
      __syncthreads();  // slot i % 2 is refilled next iteration
      tile = next_tile;
    }
#else
    __trap();  // never launched: the host picks this core only on sm_90 with sm_90a code
#endif
  } else {
    // ---- 2. the mma.sync core: rung 02's stage2 loop over the active tiles ----
    if (n_active > 0)
      load_tile_async<Br, D, kStride, Cfg::kThreads>(sQ, q + (q_head * p.Nq + q_start) * D, D, p.Nq - q_start);
    // The tile index is carried one iteration ahead in a register, so that
    // neither the copies nor the bias loads wait on a shared-memory read after
    // the barrier.
    int tile = n_active > 0 ? tile_at(0) : 0;
    if (n_active > 0) load_kv(0, tile);
    for (int i = 0; i < n_active; ++i) {
      const int next_tile = i + 1 < n_active ? tile_at(i + 1) : 0;
      if (i + 1 < n_active) load_kv(i + 1, next_tile);
      else { cp_async_commit(); cp_async_commit(); }
      const bool mask_full = is_full(tile);
      cp_async_wait<2>();  // K and V of tile i (and Q) have landed
      __syncthreads();

      // The tile's keys in kSubTiles slices (one below D = 192, two of 32 above).
#pragma unroll 1
      for (int sub = 0; sub < Cfg::kSubTiles; ++sub) {
        const int key_off = sub * Cfg::kSubCols;  // in the tile
        const int kv_start = tile * Bc + key_off;
        uint32_t bias_bits[2][Cfg::kTilesS];
        load_bias(bias_bits, kv_start);
        float S[Cfg::kTilesS][4] = {};
        const T* sKj = sK + ((i % 2) * Bc + key_off) * kStride;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t a[4];
          load_a_fragment<kStride>(a, sQ + warp_row * kStride + kk * 16, lane);
          qk_slice<T, Cfg::kTilesS, kStride>(S, a, sKj + kk * 16, lane);
        }
        // (the mask pairs after the MMAs: registers)
        logits(S, bias_bits, kv_start, mask_full, [&](uint32_t (&bits)[2][Cfg::kTilesS]) {
          load_mask(bits, kv_start);
          if constexpr (mask_in_bits) expand_mask_bits(bits);
        });
        online_softmax_update(S, O, stats, softmax_scale_log2);
        pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(O, S, sV + ((i % 2) * Bc + key_off) * kStride, lane);
      }
      __syncthreads();  // slot i % 2 is refilled next iteration
      tile = next_tile;
    }
  }

  if (splits == 1) {
    store_output<T>(O, stats, dp, q_head, row0, /*col0=*/0, t, /*write_lse=*/true, o, lse);
    return;
  }
  // Split-KV: this split's normalised O and its LSE, in fp32, for the combine
  // kernel (partials: [splits][B·H][Nq][D] then [splits][B·H][Nq]). A split
  // that saw no key writes O = 0, LSE = -inf, and the combine ignores it.
  const int64_t rows_total = int64_t(p.B) * p.H * p.Nq;
  float* part_o = partials + (int64_t(split) * p.B * p.H + q_head) * p.Nq * D;
  float* part_lse = partials + int64_t(splits) * rows_total * D + (int64_t(split) * p.B * p.H + q_head) * p.Nq;
  float row_lse[2];
  online_softmax_finalize(O, stats, dp.scale, row_lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= p.Nq) continue;
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<float2*>(part_o + int64_t(row) * D + n * 8 + 2 * t) = make_float2(O[n][2 * r], O[n][2 * r + 1]);
    if (t == 0) part_lse[row] = row_lse[r];
  }
}

// ---- decoding: one query row, the active keys themselves ---------------------
// With Nq = 1 a 64 x 64 tile holds one real row: the tile kernel above runs
// its whole chain (K, V copy -> S -> softmax -> P·V) per active tile, and a
// top-1024 row of 512K keys leaves ~8 scattered active tiles in every split,
// one chain of latency after the other. Here a block lists the split's
// active *keys* (its row of the mask, kDecodeChunk keys per pass) and copies
// only their K and V rows, up to kDecodeBatch keys per step into shared
// memory (cp.async, the next batch's rows in flight while this one is
// computed): a sparse split is one round trip. Scores on the tensor cores —
// warp w takes keys 16w .. 16w + 15 of the step as mma.m16n8k16 with q as
// row 0 of A and the gathered K rows as B (a warp per key with a butterfly
// sum is slower than the tile kernel on dense masks) — then the online
// softmax per batch and O += p·V with each thread owning D/128 (rounded up)
// output columns. The split-KV partials and the combine are the tile
// kernel's. (The same gather appears in FlashInfer's sparse decode kernels,
// which page K/V by index.)
//   shared memory = 2 slots x 2 x kDecodeBatch x (D + 8) x 2 (K, V) + kDecodeChunk x 2 (list) + scores
//   D:  32 → 37696   64 → 54080   96 → 70464   128 → 86848   192 → 119616   256 → 152384 bytes
constexpr int kDecodeBatch = 64, kDecodeChunk = 8192, kDecodeThreads = 128;
static_assert(kDecodeBatch == 64 && kDecodeBatch == 16 * (kDecodeThreads / 32),
              "the softmax step: two keys per lane of one warp; the scores: 16 keys per warp");
// Gathered rows are padded by 8 halves (16 bytes) so that the ldmatrix of
// the scores' B operand reads eight rows from eight different bank groups.
template <int kHeadDim>
constexpr int dma_decode_smem_bytes() {
  return 2 * 2 * kDecodeBatch * (kHeadDim + 8) * 2 + kDecodeChunk * 2 + 3 * kDecodeBatch * 4 + 16 * 4;
}
static_assert(dma_decode_smem_bytes<32>() == 37696 && dma_decode_smem_bytes<64>() == 54080 &&
                  dma_decode_smem_bytes<128>() == 86848 && dma_decode_smem_bytes<256>() == 152384,
              "header: decode shared memory per head dim");
static_assert(dma_decode_smem_bytes<96>() == 70464 && dma_decode_smem_bytes<192>() == 119616,
              "header: decode shared memory per head dim");

template <int kHeadDim, typename T>
__global__ void __launch_bounds__(kDecodeThreads, 2)
dma_decode_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                  float* __restrict__ lse, const DynamicMaskProblem p, unsigned long long* counters,
                  float* __restrict__ partials, int splits, bool kv_vec, bool mask_vec) {
  constexpr int D = kHeadDim, kWarps = kDecodeThreads / 32, kStride = D + 8;
  constexpr int kCols = (D + kDecodeThreads - 1) / kDecodeThreads;  // O columns per thread
  constexpr int kKeysPerThread = kDecodeChunk / kDecodeThreads;      // mask bytes a thread lists (one tile)
  static_assert(kKeysPerThread == kDmaBc, "a thread's keys of a chunk are one 64-key tile");
  griddep_wait();
  griddep_launch_dependents();

  const int h = blockIdx.x, b = blockIdx.y / splits, split = blockIdx.y % splits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_head = int64_t(b) * p.H + h;
  const int64_t kv_head = int64_t(b) * p.Hkv + h / (p.H / p.Hkv);
  const T* Kg = k + kv_head * p.Nk * D;
  const T* Vg = v + kv_head * p.Nk * D;
  // This split's keys: the tile kernel's partition of the row's causal range
  // into 64-key tiles.
  const int key_limit = mask_scan::causal_key_end(p, 0);
  const SplitTiles my_tiles = dma_split_tiles((key_limit + kDmaBc - 1) / kDmaBc, splits, split);
  const int tile_begin = my_tiles.begin, tile_end = my_tiles.end;
  const int key_begin = tile_begin * kDmaBc, key_end = min(key_limit, tile_end * kDmaBc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sKV = reinterpret_cast<T*>(smem_raw);  // [slot][K, V][kDecodeBatch][kStride]
  uint16_t* list = reinterpret_cast<uint16_t*>(smem_raw + 2 * 2 * kDecodeBatch * kStride * sizeof(T));
  float* s_score = reinterpret_cast<float*>(list + kDecodeChunk);
  float* s_bias = s_score + kDecodeBatch;  // [slot][kDecodeBatch]
  int* s_warp = reinterpret_cast<int*>(s_bias + 2 * kDecodeBatch);  // [0, 4): the list's scan
  float* s_stats = reinterpret_cast<float*>(s_warp + 8);             // the batch's max and sum

  const uint8_t* mrow = static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, 0);
  const uint32_t* mrow_bits = static_cast<const uint32_t*>(p.mask.data) + p.mask.row_offset(b, h, 0);  // kBits
  const T* brow = p.bias.data != nullptr ? static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, 0) : nullptr;
  // The scores as mma.m16n8k16 with q as row 0 of A (rows 1-15 zero): lanes
  // 0-3 hold q's pairs (2t, 2t+1) and (2t+8, 2t+9) of every 16-dim k-step,
  // every other A register is zero.
  uint32_t qa[D / 16][2];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // (16-bit loads: Q need not be 4-byte aligned here)
    const uint16_t* qrow = reinterpret_cast<const uint16_t*>(q + q_head * D + kk * 16 + 2 * (lane % 4));
    const bool row0 = lane < 4;
    qa[kk][0] = row0 ? uint32_t(qrow[0]) | uint32_t(qrow[1]) << 16 : 0u;
    qa[kk][1] = row0 ? uint32_t(qrow[8]) | uint32_t(qrow[9]) << 16 : 0u;
  }
  const float softcap = p.softcap, inv_softcap = softcap > 0.f ? 1.f / softcap : 0.f;

  float m = -INFINITY, l = 0.f, acc[kCols] = {};
  unsigned long long tiles_active = 0;
  for (int chunk = key_begin; chunk < key_end; chunk += kDecodeChunk) {
    const int chunk_end = min(key_end, chunk + kDecodeChunk);
    // 1. This thread's 64 mask bytes (keys chunk + 64·tid ...): count, then
    // a block-wide exclusive scan of the counts, then the offsets in key order.
    const int k0 = chunk + threadIdx.x * kKeysPerThread;
    uint64_t nonzero = 0;  // bit i: key k0 + i is active
    if (p.mask_format == DmaMaskFormat::kBits) {
      // The tile's 64 bits are one 8-byte load (k0 is a multiple of 64), the
      // keys at or past chunk_end cut off.
      if (k0 < chunk_end) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(mrow_bits + k0 / 32));
        const int left = chunk_end - k0;
        nonzero = (uint64_t(x.y) << 32 | x.x) & (left >= 64 ? ~0ull : (uint64_t(1) << left) - 1ull);
      }
    } else {
      uint4 bytes[kKeysPerThread / 16];
#pragma unroll
      for (int c = 0; c < kKeysPerThread / 16; ++c) {
        const int kc = k0 + 16 * c;
        if (mask_vec && kc + 16 <= chunk_end) {
          bytes[c] = __ldg(reinterpret_cast<const uint4*>(mrow + kc));
        } else {
          uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
          for (int i = 0; i < 16; ++i)
            if (kc + i < chunk_end) w[i / 4] |= uint32_t(mrow[kc + i] != 0) << (8 * (i % 4));
          bytes[c] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
#pragma unroll
      for (int c = 0; c < kKeysPerThread / 16; ++c) {
        const uint32_t w[4] = {bytes[c].x, bytes[c].y, bytes[c].z, bytes[c].w};
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if ((w[i / 4] >> (8 * (i % 4))) & 0xffu) nonzero |= uint64_t(1) << (16 * c + i);
      }
    }
    const int count = __popcll(nonzero);
    int incl = count;  // inclusive scan over the warp, then over the warps
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int x = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += x;
    }
    if (lane == 31) s_warp[warp] = incl;
    tiles_active += __syncthreads_count(count > 0);
    int base = incl - count, n = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      base += w < warp ? s_warp[w] : 0;
      n += s_warp[w];
    }
    for (uint64_t bits = nonzero; bits != 0; bits &= bits - 1) list[base++] = uint16_t(k0 - chunk + __ffsll(bits) - 1);
    __syncthreads();  // the list is complete

    // 2. Batches of the listed keys: rows of batch j + 1 copied while j is computed.
    auto issue = [&](int slot, int first, int nb) {
      T* sK = sKV + slot * 2 * kDecodeBatch * kStride;
      T* sV = sK + kDecodeBatch * kStride;
      for (int c = threadIdx.x; c < nb * (D / 8); c += kDecodeThreads) {
        const int j = c / (D / 8), part = c % (D / 8);
        const int64_t key = chunk + list[first + j];
        if (kv_vec) {
          cp_async_16(sK + j * kStride + part * 8, Kg + key * D + part * 8, true);
          cp_async_16(sV + j * kStride + part * 8, Vg + key * D + part * 8, true);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            sK[j * kStride + part * 8 + e] = Kg[key * D + part * 8 + e];
            sV[j * kStride + part * 8 + e] = Vg[key * D + part * 8 + e];
          }
        }
      }
      cp_async_commit();
      if (threadIdx.x < nb)
        s_bias[slot * kDecodeBatch + threadIdx.x] = brow != nullptr ? float(brow[chunk + list[first + threadIdx.x]]) : 0.f;
    };
    if (n > 0) issue(0, 0, min(kDecodeBatch, n));
    for (int first = 0, slot = 0; first < n; first += kDecodeBatch, slot ^= 1) {
      const int nb = min(kDecodeBatch, n - first);
      if (first + kDecodeBatch < n) issue(slot ^ 1, first + kDecodeBatch, min(kDecodeBatch, n - first - kDecodeBatch));
      else cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();  // this batch's rows and biases are in
      const T* sK = sKV + slot * 2 * kDecodeBatch * kStride;
      const T* sV = sK + kDecodeBatch * kStride;
      // Warp w: keys 16w .. 16w + 15 of the step, two n8 tiles, D/16 k-steps;
      // B from the gathered K rows by ldmatrix (lane l: key 16w + 8(l/16) +
      // l%8, dims 16kk + 8((l/8)%2)). Rows past nb hold stale data: their
      // scores (columns of their own) are never stored.
      if (16 * warp < nb) {
        float sc[2][4] = {};
        const T* krow = sK + (16 * warp + (lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t bfrag[4];
          ldmatrix_x4(bfrag, krow + kk * 16);
          const uint32_t a[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
          mma_m16n8k16<T>(sc[0], a, bfrag[0], bfrag[1]);
          mma_m16n8k16<T>(sc[1], a, bfrag[2], bfrag[3]);
        }
        if (lane < 4) {  // row 0: keys 16w + 8n + 2·lane, +1
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = 16 * warp + 8 * n + 2 * lane + e;
              if (j < nb) {
                float s = fmaf(sc[n][e], p.scale, s_bias[slot * kDecodeBatch + j]);
                if (softcap > 0.f) s = softcap * tanhf(s * inv_softcap);
                s_score[j] = s;
              }
            }
        }
      }
      __syncthreads();  // the batch's scores
      // Warp 0, two keys per lane: the new running maximum, the batch's
      // probabilities p_j = exp(s_j - m_new) in place of the scores, their sum.
      if (warp == 0) {
        const float s0 = lane < nb ? s_score[lane] : -INFINITY, s1 = lane + 32 < nb ? s_score[lane + 32] : -INFINITY;
        float mx = fmaxf(m, fmaxf(s0, s1));  // finite: every listed key has a finite score
#pragma unroll
        for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float p0 = lane < nb ? expf(s0 - mx) : 0.f, p1 = lane + 32 < nb ? expf(s1 - mx) : 0.f;
        if (lane < nb) s_score[lane] = p0;
        if (lane + 32 < nb) s_score[lane + 32] = p1;
        float sum = p0 + p1;
#pragma unroll
        for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0) {
          s_stats[0] = mx;
          s_stats[1] = sum;
        }
      }
      __syncthreads();
      const float m_new = s_stats[0];
      const float alpha = expf(m - m_new);  // 0 on the first batch (m = -inf)
      l = l * alpha + s_stats[1];
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] *= alpha;
#pragma unroll 4
      for (int j = 0; j < nb; ++j) {
        const float pj = s_score[j];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int d = threadIdx.x + c * kDecodeThreads;
          if (d < D) acc[c] = fmaf(pj, float(sV[j * kStride + d]), acc[c]);
        }
      }
      m = m_new;
      __syncthreads();  // slot and scores are reused by the next batches
    }
  }
  if (counters != nullptr && threadIdx.x == 0) {
    atomicAdd(counters, tiles_active);
    atomicAdd(counters + 1, (unsigned long long)(tile_end - tile_begin));
  }
  // No key seen: O = 0, LSE = -inf (a split's partial likewise; the combine skips it).
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  const float row_lse = l > 0.f ? m + logf(l) : -INFINITY;
  if (splits == 1) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = threadIdx.x + c * kDecodeThreads;
      if (d < D) o[q_head * D + d] = T(acc[c] * inv_l);
    }
    if (threadIdx.x == 0) lse[q_head] = row_lse;
    return;
  }
  const int64_t rows_total = int64_t(p.B) * p.H;  // Nq = 1
  float* part_o = partials + (int64_t(split) * rows_total + q_head) * D;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int d = threadIdx.x + c * kDecodeThreads;
    if (d < D) part_o[d] = acc[c] * inv_l;
  }
  if (threadIdx.x == 0) partials[int64_t(splits) * rows_total * D + int64_t(split) * rows_total + q_head] = row_lse;
}

// Split-KV merge, one block per output row: O = Σ_s w_s·O_s / Σ_s w_s with
// w_s = exp(LSE_s - max LSE), LSE = max + log Σ w_s (FlashAttention's
// combine_attn_seqk_parallel does the same). All-(-inf) rows: O = 0, LSE = -inf.
// The threads first share the splits (max, weights into shared memory), then
// the (split, column) pairs: kCombineThreads / D groups of D threads, each
// group summing every G-th split with 8 loads in flight, then the groups'
// sums added in group order. (A serial chain of L2 round trips, one per split,
// cost more than the splits saved.)
// 256 threads for a few splits (many rows: short blocks), 512 for many.
template <typename T, int kCombineThreads>
__global__ void __launch_bounds__(kCombineThreads)
dma_combine_kernel(const float* __restrict__ partials, T* __restrict__ o, float* __restrict__ lse, int splits,
                   int64_t rows, int D) {
  extern __shared__ float combine_smem[];  // weights [splits], then group sums [groups][D]
  float* weight = combine_smem;
  float* group_sum = combine_smem + splits;
  __shared__ float scratch[kCombineThreads / 32];
  griddep_wait();  // launched overlapped with the forward kernel that writes the partials
  const int64_t row = blockIdx.x;
  const float* part_lse = partials + int64_t(splits) * rows * D;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) m = fmaxf(m, part_lse[int64_t(s) * rows + row]);
  m = block_allreduce<kCombineThreads / 32>(m, scratch, true);
  float total = 0.f;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) {
    const float l = part_lse[int64_t(s) * rows + row];
    weight[s] = l == -INFINITY ? 0.f : expf(l - m);
    total += weight[s];
  }
  total = block_allreduce<kCombineThreads / 32>(total, scratch, false);  // ends with a barrier: weight[] visible
  const int groups = kCombineThreads / D, group = threadIdx.x / D, d = threadIdx.x % D;
  if (group < groups) {
    float acc[8] = {};
    int s = group;
    for (; s + 7 * groups < splits; s += 8 * groups)
#pragma unroll
      for (int u = 0; u < 8; ++u)
        acc[u] += weight[s + u * groups] * partials[(int64_t(s + u * groups) * rows + row) * D + d];
    for (; s < splits; s += groups) acc[0] += weight[s] * partials[(int64_t(s) * rows + row) * D + d];
    float sum = 0.f;
#pragma unroll
    for (int u = 0; u < 8; ++u) sum += acc[u];
    group_sum[group * D + d] = sum;
  }
  __syncthreads();
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int c = threadIdx.x; c < D; c += kCombineThreads) {
    float sum = 0.f;
    for (int g = 0; g < groups; ++g) sum += group_sum[g * D + c];
    o[row * D + c] = T(sum * inv);
  }
  if (threadIdx.x == 0) lse[row] = total > 0.f ? m + logf(total) : -INFINITY;
}

#define DMA_HEAD_DIMS 32, 64, 96, 128, 192, 256
#define DMA_WGMMA_HEAD_DIMS 64, 128  // (D = 256: S, P and O of 64 keys exceed 255 registers by a few)

size_t dma_smem_bytes(int tile_bytes, int Nk) {
  const int n_tiles = (Nk + kDmaBc - 1) / kDmaBc;
  return size_t(tile_bytes) + dma_list_bytes(n_tiles) + 2 * 4 * size_t(dma_bitmap_words(n_tiles));
}

std::string operand_unsupported(const char* what, const BroadcastOperand& x, const DynamicMaskProblem& p) {
  if (x.data == nullptr) return "";
  const std::string w = what;
  if (x.b != 1 && x.b != p.B) return w + " batch dim must be 1 or B";
  if (x.h != 1 && x.h != p.H && x.h != p.Hkv) return w + " head dim must be 1, H or Hkv";
  if (x.q != 1 && x.q != p.Nq) return w + " query dim must be 1 or Nq";
  return "";
}

// One block per (query row, head, batch): counts the row's visible keys.
__global__ void count_visible_pairs_kernel(const DynamicMaskProblem p, unsigned long long* count) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int limit = p.Nk;  // keys < limit pass the causal rule
  if (p.causal) limit = int(max(int64_t(0), min(int64_t(p.Nk), int64_t(i) + (p.Nk - p.Nq) + 1)));
  int n = 0;
  if (p.mask.data == nullptr) {
    n = threadIdx.x == 0 ? limit : 0;
  } else if (p.mask_format == DmaMaskFormat::kBits) {  // a word per thread: the bits of keys < limit
    const uint32_t* row = static_cast<const uint32_t*>(p.mask.data) + p.mask.row_offset(b, h, i);
    for (int w = threadIdx.x; w * 32 < limit; w += blockDim.x) {
      const int left = limit - w * 32;
      n += __popc(row[w] & (left >= 32 ? ~0u : (1u << left) - 1u));
    }
  } else {
    const uint8_t* row = static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, i);
    for (int j = threadIdx.x; j < limit; j += blockDim.x) n += row[j] != 0;
  }
  for (int off = 16; off > 0; off /= 2) n += __shfl_xor_sync(0xffffffffu, n, off);
  if (threadIdx.x % 32 == 0 && n > 0) atomicAdd(count, (unsigned long long)n);
}

}  // namespace

cudaError_t dma_count_visible_pairs(const DynamicMaskProblem& p, unsigned long long* d_count, cudaStream_t stream) {
  if (p.Nq > 2147483647 || p.H > 65535 || p.B > 65535) return cudaErrorInvalidValue;
  count_visible_pairs_kernel<<<dim3(p.Nq, p.H, p.B), 256, 0, stream>>>(p, d_count);
  return cudaGetLastError();
}

std::string dma_forward_unsupported(const DynamicMaskProblem& p) {
  if (p.B < 1 || p.H < 1 || p.Hkv < 1 || p.Nq < 1 || p.Nk < 1) return "sizes must be >= 1";
  if (p.H % p.Hkv != 0) return "H must be a multiple of Hkv";
  if (p.H > 65535 || p.B > 65535) return "B and H must be <= 65535 (grid limits)";
  if (int64_t((p.Nq + kDmaBr - 1) / kDmaBr) * p.H > 2147483647) return "Nq / 64 x H exceeds the grid limit";
  if (!(p.softcap >= 0.f)) return "softcap must be >= 0";
  if ((p.Nk + kDmaBc - 1) / kDmaBc > 65535) return "Nk too large for the 16-bit tile list";
  if (std::string e = operand_unsupported("mask", p.mask, p); !e.empty()) return e;
  if (std::string e = operand_unsupported("bias", p.bias, p); !e.empty()) return e;
  if (std::string e = dma_mask_bits_unsupported(p); !e.empty()) return e;
  int tile_bytes = 0;
  if (!dispatch_head_dim<DMA_HEAD_DIMS>(p.D, [&](auto d) { tile_bytes = DmaConfig<decltype(d)::value>::kTileBytes; }))
    return "head dim " + std::to_string(p.D) + " not in " + head_dim_list<DMA_HEAD_DIMS>();
  return smem_unsupported(dma_smem_bytes(tile_bytes, p.Nk));
}

int dma_auto_splits(const DynamicMaskProblem& p) {
  const int sms = device_sm_count();
  const int64_t blocks = int64_t((p.Nq + kDmaBr - 1) / kDmaBr) * p.H * p.B;
  // Half the SMs busy already: the combine pass (one block per output row)
  // costs more than the extra parallelism saves (docs/experiments.md).
  if (2 * blocks >= sms) return 1;
  const int64_t tiles = (p.Nk + kDmaBc - 1) / kDmaBc;
  // Two blocks per SM, at most 128 splits, and at least 4 KV tiles per split.
  const int64_t want = (2 * int64_t(sms) + blocks - 1) / blocks;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, 128, tiles / 4})));
}

int dma_resolve_splits(const DynamicMaskProblem& p, int requested) {
  return requested > 0 ? requested : dma_auto_splits(p);
}

// Workspace: the mask summary (16-byte rounded), then the split-KV partials.
size_t dma_forward_workspace_bytes(const DynamicMaskProblem& p, int splits) {
  const size_t summary = (dma_mask_summary_bytes(p) + 15) / 16 * 16;
  if (splits <= 1) return summary;
  return summary + size_t(splits) * size_t(p.B) * p.H * p.Nq * size_t(p.D + 1) * sizeof(float);
}

// Below this many keys the automatic core for one query row is the tile kernel:
// a short row is a few tiles whatever the mask keeps, and the gather kernel's
// key list and per-step softmax cost more than the tiles it could skip (the
// gather kernel is slower up to 1024 keys, faster from 4096 on:
// docs/experiments.md).
constexpr int64_t kDmaGatherMinKeys = 2048;

std::string dma_forward_core_name(const DynamicMaskProblem& p, DmaCore requested) {
  if (requested == DmaCore::kMma) return "mma";
  // One query row with a mask: the key-gather decoding kernel (dma_decode_kernel),
  // requested, or automatic past kDmaGatherMinKeys keys.
  const bool gather_fits = p.Nq == 1 && p.mask.data != nullptr;
  if (requested == DmaCore::kGather) return gather_fits ? "gather" : "";
  if (requested == DmaCore::kAuto && gather_fits && p.Nk > kDmaGatherMinKeys) return "gather";
  static const bool hopper = hopper_wgmma_unsupported().empty();
  const bool wgmma = hopper && dispatch_head_dim<DMA_WGMMA_HEAD_DIMS>(p.D, [](auto) {});
  if (requested == DmaCore::kWgmma) return wgmma ? "wgmma" : "";
  if (requested == DmaCore::kWgmmaCpAsync) return wgmma ? "wgmma-cp.async" : "";
  return wgmma ? "wgmma" : "mma";
}

std::string dma_forward_mask_scan_name(const DynamicMaskProblem& p, DmaMaskScan requested, int splits,
                                       DmaCore core) {
  if (p.mask.data == nullptr) return "none";
  if (dma_forward_core_name(p, core) == "gather") return "in-kernel";  // it lists its row's keys itself
  if (requested == DmaMaskScan::kPrepass) return "prepass";
  if (requested == DmaMaskScan::kInKernel) return "in-kernel";
  if (requested == DmaMaskScan::kPipelined) return splits == 1 && p.mask.q > 1 ? "pipelined" : "prepass";
  // How many forward blocks would read each mask byte in-kernel: one per
  // query head, batch and (for a query-broadcast mask) query tile it serves.
  const int64_t readers = int64_t(p.mask.b == 1 ? p.B : 1) * (p.H / p.mask.h) *
                          (p.mask.q == 1 ? (p.Nq + kDmaBr - 1) / kDmaBr : 1);
  // In-kernel beats the pre-pass with up to two readers and rows up to 16K
  // keys; beyond, a block's scan (up to 2 MiB at L = 32K) is too long a
  // serial part, and with more readers the mask is read more than once
  // (docs/experiments.md). A bit-packed mask (an eighth of the bytes per
  // block) scans rows 8 times as long in-kernel (faster than the pipelined
  // pre-pass and the pre-pass at L = 16K and 32K).
  const int keys_per_block = (p.Nk + splits - 1) / splits;
  const int in_kernel_keys = p.mask_format == DmaMaskFormat::kBits ? 8 * 16384 : 16384;
  if (readers <= 2 && keys_per_block <= in_kernel_keys) return "in-kernel";
  // Longer rows: the pre-pass, pipelined with the forward where it can be
  // (one split, rows per query) and the mask is not shared by more than two
  // heads (where more share it, the plain pre-pass is faster). Pipelining
  // hides the forward's compute under the pre-pass's traffic; it loses a
  // little only where a sparse mask leaves little work to hide (W = 32).
  return readers <= 2 && splits == 1 && p.mask.q > 1 ? "pipelined" : "prepass";
}

namespace {

// The core request dma_forward runs: a.core, except that a short decoding row
// whose tensors the tile kernels cannot copy goes to the gather kernel, which
// copies K and V rows at any alignment.
DmaCore forward_core_request(const DynamicMaskProblem& p, const DmaForwardArgs& a) {
  const bool aligned =
      dma_aligned(a.q, 16) && dma_aligned(a.k, 16) && dma_aligned(a.v, 16) && dma_aligned(a.o, 16);
  const bool gather_instead =
      a.core == DmaCore::kAuto && !aligned && dma_forward_core_name(p, DmaCore::kGather) == "gather";
  return gather_instead ? DmaCore::kGather : a.core;
}

}  // namespace

const uint32_t* dma_forward_mask_summary(const DynamicMaskProblem& p, const DmaForwardArgs& a) {
  if (a.mask_summary != nullptr && p.mask.data != nullptr) return a.mask_summary;  // given: still this mask's
  const DmaCore requested = forward_core_request(p, a);
  const int splits = dma_resolve_splits(p, a.splits);
  const std::string scan = dma_forward_mask_scan_name(p, a.mask_scan, splits, requested);
  // The summary is the workspace's first part (dma_forward_workspace_bytes):
  // written by the pre-pass, or by the tile kernel's in-kernel scan where it
  // covers whole rows (one split; the gather core reads its row itself).
  const bool in_kernel_rows = scan == "in-kernel" && splits == 1 && dma_forward_core_name(p, requested) != "gather";
  const bool written = scan == "prepass" || scan == "pipelined" || in_kernel_rows;
  return written ? reinterpret_cast<const uint32_t*>(a.workspace) : nullptr;
}

int dma_resolve_prepass_chunks(const DynamicMaskProblem& p, int requested) {
  const int q_tiles = (p.Nq + kDmaBr - 1) / kDmaBr;
  const int want = requested > 0 ? std::min(requested, kDmaMaxPrepassChunks) : kDmaPrepassChunks;
  return std::max(1, std::min(want, q_tiles));
}

namespace {

// The pipelined pre-pass's side streams and events, one set per device,
// created on first use and kept (like cuBLAS's handles). Chunk c runs on side
// stream c — its pre-pass, then its forward — and stream c has a higher
// priority than stream c + 1 (as far as the device's priority levels go), so
// the block scheduler hands a free SM place to the earliest chunk's work:
// chunk c + 1's pre-pass fills what chunk c's leaves, without a gap at the
// kernel boundary, and chunk c's forward runs as soon as its bits exist,
// under the later chunks' memory traffic instead of after it. `lock` keeps
// two host threads from interleaving their records and waits on the events.
struct PrepassPipeline {
  std::mutex lock;
  bool ready = false, failed = false;
  cudaStream_t side[kDmaMaxPrepassChunks] = {};
  cudaEvent_t fork = nullptr, done[kDmaMaxPrepassChunks] = {};
};

PrepassPipeline* prepass_pipeline() {
  static std::mutex created_lock;
  static std::vector<PrepassPipeline*> per_device;
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceCount(&count) != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> guard(created_lock);
  if (per_device.empty()) per_device.assign(size_t(count), nullptr);
  if (device >= int(per_device.size())) return nullptr;
  if (per_device[device] == nullptr) per_device[device] = new PrepassPipeline;  // lives as long as the process
  PrepassPipeline* pl = per_device[device];
  if (!pl->ready && !pl->failed) {
    int least = 0, greatest = 0;
    bool ok = cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess;
    ok = ok && cudaEventCreateWithFlags(&pl->fork, cudaEventDisableTiming) == cudaSuccess;
    for (int c = 0; ok && c < kDmaMaxPrepassChunks; ++c)  // numerically lower = higher priority
      ok = cudaStreamCreateWithPriority(&pl->side[c], cudaStreamNonBlocking, std::min(least, greatest + c)) ==
               cudaSuccess &&
           cudaEventCreateWithFlags(&pl->done[c], cudaEventDisableTiming) == cudaSuccess;
    pl->ready = ok;
    pl->failed = !ok;
    if (!ok) cudaGetLastError();  // clear it: the caller falls back to the plain pre-pass
  }
  return pl->ready ? pl : nullptr;
}

}  // namespace

// (dmattn.h) Equal shares of the mask bytes: tile m's rows read keys up to
// their causal end (+1, so that a tile reading nothing still weighs a little).
std::vector<int> dma_prepass_chunk_bounds(const DynamicMaskProblem& p, int chunks) {
  const int q_tiles = (p.Nq + kDmaBr - 1) / kDmaBr;
  std::vector<double> prefix(size_t(q_tiles) + 1, 0.0);
  for (int m = 0; m < q_tiles; ++m) prefix[m + 1] = prefix[m] + double(mask_scan::causal_key_end(p, m)) + 1.0;
  std::vector<int> bounds(size_t(chunks) + 1, q_tiles);
  bounds[0] = 0;
  int m = 0;
  for (int c = 1; c < chunks; ++c) {
    const double target = prefix[q_tiles] * c / chunks;
    while (m < q_tiles && prefix[m + 1] <= target) ++m;
    bounds[c] = std::max(bounds[c - 1] + 1, std::min(m, q_tiles - (chunks - c)));  // every chunk >= 1 tile
    m = bounds[c];
  }
  return bounds;
}

cudaError_t dma_forward(const DynamicMaskProblem& p, const DmaForwardArgs& a, cudaStream_t stream) {
  if (!dma_forward_unsupported(p).empty()) return cudaErrorInvalidValue;
  const int splits = dma_resolve_splits(p, a.splits);
  if (splits > 65535 / p.B || splits > 4096) return cudaErrorInvalidValue;  // grid.y; combine weights in smem
  const size_t need = dma_forward_workspace_bytes(p, splits);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) return cudaErrorInvalidValue;
  const bool aligned = dma_aligned(a.q, 16) && dma_aligned(a.k, 16) && dma_aligned(a.v, 16) && dma_aligned(a.o, 16);
  const DmaCore requested = forward_core_request(p, a);  // (the gather core where the tile kernels cannot copy)
  const std::string core = dma_forward_core_name(p, requested);
  if (core.empty()) return cudaErrorInvalidValue;
  // A summary given (DmaForwardArgs::mask_summary): no scan at all (the
  // gather core reads its own row whatever it is given).
  const bool summary_given = a.mask_summary != nullptr && p.mask.data != nullptr && core != "gather";
  const std::string scan = summary_given ? "given" : dma_forward_mask_scan_name(p, a.mask_scan, splits, requested);
  const bool scan_in_kernel = scan == "in-kernel";
  uint32_t* summary_storage = reinterpret_cast<uint32_t*>(a.workspace);
  PrepassPipeline* pipeline = scan == "pipelined" ? prepass_pipeline() : nullptr;
  MaskSummary summary;
  cudaError_t err = cudaSuccess;
  if (summary_given)
    summary = dma_mask_summary_view(p, const_cast<uint32_t*>(a.mask_summary));  // read only
  else if (pipeline != nullptr)
    summary = dma_mask_summary_view(p, summary_storage);  // written chunk by chunk below
  else if (!scan_in_kernel)
    err = dma_summarize_mask(p, summary_storage, &summary, stream);
  // The in-kernel scan over whole rows (one split) writes the summary too, for
  // the backward (the kernel's view: where each row goes; the gather core,
  // below, returns before it).
  uint32_t* summary_out = nullptr;
  if (scan_in_kernel && splits == 1) {
    summary = dma_mask_summary_view(p, summary_storage);
    summary_out = summary_storage;
  }
  if (err != cudaSuccess) return err;
  float* partials = a.workspace ? a.workspace + (dma_mask_summary_bytes(p) + 15) / 16 * 4 : nullptr;
  err = cudaErrorInvalidValue;
  // Split-KV: the partials merged by LSE (after either kernel).
  auto combine_partials = [&](auto type) {
    using T = decltype(type);
    const int64_t rows = int64_t(p.B) * p.H * p.Nq;
    const bool many = splits > 16;
    const int threads = many ? 512 : 256;  // >= D: at least one group of D threads
    const size_t smem = (splits + size_t(threads / p.D) * p.D) * sizeof(float);
    auto combine = many ? dma_combine_kernel<T, 512> : dma_combine_kernel<T, 256>;
    return launch_with_smem_overlapped(combine, dim3(unsigned(rows)), threads, int(smem), stream, partials,
                                       static_cast<T*>(a.o), a.lse, splits, rows, p.D);
  };
  if (core == "gather") {
    const bool kv_vec = dma_aligned(a.k, 16) && dma_aligned(a.v, 16);
    dispatch_head_dim<DMA_HEAD_DIMS>(p.D, [&](auto d) {
      constexpr int Dh = decltype(d)::value;
      err = dispatch_dtype(p.dtype, [&](auto type) {
        using T = decltype(type);
        cudaError_t e = launch_with_smem_overlapped(
            dma_decode_kernel<Dh, T>, dim3(unsigned(p.H), unsigned(p.B * splits)), kDecodeThreads,
            dma_decode_smem_bytes<Dh>(), stream, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
            static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse, p, a.tile_counters, partials, splits, kv_vec,
            mask_scan::mask_vector_loads(p));
        if (e == cudaSuccess && splits > 1) e = combine_partials(T{});
        return e;
      });
    });
    return err;
  }
  // The tile kernels copy Q, K, V in 16-byte pieces and store O in pairs.
  if (!aligned) return cudaErrorInvalidValue;
  auto run = [&](auto cfg) {
    using Cfg = decltype(cfg);
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      const dim3 grid(unsigned((p.Nq + Cfg::kBr - 1) / Cfg::kBr) * unsigned(p.H), unsigned(p.B * splits));
      // The wgmma core's K and V tensor maps (a few microseconds of host
      // time); without them (misaligned bases, no driver entry point) it
      // copies with cp.async.
      CUtensorMap tma_k{}, tma_v{};
      bool use_tma = false;
      if constexpr (Cfg::kWgmma)
        use_tma = core == "wgmma" && encode_head_tiles<Cfg::kBc>(&tma_k, a.k, p.dtype, int64_t(p.B) * p.Hkv, p.Nk, p.D) &&
                  encode_head_tiles<Cfg::kBc>(&tma_v, a.v, p.dtype, int64_t(p.B) * p.Hkv, p.Nk, p.D);
      const int smem = int(dma_smem_bytes(Cfg::kTileBytes, p.Nk));
      if (pipeline != nullptr) {
        // Side stream c, after everything before on the caller's stream:
        // pre-pass of chunk c's query tiles, then their forward; the caller's
        // stream finally waits for every side stream. Plain launches (the
        // forward's griddep_wait is then a no-op), the shared-memory limit
        // set once.
        std::lock_guard<std::mutex> guard(pipeline->lock);
        const int chunks = dma_resolve_prepass_chunks(p, a.prepass_chunks);
        const std::vector<int> bounds = dma_prepass_chunk_bounds(p, chunks);
        auto kernel = p.mask_format == DmaMaskFormat::kBits ? dma_forward_kernel<Cfg, T, true>
                                                            : dma_forward_kernel<Cfg, T, false>;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e == cudaSuccess) e = cudaEventRecord(pipeline->fork, stream);
        int launched = 0;
        for (int c = 0; c < chunks && e == cudaSuccess; ++c) {
          cudaStream_t side = pipeline->side[c];
          e = cudaStreamWaitEvent(side, pipeline->fork, 0);
          if (e == cudaSuccess) e = dma_summarize_mask_tiles(p, summary_storage, bounds[c], bounds[c + 1], side);
          const dim3 chunk_grid(unsigned(bounds[c + 1] - bounds[c]) * unsigned(p.H), unsigned(p.B));
          if (e == cudaSuccess) {
            kernel<<<chunk_grid, Cfg::kThreads, smem, side>>>(
                static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                static_cast<T*>(a.o), a.lse, p, summary, a.tile_counters, partials, 1, tma_k, tma_v, use_tma, false,
                nullptr, bounds[c]);
            e = cudaGetLastError();
          }
          // Recorded even after an error, so that the join below covers
          // every side stream this call touched.
          const cudaError_t r = cudaEventRecord(pipeline->done[c], side);
          if (e == cudaSuccess) e = r;
          ++launched;
        }
        for (int c = 0; c < launched; ++c) {
          const cudaError_t j = cudaStreamWaitEvent(stream, pipeline->done[c], 0);
          if (e == cudaSuccess) e = j;
        }
        return e;
      }
      auto kernel = p.mask_format == DmaMaskFormat::kBits ? dma_forward_kernel<Cfg, T, true>
                                                          : dma_forward_kernel<Cfg, T, false>;
      cudaError_t e = launch_with_smem_overlapped(kernel, grid, Cfg::kThreads, smem, stream,
                                                  static_cast<const T*>(a.q), static_cast<const T*>(a.k),
                                                  static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse, p, summary,
                                                  a.tile_counters, partials, splits, tma_k, tma_v, use_tma,
                                                  scan_in_kernel, summary_out, 0);
      if (e == cudaSuccess && splits > 1) e = combine_partials(T{});
      return e;
    });
  };
  if (core != "mma")
    dispatch_head_dim<DMA_WGMMA_HEAD_DIMS>(p.D, [&](auto d) { run(DmaConfig<decltype(d)::value, true>{}); });
  else
    dispatch_head_dim<DMA_HEAD_DIMS>(p.D, [&](auto d) { run(DmaConfig<decltype(d)::value>{}); });
  return err;
}

}  // namespace attnlab
