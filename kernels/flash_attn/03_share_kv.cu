// ============================================================================
// Rung 03 — split-Q + shared K/V shared memory
// ============================================================================
// What changes against rung 02: K and V stop having buffers of their own. They
// stream through one ring of shared-memory slots in the order the loop uses
// them — K_0, V_0, K_1, V_1, ... (kv_ring.cuh). With two slots, V_j lands
// while S_j = Q·K_jᵀ runs and K_{j+1} lands while P_j·V_j runs: the
// same overlap as rung 02's stage2, in two tiles of memory instead of four,
// and with two barriers per KV tile instead of three. Less shared memory per
// block lets more blocks share an SM when registers allow it.
// Where it is slower: two slots keep one item in flight where rung 02's stage2
// keeps a whole K/V tile, and rung 02's blocks per SM are set by registers,
// not shared memory, so the memory saved buys no occupancy: expect it a little
// behind rung 02 (docs/03_share_kv.md). With one slot (stage1) nothing
// overlaps at all — V_j can only be fetched once every warp is done with K_j.
//
// Per block: one Br-row tile of Q, loop over Bc-row tiles of K and V.
//   sQ:    [Br, D + 8]             halves, loaded once, re-read every tile
//   sRing: [kStages][Bc, D + 8]    halves, K_j and V_j in turn
//   S, P:  [16·kMTiles, Bc] per warp in registers; O: [16·kMTiles, D] per warp
//
// Tile configurations (constexprs in ShareKVConfig, checked below); rows per
// warp as in rung 02 (two m16 row tiles where registers allow):
// stageN = N ring slots; with three, two K/V tiles are in flight at a time.
//   D     Br   Bc  warps x rows  smem stage1  stage2  stage3
//   32   128   64    8 x 16        15360    20480   25600
//   64   128   64    4 x 32        27648    36864   46080
//   96   128   32    4 x 32        33280    39936   46592
//  128   128   32    4 x 32        43520    52224   60928
//  256    64   32    4 x 16        50688    67584   84480
// Registers: see docs/03_share_kv.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128, 256}; GQA/MQA (H a multiple
// of Hkv); any Nq, Nk >= 1; causal (bottom-right aligned) or not; writes O and
// LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 64 --variant 'share-kv*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
struct ShareKVTiles;  // the same tiles as rung 02, so only the buffering differs
template <> struct ShareKVTiles<32>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8, kMTiles = 1; };
template <> struct ShareKVTiles<64>  { static constexpr int kBr = 128, kBc = 64, kWarps = 4, kMTiles = 2; };
template <> struct ShareKVTiles<96>  { static constexpr int kBr = 128, kBc = 32, kWarps = 4, kMTiles = 2; };
template <> struct ShareKVTiles<128> { static constexpr int kBr = 128, kBc = 32, kWarps = 4, kMTiles = 2; };
template <> struct ShareKVTiles<256> { static constexpr int kBr = 64,  kBc = 32, kWarps = 4, kMTiles = 1; };

template <int kHeadDim_, int kStages_>
struct ShareKVConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // slots in the K/V ring
  static constexpr int kBr = ShareKVTiles<kHeadDim>::kBr;
  static constexpr int kBc = ShareKVTiles<kHeadDim>::kBc;
  static constexpr int kWarps = ShareKVTiles<kHeadDim>::kWarps;
  static constexpr int kMTiles = ShareKVTiles<kHeadDim>::kMTiles;  // m16 row tiles per warp
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowStride = kHeadDim + 8;
  // NEW: Q plus kStages ring slots (rung 02: Q plus kStages K and kStages V buffers).
  static constexpr int kSmemBytes = (kBr + kStages * kBc) * kRowStride * 2;
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  static constexpr int kRowsPerWarp = 16 * kMTiles;  // kMTiles m16 MMA tiles of query rows
  static_assert(kBr == kWarps * kRowsPerWarp, "the warps split the Br rows");
  static_assert(kStages >= 1 && kStages <= 3, "stage1 to stage3");
};

static_assert(ShareKVConfig<32, 1>::kSmemBytes == 15360 && ShareKVConfig<32, 2>::kSmemBytes == 20480 &&
                  ShareKVConfig<32, 3>::kSmemBytes == 25600, "header: D=32");
static_assert(ShareKVConfig<64, 1>::kSmemBytes == 27648 && ShareKVConfig<64, 2>::kSmemBytes == 36864 &&
                  ShareKVConfig<64, 3>::kSmemBytes == 46080, "header: D=64");
static_assert(ShareKVConfig<96, 1>::kSmemBytes == 33280 && ShareKVConfig<96, 2>::kSmemBytes == 39936 &&
                  ShareKVConfig<96, 3>::kSmemBytes == 46592, "header: D=96");
static_assert(ShareKVConfig<128, 1>::kSmemBytes == 43520 && ShareKVConfig<128, 2>::kSmemBytes == 52224 &&
                  ShareKVConfig<128, 3>::kSmemBytes == 60928, "header: D=128");
