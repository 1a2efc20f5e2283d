// ============================================================================
// Rung 08 — wgmma with warpgroups splitting the head dim (D = 512)
// ============================================================================
// What changes against rung 07: at D = 512 one warpgroup cannot hold its
// output rows — 64 x 512 fp32 is 256 registers per thread — so rung 07 stops
// at D = 256 and rungs 05/06 (mma.sync) take over, at a third of the speed.
// Here the two warpgroups of a block share the same 64 query rows and split
// the head dim, as rung 06 does with warps:
//   S = Q·K_jᵀ: warpgroup w multiplies its half of the head dim (columns
//               256w .. 256w+255 of Q and K) into a partial S, both partials
//               meet in shared memory, and each warpgroup adds them up in the
//               same order — the sums are bit-identical, so both warpgroups
//               compute the same softmax statistics without exchanging them;
//   O += P·V_j: warpgroup w owns output columns 256w .. 256w+255 (128
//               registers per thread) and multiplies P by its half of V.
// The price of the small row tile (64 rows per block, because O fills the
// register file): each K/V byte copied feeds only 64 rows, so the copies are
// a large share of the shared-memory bandwidth (docs/08_wgmma_split_d.md).
//
// Per block: 64 query rows, 2 warpgroups; loop over Bc = 64-row tiles of K, V.
//   sQ:   [64, 512]     sK: [64, 512]     sV: [64, 512]   (Sw128Blocks, 64 KiB each)
//   sRed: [2][64, 64] fp32 partial scores, fragment order (32 KiB)
//   S, P: [64, 64] per warpgroup (the full S, after the sum); O: [64, 256] per warpgroup
// One K and one V slot, staggered: K_{j+1} is copied while the softmax and
// P·V of tile j run, V_{j+1} while S_{j+1} is computed (rung 02's stage1 order).
// Shared memory: 229376 bytes (+1024 alignment slack) of the H200's 232448;
// there is no room for a second slot (kStages = 1).
//
// Supports: fp16, bf16; D = Dv = 512; any Nq, Nk >= 1; causal (bottom-right)
// or not; writes O and LSE. Needs an sm_90 GPU and an sm_90a build.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 512 --variant 'wgmma*' --sdpa --torch --check
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "../common/attn_problem.h"
#include "../common/online_softmax.cuh"
#include "../common/ptx.cuh"
#include "../common/rung_host.cuh"
#include "../common/split_q_parts.cuh"
#include "../common/tile_copy.cuh"
#include "../common/variant.h"
#include "../common/wgmma.cuh"

