// ============================================================================
// Rung 06 — split-Q + Q·Kᵀ *and* P·V tiled along the head dim (ffpa-attn L1)
// ============================================================================
// What changes against rung 05 (tiling-qk): V no longer sits in shared memory
// as a whole [Bc, D] tile. It streams through the same small cp.async ring as
// the Q and K slices, as [Bc, Ks] column slices, and O += P·V_j is computed one
// slice at a time while P stays in registers for the whole KV tile. Every
// shared buffer is now O(Ks·(Br + Bc)), independent of D: every bucket fits an
// A100 too, and the bucket of 1024 affords 256-column slices.
// The warps are rung 05's: kWarpsM x kWarpsD, each warp of a row group owns a
// strided share of D, and the group adds its partial S bit-identically in sRed.
// Where it is slower: a KV tile costs 2·D/Ks pipeline steps instead of D/Ks
// (twice the __syncthreads), and at stage2 each V slice has one step of
// prefetch where rung 05's V columns land during the whole Q·Kᵀ phase, so it
// trails rung 05 up to D = 512 and leads at D = 1024 (docs/06_tiling_qkv.md).
// Against rung 02 at D <= 256 both tiling rungs lose (see rung 05).
//
// Per KV tile j (Bc keys), with n = ceil(D / Ks) slices of Ks head-dim columns:
//   steps 0 .. n-1:  slot <- Q[:, s·Ks ..], K_j[:, s·Ks ..];  S += Q_s · K_j,sᵀ
//   (S partials summed, masked, online softmax: P in registers, O rescaled)
//   steps n .. 2n-1: slot <- V_j[:, s·Ks ..];  O[:, s·Ks ..] += P · V_j,s
// stage1: one slot (each step waits for its own copy); stage2: two slots.
//
// Tile configurations per head-dim bucket (constexprs in TilingQkvConfig,
// checked below; a problem runs in the smallest bucket >= D):
//   bucket  Br   Bc  warps  Ks   smem stage1  smem stage2
//     64   128   64   8x1   64      27648        55296
//    128   128   64   8x1  128      52224       104448
//    256   128   64   8x1  128      52224       104448
//    512    64   64   4x2  128      67584       102400
//   1024    32   64   2x4  256      83456       134144
// smem = kStages·(Br + Bc)·(Ks + 8)·2 B, plus 16·Bc·4 B per warp for sRed when
// kWarpsD > 1. One block of 8 warps per SM. Registers: see docs/06_tiling_qkv.md.
//
// Supports: fp16, bf16; D = Dv, any multiple of 8 up to 1024; GQA/MQA (H a
// multiple of Hkv); any Nq, Nk >= 1; causal (bottom-right aligned) or not;
// writes O and LSE (fully masked rows: O = 0, LSE = -inf).
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 1024 --variant 'tiling-q*' --check --show-all
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
struct TilingQkvTiles;
template <> struct TilingQkvTiles<64>   { static constexpr int kBr = 128, kBc = 64, kWarpsM = 8, kWarpsD = 1, kSliceCols = 64; };
template <> struct TilingQkvTiles<128>  { static constexpr int kBr = 128, kBc = 64, kWarpsM = 8, kWarpsD = 1, kSliceCols = 128; };
template <> struct TilingQkvTiles<256>  { static constexpr int kBr = 128, kBc = 64, kWarpsM = 8, kWarpsD = 1, kSliceCols = 128; };
template <> struct TilingQkvTiles<512>  { static constexpr int kBr = 64,  kBc = 64, kWarpsM = 4, kWarpsD = 2, kSliceCols = 128; };
template <> struct TilingQkvTiles<1024> { static constexpr int kBr = 32,  kBc = 64, kWarpsM = 2, kWarpsD = 4, kSliceCols = 256; };

// Tiles defaults to the bucket's row above; another Tiles type gives another
// slice width or tile shape without touching the kernel.
template <int kHeadDimMax_, int kStages_, typename Tiles = TilingQkvTiles<kHeadDimMax_>>
struct TilingQkvConfig {
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
  // One pipeline slot holds a Q·Kᵀ slice (Q [Br, Ks] + K [Bc, Ks]); a V slice
  // [Bc, Ks] reuses the start of it.
  static constexpr int kSlotElems = (kBr + kBc) * kSliceStride;
  static constexpr int kSlotBytes = kSlotElems * 2;
  // Partial S of every warp, fp32, in fragment order (only when kWarpsD > 1).
  static constexpr int kRedBytes = kWarpsD > 1 ? kWarps * 16 * kBc * 4 : 0;
  static constexpr int kSmemBytes = kRedBytes + kStages * kSlotBytes;
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
  static_assert(kStages == 1 || kStages == 2, "stage1 and stage2 only");
};

