// ============================================================================
// Rung 12 — rung 07's overlap, fed by TMA from a producer warp, with the two
//           compute warpgroups taking turns on the tensor cores (ping-pong)
// ============================================================================
// What changes against rung 07 (`wgmma+stage2+overlap`): the math per tile is
// the same (S = Q·K_jᵀ issued, then P_{j-1}·V_{j-1}; the softmax of S_j runs
// while that P·V does), but
//   NEW (ws): the copies leave the compute threads, and with them rung 07's
//        __syncthreads per tile (which made both warpgroups reach their softmax
//        together). A producer warp issues each tile as TMA boxes (rung 09's
//        split: a third warpgroup, setmaxnreg) into a ring of kStages slots
//        with a full/empty mbarrier pair per slot; the compute warpgroups never
//        meet each other;
//   NEW (+pingpong): the warpgroups take turns: a warpgroup issues its tile's
//        MMAs only after the previous one has issued its own, and passes the
//        turn on right after. While warpgroup 0's S and P·V run, warpgroup 1
//        does its softmax, and the other way round, so the tensor cores always
//        have one warpgroup's work queued. Two named barriers carry the turn
//        (FlashAttention-3's pingpong scheduling, §3.1).
// Where it is slower: the producer warpgroup takes registers (232 per compute
// thread, not 255), and under ping-pong a ready warpgroup waits for its turn.
// TMA boxes, mbarrier parity waits, setmaxnreg, named barriers: docs/hopper_primer.md.
//
// Per block: Br = 64 x W compute warpgroups + 1 producer; sQ [Br, D] once, sK and
// sV [kStages][Bc, D] (all Sw128Blocks); 1 + 4·kStages mbarriers.
// Tile configurations (constexprs in WsConfig, checked below; default build):
//   D     Br   Bc  warpgroups           stages  smem (+1024 alignment slack)
//   64   128  128   2 + 1 producer = 384     2        81992
//  128   128  128   2 + 1 producer = 384     2       163912
//  256   128   64   2 + 1 producer = 384     2       196680
// Registers: 168 at launch; setmaxnreg gives the producer 40, the compute 232.
// Build options for FlashAttention-3's tiles: -DATTNLAB_WS_D128_BC=176 and
// -DATTNLAB_WS_D64_WARPGROUPS=3 (192 rows, 512 threads, setmaxnreg 32 / 160).
//
// Supports: fp16, bf16; D = Dv ∈ {64, 128, 256}; any Nq, Nk >= 1; causal
// (bottom-right aligned) or not; writes O and LSE. Needs an sm_90 GPU, an
// sm_90a build and cuTensorMapEncodeTiled; elsewhere its rows say why.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 128 --variant 'ws*,wgmma+stage2+overlap' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/split_q_parts.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "host/arch.h"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {

namespace {

template <int kHeadDim>
struct WsTiles;
// D = 64: FlashAttention-3 runs 3 compute warpgroups here (192 rows): a tile's
// softmax costs about as much as its MMAs, so two warpgroups can keep the
// tensor cores only half busy. -DATTNLAB_WS_D64_WARPGROUPS=3 builds that tile
// in place of the default 2 (at N = 8192 it also changes the waves:
// 43 x 8 blocks of 192 rows are 2.6 waves on 132 SMs, 64 x 8 of 128 are 3.9).
#ifndef ATTNLAB_WS_D64_WARPGROUPS
#define ATTNLAB_WS_D64_WARPGROUPS 2
#endif
template <> struct WsTiles<64>  { static constexpr int kBc = 128, kWarpgroups = ATTNLAB_WS_D64_WARPGROUPS; };
// D = 128: FlashAttention-3 uses 176-key tiles here (non-causal); building with
// -DATTNLAB_WS_D128_BC=176 gives that tile in place of the default.
#ifndef ATTNLAB_WS_D128_BC
#define ATTNLAB_WS_D128_BC 128
#endif
template <> struct WsTiles<128> { static constexpr int kBc = ATTNLAB_WS_D128_BC, kWarpgroups = 2; };
template <> struct WsTiles<256> { static constexpr int kBc = 64, kWarpgroups = 2; };  // O takes 128 registers

// The producer/compute register split for W compute warpgroups: 40 / 232 for
// two (rung 09's), 32 / 160 for three (FlashAttention-3's).
template <int kWarpgroups>
using WsWarps = ProducerWarpgroupSplit<kWarpgroups, kWarpgroups == 2 ? 40 : 32, kWarpgroups == 2 ? 232 : 160>;

template <int kHeadDim_, int kStages_>
struct WsConfig : WsWarps<WsTiles<kHeadDim_>::kWarpgroups> {  // W compute warpgroups + 1 producer warpgroup
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr int kComputeWarpgroups = WsTiles<kHeadDim>::kWarpgroups;
  static constexpr int kBr = 64 * kComputeWarpgroups;  // one m64 row block per compute warpgroup
  static constexpr int kBc = WsTiles<kHeadDim>::kBc;
  static constexpr int kQElems = kBr * kHeadDim;
  static constexpr int kKVElems = kBc * kHeadDim;  // one K or one V tile
  static constexpr int kKVBytes = 2 * kKVElems;    // what one slot's full barrier expects
  static constexpr int kBoxes = kHeadDim / 64;     // TMA boxes of 64 columns per tile
  static constexpr int kBarriers = 1 + 4 * kStages;
  static constexpr int kTileBytes = 2 * (kQElems + 2 * kStages * kKVElems);
  static constexpr int kSmemBytes = kTileBytes + 8 * kBarriers + 1024;  // + slack to align the tiles to 1024
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kHeadDim / 8;
  // Named barriers kTurnBarrier + w: "warpgroup w may issue its MMAs". Each
  // phase counts that warpgroup's sync and the previous one's arrive: 256 threads.
  static constexpr int kTurnBarrier = 1;
  static constexpr int kTurnThreads = 2 * 128;
  static_assert(kHeadDim % 64 == 0 && kBoxes * 64 == kHeadDim, "Sw128Blocks stores 64-column blocks, one box each");
  static_assert(kTilesS * 8 == kBc && kTilesO * 8 == kHeadDim, "n8 accumulator tiles of S and O");
  static_assert(kKVBytes * kStages * 2 + 2 * kQElems == kTileBytes, "the tiles are Q and the two rings");
  static_assert(kTurnBarrier >= 1 && kTurnBarrier + kComputeWarpgroups <= 16 && kTurnThreads == 2 * 128,
                "one hardware barrier per warpgroup past __syncthreads' 0, each counting two warpgroups");
  static_assert(kBc % 16 == 0 && kBc <= 256 && kBr <= 256, "wgmma N and TMA box rows are at most 256");
  static_assert(kStages >= 2, "the producer fills one slot while the compute warps read the other");
  static_assert(kComputeWarpgroups == 2 || kComputeWarpgroups == 3, "two or three compute warpgroups");
  static_assert(WsConfig::kComputeWarps == 4 * kComputeWarpgroups, "the split's compute warps");
};
static_assert(WsConfig<128, 2>::kLaunchRegs == 168 && WsConfig<128, 2>::kComputeRegs == 232 &&
                  WsConfig<128, 2>::kProducerRegs == 40 && WsConfig<128, 2>::kThreads == 384,
              "header: 384 threads, 168 registers at launch, 232 / 40 after setmaxnreg");
#if ATTNLAB_WS_D64_WARPGROUPS == 2 && ATTNLAB_WS_D128_BC == 128  // the header's table: the default build
static_assert(WsConfig<64, 2>::kBr == 128 && WsConfig<64, 2>::kBc == 128 && WsConfig<128, 2>::kBr == 128 &&
                  WsConfig<128, 2>::kBc == 128,
              "header: D=64 and 128 tiles");
static_assert(WsConfig<64, 2>::kSmemBytes - 1024 == 81992, "header: D=64 shared memory");
static_assert(WsConfig<128, 2>::kSmemBytes - 1024 == 163912, "header: D=128 shared memory");
#endif
static_assert(WsConfig<256, 2>::kBr == 128 && WsConfig<256, 2>::kBc == 64 &&
                  WsConfig<256, 2>::kSmemBytes - 1024 == 196680,
              "header: D=256 tile and shared memory");
#if ATTNLAB_WS_D64_WARPGROUPS == 2
static_assert(WsConfig<64, 2>::kThreads == 384 && WsConfig<256, 2>::kThreads == 384,
              "header: 2 compute warpgroups + 1 producer warpgroup at every head dim");
#endif
static_assert(WsWarps<3>::kThreads == 512 && WsWarps<3>::kProducerRegs == 32 && WsWarps<3>::kComputeRegs == 160,
              "header: 3 compute warpgroups are 512 threads, setmaxnreg 32 / 160");

template <typename Cfg, typename T, bool kPingpong>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
ws_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
          const __grid_constant__ CUtensorMap tma_v, T* __restrict__ o, float* __restrict__ lse,
          const AttnProblem p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest query tiles first
  const int head = blockIdx.z * p.H + blockIdx.y;
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);  // the same for every warpgroup

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  T* sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  T* sK = sQ + Cfg::kQElems;                   // kStages K slots
  T* sV = sK + kStages * Cfg::kKVElems;        // kStages V slots
  uint64_t* q_full = reinterpret_cast<uint64_t*>(sV + kStages * Cfg::kKVElems);
  uint64_t* k_full = q_full + 1;  // [kStages] each
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);  // full: the producer's arrive_expect_tx, then the bytes
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], Cfg::kComputeWarps);  // empty: one arrival per compute warp
      mbarrier_init(&v_empty[s], Cfg::kComputeWarps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // no copy may signal a barrier before it is initialised

  if (warp >= Cfg::kProducerWarp) {
    // ---- the producer: one thread issues every copy of the block -----------------
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp && lane == 0 && n_tiles > 0) {
      prefetch_tensor_map(&tma_q);
      prefetch_tensor_map(&tma_k);
      prefetch_tensor_map(&tma_v);
      mbarrier_arrive_expect_tx(q_full, 2 * Cfg::kQElems);
      for (int b = 0; b < Cfg::kBoxes; ++b) tma_load_3d(sQ + b * Br * 64, &tma_q, q_full, b * 64, q_start, head);
      // Tile j goes to slot j % kStages once the compute warps have released
      // tile j - kStages from it (phase (j / kStages - 1) of its empty barrier).
      auto load = [&](T* ring, const CUtensorMap* map, uint64_t* full, uint64_t* empty, int j) {
        const int slot = j % kStages;
        if (j >= kStages) mbarrier_wait(&empty[slot], (j / kStages - 1) & 1);
        mbarrier_arrive_expect_tx(&full[slot], Cfg::kKVBytes);
        for (int b = 0; b < Cfg::kBoxes; ++b)
          tma_load_3d(ring + slot * Cfg::kKVElems + b * Bc * 64, map, &full[slot], b * 64, j * Bc, head);
      };
      // The order the compute warps use them in: K one tile ahead of V.
      load(sK, &tma_k, k_full, k_empty, 0);
      for (int j = 0; j < n_tiles; ++j) {
        if (j + 1 < n_tiles) load(sK, &tma_k, k_full, k_empty, j + 1);
        load(sV, &tma_v, v_full, v_empty, j);
      }
    }
    __syncwarp();
    return;
  }

  // ---- the W compute warpgroups -----------------------------------------------------
  warpgroup_reg_alloc<Cfg::kComputeRegs>();
  const int warpgroup = threadIdx.x / 128;
  const int row0 = q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // row of c0, c1
  const T* sQ_wg = sQ + warpgroup * 64 * 64;  // this warpgroup's 64 rows of every 64-column block
  const float scale_log2 = p.scale * kLog2e;

  // NEW (+pingpong): the turn. Warpgroup w waits on barrier kTurnBarrier + w,
  // issues its MMAs, and arrives on the next one's (w + 1, round the W
  // warpgroups). The last warpgroup pre-arrives once so that warpgroup 0 goes
  // first, and skips its arrival after the last tile, so that every barrier
  // phase that is started also completes.
  constexpr int W = Cfg::kComputeWarpgroups;
  auto take_turn = [&] {
    if constexpr (kPingpong) named_barrier_sync(Cfg::kTurnBarrier + warpgroup, Cfg::kTurnThreads);
  };
  auto pass_turn = [&](int j) {
    if constexpr (kPingpong)
      if (warpgroup < W - 1 || j + 1 < n_tiles)
        named_barrier_arrive(Cfg::kTurnBarrier + (warpgroup + 1) % W, Cfg::kTurnThreads);
  };
  // One arrival per warp, after the warp's own wgmma_wait: the slot is free
  // once all kComputeWarps warps have finished reading it.
  auto release = [&](uint64_t* empty, int j) {
    if (lane == 0) mbarrier_arrive(&empty[j % kStages]);
  };
  auto wait_full = [&](uint64_t* full, int j) { mbarrier_wait(&full[j % kStages], (j / kStages) & 1); };

  // Rung 07's tile MMAs (common/wgmma.cuh), on slot j % kStages.
  auto issue_qk = [&](float (&S)[Cfg::kTilesS][4], int j) {
    wgmma_qk_tile<T, D, Br, Bc>(S, sQ_wg, sK + (j % kStages) * Cfg::kKVElems);
    wgmma_commit();
  };
  float O[Cfg::kTilesO][4] = {};
  auto issue_pv = [&](const uint32_t (&P)[Cfg::kTilesS / 2][4], int j) {
    wgmma_pv_tile<T, D, Bc>(O, P, sV + (j % kStages) * Cfg::kKVElems);
    wgmma_commit();
  };

  RowStats stats;
  uint32_t P[Cfg::kTilesS / 2][4];  // P_{j-1}, the A operand of the next P·V
  if (n_tiles > 0) {
    if (kPingpong && warpgroup == W - 1) named_barrier_arrive(Cfg::kTurnBarrier, Cfg::kTurnThreads);
    mbarrier_wait(q_full, 0);
    wait_full(k_full, 0);
    float S[Cfg::kTilesS][4];
    take_turn();
    wgmma_fence();
    issue_qk(S, 0);
    pass_turn(0);
    wgmma_wait<0>();
    fence_accumulators(S);
    release(k_empty, 0);
    mask_scores(S, p, 0, q_start, row0, row0 + 8, lane % 4);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);  // O is still zero: no rescale
    pack_p_fragments<T>(P, S);
  }

  for (int j = 1; j < n_tiles; ++j) {
    wait_full(k_full, j);
    wait_full(v_full, j - 1);  // both before the turn: a warpgroup never holds it waiting on a copy
    float S[Cfg::kTilesS][4];
    take_turn();
    wgmma_fence();
    issue_qk(S, j);
    issue_pv(P, j - 1);
    pass_turn(j);
    wgmma_wait<1>();  // S_j is done; the P·V may still run
    fence_accumulators(S);
    release(k_empty, j);
    mask_scores(S, p, j * Bc, q_start, row0, row0 + 8, lane % 4);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);
    wgmma_wait<0>();
    fence_accumulators(O);
    release(v_empty, j - 1);
    rescale_output(O, alpha);
    pack_p_fragments<T>(P, S);
  }

  if (n_tiles > 0) {  // the last P·V
    wait_full(v_full, n_tiles - 1);
    wgmma_fence();
    issue_pv(P, n_tiles - 1);
    wgmma_wait<0>();
    fence_accumulators(O);
  }
  store_output<T>(O, stats, p, head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
#endif
}

