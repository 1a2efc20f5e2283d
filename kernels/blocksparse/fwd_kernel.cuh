// attnlab: the block-sparse forward's kernel and its launch for one pair of
// head dims (blocksparse_fwd_dims<D, Dv>), compiled in a file of its own per
// pair (instances/fwd_*.cu) so that the head dims build side by side; the
// host API that dispatches to them, and the tile table these constants are
// checked against, are in blocksparse_fwd.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/fwd_epilogue.cuh"
#include "blocksparse/fwd_mainloop.cuh"
#include "blocksparse/fwd_scheduler.cuh"
#include "blocksparse/mods.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "hopper/fwd_kernel.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {
namespace bs_fwd {

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
  // NEW (order): the block's items, one per round: blockIdx.x, then (on a
  // persistent grid) the next of `counter`, fetched by the producer
  // (hopper/fwd_kernel.cuh, rung 12's skeleton).
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ws_fwd_block<Cfg, T, !kPersistent>(
      smem_raw, order, counter, &tma_q, &tma_k, &tma_v,
      [&](const WsShared<Cfg, T>& sm, const WorkPiece& piece, WsRing& ring) __attribute__((always_inline)) {
        int q_start, head;
        blocksparse_item(order, piece.item, q_start, head, Cfg::kBr);
        const KvTileWalk walk = kv_tile_walk(lists, p, head, q_start, Cfg::kBc);  // NEW (walk)
        blocksparse_load<Cfg, T>(sm, &tma_q, &tma_k, &tma_v, p, head, q_start, walk, ring);
      },
      [&](const WsShared<Cfg, T>& sm, const WorkPiece& piece, WsRing& ring) __attribute__((always_inline)) {
        int q_start, head;
        blocksparse_item(order, piece.item, q_start, head, Cfg::kBr);
        const KvTileWalk walk = kv_tile_walk(lists, p, head, q_start, Cfg::kBc);  // NEW (walk): the producer's
        // NEW (mods): the unit of the scores the softmax sees (raw, or the score_mod's scaled output)
        const float score_scale = score.kind == ScoreModKind::kNone ? p.scale : 1.f;
        float O[Cfg::kTilesO][4] = {};
        RowStats stats;
        blocksparse_compute<Cfg, T, kPingpong, kTensorMods>(sm, p, walk, mask, score, score_scale, head, q_start,
                                                            ring, O, stats);
        blocksparse_store<T>(O, stats, p, score_scale, head, q_start, o, lse);
      });
#endif
}

}  // namespace bs_fwd

// O and LSE of p on the kernel of head dims (D, Dv) (blocksparse_fwd checks
// the problem and the mods first).
template <int D, int Dv>
cudaError_t blocksparse_fwd_dims(const AttnProblem& p, const AttnBuffers& b, const BlockMaskView& bm,
                                 const MaskMod& mask, const ScoreMod& score, cudaStream_t stream) {
  using namespace bs_fwd;
  using Cfg = Config<D, Dv>;
  return dispatch_dtype(p.dtype, [&](auto type) {
    using T = decltype(type);
    CUtensorMap maps[3];
    if (!encode_qkv_maps<Cfg::kBr, Cfg::kBc>(maps, p, b.q, b.k, b.v)) return cudaErrorInvalidValue;
    // A persistent grid taking the items from a counter where the tile
    // allows it (hopper/fwd_scheduler.h), else a block per item.
    FwdSchedule s;
    if (cudaError_t e = plan_fwd_schedule(p, kBlockSparsePolicy, FwdTiles{Cfg::kBr, Cfg::kBc, 0, 0},
                                          BsTile<D, Dv>::kPersistent, b.workspace, b.workspace_bytes,
                                          device_sm_count(), stream, s);
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
                            dim3(unsigned(s.blocks)), Cfg::kThreads, Cfg::kSmemBytes, stream, maps[0], maps[1],
                            maps[2], static_cast<T*>(b.o), b.lse, p, s.order, lists, mask, score, s.counter);
  });
}

// Compiled in instances/fwd_*.cu, one pair of head dims each.
extern template cudaError_t blocksparse_fwd_dims<64, 64>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                            const MaskMod&, const ScoreMod&, cudaStream_t);
extern template cudaError_t blocksparse_fwd_dims<128, 128>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                            const MaskMod&, const ScoreMod&, cudaStream_t);
extern template cudaError_t blocksparse_fwd_dims<256, 256>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                            const MaskMod&, const ScoreMod&, cudaStream_t);
extern template cudaError_t blocksparse_fwd_dims<192, 128>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                            const MaskMod&, const ScoreMod&, cudaStream_t);
extern template cudaError_t blocksparse_fwd_dims<128, 64>(const AttnProblem&, const AttnBuffers&, const BlockMaskView&,
                                                            const MaskMod&, const ScoreMod&, cudaStream_t);

}  // namespace attnlab
