// ============================================================================
// Rung 05 — split-Q + Q·Kᵀ tiled along the head dim (LeetCUDA tiling-qk)
// ============================================================================
// What changes against rung 02 (split-Q): rung 02 keeps Q [Br, D] and K_j, V_j
// [Bc, D] whole in shared memory and O as D/2 fp32 registers per thread, so it
// stops at D = 256. Here Q·Kᵀ is tiled along D: Q and K_j go through a small
// cp.async ring as [Br, Ks] and [Bc, Ks] column slices, S accumulates over the
// slices, and the Q/K buffers are O(Ks·(Br + Bc)) whatever D is. V_j is still
// loaded whole, [Bc, D]: its columns ride along with the Q/K slices, so they
// land during Q·Kᵀ, and P·V then runs over the whole head dim with no barrier.
// O still limits D (16 rows x D columns are D/2 registers per thread), so the
// warps are kWarpsM x kWarpsD: the kWarpsD warps of a row group share 16 rows,
// each keeps O for a strided D/kWarpsD of the columns and computes a partial S
// over them. The partials meet in shared memory (sRed) at a named barrier and
// are added in a fixed order, so every warp of the group holds bit-identical S,
// m_i, l_i and P without exchanging statistics. Block-wide, O is Br·D fp32 of
// the SM's 256 KB register file: Br = 64 at D = 512, Br = 32 at D = 1024.
// Where it is slower: against rung 02 at D <= 256, since Q is re-copied from L2
// for every KV tile and every slice ends with a barrier; it exists for the head
// dims rung 02 cannot run. The whole V tile makes shared memory grow with D.
// stage1: one slot, each step waits for its own slice; stage2: two, one in flight.
//
// Tile configurations per head-dim bucket (constexprs in TilingQkConfig,
// checked below; a problem runs in the smallest bucket >= D):
//   bucket  Br   Bc  warps  Ks   smem stage1  smem stage2
//     64   128   64   8x1   64      36864        64512
//    128   128   64   8x1  128      69632       121856
//    256   128   64   8x1  128      86016       138240
//    512    64   64   4x2  128     134144       168960
//   1024    32   64   2x4  128     190976       217088
// smem = kStages·(Br + Bc)·(Ks + 8)·2 B + Bc·(bucket + 8)·2 B, plus 16·Bc·4 B
// per warp for sRed when kWarpsD > 1. One block of 8 warps per SM.
// Registers: see docs/05_tiling_qk.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv, any multiple of 8 up to 1024 (an A100's 163 KB:
// up to 256 at stage2, 512 at stage1); GQA/MQA (H a multiple of Hkv); any Nq,
// Nk >= 1; causal (bottom-right) or not; writes O and LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 512 --variant 'tiling-q*' --check --show-all
// ============================================================================
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {
namespace {

// Tile shape per head-dim bucket: a problem runs in the smallest bucket >= D.
// kWarpsM x kWarpsD warps; each row group of kWarpsD warps owns 16 query rows.
template <int kHeadDimMax>
struct TilingQkTiles;
template <> struct TilingQkTiles<64>   { static constexpr int kBr = 128, kBc = 64, kWarpsM = 8, kWarpsD = 1, kSliceCols = 64; };
template <> struct TilingQkTiles<128>  { static constexpr int kBr = 128, kBc = 64, kWarpsM = 8, kWarpsD = 1, kSliceCols = 128; };
template <> struct TilingQkTiles<256>  { static constexpr int kBr = 128, kBc = 64, kWarpsM = 8, kWarpsD = 1, kSliceCols = 128; };
template <> struct TilingQkTiles<512>  { static constexpr int kBr = 64,  kBc = 64, kWarpsM = 4, kWarpsD = 2, kSliceCols = 128; };
template <> struct TilingQkTiles<1024> { static constexpr int kBr = 32,  kBc = 64, kWarpsM = 2, kWarpsD = 4, kSliceCols = 128; };

// Tiles defaults to the bucket's row above; another Tiles type gives another
// slice width or tile shape without touching the kernel.
template <int kHeadDimMax_, int kStages_, typename Tiles = TilingQkTiles<kHeadDimMax_>>
struct TilingQkConfig {
  static constexpr int kHeadDimMax = kHeadDimMax_;
  static constexpr int kStages = kStages_;
  static constexpr int kBr = Tiles::kBr;
  static constexpr int kBc = Tiles::kBc;
  static constexpr int kWarpsM = Tiles::kWarpsM;         // row groups of 16 query rows
  static constexpr int kWarpsD = Tiles::kWarpsD;         // warps sharing a row group, splitting D
  static constexpr int kWarps = kWarpsM * kWarpsD;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSliceCols = Tiles::kSliceCols;   // head-dim columns per pipeline slice
  static constexpr int kPad = 8;                          // halves appended to every shared row
  static constexpr int kSliceStride = kSliceCols + kPad;
  static constexpr int kMaxSlices = kHeadDimMax / kSliceCols;
  static constexpr int kColsPerWarp = kSliceCols / kWarpsD;  // of every slice, per warp
  // One pipeline slot holds a Q·Kᵀ slice: Q [Br, Ks] + K [Bc, Ks].
  static constexpr int kSlotElems = (kBr + kBc) * kSliceStride;
  static constexpr int kSlotBytes = kSlotElems * 2;
  // V_j, whole: [Bc, kHeadDimMax + 8], one buffer.
  static constexpr int kVStride = kHeadDimMax + kPad;
  static constexpr int kVBytes = kBc * kVStride * 2;
  // Partial S of every warp, fp32, in fragment order (only when kWarpsD > 1).
  static constexpr int kRedBytes = kWarpsD > 1 ? kWarps * 16 * kBc * 4 : 0;
  static constexpr int kSmemBytes = kRedBytes + kStages * kSlotBytes + kVBytes;
  // Register tiles per warp.
  static constexpr int kTilesS = kBc / 8;                       // n8 tiles of S over Bc keys
  static constexpr int kTilesOPerSlice = kColsPerWarp / 8;      // n8 tiles of O per slice
  static constexpr int kTilesO = kMaxSlices * kTilesOPerSlice;  // = kHeadDimMax / kWarpsD / 8
  static constexpr int kORegs = 4 * kTilesO;                    // fp32 O registers per thread

  static_assert(kBr == 16 * kWarpsM, "a row group owns one m16 tile of query rows");
  static_assert(kHeadDimMax % kSliceCols == 0, "the bucket is a whole number of slices");
  static_assert(kColsPerWarp % 16 == 0, "a warp takes whole k16 steps of Q·Kᵀ and n16 pairs of P·V per slice");
  static_assert(kBc % 16 == 0, "Bc must be a multiple of the MMA K (16)");
  static_assert(kORegs <= 128, "the O accumulator must leave room for S, P and addresses (no spills)");
  static_assert(kStages == 1 || kStages == 2, "stage1 and stage2 only (the cp.async group counts assume it)");
};

// The header table, checked against the code.
static_assert(TilingQkConfig<64, 1>::kSmemBytes == 36864 && TilingQkConfig<64, 2>::kSmemBytes == 64512, "header: D<=64");
static_assert(TilingQkConfig<128, 1>::kSmemBytes == 69632 && TilingQkConfig<128, 2>::kSmemBytes == 121856, "header: D<=128");
static_assert(TilingQkConfig<256, 1>::kSmemBytes == 86016 && TilingQkConfig<256, 2>::kSmemBytes == 138240, "header: D<=256");
static_assert(TilingQkConfig<512, 1>::kSmemBytes == 134144 && TilingQkConfig<512, 2>::kSmemBytes == 168960, "header: D<=512");
static_assert(TilingQkConfig<1024, 1>::kSmemBytes == 190976 && TilingQkConfig<1024, 2>::kSmemBytes == 217088, "header: D<=1024");
static_assert(TilingQkConfig<512, 2>::kORegs == 128 && TilingQkConfig<1024, 2>::kORegs == 128, "header: O registers");
static_assert(TilingQkConfig<64, 1>::kBr == 128 && TilingQkConfig<64, 1>::kBc == 64 &&
                  TilingQkConfig<64, 1>::kWarpsM == 8 && TilingQkConfig<64, 1>::kWarpsD == 1 &&
                  TilingQkConfig<64, 1>::kSliceCols == 64,
              "header: bucket 64 is Br 128 x Bc 64, 8x1 warps, Ks = 64");
static_assert(TilingQkConfig<128, 1>::kBr == 128 && TilingQkConfig<128, 1>::kBc == 64 &&
                  TilingQkConfig<128, 1>::kWarpsM == 8 && TilingQkConfig<128, 1>::kWarpsD == 1 &&
                  TilingQkConfig<128, 1>::kSliceCols == 128,
              "header: bucket 128 is Br 128 x Bc 64, 8x1 warps, Ks = 128");
static_assert(TilingQkConfig<256, 1>::kBr == 128 && TilingQkConfig<256, 1>::kBc == 64 &&
                  TilingQkConfig<256, 1>::kWarpsM == 8 && TilingQkConfig<256, 1>::kWarpsD == 1 &&
                  TilingQkConfig<256, 1>::kSliceCols == 128,
              "header: bucket 256 is Br 128 x Bc 64, 8x1 warps, Ks = 128");
static_assert(TilingQkConfig<512, 1>::kBr == 64 && TilingQkConfig<512, 1>::kBc == 64 &&
                  TilingQkConfig<512, 1>::kWarpsM == 4 && TilingQkConfig<512, 1>::kWarpsD == 2 &&
                  TilingQkConfig<512, 1>::kSliceCols == 128,
              "header: bucket 512 is Br 64 x Bc 64, 4x2 warps, Ks = 128");
static_assert(TilingQkConfig<1024, 1>::kBr == 32 && TilingQkConfig<1024, 1>::kBc == 64 &&
                  TilingQkConfig<1024, 1>::kWarpsM == 2 && TilingQkConfig<1024, 1>::kWarpsD == 4 &&
                  TilingQkConfig<1024, 1>::kSliceCols == 128,
              "header: bucket 1024 is Br 32 x Bc 64, 2x4 warps, Ks = 128");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
tiling_qk_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                 float* __restrict__ lse, const AttnProblem p) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc, Ks = Cfg::kSliceCols, kStages = Cfg::kStages;
  constexpr int kStride = Cfg::kSliceStride, kThreads = Cfg::kThreads;
  constexpr int kWarpsM = Cfg::kWarpsM, kWarpsD = Cfg::kWarpsD, kColsPerWarp = Cfg::kColsPerWarp;
  const int D = p.D;  // <= kHeadDimMax; columns past D are zero-filled and never stored

  // Heaviest query tiles first: under a causal mask the last tiles see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;                       // fragment row group and column pair
  const int wm = warp % kWarpsM, wd = warp / kWarpsM;         // NEW: row group, head-dim share
  const int col0 = wd * kColsPerWarp;                         // NEW: this warp's first column of every slice

  const T* Qg = q + (head * p.Nq + q_start) * D;  // [Br, D] tile of this block
  const T* Kg = k + kv_head * p.Nk * D;              // [Nk, D]
  const T* Vg = v + kv_head * p.Nk * D;              // [Nk, D]

  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);
  const int n_slices = (D + Ks - 1) / Ks;  // NEW: Q·Kᵀ slices per KV tile, <= kMaxSlices

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sRed = reinterpret_cast<float*>(smem_raw);                 // [kWarps][16 x Bc] fp32, fragment order
  T* sSlots = reinterpret_cast<T*>(smem_raw + Cfg::kRedBytes);      // [kStages][kSlotElems]
  T* sV = sSlots + kStages * Cfg::kSlotElems;                        // [Bc, kVStride]

  // Rows of this warp's fragments, as global query indices.
  const int row0 = q_start + wm * 16 + g;  // c0, c1
  const int row1 = row0 + 8;               // c2, c3

  float O[Cfg::kTilesO][4] = {};  // O_i: [16, D / kWarpsD] per warp, fp32 (strided columns, see header)
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;

  // ---- NEW: a cp.async pipeline over the Q·Kᵀ slices of every KV tile ------
  // Step s of tile j copies Q[:, s·Ks..] and K_j[:, s·Ks..]; steps use the
  // slots round-robin. Columns s·Ks.. of V_j ride along (see begin_step).
  int pf_tile = 0, pf_step = 0;  // the next step to copy
  auto issue_next = [&](T* slot) {
    if (pf_tile < n_kv_tiles) {
      const int kv_start = pf_tile * Bc, col = pf_step * Ks;
      load_slice_async<Br, Ks, kStride, kThreads>(slot, Qg + col, D, p.Nq - q_start, D - col);
      load_slice_async<Bc, Ks, kStride, kThreads>(slot + Br * kStride, Kg + int64_t(kv_start) * D + col, D,
                                                  p.Nk - kv_start, D - col);
    }
    if (++pf_step == n_slices) { pf_step = 0; ++pf_tile; }
  };
  auto issue_v = [&](int tile, int s) {  // V_tile[:, s·Ks .. s·Ks + Ks) into sV
    const int kv_start = tile * Bc, col = s * Ks;
    load_slice_async<Bc, Ks, Cfg::kVStride, kThreads>(sV + col, Vg + int64_t(kv_start) * D + col, D,
                                                      p.Nk - kv_start, D - col);
  };
  int step = 0;  // steps consumed so far
  // Waits until this step's slot has landed for every thread and every warp is
  // done with the slot about to be refilled (and, at s = 0, with sV), then
  // starts the copy of V_j's columns of this slice. Returns this step's slot.
  auto begin_step = [&](int j, int s) -> const T* {
    T* slot = sSlots + (step % kStages) * Cfg::kSlotElems;
    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with the previous step (same slot)
      issue_next(slot);
      cp_async_commit();
      cp_async_wait<0>();  // also V_j's previous columns
      __syncthreads();
      issue_v(j, s);       // lands while this slice is computed
      cp_async_commit();
    } else {
      cp_async_wait<0>();  // this step's slice (and V_j's previous columns) landed
      __syncthreads();     // ... for every thread; step-1's slot is free again
      issue_v(j, s);       // V first: the P·V wait below may then leave the prefetch in flight
      cp_async_commit();
      issue_next(sSlots + ((step + 1) % kStages) * Cfg::kSlotElems);
      cp_async_commit();   // possibly empty: keeps the group count uniform
    }
    ++step;
    return slot;
  };
  if (kStages > 1 && n_kv_tiles > 0) {
    issue_next(sSlots);
    cp_async_commit();
  }

  for (int j = 0; j < n_kv_tiles; ++j) {
    // ---- S = Q · K_jᵀ, one Ks-wide slice at a time  [16, Bc] per warp ------
    // NEW: warp (wm, wd) takes columns [wd·Ks/kWarpsD, (wd+1)·Ks/kWarpsD) of
    // every slice, so with kWarpsD > 1 it holds a partial S over its share of D.
    float S[Cfg::kTilesS][4] = {};
#pragma unroll 1
    for (int s = 0; s < n_slices; ++s) {
      const T* slot = begin_step(j, s);
      const T* sQ = slot + wm * 16 * kStride;  // Q slice rows of this row group: [16, Ks]
      const T* sK = slot + Br * kStride;       // K slice: [Bc, Ks]
      if (s * Ks + col0 < D) {  // a share wholly past D is zeros: skip it (one uniform branch)
#pragma unroll
        for (int i = 0; i < kColsPerWarp / 16; ++i) {
          uint32_t a[4];
          load_a_fragment<kStride>(a, sQ + col0 + i * 16, lane);
          qk_slice<T, Cfg::kTilesS, kStride>(S, a, sK + col0 + i * 16, lane);
        }
      }
    }

    // ---- NEW: S = sum of the kWarpsD partials, through shared memory --------
    // sRed is rewritten only after the next tile's Q·Kᵀ, i.e. after the
    // __syncthreads before P·V below: no second barrier needed.
    if constexpr (kWarpsD > 1) sum_partial_scores<Cfg::kTilesS, kWarpsM, kWarpsD>(S, sRed, warp, wm, wd, lane);
    // Keys past Nk (ragged last tile) and, if causal, after the diagonal: -inf.
    mask_scores(S, p, j * Bc, q_start, row0, row1, t);

    // ---- online softmax: S -> P in place, rescale O ------------------------
    online_softmax_update(S, O, stats, scale_log2);
    uint32_t P[Bc / 16][4];  // P as 16-bit A fragments: [16, Bc], k16 step kk in P[kk]
    pack_p_fragments<T>(P, S);

    // ---- O += P · V_j over the whole head dim ------------------------------
    // Every column of V_j has landed once the newest group (stage2: the
    // prefetch of the next tile's first slice) is the only one in flight.
    cp_async_wait<kStages == 1 ? 0 : 1>();
    __syncthreads();
    // Unrolled: columns s·Ks.. update the fixed registers O[s·kTilesOPerSlice ..].
#pragma unroll
    for (int s = 0; s < Cfg::kMaxSlices; ++s) {
      if (s * Ks + col0 < D) {
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
          for (int nd = 0; nd < kColsPerWarp / 16; ++nd) {
            uint32_t b[4];  // V rows 16kk .. 16kk+15, columns s·Ks + col0 + 16nd .. +15, transposed
            ldmatrix_x4_trans(b, sV + (kk * 16 + lane % 16) * Cfg::kVStride + s * Ks + col0 + nd * 16 + (lane / 16) * 8);
            mma_m16n8k16<T>(O[s * Cfg::kTilesOPerSlice + 2 * nd], P[kk], b[0], b[1]);
            mma_m16n8k16<T>(O[s * Cfg::kTilesOPerSlice + 2 * nd + 1], P[kk], b[2], b[3]);
          }
      }
    }
    // No barrier here: the next tile's first step has one before sV is refilled.
  }

  // ---- epilogue: O_i / l_i, LSE; rows past Nq and columns past D not written
  store_output_sliced<T, Cfg::kMaxSlices, Cfg::kTilesOPerSlice, Ks>(O, stats, p, D, head, row0, col0, t,
                                                                    /*write_lse=*/wd == 0, o, lse);
}

#define TILING_QK_BUCKETS 64, 128, 256, 512, 1024


// The config of a bucket with its default tiles (for the host helpers).
template <int kBucket, int kStages>
using TilingQkBucketConfig = TilingQkConfig<kBucket, kStages>;

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "tiling-qk+stage" + std::to_string(kStages);
  v.rung = "05_tiling_qk";
  v.unsupported_reason = bucket_unsupported<TilingQkBucketConfig, kStages, TILING_QK_BUCKETS>;
  v.launch = [](const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
    return bucket_launch<TilingQkBucketConfig, kStages, TILING_QK_BUCKETS>(
        p, b, stream, [](auto cfg, auto type) { return tiling_qk_kernel<decltype(cfg), decltype(type)>; });
  };
  v.describe = bucket_describe<TilingQkBucketConfig, kStages, TILING_QK_BUCKETS>;
  return v;
}

}  // namespace

std::vector<Variant> make_tiling_qk_variants() { return {make_variant<1>(), make_variant<2>()}; }

}  // namespace attnlab
