// ============================================================================
// Block-sparse forward — FlexAttention's forward on rung 12's engine
// ============================================================================
// What changes against rung 12 (`ws+pingpong`): the same producer warp, TMA ring
// and ping-pong compute warpgroups with P in registers (ws_mainloop.cuh), but
//   NEW (walk, fwd_mainloop.cuh): a query tile visits only the key blocks its
//        query block lists, partial list then full list, each from the largest
//        block down (flash_attn/cute's block_sparse_utils.py), each block cut into
//        block_kv / Bc key tiles (kv subtiling). Producer and consumers walk the
//        same lists, so they agree on the count, 0 included: O = 0, LSE = -inf;
//   NEW (mods, apply_mods.cuh): per tile, score_mod(scale·s) when there is one
//        (a bias broadcast over the queries loaded before the tile's score MMA),
//        the mask_mod on partial tiles only, the sequence bounds on every tile;
//   NEW (order, fwd_scheduler.cuh): the (query tile, head) items in rung 12's
//        causal order (bottom tiles first), taken from a counter by a persistent
//        grid (rung 12's dynamic order) where a workspace holds it; no stream-K split.
// Where it is slower than rung 12 on the same keys: Bc = 128 at D = 128 (176 does
// not divide a 128-key block), an index load per tile, a mod per partial tile.
//
// Per block: Br = 64 x 2 compute warpgroups + 1 producer; sQ [Br, D] once, sK
// [kStages][Bc, D], sV [kStages][Bc, Dv] (Sw128Blocks); 6 + 4·kStages mbarriers.
// Tiles (BsTile below, checked by static_assert): rung 12's, with Br and Bc
// dividing 128 so that FlexAttention's default 128 x 128 blocks map onto tiles:
//   D / Dv     Br   Bc  warpgroups  stages  ping-pong  persistent  smem (+1024 slack)
//   64        128  128   2 + 1       2       yes        no          82040
//   128       128  128   2 + 1       2       yes        yes        163960
//   256       128   64   2 + 1       2       no         yes        196728
//   192 / 128 128  128   2 + 1       2       yes        yes        213112
//   128 / 64  128  128   2 + 1       2       yes        yes        131192
// Block sizes: block_q a multiple of Br, block_kv of Bc (else refused).
// Registers (setmaxnreg): producer / compute 40 / 232.
//
// Supports: fp16, bf16; the (D, Dv) above; GQA/MQA; any Nq, Nk >= 1; every
// mask_mod and score_mod of mods.h; block masks of block_mask.h, B and H
// broadcast. Writes O and LSE. Needs sm_90a, cuTensorMapEncodeTiled.
//
// Run: build/test_blocksparse_fwd   (tests/gpu/test_blocksparse_fwd.cpp)
// ============================================================================

