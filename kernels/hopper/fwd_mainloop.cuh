// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: rung 12's mainloop, one work item at a time — what its producer
// thread and its compute warpgroups do for one (query tile, head), in the
// roles of FlashAttention-3's CollectiveMainloop (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp):
// ws_load issues the TMA copies of Q and of each K and V tile into the ring,
// ws_compute runs the tile MMAs and the online softmax, leaving O and the row
// statistics to the epilogue (hopper/fwd_epilogue.cuh). The kernel skeleton
// (hopper/fwd_kernel.cuh) walks the block's work pieces (hopper/fwd_scheduler.cuh)
// and calls one or the other.
//
// Both are built on two walks that other kernels on this engine share (the
// block-sparse forward, kernels/blocksparse/): ws_load_tiles copies n key
// tiles given by a functor (the i-th is key tile tile_of(i)), ws_compute_tiles
// runs the MMAs and the softmax over them with a hook on each tile's scores
// (here the causal/bounds mask; there the mask_mod and score_mod), as
// FlashAttention-3's mainloop takes its n_block range and its Mask functor.
#pragma once

#include <cuda.h>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "hopper/fwd_scheduler.cuh"
#include "hopper/fwd_scheduler.h"
#include "host/attn_problem.h"

namespace attnlab {

// The producer/compute register split for W compute warpgroups: 40 / 232 for
// two (rung 09's), 32 / 160 for three (FlashAttention-3's; the producer's loop
// is kept rolled to fit 32, the compute needs all 160).
template <int kWarpgroups>
using WsWarps = ProducerWarpgroupSplit<kWarpgroups, kWarpgroups == 2 ? 40 : 32, kWarpgroups == 2 ? 232 : 160>;

template <int kHeadDim_, int kHeadDimV_, int kBc_, int kWarpgroups_, int kStages_>
struct WsConfig : WsWarps<kWarpgroups_> {  // W compute warpgroups + 1 producer warpgroup
  static constexpr int kHeadDim = kHeadDim_;    // D: Q and K
  static constexpr int kHeadDimV = kHeadDimV_;  // Dv: V and O
  static constexpr int kStages = kStages_;
  static constexpr int kComputeWarpgroups = kWarpgroups_;
  static constexpr int kBr = 64 * kComputeWarpgroups;  // one m64 row block per compute warpgroup
  static constexpr int kBc = kBc_;
  static constexpr int kQElems = kBr * kHeadDim;
  static constexpr int kKElems = kBc * kHeadDim;   // one K tile
  static constexpr int kVElems = kBc * kHeadDimV;  // one V tile
  static constexpr int kKBytes = 2 * kKElems;      // what a K slot's full barrier expects
  static constexpr int kVBytes = 2 * kVElems;
  static constexpr int kBoxesQK = kHeadDim / 64;   // TMA boxes of 64 columns per Q or K tile
  static constexpr int kBoxesV = kHeadDimV / 64;
  static constexpr int kBarriers = 2 + 4 * kStages;  // Q, K and V rings
  static constexpr int kTileBytes = 2 * (kQElems + kStages * (kKElems + kVElems));
  // + the scheduler's hand-off, + slack to align to 1024
  static constexpr int kSmemBytes = kTileBytes + 8 * kBarriers + FwdSchedulerShared::kBytes + 1024;
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kHeadDimV / 8;
  // Named barriers kTurnBarrier + w: "warpgroup w may issue its MMAs". Each
  // phase counts that warpgroup's sync and the previous one's arrive: 256 threads.
  static constexpr int kTurnBarrier = 1;
  static constexpr int kTurnThreads = 2 * 128;
  // Named barrier of all compute warps, for a piece's partial state (hopper/fwd_epilogue.cuh).
  static constexpr int kSplitBarrier = kTurnBarrier + kComputeWarpgroups;
  static_assert(kBoxesQK * 64 == kHeadDim && kBoxesV * 64 == kHeadDimV,
                "Sw128Blocks stores 64-column blocks, one box each");
  static_assert(kTilesS * 8 == kBc && kTilesO * 8 == kHeadDimV, "n8 accumulator tiles of S and O");
  static_assert(2 * kQElems + kStages * (kKBytes + kVBytes) == kTileBytes, "the tiles are Q and the two rings");
  static_assert(kTurnBarrier >= 1 && kTurnBarrier + kComputeWarpgroups <= 16 && kTurnThreads == 2 * 128,
                "one hardware barrier per warpgroup past __syncthreads' 0, each counting two warpgroups");
  static_assert(kSplitBarrier <= 15, "hardware barriers 1..15");
  static_assert(kBc % 16 == 0 && kBc <= 256 && kBr <= 256, "wgmma N and TMA box rows are at most 256");
  static_assert((kBc * 128) % 1024 == 0, "each 64-column block of a K or V slot starts 1024-aligned (the swizzle atom)");
  static_assert(kStages >= 2, "the producer fills one slot while the compute warps read the other");
  static_assert(kComputeWarpgroups == 2 || kComputeWarpgroups == 3, "two or three compute warpgroups");
  static_assert(WsConfig::kComputeWarps == 4 * kComputeWarpgroups, "the split's compute warps");
};

// Device code of sm_90a only (TMA, mbarriers and wgmma exist there alone).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The block's shared memory, Cfg's tiles then its barriers: sQ [Br, D] once,
// sK [kStages][Bc, D], sV [kStages][Bc, Dv] (Sw128Blocks, 1024-aligned),
// 2 + 4·kStages mbarriers, then the scheduler's hand-off (FwdSchedulerShared).
template <typename Cfg, typename T>
struct WsShared {
  T* sQ;
  T* sK;  // kStages K slots [Bc, D]
  T* sV;  // kStages V slots [Bc, Dv]
  uint64_t* q_full;
  uint64_t* q_empty;  // NEW (persistent): sQ free for the block's next tile
  uint64_t* k_full;   // [kStages] each
  uint64_t* k_empty;
  uint64_t* v_full;
  uint64_t* v_empty;
  FwdSchedulerShared sched;  // NEW (dynamic): the producer's hand-off of the next item (hopper/fwd_scheduler.cuh)

