// ============================================================================
// Rung 02 — split-Q (FlashAttention-2 style)
// ============================================================================
// What changes against rung 01 (split-KV): the warps of a block split the
// *query* rows instead of the key columns. Each warp owns whole rows of
// S = Q·Kᵀ, so the softmax row statistics (m_i, l_i) live in that warp's
// registers and P never leaves registers (the QKᵀ accumulator is fed straight
// back as the A operand of P·V). What goes away is the S/P exchange through
// shared memory: three barriers per KV tile (K_j landed, V_j landed, slot
// free) instead of rung 01's four; the one between the two matmuls waits only
// for V_j's copy. A warp owns kMTiles m16 row tiles: with two, every K and V
// fragment read from shared memory feeds two MMAs, halving the shared-memory
// reads per MMA (FlashAttention-2's layout).
//
// Per block: one Br-row tile of Q, loop over Bc-row tiles of K and V.
//   sQ: [Br, D + 8]   sK, sV: [kStages][Bc, D + 8]   halves (+8: ldmatrix conflict-free)
//   S, P: [16·kMTiles, Bc] per warp in registers; O: [16·kMTiles, D] per warp (fp32)
// stage1: one K/V buffer (V_j lands during S_j; K_{j+1} waits for P_j·V_j);
// stage2: two K/V buffers (tile j+1 is copied while tile j is computed).
//
// Tile configurations (constexprs in SplitQConfig, checked below). Bc = 32 at
// D = 128 and one row tile at D = 256 keep S and O within 255 registers.
//   D     Br   Bc  warps x rows  smem stage1  stage2
//   32   128   64    8 x 16        20480    30720
//   64   128   64    4 x 32        36864    55296
//   96   128   64    4 x 32        53248    79872
//  128   128   32    4 x 32        52224    69632
//  256    64   32    4 x 16        67584   101376
// split-q+swizzle+stage2: the same kernel with dense rows whose 16-byte chunks
// are XOR-swizzled (chunk c of row r at c ^ (r % 8)) instead of padded, for
// D ∈ {64, 128, 256}: smem 49152 / 65536 / 98304 bytes. Its bank conflicts
// against the padded layout (ncu) and the registers (ptxas): docs/02_split_q.md.
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128, 256}; GQA/MQA (H a multiple
// of Hkv); any Nq, Nk >= 1 (ragged last tiles are zero-filled and masked);
// causal (bottom-right aligned) or not; writes O and LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 64 --variant 'split-q*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>
#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/smem_layout.cuh"
#include "common/tile_copy.cuh"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {
namespace {

template <int kHeadDim>
struct SplitQTiles;  // Br, Bc and warps per head dim
template <> struct SplitQTiles<32>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8, kMTiles = 1; };
template <> struct SplitQTiles<64>  { static constexpr int kBr = 128, kBc = 64, kWarps = 4, kMTiles = 2; };
template <> struct SplitQTiles<96>  { static constexpr int kBr = 128, kBc = 64, kWarps = 4, kMTiles = 2; };
template <> struct SplitQTiles<128> { static constexpr int kBr = 128, kBc = 32, kWarps = 4, kMTiles = 2; };
template <> struct SplitQTiles<256> { static constexpr int kBr = 64,  kBc = 32, kWarps = 4, kMTiles = 1; };

template <int kHeadDim_, int kStages_, bool kSwizzle_ = false>
struct SplitQConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr bool kSwizzle = kSwizzle_;
  static constexpr int kBr = SplitQTiles<kHeadDim>::kBr;
  static constexpr int kBc = SplitQTiles<kHeadDim>::kBc;
  static constexpr int kWarps = SplitQTiles<kHeadDim>::kWarps;
  static constexpr int kMTiles = SplitQTiles<kHeadDim>::kMTiles;  // m16 row tiles per warp
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = 16 * kMTiles;  // kMTiles m16 MMA tiles of query rows
  // Shared rows padded by 8 halves, or dense with XOR-swizzled 16-byte chunks
  // (kernels/common/smem_layout.cuh): both keep ldmatrix free of bank conflicts.
  using Layout = std::conditional_t<kSwizzle, SwizzledRows<kHeadDim>, PaddedRows<kHeadDim>>;
  static constexpr int kRowStride = Layout::kStride;
  static constexpr int kSmemBytes = (kBr + 2 * kStages * kBc) * kRowStride * 2;
  // MMA tile counts per warp.
  static constexpr int kTilesS = kBc / 8;         // n8 tiles of S across Bc keys
  static constexpr int kTilesO = kHeadDim / 8;    // n8 tiles of O across D
  static_assert(kBr == kWarps * kRowsPerWarp, "the warps split the Br rows");
  static_assert(kHeadDim % 16 == 0 && kBc % 16 == 0, "D and Bc must be multiples of the MMA K (16)");
  static_assert(kStages == 1 || kStages == 2, "stage1 and stage2 only");
};