namespace attnlab {

std::string hopper_wgmma_unsupported();  // 07_wgmma.cu

namespace {

template <int kHeadDim_, int kStages_>
struct SplitDConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpgroups = 2;                 // split the head dim
  static constexpr int kBr = 64;                        // one m64 row block, shared by both warpgroups
  static constexpr int kBc = 64;
  static constexpr int kSliceCols = kHeadDim / kWarpgroups;  // head-dim columns per warpgroup
  static constexpr int kWarps = 4 * kWarpgroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTileElems = 64 * kHeadDim;      // Q, K or V tile (Br = Bc = 64)
  static constexpr int kRedFloats = kWarpgroups * kBr * kBc;
  static constexpr int kTileBytes = 3 * kTileElems * 2 + kRedFloats * 4;
  static constexpr int kSmemBytes = kTileBytes + 1024;  // + slack to align the tiles to 1024 bytes
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kSliceCols / 8;
  static_assert(kStages == 1, "one K and one V slot: a second would not fit");
  static_assert(kSliceCols % 64 == 0 && kSliceCols <= 256, "wgmma N (the slice of O) is at most 256");
};
static_assert(SplitDConfig<512, 1>::kTileBytes == 229376, "header: D=512 shared memory");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
wgmma_split_d_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ o, float* __restrict__ lse, const AttnProblem p) {
  static_assert(Cfg::kTilesS > 0 && Cfg::kTilesO > 0, "fragment counts");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kSlice = Cfg::kSliceCols;
  constexpr int kBlocksPerSlice = kSlice / 64;  // 64-column Sw128 blocks per warpgroup

  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int q_start = m_block * Br;
  const int warpgroup = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row0 = q_start + warp * 16 + lane / 4;  // both warpgroups: the same rows
  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  T* sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  T* sK = sQ + Cfg::kTileElems;
  T* sV = sK + Cfg::kTileElems;
  float* sRed = reinterpret_cast<float*>(sV + Cfg::kTileElems);  // [2 warpgroups][kTilesS][128 threads][4]

  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;
  const T* k_head = k + head * p.Nk * D;
  const T* v_head = v + head * p.Nk * D;
  // This warpgroup's slice of the head dim starts at 64-column block first_block.
  const int first_block = warpgroup * kBlocksPerSlice;

  if (n_kv_tiles > 0) {
    load_tile_async<Br, D, Sw128Blocks<Br>, Cfg::kThreads>(sQ, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    load_tile_async_rolled<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sK, k_head, D, p.Nk);
    cp_async_commit();
    load_tile_async_rolled<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sV, v_head, D, p.Nk);
    cp_async_commit();
  }

  const int tid_in_wg = threadIdx.x % 128;
  float* red_mine = sRed + (warpgroup * Cfg::kTilesS * 128 + tid_in_wg) * 4;
  const float* red_other = sRed + ((1 - warpgroup) * Cfg::kTilesS * 128 + tid_in_wg) * 4;

  for (int j = 0; j < n_kv_tiles; ++j) {
    cp_async_wait<1>();  // K_j has landed (V_j may still be in flight)
    fence_proxy_async_shared();
    __syncthreads();

    // ---- partial S over this warpgroup's half of the head dim ---------------
    float S[Cfg::kTilesS][4];
    const uint64_t desc_q = opaque(make_sw128_desc(sQ + first_block * Br * 64, 0, 1024));
    const uint64_t desc_k = opaque(make_sw128_desc(sK + first_block * Bc * 64, 0, 1024));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSlice / 16; ++kk) {  // block kk/4 of the slice, 32 bytes per step inside it
      wgmma_ss<T, Bc>(S, advance_desc(desc_q, (kk / 4) * Br * 128 + (kk % 4) * 32),
                      advance_desc(desc_k, (kk / 4) * Bc * 128 + (kk % 4) * 32), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(S);
#pragma unroll
    for (int n = 0; n < Cfg::kTilesS; ++n)
      *reinterpret_cast<float4*>(red_mine + n * 128 * 4) = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
    __syncthreads();  // both partials written; K_j no longer read
    if (j + 1 < n_kv_tiles) {
      load_tile_async_rolled<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sK, k_head + int64_t(j + 1) * Bc * D, D,
                                                             p.Nk - (j + 1) * Bc);
      cp_async_commit();
    }
    // S = partial 0 + partial 1 (a + b == b + a exactly: both warpgroups agree bit for bit).
#pragma unroll
    for (int n = 0; n < Cfg::kTilesS; ++n) {
      const float4 other = *reinterpret_cast<const float4*>(red_other + n * 128 * 4);
      S[n][0] += other.x;
      S[n][1] += other.y;
      S[n][2] += other.z;
      S[n][3] += other.w;
    }
    mask_scores(S, p, j * Bc, q_start, row0, row0 + 8, lane % 4);
    online_softmax_update(S, O, stats, scale_log2);
    uint32_t P[Cfg::kTilesS / 2][4];
    pack_p_fragments<T>(P, S);

    // ---- O[:, slice] += P · V_j[:, slice] ------------------------------------------
    if (j + 1 < n_kv_tiles) cp_async_wait<1>();  // V_j (K_{j+1} may still be in flight)
    else cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
    const uint64_t desc_v = opaque(make_sw128_desc(sV + first_block * Bc * 64, Bc * 128, 1024));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)  // 16 rows of V per step: 2048 bytes
      wgmma_rs_vt<T, kSlice>(O, P[kk], advance_desc(desc_v, kk * 16 * 128));
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(O);
    __syncthreads();  // V_j and the partials are no longer read
    if (j + 1 < n_kv_tiles) {
      load_tile_async_rolled<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sV, v_head + int64_t(j + 1) * Bc * D, D,
                                                             p.Nk - (j + 1) * Bc);
      cp_async_commit();
    }
  }
  store_output<T>(O, stats, p, head, row0, /*col0=*/warpgroup * kSlice, lane % 4, /*write_lse=*/warpgroup == 0, o,
                  lse);
#endif
}

#define SPLIT_D_HEAD_DIMS 512

template <int kStages>
std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_wgmma_unsupported();
  if (!hopper.empty()) return hopper;
  return rung_unsupported<SplitDConfig, kStages, SPLIT_D_HEAD_DIMS>(p);
}

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  dispatch_head_dim<SPLIT_D_HEAD_DIMS>(p.D, [&](auto head_dim) {
    using Cfg = SplitDConfig<decltype(head_dim)::value, kStages>;
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
           rung_describe<SplitDConfig, 1, SPLIT_D_HEAD_DIMS>();
  };
  return {v};
}

}  // namespace attnlab
