// ============================================================================
// Rung 08 — wgmma with warpgroups splitting the head dim (D = 512)
// ============================================================================
// What changes against rung 07: at D = 512 one warpgroup cannot hold its
// output rows — 64 x 512 fp32 is 256 registers per thread — so rung 07 stops
// at D = 256 and rungs 05/06 (mma.sync) take over. Here the two warpgroups of
// a block share the same 64 query rows and split the head dim, as rung 06 does
// with warps:
//   S = Q·K_jᵀ: warpgroup w multiplies its half of the head dim (columns
//               256w .. 256w+255 of Q and K) into a partial S; both partials
//               meet in shared memory and each warpgroup adds them in the same
//               order, so both compute bit-identical softmax statistics;
//   O += P·V_j: warpgroup w owns output columns 256w .. 256w+255 (128
//               registers per thread) and multiplies P by its half of V.
// Where it is slower: the row tile is small (64 rows, because O fills the
// register file), so each K/V byte copied feeds only 64 rows and the copies
// take a large share of the shared-memory bandwidth (docs/08_wgmma_split_d.md).
// The tile's compute lives in split_d_tile.cuh (rung 09 feeds the same
// compute by TMA); this file holds the config and the cp.async copy pipeline.
//
// Per block: 64 query rows, 2 warpgroups; loop over 64-row tiles of K and V.
//   sQ, sK, sV: [64, 512] each (Sw128Blocks, 64 KiB)
//   sRed: [2][64, 64] fp32 partial scores, fragment order (32 KiB)
//   S, P: [64, 64] per warpgroup (the full S, after the sum); O: [64, 256] per warpgroup
// One K and one V slot, staggered: K_{j+1} is copied while the softmax and
// P·V of tile j run, V_{j+1} while S_{j+1} is computed (rung 02's stage1 order).
//
// Tile configuration (constexprs in SplitDTiles and SplitDConfig, checked below):
//   D     Br   Bc  warpgroups  stages  smem (+1024 alignment slack)
//  512    64   64   2 (split D)   1      229376
// of the 232448 bytes a block may have on sm_90: no room for a second slot.
// Registers: see docs/08_wgmma_split_d.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv = 512; GQA/MQA (H a multiple of Hkv); any Nq,
// Nk >= 1; causal (bottom-right) or not; writes O and LSE. Needs an sm_90 GPU
// and an sm_90a build.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 512 --variant 'wgmma*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "common/wgmma.cuh"
#include "flash_attn/split_d_tile.cuh"
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {

namespace {

template <int kHeadDim_, int kStages_>
struct SplitDConfig : SplitDTiles<kHeadDim_> {  // tile shapes: split_d_tile.cuh
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = 4 * SplitDConfig::kWarpgroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSmemBytes = SplitDConfig::kTileBytes + 1024;  // + slack to align the tiles to 1024 bytes
  static_assert(kStages == 1, "one K and one V slot: a second would not fit");
};
static_assert(SplitDConfig<512, 1>::kTileBytes == 229376, "header: D=512 shared memory");
static_assert(SplitDConfig<512, 1>::kBr == 64 && SplitDConfig<512, 1>::kBc == 64 &&
                  SplitDConfig<512, 1>::kWarpgroups == 2 && SplitDConfig<512, 1>::kSliceCols == 256,
              "header: D=512 is Br 64 x Bc 64, 2 warpgroups of 256 columns each");
static_assert(SplitDConfig<512, 1>::kSmemBytes <= 232448, "header: fits the 232448 bytes a block may have on sm_90");
static_assert(SplitDConfig<512, 1>::kSmemBytes + SplitDConfig<512, 1>::kTileBytesQKV * 2 > 232448,
              "header: no room for a second K and V slot");

// The copy pipeline (split_d_tile.cuh's hooks): one K and one V slot,
// refilled by all 256 threads with cp.async as soon as the tile in it has been
// read — K_{j+1} behind the softmax and P·V of tile j, V_{j+1} behind S_{j+1}.
template <typename Cfg, typename T>
struct CpAsyncSlots {
  T* sK;
  T* sV;
  const T* k_head;
  const T* v_head;
  int Nk;
  int n_tiles;

  __device__ __forceinline__ void load(T* slot, const T* head, int j) const {
    load_tile_async_rolled<Cfg::kBc, Cfg::kHeadDim, Sw128Blocks<Cfg::kBc>, Cfg::kThreads>(
        slot, head + int64_t(j) * Cfg::kBc * Cfg::kHeadDim, Cfg::kHeadDim, Nk - j * Cfg::kBc);
    cp_async_commit();
  }
  __device__ __forceinline__ void landed() const {  // this thread's copies are done: make everyone's visible to wgmma
    fence_proxy_async_shared();
    __syncthreads();
  }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
  __device__ __forceinline__ void wait_k(int) const {
    cp_async_wait<1>();  // K_j has landed (V_j may still be in flight)
    landed();
  }
  __device__ __forceinline__ void release_k(int j) const {
    if (j + 1 < n_tiles) load(sK, k_head, j + 1);
  }
  __device__ __forceinline__ void wait_v(int j) const {
    if (j + 1 < n_tiles) cp_async_wait<1>();  // V_j (K_{j+1} may still be in flight)
    else cp_async_wait<0>();
    landed();
  }
  __device__ __forceinline__ void release_v(int j) const {
    if (j + 1 < n_tiles) load(sV, v_head, j + 1);
  }
};

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
wgmma_split_d_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ o, float* __restrict__ lse, const AttnProblem p) {
  static_assert(Cfg::kTilesS > 0 && Cfg::kTilesO > 0, "fragment counts");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kSlice = Cfg::kSliceCols;

  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warpgroup = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row0 = q_start + warp * 16 + lane / 4;  // both warpgroups: the same rows
  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const SplitDSmem<T> sm = carve_split_d_smem<Cfg, T>(smem_raw);

  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;
  const CpAsyncSlots<Cfg, T> pipe{sm.sK, sm.sV, k + kv_head * p.Nk * D, v + kv_head * p.Nk * D, p.Nk, n_kv_tiles};

  if (n_kv_tiles > 0) {
    load_tile_async<Br, D, Sw128Blocks<Br>, Cfg::kThreads>(sm.sQ, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    pipe.load(sm.sK, pipe.k_head, 0);  // Q and K_0 in the first group
    pipe.load(sm.sV, pipe.v_head, 0);
  }
  for (int j = 0; j < n_kv_tiles; ++j) split_d_kv_tile<Cfg>(O, stats, sm, p, j, q_start, row0, scale_log2, pipe);
  store_output<T>(O, stats, p, head, row0, /*col0=*/warpgroup * kSlice, lane % 4, /*write_lse=*/warpgroup == 0, o,
                  lse);
#endif
}

using SplitDHeadDims = EqualHeadDims<512>;

template <int kStages>
std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_wgmma_unsupported();
  if (!hopper.empty()) return hopper;
  return rung_unsupported<SplitDConfig, kStages, SplitDHeadDims>(p);
}

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  SplitDHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = SplitDConfig<decltype(dims)::D, kStages>;
    err = launch_config<Cfg>(p, b, stream, [](auto cfg, auto type) {
      return wgmma_split_d_kernel<decltype(cfg), decltype(type)>;
    });
  });
  return err;
}

}  // namespace

std::vector<Variant> make_wgmma_split_d_variants() {
  Variant v;
  v.name = "wgmma-split-d+stage1";
  v.rung = "08_wgmma_split_d";
  v.unsupported_reason = unsupported<1>;
  v.launch = launch<1>;
  v.describe = [] {
    return "sm_90a wgmma, 2 warpgroups split the head dim of 64 rows; " +
           rung_describe<SplitDConfig, 1, SplitDHeadDims>();
  };
  return {v};
}

}  // namespace attnlab