// The header table, checked against the code.
static_assert(SplitQConfig<32, 1>::kSmemBytes == 20480 && SplitQConfig<32, 2>::kSmemBytes == 30720, "header: D=32");
static_assert(SplitQConfig<64, 1>::kSmemBytes == 36864 && SplitQConfig<64, 2>::kSmemBytes == 55296, "header: D=64");
static_assert(SplitQConfig<96, 1>::kSmemBytes == 53248 && SplitQConfig<96, 2>::kSmemBytes == 79872, "header: D=96");
static_assert(SplitQConfig<128, 1>::kSmemBytes == 52224 && SplitQConfig<128, 2>::kSmemBytes == 69632, "header: D=128");
static_assert(SplitQConfig<256, 1>::kSmemBytes == 67584 && SplitQConfig<256, 2>::kSmemBytes == 101376, "header: D=256");
static_assert(SplitQConfig<64, 2, true>::kSmemBytes == 49152 && SplitQConfig<128, 2, true>::kSmemBytes == 65536 &&
                  SplitQConfig<256, 2, true>::kSmemBytes == 98304, "header: swizzled stage2");
static_assert(SplitQConfig<32, 1>::kBr == 128 && SplitQConfig<32, 1>::kBc == 64 &&
                  SplitQConfig<32, 1>::kWarps == 8 && SplitQConfig<32, 1>::kRowsPerWarp == 16,
              "header: D=32 is Br 128 x Bc 64, 8 warps x 16 rows");
static_assert(SplitQConfig<64, 1>::kBr == 128 && SplitQConfig<64, 1>::kBc == 64 &&
                  SplitQConfig<64, 1>::kWarps == 4 && SplitQConfig<64, 1>::kRowsPerWarp == 32,
              "header: D=64 is Br 128 x Bc 64, 4 warps x 32 rows");
static_assert(SplitQConfig<96, 1>::kBr == 128 && SplitQConfig<96, 1>::kBc == 64 &&
                  SplitQConfig<96, 1>::kWarps == 4 && SplitQConfig<96, 1>::kRowsPerWarp == 32,
              "header: D=96 is Br 128 x Bc 64, 4 warps x 32 rows");
static_assert(SplitQConfig<128, 1>::kBr == 128 && SplitQConfig<128, 1>::kBc == 32 &&
                  SplitQConfig<128, 1>::kWarps == 4 && SplitQConfig<128, 1>::kRowsPerWarp == 32,
              "header: D=128 is Br 128 x Bc 32, 4 warps x 32 rows");
static_assert(SplitQConfig<256, 1>::kBr == 64 && SplitQConfig<256, 1>::kBc == 32 &&
                  SplitQConfig<256, 1>::kWarps == 4 && SplitQConfig<256, 1>::kRowsPerWarp == 16,
              "header: D=256 is Br 64 x Bc 32, 4 warps x 16 rows");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
