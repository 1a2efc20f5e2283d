// ============================================================================
// Rung 04 — split-Q + shared Q/K/V shared memory
// ============================================================================
// What changes against rung 03: Q is read from shared memory into registers
// once, before the KV loop, and its shared memory becomes the K/V ring. Every
// KV tile then reads only K and V from shared memory (rung 03 also re-read Q
// each tile: D/16 extra ldmatrix.x4 per warp per tile), and the block needs
// max(Q tile, ring) bytes instead of their sum.
// Where it is slower: Q costs D/4 more registers per thread per row tile
// (16 rows x D halves per warp). Only D = 64 still affords two row tiles per
// warp; at D = 96 and 128 a warp owns one, so every K/V fragment feeds one MMA
// instead of two, and the rung falls behind rung 03 there (docs/04_share_qkv.md).
//
// Per block: one Br-row tile of Q, loop over Bc-row tiles of K and V.
//   smem:  first [Br, D + 8] Q, then reused as [kStages][Bc, D + 8] K/V ring
//   Q:     [D/16][kMTiles][4] 32-bit registers per lane: the warp's rows, as A fragments
//   S, P:  [16·kMTiles, Bc] per warp in registers; O: [16·kMTiles, D] per warp
//
// Tile configurations (constexprs in ShareQKVConfig, checked below). stageN =
// N ring slots; with three, two K/V tiles are in flight while one is used.
//   D     Br   Bc  warps x rows  smem stage1  stage2  stage3
//   32   128   64    8 x 16        10240    10240   15360
//   64   128   64    4 x 32        18432    18432   27648
//   96   128   64    8 x 16        26624    26624   39936
//  128   128   64    8 x 16        34816    34816   52224
// D = 256 is not offered: Q's 64 more registers per thread do not fit next to
// the O and S that rung 02 already holds there.
// Registers: see docs/04_share_qkv.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128}; GQA/MQA (H a multiple of
// Hkv); any Nq, Nk >= 1; causal (bottom-right aligned) or not; writes O, LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 64 --variant 'share-*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "flash_attn/kv_ring.cuh"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {
namespace {

template <int kHeadDim>
struct ShareQKVTiles;  // two row tiles per warp only where Q's registers still fit
template <> struct ShareQKVTiles<32>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8, kMTiles = 1; };
template <> struct ShareQKVTiles<64>  { static constexpr int kBr = 128, kBc = 64, kWarps = 4, kMTiles = 2; };
template <> struct ShareQKVTiles<96>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8, kMTiles = 1; };
template <> struct ShareQKVTiles<128> { static constexpr int kBr = 128, kBc = 64, kWarps = 8, kMTiles = 1; };

template <int kHeadDim_, int kStages_>
struct ShareQKVConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // slots in the K/V ring
  static constexpr int kBr = ShareQKVTiles<kHeadDim>::kBr;
  static constexpr int kBc = ShareQKVTiles<kHeadDim>::kBc;
  static constexpr int kWarps = ShareQKVTiles<kHeadDim>::kWarps;
  static constexpr int kMTiles = ShareQKVTiles<kHeadDim>::kMTiles;  // m16 row tiles per warp
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowStride = kHeadDim + 8;
  // NEW: Q and the ring take turns in the same bytes.
  static constexpr int kSmemBytes = std::max(kBr, kStages * kBc) * kRowStride * 2;
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  static constexpr int kQSlices = kHeadDim / 16;  // A fragments of Q held in registers
  static_assert(kBr == kWarps * kRowsPerWarp, "the warps split the Br rows");
  static_assert(kStages >= 1 && kStages <= 3, "stage1 to stage3");
};

static_assert(ShareQKVConfig<32, 1>::kSmemBytes == 10240 && ShareQKVConfig<32, 2>::kSmemBytes == 10240 &&
                  ShareQKVConfig<32, 3>::kSmemBytes == 15360, "header: D=32");
static_assert(ShareQKVConfig<64, 1>::kSmemBytes == 18432 && ShareQKVConfig<64, 2>::kSmemBytes == 18432 &&
                  ShareQKVConfig<64, 3>::kSmemBytes == 27648, "header: D=64");
static_assert(ShareQKVConfig<96, 1>::kSmemBytes == 26624 && ShareQKVConfig<96, 2>::kSmemBytes == 26624 &&
                  ShareQKVConfig<96, 3>::kSmemBytes == 39936, "header: D=96");
static_assert(ShareQKVConfig<128, 1>::kSmemBytes == 34816 && ShareQKVConfig<128, 2>::kSmemBytes == 34816 &&
                  ShareQKVConfig<128, 3>::kSmemBytes == 52224, "header: D=128");