#include "blocksparse/blocksparse_fwd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "blocksparse/fwd_epilogue.cuh"
#include "blocksparse/fwd_mainloop.cuh"
#include "blocksparse/fwd_scheduler.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flash_attn/ws_mainloop.cuh"
#include "host/arch.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {
namespace {

// The key tile Bc and whether the warpgroups take turns, per (D, Dv): rung 12's
// WsTile where Bc divides 128 (Bc = 128 at D = 128 where rung 12 takes 176, as
// FlashAttention-3 does under a mask; 64 at D = 256 where it takes 80), two
// compute warpgroups everywhere (rung 12's three at D = 64 make Br = 192).
template <int kHeadDim, int kHeadDimV>
struct BsTile;
// kPersistent: the persistent grid where its loop over items compiles without
// spills: everywhere but D = 64 (24 bytes), with the kernel's parameters
// __grid_constant__ (read where used; held in registers, 192/128 spilled 4).
template <int Bc, bool Pingpong, bool Persistent>
struct BsTileOf {
  static constexpr int kBc = Bc;
  static constexpr bool kPingpong = Pingpong, kPersistent = Persistent;
};
template <> struct BsTile<64, 64>   : BsTileOf<128, true, false> {};
template <> struct BsTile<128, 128> : BsTileOf<128, true, true> {};
template <> struct BsTile<256, 256> : BsTileOf<64, false, true> {};
template <> struct BsTile<192, 128> : BsTileOf<128, true, true> {};
template <> struct BsTile<128, 64>  : BsTileOf<128, true, true> {};

constexpr int kBsWarpgroups = 2, kBsStages = 2;
template <int D, int Dv>
using Config = WsConfig<D, Dv, BsTile<D, Dv>::kBc, kBsWarpgroups, kBsStages>;

// The header's table.
template <int D, int Dv, int kBr, int kBc, int kThreads, bool kPingpong, bool kPersistent, int kSmem>
constexpr bool kTableRow = Config<D, Dv>::kBr == kBr && Config<D, Dv>::kBc == kBc &&
                           Config<D, Dv>::kThreads == kThreads && Config<D, Dv>::kStages == 2 &&
                           BsTile<D, Dv>::kPingpong == kPingpong && BsTile<D, Dv>::kPersistent == kPersistent &&
                           Config<D, Dv>::kSmemBytes - 1024 == kSmem;
static_assert(kTableRow<64, 64, 128, 128, 384, true, false, 82040>, "header: D=64");
static_assert(kTableRow<128, 128, 128, 128, 384, true, true, 163960>, "header: D=128");
static_assert(kTableRow<256, 256, 128, 64, 384, false, true, 196728>, "header: D=256");
static_assert(kTableRow<192, 128, 128, 128, 384, true, true, 213112>, "header: D=192, Dv=128");
static_assert(kTableRow<128, 64, 128, 128, 384, true, true, 131192>, "header: D=128, Dv=64");
static_assert(WsWarps<kBsWarpgroups>::kProducerRegs == 40 && WsWarps<kBsWarpgroups>::kComputeRegs == 232,
              "header: 40 / 232 after setmaxnreg");
static_assert(128 % Config<64, 64>::kBr == 0 && 128 % Config<128, 128>::kBc == 0 && 128 % Config<256, 256>::kBc == 0,
              "FlexAttention's default 128 x 128 blocks are whole tiles");

// kTensorMods: the instance for a tensor mask_mod or a bias score_mod
// (apply_mods.cuh says why they have their own).
template <typename Cfg, typename T, bool kPingpong, bool kPersistent, bool kTensorMods>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
blocksparse_fwd_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                       const __grid_constant__ CUtensorMap tma_v, T* __restrict__ o, float* __restrict__ lse,
                       const __grid_constant__ AttnProblem p, const __grid_constant__ TileOrder order,
                       const __grid_constant__ BlockSparseLists lists, const __grid_constant__ MaskMod mask,
                       const __grid_constant__ ScoreMod score, int* __restrict__ counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const WsShared<Cfg, T> sm(smem_raw);
  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // no copy may signal a barrier before it is initialised

  // NEW (order): the block's items, one per round: blockIdx.x, then (on a
  // persistent grid) the next of `counter`, fetched by the producer.
  WsRing ring;
  int q_start, head;
  if (threadIdx.x / 32 >= Cfg::kProducerWarp) {
    // ---- the producer: one thread issues every copy of the block -----------------
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (threadIdx.x == 32 * Cfg::kProducerWarp) {
      prefetch_tensor_map(&tma_q);
      prefetch_tensor_map(&tma_k);
      prefetch_tensor_map(&tma_v);
      WorkPiece piece;
      for (int round = 0; (piece = ws_producer_piece(sm, order, counter, round)).item >= 0; ++round) {
        blocksparse_item(order, piece.item, q_start, head, Cfg::kBr);
        const KvTileWalk walk = kv_tile_walk(lists, p, head, q_start, Cfg::kBc);  // NEW (walk)
        blocksparse_load<Cfg, T>(sm, &tma_q, &tma_k, &tma_v, p, head, q_start, walk, ring);
        if constexpr (!kPersistent) break;  // its one item
      }
    }
    __syncwarp();
    return;
  }
  // ---- the 2 compute warpgroups -------------------------------------------------------
  warpgroup_reg_alloc<Cfg::kComputeRegs>();
  // NEW (mods): the unit of the scores the softmax sees (raw, or the score_mod's scaled output)
  const float score_scale = score.kind == ScoreModKind::kNone ? p.scale : 1.f;
  WorkPiece piece;
  for (int round = 0; (piece = ws_compute_piece(sm, order, round)).item >= 0; ++round) {
    blocksparse_item(order, piece.item, q_start, head, Cfg::kBr);
    const KvTileWalk walk = kv_tile_walk(lists, p, head, q_start, Cfg::kBc);  // NEW (walk): the producer's
    float O[Cfg::kTilesO][4] = {};
    RowStats stats;
    blocksparse_compute<Cfg, T, kPingpong, kTensorMods>(sm, p, walk, mask, score, score_scale, head, q_start, ring,
                                                        O, stats);
    blocksparse_store<T>(O, stats, p, score_scale, head, q_start, o, lse);
    if constexpr (!kPersistent) break;
  }
#endif
}

using BsHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<256, 256>, HeadDims<192, 128>,
                               HeadDims<128, 64>>;

}  // namespace

std::string blocksparse_fwd_unsupported(const AttnProblem& p, const BlockMaskView& bm) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  int smem = 0, Br = 0, Bc = 0;
  if (!BsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
        using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
        smem = Cfg::kSmemBytes, Br = Cfg::kBr, Bc = Cfg::kBc;
      }))
    return "head dims " + std::to_string(p.D) + (p.Dv == p.D ? "" : "/" + std::to_string(p.Dv)) + " not in " +
           BsHeadDims::names() + " (D, or D/Dv)";
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  if (!bm.kv_count || !bm.kv_index || !bm.full_count || !bm.full_index) return "block mask without forward lists";
  if (std::string why = block_mask_view_unsupported(p, bm, Br, Bc); !why.empty()) return why;
  if (blocksparse_tile_order(p, Br).items == 0) return "more than 2^30 query tiles";
  return smem_unsupported(size_t(smem));
}

size_t blocksparse_fwd_workspace_bytes() { return kDynamicCounterBytes; }

cudaError_t blocksparse_fwd(const AttnProblem& p, const AttnBuffers& b, const BlockMaskView& bm, const MaskMod& mask,
                            const ScoreMod& score, cudaStream_t stream) {
  if (!blocksparse_fwd_unsupported(p, bm).empty() || !mods_unfit(p, mask, score).empty())
    return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  BsHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      CUtensorMap maps[3];
      if (!encode_qkv_maps<Cfg::kBr, Cfg::kBc>(maps, p, b.q, b.k, b.v)) return cudaErrorInvalidValue;
      TileOrder order = blocksparse_tile_order(p, Cfg::kBr);
      // A persistent grid taking the items from a counter where the tile
      // allows it (tile_order.cuh), else a block per item.
      int blocks = order.items;
      int* counter = nullptr;
      if constexpr (BsTile<D, Dv>::kPersistent)
        if (cudaError_t e = plan_dynamic_order(order, b.workspace, b.workspace_bytes, device_sm_count(), stream,
                                               blocks, counter);
            e != cudaSuccess)
          return e;
      BlockSparseLists lists;
      lists.kv_count = bm.kv_count, lists.kv_index = bm.kv_index;
      lists.full_count = bm.full_count, lists.full_index = bm.full_index;
      lists.B = bm.B, lists.H = bm.H, lists.m_blocks = bm.m_blocks, lists.n_blocks = bm.n_blocks;
      lists.block_q = bm.block_q;
      lists.tiles_per_block = bm.block_kv / Cfg::kBc;
      constexpr bool kPingpong = BsTile<D, Dv>::kPingpong, kPersistent = BsTile<D, Dv>::kPersistent;
      return launch_with_smem(has_tensor_mods(mask, score)
                                  ? blocksparse_fwd_kernel<Cfg, T, kPingpong, kPersistent, true>
                                  : blocksparse_fwd_kernel<Cfg, T, kPingpong, kPersistent, false>,
                              dim3(unsigned(blocks)),
                              Cfg::kThreads, Cfg::kSmemBytes, stream, maps[0], maps[1], maps[2],
                              static_cast<T*>(b.o), b.lse, p, order, lists, mask, score, counter);
    });
  });
  return err;
}

std::string blocksparse_fwd_describe() {
  std::string s = "sm_90a wgmma, K/V by TMA from a producer warp, listed key tiles only; stages=" +
                  std::to_string(kBsStages);
  BsHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    s += "; D=" + std::to_string(D) + (Dv == D ? "" : "/" + std::to_string(Dv)) + ": Br=" + std::to_string(Cfg::kBr) +
         " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) +
         " smem=" + std::to_string(Cfg::kSmemBytes) + "B" + (BsTile<D, Dv>::kPingpong ? " pingpong" : "");
  });
  return s + "; fp16/bf16; GQA/MQA; any Nq, Nk; block sizes multiples of Br x Bc; a persistent grid taking the "
             "items from a counter";
}

}  // namespace attnlab
