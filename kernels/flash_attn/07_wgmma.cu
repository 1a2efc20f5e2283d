// ============================================================================
// Rung 07 — split-Q on Hopper warpgroup MMA (wgmma, sm_90a)
// ============================================================================
// What changes against rung 02 (split-Q with mma.sync): the unit of work is a
// warpgroup (4 warps, 64 query rows) and the tensor-core instruction is
// wgmma.mma_async m64nNk16, which reads its B operand — and for S = Q·Kᵀ also
// its A operand — straight from shared memory through a descriptor. Gone are
// the ldmatrix loads that fed every mma.sync; one wgmma does the work of
// 4·N/8 mma.sync instructions and runs asynchronously, and on Hopper only
// wgmma reaches the tensor cores' full rate.
//   S = Q·K_jᵀ:  wgmma SS, A = Q tile, B = K tile (both shared, K-major)
//   O += P·V_j:  wgmma RS, A = P in registers (the S accumulators after the
//                softmax, packed to 16 bit, as in rung 02), B = V tile (N-major)
// Shared tiles use wgmma's 128-byte swizzle (Sw128Blocks, common/wgmma.cuh),
// which also keeps cp.async stores conflict-free. A warp's accumulators have
// the mma.m16n8k16 layout, so masking, the online softmax and the epilogue are
// rung 02's code. Descriptors, swizzle and fences: docs/hopper_primer.md.
//
// Per block: kWarpgroups x 64 rows = Br query rows; loop over Bc-row K/V tiles.
//   sQ: [Br, D] once   sK, sV: [kStages][Bc, D]   (all Sw128Blocks)
//   S, P: [64, Bc] per warpgroup in registers;  O: [64, D] per warpgroup
// stage1: one K/V buffer, tile j+1 copied after tile j; stage2: two buffers,
// tile j+1 copied while tile j is computed. wgmma+stage2+overlap: the softmax
// of tile j runs while the tensor cores do P_{j-1}·V_{j-1}.
// Where it is slower: every tile the whole block meets at a __syncthreads, so
// both warpgroups reach their softmax together and the tensor cores wait.
//
// Tile configurations (constexprs in WgmmaConfig, checked below):
//   D     Br   Bc  warpgroups  smem stage1  smem stage2   (+1024 alignment slack)
//   64   128  128      2          49152        81920
//  128   128  128      2          98304       163840
//  256   128   64      2         131072       196608
// Registers: see docs/07_wgmma.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {64, 128, 256}; GQA/MQA (H a multiple of Hkv);
// any Nq, Nk >= 1 (ragged tiles zero-filled and masked); causal (bottom-right)
// or not; writes O and LSE. Needs sm_90 and an sm_90a build; else rows say why.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 128 --variant 'wgmma*' --check --show-all
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
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {

namespace {

template <int kHeadDim>
struct WgmmaTiles;
template <> struct WgmmaTiles<64>  { static constexpr int kBc = 128, kWarpgroups = 2; };
template <> struct WgmmaTiles<128> { static constexpr int kBc = 128, kWarpgroups = 2; };
template <> struct WgmmaTiles<256> { static constexpr int kBc = 64, kWarpgroups = 2; };  // O takes 128 registers

template <int kHeadDim_, int kStages_>
struct WgmmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpgroups = WgmmaTiles<kHeadDim>::kWarpgroups;
  static constexpr int kBr = 64 * kWarpgroups;  // one m64 row block per warpgroup
  static constexpr int kBc = WgmmaTiles<kHeadDim>::kBc;
  static constexpr int kWarps = 4 * kWarpgroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kQElems = kBr * kHeadDim;
  static constexpr int kKVElems = kBc * kHeadDim;  // one K or one V tile
  static constexpr int kTileBytes = 2 * (kQElems + 2 * kStages * kKVElems);
  static constexpr int kSmemBytes = kTileBytes + 1024;  // + slack to align the tiles to 1024 bytes
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  static_assert(kHeadDim % 64 == 0, "Sw128Blocks stores 64-column blocks");
  static_assert(kBc % 16 == 0 && kBc <= 256, "Bc is wgmma's N for Q·Kᵀ and its K for P·V");
  static_assert(kStages == 1 || kStages == 2, "stage1 or stage2");
  static_assert(kTilesS * 8 == kBc && kTilesO * 8 == kHeadDim, "n8 accumulator tiles of S and O");
};

static_assert(WgmmaConfig<64, 1>::kTileBytes == 49152 && WgmmaConfig<64, 2>::kTileBytes == 81920, "header: D=64");
static_assert(WgmmaConfig<128, 1>::kTileBytes == 98304 && WgmmaConfig<128, 2>::kTileBytes == 163840,
              "header: D=128");
static_assert(WgmmaConfig<256, 1>::kTileBytes == 131072 && WgmmaConfig<256, 2>::kTileBytes == 196608,
              "header: D=256");
static_assert(WgmmaConfig<64, 1>::kBr == 128 && WgmmaConfig<64, 1>::kBc == 128 && WgmmaConfig<64, 1>::kWarpgroups == 2,
              "header: D=64 is Br 128 x Bc 128, 2 warpgroups");
static_assert(WgmmaConfig<128, 1>::kBr == 128 && WgmmaConfig<128, 1>::kBc == 128 &&
                  WgmmaConfig<128, 1>::kWarpgroups == 2,
              "header: D=128 is Br 128 x Bc 128, 2 warpgroups");
static_assert(WgmmaConfig<256, 1>::kBr == 128 && WgmmaConfig<256, 1>::kBc == 64 &&
                  WgmmaConfig<256, 1>::kWarpgroups == 2,
              "header: D=256 is Br 128 x Bc 64, 2 warpgroups");
static_assert(WgmmaConfig<64, 1>::kSmemBytes - WgmmaConfig<64, 1>::kTileBytes == 1024, "header: +1024 alignment slack");

// Copies K_j and V_j (rows kv_start ..) into ring slot `slot`.
template <typename Cfg, typename T>
__device__ __forceinline__ void load_kv_tile(T* sK, T* sV, const T* k, const T* v, int kv_start, int Nk) {
  constexpr int D = Cfg::kHeadDim, Bc = Cfg::kBc;
  load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sK, k + int64_t(kv_start) * D, D, Nk - kv_start);
  load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sV, v + int64_t(kv_start) * D, D, Nk - kv_start);
}

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
wgmma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
             float* __restrict__ lse, const AttnProblem p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest query tiles first
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warpgroup = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row0 = q_start + warpgroup * 64 + warp * 16 + lane / 4;  // row of c0, c1
  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  // NEW: tiles aligned to 1024 bytes, the period of the 128-byte swizzle.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  T* sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  T* sK = sQ + Cfg::kQElems;                   // kStages K tiles
  T* sV = sK + Cfg::kStages * Cfg::kKVElems;  // kStages V tiles

  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;
  const T* k_head = k + kv_head * p.Nk * D;
  const T* v_head = v + kv_head * p.Nk * D;

  if (n_kv_tiles > 0) {
    load_tile_async<Br, D, Sw128Blocks<Br>, Cfg::kThreads>(sQ, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    load_kv_tile<Cfg>(sK, sV, k_head, v_head, 0, p.Nk);
    cp_async_commit();
  }
  // This warpgroup's 64 rows of Q: K-major, 8-row groups 1024 bytes apart.
  const T* sQ_wg = sQ + warpgroup * 64 * 64;  // rows 64·wg.. of every 64-column block

  for (int j = 0; j < n_kv_tiles; ++j) {
    const int slot = Cfg::kStages == 2 ? j % 2 : 0;
    if (Cfg::kStages == 2 && j + 1 < n_kv_tiles) {
      // Slot (j+1) % 2 was last read in iteration j-1, which every thread has left.
      load_kv_tile<Cfg>(sK + (1 - slot) * Cfg::kKVElems, sV + (1 - slot) * Cfg::kKVElems, k_head, v_head,
                        (j + 1) * Bc, p.Nk);
      cp_async_commit();
      cp_async_wait<1>();  // tile j has landed, tile j+1 may still be in flight
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async_shared();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    __syncthreads();

    // ---- S = Q · K_jᵀ: D/16 wgmma k-steps, operands from shared memory -------
    const T* sKj = sK + slot * Cfg::kKVElems;
    float S[Cfg::kTilesS][4];
    wgmma_fence();
    wgmma_qk_tile<T, D, Br, Bc>(S, sQ_wg, sKj);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(S);

    mask_scores(S, p, j * Bc, q_start, row0, row0 + 8, lane % 4);
    online_softmax_update(S, O, stats, scale_log2);
    uint32_t P[Cfg::kTilesS / 2][4];
    pack_p_fragments<T>(P, S);

    // ---- O += P · V_j: Bc/16 wgmma k-steps, P from registers ------------------
    const T* sVj = sV + slot * Cfg::kKVElems;
    wgmma_fence();  // O was just rescaled by the softmax
    wgmma_pv_tile<T, D, Bc>(O, P, sVj);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(O);

    __syncthreads();  // every warpgroup is done with this slot before it is refilled
    if (Cfg::kStages == 1 && j + 1 < n_kv_tiles) {
      load_kv_tile<Cfg>(sK, sV, k_head, v_head, (j + 1) * Bc, p.Nk);
      cp_async_commit();
    }
  }
  store_output<T>(O, stats, p, head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
#endif
}

// ---- wgmma+overlap: the softmax of tile j runs while the tensor cores do P·V of j-1
// Same config as stage2 (two K and two V slots). Per iteration j, per warpgroup:
//   issue S_j = Q·K_jᵀ; issue O += P_{j-1}·V_{j-1}     (both async, in order)
//   wait for S_j; mask; P_j = exp(S_j - m_new), row sums   <- overlaps the P·V
//   wait for the P·V; O *= exp(m_old - m_new)
// The O rescale has to wait: the tensor cores are still accumulating into O.
// Loads: K_{j+1} and V_j are issued at the top of iteration j (into the slots
// of K_{j-1} and V_{j-2}, which every warpgroup has finished with, as the
// barrier just passed proves) and waited for one iteration later. One barrier
// per iteration. FlashAttention-3 (Shah et al., 2024, §3.2) calls this
// intra-warpgroup overlapping; this is our own, barrier-based, version of it.
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
wgmma_overlap_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                     T* __restrict__ o, float* __restrict__ lse, const AttnProblem p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc;
  static_assert(Cfg::kStages == 2, "two K and two V slots");

  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warpgroup = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int row0 = q_start + warpgroup * 64 + warp * 16 + lane / 4;
  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  T* sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  T* sK = sQ + Cfg::kQElems;
  T* sV = sK + 2 * Cfg::kKVElems;
  const T* sQ_wg = sQ + warpgroup * 64 * 64;

  float O[Cfg::kTilesO][4] = {};
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;
  const T* k_head = k + kv_head * p.Nk * D;
  const T* v_head = v + kv_head * p.Nk * D;
  auto load_k = [&](int tile) {
    load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sK + (tile % 2) * Cfg::kKVElems,
                                                           k_head + int64_t(tile) * Bc * D, D, p.Nk - tile * Bc);
  };
  auto load_v = [&](int tile) {
    load_tile_async<Bc, D, Sw128Blocks<Bc>, Cfg::kThreads>(sV + (tile % 2) * Cfg::kKVElems,
                                                           v_head + int64_t(tile) * Bc * D, D, p.Nk - tile * Bc);
  };
  auto issue_qk = [&](float (&S)[Cfg::kTilesS][4], int tile) {
    wgmma_qk_tile<T, D, Br, Bc>(S, sQ_wg, sK + (tile % 2) * Cfg::kKVElems);
    wgmma_commit();
  };
  auto issue_pv = [&](const uint32_t (&P)[Cfg::kTilesS / 2][4], int tile) {
    wgmma_pv_tile<T, D, Bc>(O, P, sV + (tile % 2) * Cfg::kKVElems);
    wgmma_commit();
  };

  uint32_t P[Cfg::kTilesS / 2][4];  // P_{j-1}, the A operand of the next P·V
  if (n_kv_tiles > 0) {
    load_tile_async<Br, D, Sw128Blocks<Br>, Cfg::kThreads>(sQ, q + (head * p.Nq + q_start) * D, D, p.Nq - q_start);
    load_k(0);
    cp_async_commit();
    if (n_kv_tiles > 1) load_k(1);
    load_v(0);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K_0
    fence_proxy_async_shared();
    __syncthreads();

    float S[Cfg::kTilesS][4];
    wgmma_fence();
    issue_qk(S, 0);
    wgmma_wait<0>();
    fence_accumulators(S);
    mask_scores(S, p, 0, q_start, row0, row0 + 8, lane % 4);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);  // O is still zero: no rescale
    pack_p_fragments<T>(P, S);
  }

  for (int j = 1; j < n_kv_tiles; ++j) {
    cp_async_wait<0>();  // K_j and V_{j-1}, issued one iteration ago
    fence_proxy_async_shared();
    __syncthreads();  // ...have landed for every thread; K_{j-1} and V_{j-2} are free
    if (j + 1 < n_kv_tiles) load_k(j + 1);
    load_v(j);
    cp_async_commit();

    float S[Cfg::kTilesS][4];
    wgmma_fence();
    issue_qk(S, j);
    issue_pv(P, j - 1);
    wgmma_wait<1>();  // S_j is done; the P·V may still run
    fence_accumulators(S);
    mask_scores(S, p, j * Bc, q_start, row0, row0 + 8, lane % 4);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);
    wgmma_wait<0>();
    fence_accumulators(O);
    rescale_output(O, alpha);
    pack_p_fragments<T>(P, S);
  }

  if (n_kv_tiles > 0) {  // the last P·V
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
    wgmma_fence();
    issue_pv(P, n_kv_tiles - 1);
    wgmma_wait<0>();
    fence_accumulators(O);
  }
  store_output<T>(O, stats, p, head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
#endif
}