static_assert(ShareKVConfig<256, 1>::kSmemBytes == 50688 && ShareKVConfig<256, 2>::kSmemBytes == 67584 &&
                  ShareKVConfig<256, 3>::kSmemBytes == 84480, "header: D=256");
static_assert(ShareKVConfig<32, 1>::kBr == 128 && ShareKVConfig<32, 1>::kBc == 64 &&
                  ShareKVConfig<32, 1>::kWarps == 8 && ShareKVConfig<32, 1>::kRowsPerWarp == 16,
              "header: D=32 is Br 128 x Bc 64, 8 warps x 16 rows");
static_assert(ShareKVConfig<64, 1>::kBr == 128 && ShareKVConfig<64, 1>::kBc == 64 &&
                  ShareKVConfig<64, 1>::kWarps == 4 && ShareKVConfig<64, 1>::kRowsPerWarp == 32,
              "header: D=64 is Br 128 x Bc 64, 4 warps x 32 rows");
static_assert(ShareKVConfig<96, 1>::kBr == 128 && ShareKVConfig<96, 1>::kBc == 32 &&
                  ShareKVConfig<96, 1>::kWarps == 4 && ShareKVConfig<96, 1>::kRowsPerWarp == 32,
              "header: D=96 is Br 128 x Bc 32, 4 warps x 32 rows");
static_assert(ShareKVConfig<128, 1>::kBr == 128 && ShareKVConfig<128, 1>::kBc == 32 &&
                  ShareKVConfig<128, 1>::kWarps == 4 && ShareKVConfig<128, 1>::kRowsPerWarp == 32,
              "header: D=128 is Br 128 x Bc 32, 4 warps x 32 rows");
static_assert(ShareKVConfig<256, 1>::kBr == 64 && ShareKVConfig<256, 1>::kBc == 32 &&
                  ShareKVConfig<256, 1>::kWarps == 4 && ShareKVConfig<256, 1>::kRowsPerWarp == 16,
              "header: D=256 is Br 64 x Bc 32, 4 warps x 16 rows");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
share_kv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
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
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [Br, kStride]
  // NEW: one ring for K and V.
  const KVRing<Cfg::kStages, Bc, D, kStride, Cfg::kThreads, T> ring{
      sQ + Br * kStride, k + kv_head * p.Nk * D, v + kv_head * p.Nk * D, p.Nk, 2 * n_kv_tiles};

  float O[kM][Cfg::kTilesO][4] = {};
  RowStats stats[kM];
  const float scale_log2 = p.scale * kLog2e;

  if (n_kv_tiles > 0) {
    // Q joins the group of the first ring item.
    load_tile_async<Br, D, kStride, Cfg::kThreads>(sQ, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    ring.prologue();
  }
  for (int j = 0; j < n_kv_tiles; ++j) {
    // ---- S = Q · K_jᵀ ------------------------------------------------------
    const T* sK = ring.acquire(2 * j);  // NEW: K_j from the ring (V_j starts landing)
    float S[kM][Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kM][4];
#pragma unroll
      for (int m = 0; m < kM; ++m)
        load_a_fragment<kStride>(a[m], sQ + (warp * Cfg::kRowsPerWarp + 16 * m) * kStride + kk * 16, lane);
      qk_slice<T, kM, Cfg::kTilesS, kStride>(S, a, sK + kk * 16, lane);
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      mask_scores(S[m], p, j * Bc, q_start, row0 + 16 * m, row0 + 16 * m + 8, lane % 4);
      online_softmax_update(S[m], O[m], stats[m], scale_log2);
    }

    // ---- O += P · V_j -------------------------------------------------------
    const T* sV = ring.acquire(2 * j + 1);  // NEW: V_j from the ring (K_{j+1} starts landing)
    pv_tile<T, kM, Cfg::kTilesS, Cfg::kTilesO, kStride>(O, S, sV, lane);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
    store_output<T>(O[m], stats[m], p, head, row0 + 16 * m, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
}

using ShareKvHeadDims = EqualHeadDims<32, 64, 96, 128, 256>;

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  ShareKvHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = ShareKVConfig<decltype(dims)::D, kStages>;
    err = launch_config<Cfg>(p, b, stream, [](auto cfg, auto type) {
      return share_kv_kernel<decltype(cfg), decltype(type)>;
    });
  });
  return err;
}

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "share-kv+stage" + std::to_string(kStages);
  v.rung = "03_share_kv";
  v.unsupported_reason = rung_unsupported<ShareKVConfig, kStages, ShareKvHeadDims>;
  v.launch = launch<kStages>;
  v.describe = rung_describe<ShareKVConfig, kStages, ShareKvHeadDims>;
  return v;
}

}  // namespace

std::vector<Variant> make_share_kv_variants() { return {make_variant<1>(), make_variant<2>(), make_variant<3>()}; }

}  // namespace attnlab