#define WS_HEAD_DIMS 64, 128, 256
constexpr int kWsStages = 2;
static_assert(kWsStages == 2, "header: two slots in each of the K and V rings");

std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  return rung_unsupported<WsConfig, kWsStages, WS_HEAD_DIMS>(p);
}

template <bool kPingpong>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  dispatch_head_dim<WS_HEAD_DIMS>(p.D, [&](auto head_dim) {
    using Cfg = WsConfig<decltype(head_dim)::value, kWsStages>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      CUtensorMap maps[3];
      if (!encode_qkv_maps<Cfg::kBr, Cfg::kBc>(maps, p, b.q, b.k, b.v)) return cudaErrorInvalidValue;
      const dim3 grid((p.Nq + Cfg::kBr - 1) / Cfg::kBr, p.H, p.B);
      return launch_with_smem(ws_kernel<Cfg, T, kPingpong>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, maps[0],
                              maps[1], maps[2], static_cast<T*>(b.o), b.lse, p);
    });
  });
  return err;
}

template <bool kPingpong>
Variant make_variant() {
  Variant v;
  v.name = std::string("ws+stage") + std::to_string(kWsStages) + (kPingpong ? "+pingpong" : "");
  v.rung = "12_ws_pingpong";
  v.unsupported_reason = unsupported;
  v.launch = launch<kPingpong>;
  v.describe = [] {
    return std::string("sm_90a wgmma, K/V by TMA from a producer warp, softmax overlapped with P·V") +
           (kPingpong ? ", the 2 warpgroups alternate on the tensor cores" : "") + "; " +
           rung_describe<WsConfig, kWsStages, WS_HEAD_DIMS>();
  };
  return v;
}

}  // namespace

std::vector<Variant> make_ws_pingpong_variants() { return {make_variant<false>(), make_variant<true>()}; }

}  // namespace attnlab