  __device__ __forceinline__ explicit WsShared(unsigned char* smem_raw) {
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
    sK = sQ + Cfg::kQElems;
    sV = sK + Cfg::kStages * Cfg::kKElems;
    q_full = reinterpret_cast<uint64_t*>(sV + Cfg::kStages * Cfg::kVElems);
    q_empty = q_full + 1;
    k_full = q_full + 2;
    k_empty = k_full + Cfg::kStages;
    v_full = k_empty + Cfg::kStages;
    v_empty = v_full + Cfg::kStages;
    sched = fwd_scheduler_shared(v_empty + Cfg::kStages);
  }

  // By one thread, before the block's first __syncthreads.
  __device__ __forceinline__ void init_barriers() const {
    mbarrier_init(q_full, 1);  // full: the producer's arrive_expect_tx, then the bytes
    mbarrier_init(q_empty, Cfg::kComputeWarps);
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], Cfg::kComputeWarps);  // empty: one arrival per compute warp
      mbarrier_init(&v_empty[s], Cfg::kComputeWarps);
    }
    fwd_scheduler_init(sched, Cfg::kComputeWarps * 32);
    fence_mbarrier_init();
  }
};

// One work piece: its (query) head, the KV head it reads, its first query
// row, and its K/V tiles kv_begin .. kv_begin + n_tiles - 1 (the same for
// every warpgroup); all of the item's, or a share of them (hopper/fwd_scheduler.h).
struct WsWork {
  int head, kv_head, q_start, kv_begin, n_tiles;
};
template <typename Cfg>
__device__ __forceinline__ WsWork ws_work(const AttnProblem& p, const TileOrder& order, const WorkPiece& piece) {
  WsWork w;
  int m_block;
  order.item(piece.item, m_block, w.head);
  w.kv_head = int(p.kv_head(w.head));  // the K and V it reads (GQA: shared by H / Hkv heads)
  w.q_start = m_block * Cfg::kBr;
  const int all = kv_tiles_for_query_tile(p, w.q_start, Cfg::kBr, Cfg::kBc);
  w.kv_begin = piece.kv_begin;
  w.n_tiles = (piece.kv_end < all ? piece.kv_end : all) - piece.kv_begin;
  return w;
}

// Where a block's producer and compute warps are in the ring: K/V tiles and
// Q tiles so far, from which both find slots and barrier phases. They walk the
// same pieces, so they count alike. Each advances its own count past a piece
// of n key tiles (a piece without tiles loads no Q either).
struct WsRing {
  int kv_count = 0, q_count = 0;
  __device__ __forceinline__ void advance(int n) {
    kv_count += n;
    q_count += n > 0 ? 1 : 0;
  }
};

