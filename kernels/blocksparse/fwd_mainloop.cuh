// attnlab: the block-sparse forward's mainloop — rung 12's producer and
// compute warpgroups (ws_load_tiles, ws_compute_tiles in
// hopper/fwd_mainloop.cuh) walking the key tiles a block mask lists
// instead of a range, with the mask_mod and score_mod on each tile's scores
// (apply_mods.cuh). FlashAttention-3's hopper/ mainloop takes a tile range and
// a Mask; flash_attn/cute's block_sparse_utils.py walks the lists this way.
//
// The walk of one query tile (rows q_start .. q_start + Br - 1, inside query
// block m = q_start / block_q): the partial list of m, then its full list,
// each from its largest key block down, each key block expanded into its
// f = block_kv / Bc key tiles (kv subtiling), largest first; tiles past Nk (of
// the last key block) are left out. The producer and the compute warpgroups
// walk the same lists, so they agree on the number of tiles, 0 included.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "blocksparse/apply_mods.cuh"
#include "blocksparse/mods.h"
#include "common/online_softmax.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "host/attn_problem.h"

namespace attnlab {

// The block mask's forward lists as the kernel reads them (block_mask.h's
// layout): per (b, h, m), kv_count partial key blocks at kv_index, full_count
// full ones at full_index. B or H may be 1: the same lists for every batch or
// head.
struct BlockSparseLists {
  const int32_t* kv_count = nullptr;    // [B][H][m_blocks]
  const int32_t* kv_index = nullptr;    // [B][H][m_blocks][n_blocks]
  const int32_t* full_count = nullptr;
  const int32_t* full_index = nullptr;
  int B = 1, H = 1, m_blocks = 0, n_blocks = 0;
  int block_q = 0;    // rows per query block, a multiple of Br
  int tiles_per_block = 1;  // f = block_kv / Bc
};

// Device code of sm_90a only (the mainloop's TMA, mbarriers and wgmma).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The key tiles of one query tile, in walk order: tile(i) for i < n_tiles(),
// partial(i) when it comes from the partial list. Two lists as scalars, not
// arrays, so that nothing is indexed at run time (which would be local memory).
struct KvTileWalk {
  const int32_t* partial_index;  // ascending key blocks
  const int32_t* full_index;
  int partial_count, full_count;  // listed key blocks
  int partial_skip, full_skip;    // key tiles past Nk of the list's last block (the first it walks)
  int partial_tiles;              // key tiles of the partial list
  int f;                          // key tiles per key block