// The header table, checked against the code.
static_assert(TilingQkvConfig<64, 1>::kSmemBytes == 27648 && TilingQkvConfig<64, 2>::kSmemBytes == 55296, "header: D<=64");
static_assert(TilingQkvConfig<128, 1>::kSmemBytes == 52224 && TilingQkvConfig<128, 2>::kSmemBytes == 104448, "header: D<=128");
static_assert(TilingQkvConfig<256, 1>::kSmemBytes == 52224 && TilingQkvConfig<256, 2>::kSmemBytes == 104448, "header: D<=256");
static_assert(TilingQkvConfig<512, 1>::kSmemBytes == 67584 && TilingQkvConfig<512, 2>::kSmemBytes == 102400, "header: D<=512");
static_assert(TilingQkvConfig<1024, 1>::kSmemBytes == 83456 && TilingQkvConfig<1024, 2>::kSmemBytes == 134144, "header: D<=1024");
static_assert(TilingQkvConfig<512, 2>::kORegs == 128 && TilingQkvConfig<1024, 2>::kORegs == 128, "header: O registers");
static_assert(TilingQkvConfig<64, 1>::kBr == 128 && TilingQkvConfig<64, 1>::kBc == 64 &&
                  TilingQkvConfig<64, 1>::kWarpsM == 8 && TilingQkvConfig<64, 1>::kWarpsD == 1 &&
                  TilingQkvConfig<64, 1>::kSliceCols == 64,
              "header: bucket 64 is Br 128 x Bc 64, 8x1 warps, Ks = 64");
static_assert(TilingQkvConfig<128, 1>::kBr == 128 && TilingQkvConfig<128, 1>::kBc == 64 &&
                  TilingQkvConfig<128, 1>::kWarpsM == 8 && TilingQkvConfig<128, 1>::kWarpsD == 1 &&
                  TilingQkvConfig<128, 1>::kSliceCols == 128,
              "header: bucket 128 is Br 128 x Bc 64, 8x1 warps, Ks = 128");
static_assert(TilingQkvConfig<256, 1>::kBr == 128 && TilingQkvConfig<256, 1>::kBc == 64 &&
                  TilingQkvConfig<256, 1>::kWarpsM == 8 && TilingQkvConfig<256, 1>::kWarpsD == 1 &&
                  TilingQkvConfig<256, 1>::kSliceCols == 128,
              "header: bucket 256 is Br 128 x Bc 64, 8x1 warps, Ks = 128");
static_assert(TilingQkvConfig<512, 1>::kBr == 64 && TilingQkvConfig<512, 1>::kBc == 64 &&
                  TilingQkvConfig<512, 1>::kWarpsM == 4 && TilingQkvConfig<512, 1>::kWarpsD == 2 &&
                  TilingQkvConfig<512, 1>::kSliceCols == 128,
              "header: bucket 512 is Br 64 x Bc 64, 4x2 warps, Ks = 128");
static_assert(TilingQkvConfig<1024, 1>::kBr == 32 && TilingQkvConfig<1024, 1>::kBc == 64 &&
                  TilingQkvConfig<1024, 1>::kWarpsM == 2 && TilingQkvConfig<1024, 1>::kWarpsD == 4 &&
                  TilingQkvConfig<1024, 1>::kSliceCols == 256,
              "header: bucket 1024 is Br 32 x Bc 64, 2x4 warps, Ks = 256");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