// The producer thread's copies for one query tile (rows q_start.., query head
// `head`, KV head `kv_head`) against n key tiles, the i-th being key tile
// tile_of(i): Q, then K of tile 0, then K of tile i + 1 and V of tile i for
// each i, the order the compute warps use them in. Key tile j starts at row
// kv_row0 + j·Bc of K and V (a sequence's first row in a packed batch).
template <typename Cfg, typename T, typename TileOf>
__device__ __forceinline__ void ws_load_tiles(const WsShared<Cfg, T>& sm, const CUtensorMap* tma_q,
                                              const CUtensorMap* tma_k, const CUtensorMap* tma_v, int head,
                                              int kv_head, int q_start, int n, TileOf&& tile_of, WsRing& ring,
                                              int kv_row0 = 0) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  const int q_count = ring.q_count;
  const int kv0 = ring.kv_count;  // the piece's i-th tile is the ring's tile kv0 + i
  if (n == 0) return;
  if (q_count > 0) mbarrier_wait(sm.q_empty, (q_count - 1) & 1);  // the last tile's Q·Kᵀ are done
  mbarrier_arrive_expect_tx(sm.q_full, 2 * Cfg::kQElems);
  for (int b = 0; b < Cfg::kBoxesQK; ++b)
    tma_load_3d(sm.sQ + b * Br * 64, tma_q, sm.q_full, b * 64, q_start, head);
  // The ring's tile g = kv0 + i goes to slot g % kStages, once the compute
  // warps have released tile g - kStages from it (phase (g / kStages - 1) of
  // its empty barrier).
  auto load = [&](T* slots, int elems, int boxes, const CUtensorMap* map, uint64_t* full, uint64_t* empty,
                  int i, int tile) {
    const int g = kv0 + i, slot = g % kStages;
    if (g >= kStages) mbarrier_wait(&empty[slot], (g / kStages - 1) & 1);
    mbarrier_arrive_expect_tx(&full[slot], 2 * elems);
    for (int b = 0; b < boxes; ++b)
      tma_load_3d(slots + slot * elems + b * Bc * 64, map, &full[slot], b * 64, kv_row0 + tile * Bc, kv_head);
  };
  auto load_k = [&](int i, int tile) { load(sm.sK, Cfg::kKElems, Cfg::kBoxesQK, tma_k, sm.k_full, sm.k_empty, i, tile); };
  auto load_v = [&](int i, int tile) { load(sm.sV, Cfg::kVElems, Cfg::kBoxesV, tma_v, sm.v_full, sm.v_empty, i, tile); };
  // The order the compute warps use them in: K one tile ahead of V.
  load_k(0, tile_of(0));
#pragma unroll 1  // rolled: the producer has 32 registers with three compute warpgroups
  for (int i = 0; i < n; ++i) {
    if (i + 1 < n) load_k(i + 1, tile_of(i + 1));
    load_v(i, tile_of(i));
  }
  ring.advance(n);
}

// The producer thread's copies for work piece w: its key tiles kv_begin .. kv_begin + n_tiles - 1.
template <typename Cfg, typename T>
__device__ __forceinline__ void ws_load(const WsShared<Cfg, T>& sm, const CUtensorMap* tma_q,
                                        const CUtensorMap* tma_k, const CUtensorMap* tma_v, const WsWork& w,
                                        WsRing& ring) {
  const int j0 = w.kv_begin;
  ws_load_tiles<Cfg, T>(sm, tma_q, tma_k, tma_v, w.head, w.kv_head, w.q_start, w.n_tiles,
                        [&](int i) { return j0 + i; }, ring);
}