split_q_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
               float* __restrict__ lse, const AttnProblem p) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kStride = Cfg::kRowStride;
  using Layout = typename Cfg::Layout;

  // Heaviest query tiles first: under a causal mask the last tiles see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair

  const T* Qg = q + (head * p.Nq + q_start) * D;  // [Br, D] tile of this block
  const T* Kg = k + kv_head * p.Nk * D;              // [Nk, D]
  const T* Vg = v + kv_head * p.Nk * D;              // [Nk, D]

  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [Br, kStride]
  T* sK = sQ + Br * kStride;               // [kStages][Bc, kStride]
  T* sV = sK + kStages * Bc * kStride;     // [kStages][Bc, kStride]

  constexpr int kM = Cfg::kMTiles;
  // Global query row of the c0, c1 entries of row tile m: row0 + 16m (c2, c3: + 8).
  const int row0 = q_start + warp * Cfg::kRowsPerWarp + g;

  float O[kM][Cfg::kTilesO][4] = {};  // O_i: [16 kM, D] per warp, fp32
  RowStats stats[kM];
  const float scale_log2 = p.scale * kLog2e;

  auto load_kv = [&](int tile) {  // K then V of `tile`, as two commit groups
    const int slot = tile % kStages;
    const int rows = p.Nk - tile * Bc;
    load_tile_async<Bc, D, Layout, Cfg::kThreads>(sK + slot * Bc * kStride, Kg + int64_t(tile) * Bc * D, D, rows);
    cp_async_commit();
    load_tile_async<Bc, D, Layout, Cfg::kThreads>(sV + slot * Bc * kStride, Vg + int64_t(tile) * Bc * D, D, rows);
    cp_async_commit();
  };

  if (n_kv_tiles > 0) {
    // Q joins the first K group: one wait covers both.
    load_tile_async<Br, D, Layout, Cfg::kThreads>(sQ, Qg, D, p.Nq - q_start);
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_kv_tiles) load_kv(s);
      else { cp_async_commit(); cp_async_commit(); }
    }
  }

  for (int j = 0; j < n_kv_tiles; ++j) {
    const int prefetch = j + kStages - 1;
    if (prefetch < n_kv_tiles) load_kv(prefetch);
    else { cp_async_commit(); cp_async_commit(); }  // empty groups keep the count uniform

    // 2·kStages groups are in flight; the oldest is K_j (and Q on the first pass).
    cp_async_wait<2 * kStages - 1>();
    __syncthreads();

    // ---- S = Q · K_jᵀ   [16, Bc] per warp --------------------------------
    const T* sKj = sK + (j % kStages) * Bc * kStride;
    float S[kM][Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kM][4];  // Q[warp rows, 16kk .. 16kk+15], re-read from shared memory every tile
#pragma unroll
      for (int m = 0; m < kM; ++m)
        load_a_fragment<Layout>(a[m], sQ, warp * Cfg::kRowsPerWarp + 16 * m, kk * 16, lane);
      qk_slice<T, kM, Cfg::kTilesS, Layout>(S, a, sKj, kk * 16, lane);
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      // Keys past Nk (ragged last tile) and, if causal, after the diagonal: -inf.
      mask_scores(S[m], p, j * Bc, q_start, row0 + 16 * m, row0 + 16 * m + 8, t);
      // ---- online softmax: S -> P in place, rescale O ----------------------
      online_softmax_update(S[m], O[m], stats[m], scale_log2);
    }

    cp_async_wait<2 * kStages - 2>();  // V_j has landed
    __syncthreads();

    // ---- O += P · V_j  (P straight from registers as the A operand) ---------
    pv_tile<T, kM, Cfg::kTilesS, Cfg::kTilesO, Layout>(O, S, sV + (j % kStages) * Bc * kStride, 0, lane);
    __syncthreads();  // every warp is done with slot j % kStages before it is refilled
  }

  // ---- epilogue: O_i / l_i, LSE; rows past Nq are not written ---------------
#pragma unroll
  for (int m = 0; m < kM; ++m)
    store_output<T>(O[m], stats[m], p, head, row0 + 16 * m, /*col0=*/0, t, /*write_lse=*/true, o, lse);
}

using SplitQHeadDims = EqualHeadDims<32, 64, 96, 128, 256>;
using SplitQSwizzleHeadDims = EqualHeadDims<64, 128, 256>;  // the swizzle needs rows of 64k halves

template <int kHeadDim, int kStages>
using SplitQSwizzledConfig = SplitQConfig<kHeadDim, kStages, true>;

template <int kStages, bool kSwizzle = false>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;  // unsupported_reason() rejects other head dims first
  auto run = [&](auto dims) {
    using Cfg = SplitQConfig<decltype(dims)::D, kStages, kSwizzle>;
    err = launch_config<Cfg>(p, b, stream, [](auto cfg, auto type) {
      return split_q_kernel<decltype(cfg), decltype(type)>;
    });
  };
  if constexpr (kSwizzle) SplitQSwizzleHeadDims::dispatch(p.D, p.Dv, run);
  else SplitQHeadDims::dispatch(p.D, p.Dv, run);
  return err;
}

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "split-q+stage" + std::to_string(kStages);
  v.rung = "02_split_q";
  v.unsupported_reason = rung_unsupported<SplitQConfig, kStages, SplitQHeadDims>;
  v.launch = launch<kStages>;
  v.describe = rung_describe<SplitQConfig, kStages, SplitQHeadDims>;
  return v;
}

// The same kernel with dense, XOR-swizzled shared rows instead of padded ones
// (the bank-conflict comparison of docs/02_split_q.md).
Variant make_swizzled_variant() {
  Variant v;
  v.name = "split-q+swizzle+stage2";
  v.rung = "02_split_q";
  v.unsupported_reason = rung_unsupported<SplitQSwizzledConfig, 2, SplitQSwizzleHeadDims>;
  v.launch = launch<2, true>;
  v.describe = rung_describe<SplitQSwizzledConfig, 2, SplitQSwizzleHeadDims>;
  return v;
}

}  // namespace

std::vector<Variant> make_split_q_variants() { return {make_variant<1>(), make_variant<2>(), make_swizzled_variant()}; }

}  // namespace attnlab