static_assert(ShareQKVConfig<32, 1>::kBr == 128 && ShareQKVConfig<32, 1>::kBc == 64 &&
                  ShareQKVConfig<32, 1>::kWarps == 8 && ShareQKVConfig<32, 1>::kRowsPerWarp == 16,
              "header: D=32 is Br 128 x Bc 64, 8 warps x 16 rows");
static_assert(ShareQKVConfig<64, 1>::kBr == 128 && ShareQKVConfig<64, 1>::kBc == 64 &&
                  ShareQKVConfig<64, 1>::kWarps == 4 && ShareQKVConfig<64, 1>::kRowsPerWarp == 32,
              "header: D=64 is Br 128 x Bc 64, 4 warps x 32 rows");
static_assert(ShareQKVConfig<96, 1>::kBr == 128 && ShareQKVConfig<96, 1>::kBc == 64 &&
                  ShareQKVConfig<96, 1>::kWarps == 8 && ShareQKVConfig<96, 1>::kRowsPerWarp == 16,
              "header: D=96 is Br 128 x Bc 64, 8 warps x 16 rows");
static_assert(ShareQKVConfig<128, 1>::kBr == 128 && ShareQKVConfig<128, 1>::kBc == 64 &&
                  ShareQKVConfig<128, 1>::kWarps == 8 && ShareQKVConfig<128, 1>::kRowsPerWarp == 16,
              "header: D=128 is Br 128 x Bc 64, 8 warps x 16 rows");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
share_qkv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                 float* __restrict__ lse, const AttnProblem p) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kRowStride;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest query tiles first
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kM = Cfg::kMTiles;
  const int row0 = q_start + warp * Cfg::kRowsPerWarp + lane / 4;  // row of c0, c1 in row tile 0
  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);  // first sQ [Br, kStride], then the ring

  float O[kM][Cfg::kTilesO][4] = {};
  RowStats stats[kM];
  const float scale_log2 = p.scale * kLog2e;

  // NEW: Q -> shared -> registers, once. Then its shared memory is free.
  uint32_t Q[Cfg::kQSlices][kM][4];  // A fragments: row tile m of the warp, 16 columns each
  if (n_kv_tiles > 0) {
    load_tile_async<Br, D, kStride, Cfg::kThreads>(smem, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < Cfg::kQSlices; ++kk)
#pragma unroll
      for (int m = 0; m < kM; ++m)
        load_a_fragment<kStride>(Q[kk][m], smem + (warp * Cfg::kRowsPerWarp + 16 * m) * kStride + kk * 16, lane);
    __syncthreads();  // every warp holds its Q before the ring overwrites it
  }
  // NEW: the ring lives where Q was.
  const KVRing<Cfg::kStages, Bc, D, kStride, Cfg::kThreads, T> ring{
      smem, k + kv_head * p.Nk * D, v + kv_head * p.Nk * D, p.Nk, 2 * n_kv_tiles};
  if (n_kv_tiles > 0) ring.prologue();

  for (int j = 0; j < n_kv_tiles; ++j) {
    // ---- S = Q · K_jᵀ, Q from registers ---------------------------------------
    const T* sK = ring.acquire(2 * j);
    float S[kM][Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < Cfg::kQSlices; ++kk) qk_slice<T, kM, Cfg::kTilesS, kStride>(S, Q[kk], sK + kk * 16, lane);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      mask_scores(S[m], p, j * Bc, q_start, row0 + 16 * m, row0 + 16 * m + 8, lane % 4);
      online_softmax_update(S[m], O[m], stats[m], scale_log2);
    }

    // ---- O += P · V_j -----------------------------------------------------------
    const T* sV = ring.acquire(2 * j + 1);
    pv_tile<T, kM, Cfg::kTilesS, Cfg::kTilesO, kStride>(O, S, sV, lane);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
    store_output<T>(O[m], stats[m], p, head, row0 + 16 * m, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
}

using ShareQkvHeadDims = EqualHeadDims<32, 64, 96, 128>;

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  ShareQkvHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = ShareQKVConfig<decltype(dims)::D, kStages>;
    err = launch_config<Cfg>(p, b, stream, [](auto cfg, auto type) {
      return share_qkv_kernel<decltype(cfg), decltype(type)>;
    });
  });
  return err;
}

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "share-qkv+stage" + std::to_string(kStages);
  v.rung = "04_share_qkv";
  v.unsupported_reason = rung_unsupported<ShareQKVConfig, kStages, ShareQkvHeadDims>;
  v.launch = launch<kStages>;
  v.describe = rung_describe<ShareQKVConfig, kStages, ShareQkvHeadDims>;
  return v;
}

}  // namespace

std::vector<Variant> make_share_qkv_variants() { return {make_variant<1>(), make_variant<2>(), make_variant<3>()}; }

}  // namespace attnlab