tiling_qkv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
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
  const int n_slices = (D + Ks - 1) / Ks;            // NEW: slices per matmul, <= kMaxSlices
  const int steps_per_tile = 2 * n_slices;           // Q·Kᵀ slices, then P·V slices

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sRed = reinterpret_cast<float*>(smem_raw);                 // [kWarps][16 x Bc] fp32, fragment order
  T* sSlots = reinterpret_cast<T*>(smem_raw + Cfg::kRedBytes);      // [kStages][kSlotElems]

  // Rows of this warp's fragments, as global query indices.
  const int row0 = q_start + wm * 16 + g;  // c0, c1
  const int row1 = row0 + 8;               // c2, c3

  float O[Cfg::kTilesO][4] = {};  // O_i: [16, D / kWarpsD] per warp, fp32 (strided columns, see header)
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;

  // ---- NEW: one cp.async pipeline over the slices of every KV tile ----------
  // Step s of tile j: s < n_slices copies Q[:, s·Ks..] and K_j[:, s·Ks..];
  // otherwise V_j[:, (s - n_slices)·Ks..]. Steps use the slots round-robin.
  int pf_tile = 0, pf_step = 0;  // the next step to copy
  auto issue_next = [&](T* slot) {
    if (pf_tile < n_kv_tiles) {
      const int kv_start = pf_tile * Bc;
      const T* kv_rows = (pf_step < n_slices ? Kg : Vg) + int64_t(kv_start) * D;
      if (pf_step < n_slices) {
        const int col = pf_step * Ks;
        load_slice_async<Br, Ks, kStride, kThreads>(slot, Qg + col, D, p.Nq - q_start, D - col);
        load_slice_async<Bc, Ks, kStride, kThreads>(slot + Br * kStride, kv_rows + col, D, p.Nk - kv_start, D - col);
      } else {
        const int col = (pf_step - n_slices) * Ks;
        load_slice_async<Bc, Ks, kStride, kThreads>(slot, kv_rows + col, D, p.Nk - kv_start, D - col);
      }
    }
    if (++pf_step == steps_per_tile) { pf_step = 0; ++pf_tile; }
  };
  int step = 0;  // steps consumed so far
  // Waits until this step's slot has landed for every thread and every warp is
  // done with the slot about to be refilled; returns this step's slot.
  auto begin_step = [&]() -> const T* {
    T* slot = sSlots + (step % kStages) * Cfg::kSlotElems;
    if constexpr (kStages == 1) {
      __syncthreads();  // every warp is done with the previous step (same slot)
      issue_next(slot);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    } else {
      cp_async_wait<kStages - 2>();  // this step's group (committed kStages-1 steps ago) has landed
      __syncthreads();               // ... for every thread; and step-1's slot is free again
      issue_next(sSlots + ((step + kStages - 1) % kStages) * Cfg::kSlotElems);
      cp_async_commit();             // possibly empty: keeps one group per step
    }
    ++step;
    return slot;
  };
  if (kStages > 1 && n_kv_tiles > 0)
    for (int s = 0; s < kStages - 1; ++s) {
      issue_next(sSlots + s * Cfg::kSlotElems);
      cp_async_commit();
    }

  for (int j = 0; j < n_kv_tiles; ++j) {
    // ---- S = Q · K_jᵀ, one Ks-wide slice at a time  [16, Bc] per warp ------
    // NEW: warp (wm, wd) takes columns [wd·Ks/kWarpsD, (wd+1)·Ks/kWarpsD) of
    // every slice, so with kWarpsD > 1 it holds a partial S over its share of D.
    float S[Cfg::kTilesS][4] = {};
#pragma unroll 1
    for (int s = 0; s < n_slices; ++s) {
      const T* slot = begin_step();
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

    // ---- NEW: O += P · V_j, one Ks-wide slice of V at a time ----------------
    // Unrolled: slice s updates the fixed registers O[s·kTilesOPerSlice ..].
#pragma unroll
    for (int s = 0; s < Cfg::kMaxSlices; ++s) {
      if (s < n_slices) {
        const T* sV = begin_step();  // V slice: [Bc, Ks]
        if (s * Ks + col0 < D) {
#pragma unroll
          for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
            for (int nd = 0; nd < kColsPerWarp / 16; ++nd) {
              uint32_t b[4];  // V rows 16kk .. 16kk+15, columns col0 + 16nd .. +15, transposed
              ldmatrix_x4_trans(b, sV + (kk * 16 + lane % 16) * kStride + col0 + nd * 16 + (lane / 16) * 8);
              mma_m16n8k16<T>(O[s * Cfg::kTilesOPerSlice + 2 * nd], P[kk], b[0], b[1]);
              mma_m16n8k16<T>(O[s * Cfg::kTilesOPerSlice + 2 * nd + 1], P[kk], b[2], b[3]);
            }
        }
      }
    }
  }

  // ---- epilogue: O_i / l_i, LSE; rows past Nq and columns past D not written
  store_output_sliced<T, Cfg::kMaxSlices, Cfg::kTilesOPerSlice, Ks>(O, stats, p, D, head, row0, col0, t,
                                                                    /*write_lse=*/wd == 0, o, lse);
}

#define TILING_QKV_BUCKETS 64, 128, 256, 512, 1024


// The config of a bucket with its default tiles (for the host helpers).
template <int kBucket, int kStages>
using TilingQkvBucketConfig = TilingQkvConfig<kBucket, kStages>;

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "tiling-qkv+stage" + std::to_string(kStages);
  v.rung = "06_tiling_qkv";
  v.unsupported_reason = bucket_unsupported<TilingQkvBucketConfig, kStages, TILING_QKV_BUCKETS>;
  v.launch = [](const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
    return bucket_launch<TilingQkvBucketConfig, kStages, TILING_QKV_BUCKETS>(
        p, b, stream, [](auto cfg, auto type) { return tiling_qkv_kernel<decltype(cfg), decltype(type)>; });
  };
  v.describe = bucket_describe<TilingQkvBucketConfig, kStages, TILING_QKV_BUCKETS>;
  return v;
}

}  // namespace

std::vector<Variant> make_tiling_qkv_variants() { return {make_variant<1>(), make_variant<2>()}; }

}  // namespace attnlab