using WgmmaHeadDims = EqualHeadDims<64, 128, 256>;

template <int kStages>
std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_wgmma_unsupported();
  if (!hopper.empty()) return hopper;
  return rung_unsupported<WgmmaConfig, kStages, WgmmaHeadDims>(p);
}

template <int kStages, bool kOverlap>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  WgmmaHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = WgmmaConfig<decltype(dims)::D, kStages>;
    err = launch_config<Cfg>(p, b, stream, [](auto cfg, auto type) {
      if constexpr (kOverlap) return wgmma_overlap_kernel<decltype(cfg), decltype(type)>;
      else return wgmma_kernel<decltype(cfg), decltype(type)>;
    });
  });
  return err;
}

template <int kStages, bool kOverlap = false>
Variant make_variant() {
  Variant v;
  v.name = "wgmma+stage" + std::to_string(kStages) + (kOverlap ? "+overlap" : "");
  v.rung = "07_wgmma";
  v.unsupported_reason = unsupported<kStages>;
  v.launch = launch<kStages, kOverlap>;
  v.describe = [] {
    return std::string(kOverlap ? "softmax overlapped with P·V; " : "") + "sm_90a wgmma, warpgroups of 64 rows; " +
           rung_describe<WgmmaConfig, kStages, WgmmaHeadDims>();
  };
  return v;
}

}  // namespace

std::vector<Variant> make_wgmma_variants() {
  return {make_variant<1>(), make_variant<2>(), make_variant<2, /*kOverlap=*/true>()};
}

}  // namespace attnlab
