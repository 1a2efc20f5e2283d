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
#include "dmattn/fwd_tile_list.cuh"

namespace attnlab {
namespace {

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
                                                         scan_in_kernel, summary_out, active, bitmap, full_bitmap, warp, lane);
  if (counters != nullptr && threadIdx.x == 0) {
    atomicAdd(counters, (unsigned long long)n_active);
    atomicAdd(counters + 1, (unsigned long long)(tile_end - tile_begin));
  }
  if (n_active == 0) {  // every row fully masked: O = 0, LSE = -inf, nothing loaded
    dma_fwd_store_empty<Cfg, T>(o, lse, partials, p, q_head, q_start, split, splits);
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

  dma_fwd_store<Cfg, T>(O, stats, dp, o, lse, partials, p, q_head, row0, t, split, splits);
}

}  // namespace
}  // namespace attnlab