// A compute warpgroup's mainloop over n key tiles (ring tiles kv_count ..
// kv_count + n - 1): for each, S = Q·Kᵀ (64 of the tile's query rows),
// score_tile(S, i) on the raw scores of the i-th tile (it masks, and may
// rewrite them), the online softmax with exp2(S·scale_log2 - m), and O += P·V.
// ahead(i) runs before the i-th tile's MMAs are issued: loads it starts for
// score_tile (a bias) run under them. O (zero on entry) and stats are left
// unnormalised, for the epilogue.
struct NoTileAhead {
  __device__ __forceinline__ void operator()(int) const {}
};
template <typename Cfg, typename T, bool kPingpong, typename ScoreTile, typename TileAhead = NoTileAhead>
__device__ __forceinline__ void ws_compute_tiles(const WsShared<Cfg, T>& sm, int n, float scale_log2,
                                                 ScoreTile&& score_tile, WsRing& ring,
                                                 float (&O)[Cfg::kTilesO][4], RowStats& stats,
                                                 TileAhead&& ahead = TileAhead{}) {
  constexpr int D = Cfg::kHeadDim, Dv = Cfg::kHeadDimV, Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int W = Cfg::kComputeWarpgroups;
  const int lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
  const T* sQ_wg = sm.sQ + warpgroup * 64 * 64;  // this warpgroup's 64 rows of every 64-column block
  const int q_count = ring.q_count;
  const int kv0 = ring.kv_count;  // the piece's i-th tile is the ring's tile kv0 + i

  // NEW (+pingpong): the turn. Warpgroup w waits on barrier kTurnBarrier + w,
  // issues its MMAs, and arrives on the next one's (w + 1, round the W
  // warpgroups). The last warpgroup pre-arrives once so that warpgroup 0 goes
  // first, and skips its arrival after the last tile, so that every barrier
  // phase that is started also completes, tile by tile.
  auto take_turn = [&] {
    if constexpr (kPingpong) named_barrier_sync(Cfg::kTurnBarrier + warpgroup, Cfg::kTurnThreads);
  };
  auto pass_turn = [&](int i) {
    if constexpr (kPingpong)
      if (warpgroup < W - 1 || i + 1 < n)
        named_barrier_arrive(Cfg::kTurnBarrier + (warpgroup + 1) % W, Cfg::kTurnThreads);
  };
  // One arrival per warp, after the warp's own wgmma_wait: the slot is free
  // once all kComputeWarps warps have finished reading it.
  auto release = [&](uint64_t* empty, int i) {
    if (lane == 0) mbarrier_arrive(&empty[(kv0 + i) % kStages]);
  };
  auto wait_full = [&](uint64_t* full, int i) {
    const int g = kv0 + i;
    mbarrier_wait(&full[g % kStages], (g / kStages) & 1);
  };

  // Rung 07's tile MMAs (common/wgmma.cuh), on the ring's slot of tile i.
  auto issue_qk = [&](float (&S)[Cfg::kTilesS][4], int i) {
    wgmma_qk_tile<T, D, Br, Bc>(S, sQ_wg, sm.sK + ((kv0 + i) % kStages) * Cfg::kKElems);
    wgmma_commit();
  };
  auto issue_pv = [&](const uint32_t (&P)[Cfg::kTilesS / 2][4], int i) {
    wgmma_pv_tile<T, Dv, Bc>(O, P, sm.sV + ((kv0 + i) % kStages) * Cfg::kVElems);
    wgmma_commit();
  };

  uint32_t P[Cfg::kTilesS / 2][4];  // P_{i-1}, the A operand of the next P·V
  if (n > 0) {
    if (kPingpong && warpgroup == W - 1) named_barrier_arrive(Cfg::kTurnBarrier, Cfg::kTurnThreads);
    mbarrier_wait(sm.q_full, q_count & 1);
    wait_full(sm.k_full, 0);
    ahead(0);
    float S[Cfg::kTilesS][4];
    take_turn();
    wgmma_fence();
    issue_qk(S, 0);
    pass_turn(0);
    wgmma_wait<0>();
    fence_accumulators(S);
    release(sm.k_empty, 0);
    score_tile(S, 0);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);  // O is still zero: no rescale
    pack_p_fragments<T>(P, S);
  }

  for (int i = 1; i < n; ++i) {
    wait_full(sm.k_full, i);
    wait_full(sm.v_full, i - 1);  // both before the turn: a warpgroup never holds it waiting on a copy
    ahead(i);
    float S[Cfg::kTilesS][4];
    take_turn();
    wgmma_fence();
    issue_qk(S, i);
    issue_pv(P, i - 1);
    pass_turn(i);
    wgmma_wait<1>();  // S_i is done; the P·V may still run
    fence_accumulators(S);
    release(sm.k_empty, i);
    score_tile(S, i);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);
    wgmma_wait<0>();
    fence_accumulators(O);
    release(sm.v_empty, i - 1);
    rescale_output(O, alpha);
    pack_p_fragments<T>(P, S);
  }

  if (n > 0) {
    if (lane == 0) mbarrier_arrive(sm.q_empty);  // every Q·Kᵀ of the tile is done: the producer may load the next Q
    wait_full(sm.v_full, n - 1);  // the last P·V
    wgmma_fence();
    issue_pv(P, n - 1);
    wgmma_wait<0>();
    fence_accumulators(O);
    release(sm.v_empty, n - 1);
  }
  ring.advance(n);
}

// A compute warpgroup's mainloop over work piece w: 64 of its query rows
// against its K/V tiles kv_begin .. kv_begin + n_tiles - 1, masked for the
// causal rule and the bounds. O (zero on entry) and stats are left
// unnormalised for the epilogue (hopper/fwd_epilogue.cuh).
template <typename Cfg, typename T, bool kPingpong>
__device__ __forceinline__ void ws_compute(const WsShared<Cfg, T>& sm, const AttnProblem& p, const WsWork& w,
                                           WsRing& ring, float (&O)[Cfg::kTilesO][4], RowStats& stats) {
  constexpr int Bc = Cfg::kBc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
  const int j0 = w.kv_begin;
  const int row0 = w.q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // row of c0, c1
  ws_compute_tiles<Cfg, T, kPingpong>(
      sm, w.n_tiles, p.scale * kLog2e,
      [&](float (&S)[Cfg::kTilesS][4], int i) {
        mask_scores(S, p, (j0 + i) * Bc, w.q_start, row0, row0 + 8, lane % 4);
      },
      ring, O, stats);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
