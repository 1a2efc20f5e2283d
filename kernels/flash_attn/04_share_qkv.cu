// ============================================================================
// Rung 04 — split-Q + shared Q/K/V shared memory
// ============================================================================
// What changes against rung 03: Q is read from shared memory into registers
// once, before the KV loop, and its shared memory becomes the K/V ring. Every
// KV tile then reads only K and V from shared memory (rung 03 also re-read Q
// each tile: D/16 extra ldmatrix.x4 per warp per tile), and the block needs
// max(Q tile, ring) bytes instead of their sum — about a quarter of rung 02's
// stage2 footprint. The price: D/4 more registers per thread to hold Q
// (16 rows x D halves per warp), which at D=256 would not fit next to O.
//
// Per block: one Br-row tile of Q, loop over Bc-row tiles of K and V.
//   smem:  first [Br, D + 8] Q, then reused as [kStages][Bc, D + 8] K/V ring
//   Q:     [D/16][4] 32-bit registers per lane: the warp's 16 rows, as A fragments
//   S, P:  [16, Bc] per warp in registers; O: [16, D] per warp in registers
//
// Tile configurations (constexprs in ShareQKVConfig, checked below):
//   D     Br   Bc  warps  smem stage1  smem stage2
//   32   128   64    8      10240        10240
//   64   128   64    8      18432        18432
//   96   128   64    8      26624        26624
//  128   128   64    8      34816        34816
// (D=256 is not offered: Q would need 64 more registers per thread on top of
//  rung 02's 245, and the kernel would spill.)
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128}; any Nq, Nk >= 1; causal
// (bottom-right aligned) or not; writes O and LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 64 --variant 'share-*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../common/attn_problem.h"
#include "../common/kv_ring.cuh"
#include "../common/online_softmax.cuh"
#include "../common/rung_host.cuh"
#include "../common/split_q_parts.cuh"
#include "../common/tile_copy.cuh"
#include "../common/variant.h"

namespace attnlab {
namespace {

template <int kHeadDim>
struct ShareQKVTiles;  // rung 02's tiles
template <> struct ShareQKVTiles<32>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct ShareQKVTiles<64>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct ShareQKVTiles<96>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct ShareQKVTiles<128> { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };

template <int kHeadDim_, int kStages_>
struct ShareQKVConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // slots in the K/V ring
  static constexpr int kBr = ShareQKVTiles<kHeadDim>::kBr;
  static constexpr int kBc = ShareQKVTiles<kHeadDim>::kBc;
  static constexpr int kWarps = ShareQKVTiles<kHeadDim>::kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowStride = kHeadDim + 8;
  // NEW: Q and the ring take turns in the same bytes.
  static constexpr int kSmemBytes = std::max(kBr, kStages * kBc) * kRowStride * 2;
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  static constexpr int kQSlices = kHeadDim / 16;  // A fragments of Q held in registers
  static_assert(kBr == kWarps * 16, "each warp owns 16 query rows");
  static_assert(kStages == 1 || kStages == 2, "stage1 and stage2");
};

static_assert(ShareQKVConfig<32, 1>::kSmemBytes == 10240 && ShareQKVConfig<32, 2>::kSmemBytes == 10240, "header: D=32");
static_assert(ShareQKVConfig<64, 1>::kSmemBytes == 18432 && ShareQKVConfig<64, 2>::kSmemBytes == 18432, "header: D=64");
static_assert(ShareQKVConfig<96, 1>::kSmemBytes == 26624 && ShareQKVConfig<96, 2>::kSmemBytes == 26624, "header: D=96");
static_assert(ShareQKVConfig<128, 1>::kSmemBytes == 34816 && ShareQKVConfig<128, 2>::kSmemBytes == 34816,
              "header: D=128");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
share_qkv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                 float* __restrict__ lse, const AttnProblem p) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kRowStride;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest query tiles first
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = q_start + warp * 16 + lane / 4;  // global query row of c0, c1 (c2, c3: +8)
  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);  // first sQ [Br, kStride], then the ring

  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;

  // NEW: Q -> shared -> registers, once. Then its shared memory is free.
  uint32_t Q[Cfg::kQSlices][4];  // A fragments: the warp's 16 rows, 16 columns each
  if (n_kv_tiles > 0) {
    load_tile_async<Br, D, kStride, Cfg::kThreads>(smem, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < Cfg::kQSlices; ++kk) load_a_fragment<kStride>(Q[kk], smem + warp * 16 * kStride + kk * 16, lane);
    __syncthreads();  // every warp holds its Q before the ring overwrites it
  }
  // NEW: the ring lives where Q was.
  const KVRing<Cfg::kStages, Bc, D, kStride, Cfg::kThreads, T> ring{smem, k + head * p.Nk * D, v + head * p.Nk * D,
                                                                     p.Nk, 2 * n_kv_tiles};
  if (n_kv_tiles > 0) ring.prologue();

  for (int j = 0; j < n_kv_tiles; ++j) {
    // ---- S = Q · K_jᵀ, Q from registers ---------------------------------------
    const T* sK = ring.acquire(2 * j);
    float S[Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < Cfg::kQSlices; ++kk) qk_slice<T, Cfg::kTilesS, kStride>(S, Q[kk], sK + kk * 16, lane);
    mask_scores(S, p, j * Bc, q_start, row0, row0 + 8, lane % 4);
    online_softmax_update(S, O, stats, scale_log2);

    // ---- O += P · V_j -----------------------------------------------------------
    const T* sV = ring.acquire(2 * j + 1);
    pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(O, S, sV, lane);
  }
  store_output<T>(O, stats, p, head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
}

#define SHARE_QKV_HEAD_DIMS 32, 64, 96, 128

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  dispatch_head_dim<SHARE_QKV_HEAD_DIMS>(p.D, [&](auto head_dim) {
    using Cfg = ShareQKVConfig<decltype(head_dim)::value, kStages>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      const dim3 grid((p.Nq + Cfg::kBr - 1) / Cfg::kBr, p.H, p.B);
      return launch_with_smem(share_qkv_kernel<Cfg, T>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                              static_cast<const T*>(b.q), static_cast<const T*>(b.k), static_cast<const T*>(b.v),
                              static_cast<T*>(b.o), b.lse, p);
    });
  });
  return err;
}

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "share-qkv+stage" + std::to_string(kStages);
  v.rung = "04_share_qkv";
  v.unsupported_reason = rung_unsupported<ShareQKVConfig, kStages, SHARE_QKV_HEAD_DIMS>;
  v.launch = launch<kStages>;
  v.describe = rung_describe<ShareQKVConfig, kStages, SHARE_QKV_HEAD_DIMS>;
  return v;
}

}  // namespace

std::vector<Variant> make_share_qkv_variants() { return {make_variant<1>(), make_variant<2>()}; }

}  // namespace attnlab