  __device__ __forceinline__ int n_tiles() const { return partial_tiles + full_count * f - full_skip; }
  __device__ __forceinline__ bool partial(int i) const { return i < partial_tiles; }
  __device__ __forceinline__ int tile(int i) const {
    const bool in_partial = i < partial_tiles;
    const int r = in_partial ? i + partial_skip : i - partial_tiles + full_skip;  // from the list's end
    const int32_t* index = in_partial ? partial_index : full_index;
    const int count = in_partial ? partial_count : full_count;
    return index[count - 1 - r / f] * f + (f - 1 - r % f);
  }
};

// The walk of the query tile starting at row q_start of query head `head`
// (b·H + h) for key tiles of Bc keys.
__device__ __forceinline__ KvTileWalk kv_tile_walk(const BlockSparseLists& lists, const AttnProblem& p, int head,
                                                   int q_start, int Bc) {
  const int batch = head / p.H, h = head % p.H;
  const int64_t row = (int64_t(lists.B == 1 ? 0 : batch) * lists.H + (lists.H == 1 ? 0 : h)) * lists.m_blocks +
                      q_start / lists.block_q;
  const int f = lists.tiles_per_block;
  const int last = lists.n_blocks - 1;
  const int last_skip = f - ((p.Nk + Bc - 1) / Bc - last * f);  // tiles of the last key block past Nk
  KvTileWalk w;
  w.f = f;
  w.partial_index = lists.kv_index + row * lists.n_blocks;
  w.full_index = lists.full_index + row * lists.n_blocks;
  w.partial_count = lists.kv_count[row];
  w.full_count = lists.full_count[row];
  w.partial_skip = w.partial_count > 0 && w.partial_index[w.partial_count - 1] == last ? last_skip : 0;
  w.full_skip = w.full_count > 0 && w.full_index[w.full_count - 1] == last ? last_skip : 0;
  w.partial_tiles = w.partial_count * f - w.partial_skip;
  return w;
}

// The producer thread's copies for one query tile: Q, then its walk's K and V tiles.
template <typename Cfg, typename T>
__device__ __forceinline__ void blocksparse_load(const WsShared<Cfg, T>& sm, const CUtensorMap* tma_q,
                                                 const CUtensorMap* tma_k, const CUtensorMap* tma_v,
                                                 const AttnProblem& p, int head, int q_start, const KvTileWalk& walk,
                                                 WsRing& ring) {
  ws_load_tiles<Cfg, T>(sm, tma_q, tma_k, tma_v, head, int(p.kv_head(head)), q_start, walk.n_tiles(),
                        [&](int i) { return walk.tile(i); }, ring);
}

// One mainloop of blocksparse_compute. kAheadRows > 0: a bias whose tile pairs
// are loaded ahead (apply_mods.cuh's BiasAhead: 1 row broadcast over the
// queries, or the lane's 2 rows), in a mainloop of its own, so that its
// registers are not held through the other score_mods' loops.
template <typename Cfg, typename T, bool kPingpong, bool kTensorMods, int kAheadRows>
__device__ __forceinline__ void blocksparse_compute_loop(const WsShared<Cfg, T>& sm, const AttnProblem& p,
                                                         const KvTileWalk& walk, const MaskMod& mask,
                                                         const ScoreMod& score, float score_scale, int head,
                                                         int q_start, WsRing& ring, float (&O)[Cfg::kTilesO][4],
                                                         RowStats& stats) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
  const int row0 = q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // row of c0, c1
  const int batch = head / p.H, h = head % p.H;
  const bool ragged_rows = q_start + Br > p.Nq;
  const int n = walk.n_tiles();
  int tile = n > 0 ? walk.tile(0) : 0;  // the key tile of the next call, its index loaded one tile ahead
  constexpr bool kAhead = kAheadRows > 0;
  BiasAhead<Cfg::kTilesS, kAhead ? kAheadRows : 1> bias_ahead;
  ws_compute_tiles<Cfg, T, kPingpong>(
      sm, n, score_scale * kLog2e,
      [&](float (&S)[Cfg::kTilesS][4], int i) {
        const int kv_start = tile * Bc;
        if (i + 1 < n) tile = walk.tile(i + 1);
        if constexpr (kAhead) {
          if (score.bias_bf16) bias_ahead.template add<__nv_bfloat16>(S, p.scale);
          else bias_ahead.template add<__half>(S, p.scale);
        } else if (score.kind != ScoreModKind::kNone) {
          apply_score_mod<kTensorMods>(S, score, p.scale, batch, h, row0, kv_start, lane % 4);
        }
        if (walk.partial(i)) apply_mask_mod<kTensorMods>(S, mask, batch, h, row0, kv_start, lane % 4, p.Nq, p.Nk);
        else if (ragged_rows || kv_start + Bc > p.Nk) apply_bounds(S, row0, kv_start, lane % 4, p.Nq, p.Nk);
      },
      ring, O, stats, [&](int) {
        if constexpr (kAhead) {
          if (score.bias_bf16) bias_ahead.template load<__nv_bfloat16>(score, batch, h, row0, tile * Bc, lane % 4);
          else bias_ahead.template load<__half>(score, batch, h, row0, tile * Bc, lane % 4);
        }
      });
}

// A compute warpgroup's 64 rows of the query tile against the walk's tiles:
// on each tile's raw scores s, s' = score_mod(scale·s) when there is a score_mod
// (the softmax then takes s' as it is: score_scale = 1; otherwise s and
// score_scale = scale, folded into its exp2 as in rung 12), then the mask_mod
// and the bounds on a partial tile, the bounds alone on a ragged full tile.
// O (zero on entry) and stats are left for the epilogue.
template <typename Cfg, typename T, bool kPingpong, bool kTensorMods>
__device__ __forceinline__ void blocksparse_compute(const WsShared<Cfg, T>& sm, const AttnProblem& p,
                                                    const KvTileWalk& walk, const MaskMod& mask,
                                                    const ScoreMod& score, float score_scale, int head, int q_start,
                                                    WsRing& ring, float (&O)[Cfg::kTilesO][4], RowStats& stats) {
  if constexpr (kTensorMods) {
    if (BiasAhead<Cfg::kTilesS, 1>::applies(score)) {
      blocksparse_compute_loop<Cfg, T, kPingpong, kTensorMods, 1>(sm, p, walk, mask, score, score_scale, head,
                                                                   q_start, ring, O, stats);
      return;
    }
    if (BiasAhead<Cfg::kTilesS, 2>::applies(score)) {
      blocksparse_compute_loop<Cfg, T, kPingpong, kTensorMods, 2>(sm, p, walk, mask, score, score_scale, head,
                                                                   q_start, ring, O, stats);
      return;
    }
  }
  blocksparse_compute_loop<Cfg, T, kPingpong, kTensorMods, 0>(sm, p, walk, mask, score, score_scale, head, q_start,
                                                               ring, O, stats);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
