// attnlab: the dynamic-mask forward's tile kernel, dma_forward_kernel
// (dmattn_fwd.cu's header says what it does; docs/dmattn_forward.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/dmattn_tiles.cuh"
#include "dmattn/fwd_config.cuh"
#include "dmattn/fwd_epilogue.cuh"
#include "dmattn/fwd_mainloop.cuh"
#include "dmattn/fwd_scores.cuh"
#include "dmattn/fwd_tile_list.cuh"

namespace attnlab {
namespace {

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

  // ---- 1. which KV tiles does any row of this block see? (fwd_tile_list.cuh) ----
  int n_active = tile_end - tile_begin;
  if (p.mask.data != nullptr)
    n_active = dma_fwd_list_active_tiles<Cfg, kMaskBits>(p, summary, b, h, m_block, tile_begin, tile_end,
                                                         scan_in_kernel, summary_out, active, bitmap, full_bitmap, warp,
                                                         lane);
  if (counters != nullptr && threadIdx.x == 0) {
    atomicAdd(counters, (unsigned long long)n_active);
    atomicAdd(counters + 1, (unsigned long long)(tile_end - tile_begin));
  }
  if (n_active == 0) {  // every row fully masked: O = 0, LSE = -inf, nothing loaded
    dma_fwd_store_empty<Cfg, T>(o, lse, partials, p, q_head, q_start, split, splits);
    return;
  }

  // ---- 2. the loop over the active tiles (fwd_mainloop.cuh), 3. their logits (fwd_scores.cuh)
  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  // The operands of the logits, uniform per block (DmaFwdScores refers to these).
  const float softcap = p.softcap, inv_softcap = p.softcap > 0.f ? 1.f / p.softcap : 0.f;
  // Uniform facts about the operands: one row for all queries (broadcast), and
  // whether key pairs are aligned single loads (Nk even, aligned bases).
  const bool has_bias = p.bias.data != nullptr, has_mask = p.mask.data != nullptr;
  const bool bias_one_row = p.bias.stride_q == 0, mask_one_row = p.mask.stride_q == 0;
  const bool bias_pairs = p.Nk % 2 == 0 && (reinterpret_cast<uintptr_t>(p.bias.data) & 3) == 0;
  const bool mask_pairs = p.Nk % 2 == 0 && (reinterpret_cast<uintptr_t>(p.mask.data) & 1) == 0;
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
      mask_rows[r] = static_cast<const uint8_t*>(p.mask.data) + (kMaskBits ? 4 : 1) * p.mask.row_offset(b, h, rows[r]);
  }
  const DmaFwdScores<Cfg, T, kMaskBits> scores{p, dp, q_start, row0, t, softcap, inv_softcap, has_bias, has_mask,
                                               bias_one_row, mask_one_row, bias_pairs, mask_pairs, logit_pass,
                                               softmax_scale_log2, bias_rows, mask_rows};
  const DmaActiveTiles tiles{p, active, full_bitmap, tile_begin, n_active, has_mask};
  const DmaFwdOperands<T> operands{p, sQ, sK, sV, q, q_head, q_start, Kg, Vg, kv_head};
  if constexpr (Cfg::kWgmma)
    dma_fwd_mainloop_wgmma<Cfg, T, kMaskBits>(O, stats, scores, tiles, operands, tma_k, tma_v, use_tma);
  else
    dma_fwd_mainloop_mma<Cfg, T, kMaskBits>(O, stats, scores, tiles, operands, warp_row, lane);

  // ---- 4. O and LSE (fwd_epilogue.cuh) ------------------------------------------
  dma_fwd_store<Cfg, T>(O, stats, dp, o, lse, partials, p, q_head, row0, t, split, splits);
}

}  // namespace
}  // namespace attnlab
