// attnlab: rung 12's mainloop, one work item at a time — what its producer
// thread and its compute warpgroups do for one (query tile, head), in the
// roles of FlashAttention-3's CollectiveMainloop (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp):
// ws_load issues the TMA copies of Q and of each K and V tile into the ring,
// ws_compute runs the tile MMAs and the online softmax and ends in the epilogue
// (store_output, common/split_q_parts.cuh; or, for a piece of an item split
// over blocks, common/kv_split.cuh). The kernel (12_ws_pingpong.cu) walks its
// work pieces (tile_order.cuh) and calls one or the other.
#pragma once

#include <cuda.h>

#include "common/kv_split.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/split_q_parts.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flash_attn/tile_order.cuh"
#include "host/attn_problem.h"

namespace attnlab {

// Device code of sm_90a only (TMA, mbarriers and wgmma exist there alone).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The block's shared memory, Cfg's tiles then its barriers: sQ [Br, D] once,
// sK [kStages][Bc, D], sV [kStages][Bc, Dv] (Sw128Blocks, 1024-aligned),
// 2 + 4·kStages + 4 mbarriers, and the two slots of the items handed out.
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
  uint64_t* item_full;  // NEW (dynamic): [2] the producer's hand-off of the next item
  uint64_t* item_empty;
  int* item;            // [2]

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
    item_full = v_empty + Cfg::kStages;
    item_empty = item_full + 2;
    item = reinterpret_cast<int*>(item_empty + 2);
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
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&item_full[s], 1);
      mbarrier_init(&item_empty[s], Cfg::kComputeWarps);
    }
    fence_mbarrier_init();
  }
};

// One work piece: its (query) head, the KV head it reads, its first query
// row, and its K/V tiles kv_begin .. kv_begin + n_tiles - 1 (the same for
// every warpgroup); all of the item's, or a share of them (tile_order.cuh).
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

// The block's work piece of round `round`, for its producer thread (the
// order's, or under a dynamic order the next item of `counter`) and for its
// compute warps (the order's, or the one the producer handed over). Items
// go through a ring of two slots of shared memory, one full/empty pair each
// (full: the producer's arrival, which releases its store; empty: one per
// compute warp). `counter` holds the items taken after round 0, from 0.
template <typename Cfg, typename T>
__device__ __forceinline__ WorkPiece ws_producer_piece(const WsShared<Cfg, T>& sm, const TileOrder& order,
                                                       int* counter, int round) {
  if (!order.dynamic || round == 0) return order.piece(blockIdx.x, gridDim.x, round);
  const int u = round - 1, slot = u % 2;  // the hand-off's index
  const int next = atomicAdd(counter, 1) + int(gridDim.x);
  WorkPiece w;
  w.item = next < order.items ? next : -1;
  if (u >= 2) mbarrier_wait(&sm.item_empty[slot], (u / 2 - 1) & 1);
  sm.item[slot] = w.item;
  mbarrier_arrive(&sm.item_full[slot]);
  return w;
}
template <typename Cfg, typename T>
__device__ __forceinline__ WorkPiece ws_compute_piece(const WsShared<Cfg, T>& sm, const TileOrder& order,
                                                      int round) {
  if (!order.dynamic || round == 0) return order.piece(blockIdx.x, gridDim.x, round);
  const int u = round - 1, slot = u % 2;
  mbarrier_wait(&sm.item_full[slot], (u / 2) & 1);
  WorkPiece w;
  w.item = *static_cast<volatile int*>(&sm.item[slot]);
  __syncwarp();
  if (threadIdx.x % 32 == 0) mbarrier_arrive(&sm.item_empty[slot]);
  return w;
}

// Where a block's producer and compute warps are in the ring: K/V tiles and
// Q tiles so far, from which both find slots and barrier phases. They walk the
// same pieces, so they count alike. Each advances its own count past a piece
// (kv_count = ring0 + j_end: ring0 and j_end are what the piece's loop keeps).
struct WsRing {
  int kv_count = 0, q_count = 0;
  __device__ __forceinline__ void advance(int ring0, int j0, int j_end) {
    kv_count = ring0 + j_end;
    q_count += j_end > j0 ? 1 : 0;
  }
};

// The producer thread's copies for work piece w: Q, then K_j0, then K_{j+1}
// and V_j for each of its key tiles j, the order the compute warps use them in.
template <typename Cfg, typename T>
__device__ __forceinline__ void ws_load(const WsShared<Cfg, T>& sm, const CUtensorMap* tma_q,
                                        const CUtensorMap* tma_k, const CUtensorMap* tma_v, const WsWork& w,
                                        WsRing& ring) {
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  const int q_count = ring.q_count;
  const int j0 = w.kv_begin, j_end = w.kv_begin + w.n_tiles;
  const int ring0 = ring.kv_count - j0;  // key tile j is the ring's tile ring0 + j
  if (j_end == j0) return;
  if (q_count > 0) mbarrier_wait(sm.q_empty, (q_count - 1) & 1);  // the last tile's Q·Kᵀ are done
  mbarrier_arrive_expect_tx(sm.q_full, 2 * Cfg::kQElems);
  for (int b = 0; b < Cfg::kBoxesQK; ++b)
    tma_load_3d(sm.sQ + b * Br * 64, tma_q, sm.q_full, b * 64, w.q_start, w.head);
  // Key tile j is the ring's tile g = ring0 + j: slot g % kStages, once the
  // compute warps have released tile g - kStages from it (phase
  // (g / kStages - 1) of its empty barrier).
  auto load = [&](T* slots, int elems, int boxes, const CUtensorMap* map, uint64_t* full, uint64_t* empty,
                  int j) {
    const int g = ring0 + j, slot = g % kStages;
    if (g >= kStages) mbarrier_wait(&empty[slot], (g / kStages - 1) & 1);
    mbarrier_arrive_expect_tx(&full[slot], 2 * elems);
    for (int b = 0; b < boxes; ++b)
      tma_load_3d(slots + slot * elems + b * Bc * 64, map, &full[slot], b * 64, j * Bc, w.kv_head);
  };
  auto load_k = [&](int j) { load(sm.sK, Cfg::kKElems, Cfg::kBoxesQK, tma_k, sm.k_full, sm.k_empty, j); };
  auto load_v = [&](int j) { load(sm.sV, Cfg::kVElems, Cfg::kBoxesV, tma_v, sm.v_full, sm.v_empty, j); };
  // The order the compute warps use them in: K one tile ahead of V.
  load_k(j0);
#pragma unroll 1  // rolled: the producer has 32 registers with three compute warpgroups
  for (int j = j0; j < j_end; ++j) {
    if (j + 1 < j_end) load_k(j + 1);
    load_v(j);
  }
  ring.advance(ring0, j0, j_end);
}

// A compute warpgroup's share of work piece w: 64 of its query rows against
// its K/V tiles j0 .. j_end - 1 (ring tiles kv_count .. kv_count + n_tiles - 1),
// then O and LSE stored, or the partial state left for another block.
template <typename Cfg, typename T, bool kPingpong>
__device__ __forceinline__ void ws_compute(const WsShared<Cfg, T>& sm, const AttnProblem& p, const TileOrder& order,
                                           const WsWork& w, WsRing& ring, const KvSplitArgs& split,
                                           T* __restrict__ o, float* __restrict__ lse) {
  constexpr int D = Cfg::kHeadDim, Dv = Cfg::kHeadDimV, Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int W = Cfg::kComputeWarpgroups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warpgroup = threadIdx.x / 128;
  const T* sQ_wg = sm.sQ + warpgroup * 64 * 64;  // this warpgroup's 64 rows of every 64-column block
  const float scale_log2 = p.scale * kLog2e;
  const int q_count = ring.q_count;
  const int j0 = w.kv_begin, j_end = w.kv_begin + w.n_tiles;  // the same for every warpgroup
  const int ring0 = ring.kv_count - j0;                       // key tile j is the ring's tile ring0 + j
  const int row0 = w.q_start + warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // row of c0, c1

  // NEW (+pingpong): the turn. Warpgroup w waits on barrier kTurnBarrier + w,
  // issues its MMAs, and arrives on the next one's (w + 1, round the W
  // warpgroups). The last warpgroup pre-arrives once so that warpgroup 0 goes
  // first, and skips its arrival after the last tile, so that every barrier
  // phase that is started also completes, tile by tile.
  auto take_turn = [&] {
    if constexpr (kPingpong) named_barrier_sync(Cfg::kTurnBarrier + warpgroup, Cfg::kTurnThreads);
  };
  auto pass_turn = [&](int j) {
    if constexpr (kPingpong)
      if (warpgroup < W - 1 || j + 1 < j_end)
        named_barrier_arrive(Cfg::kTurnBarrier + (warpgroup + 1) % W, Cfg::kTurnThreads);
  };
  // One arrival per warp, after the warp's own wgmma_wait: the slot is free
  // once all kComputeWarps warps have finished reading it.
  auto release = [&](uint64_t* empty, int j) {
    if (lane == 0) mbarrier_arrive(&empty[(ring0 + j) % kStages]);
  };
  auto wait_full = [&](uint64_t* full, int j) {
    const int g = ring0 + j;
    mbarrier_wait(&full[g % kStages], (g / kStages) & 1);
  };

  // Rung 07's tile MMAs (common/wgmma.cuh), on the ring's slot of tile j.
  auto issue_qk = [&](float (&S)[Cfg::kTilesS][4], int j) {
    wgmma_qk_tile<T, D, Br, Bc>(S, sQ_wg, sm.sK + ((ring0 + j) % kStages) * Cfg::kKElems);
    wgmma_commit();
  };
  float O[Cfg::kTilesO][4] = {};
  auto issue_pv = [&](const uint32_t (&P)[Cfg::kTilesS / 2][4], int j) {
    wgmma_pv_tile<T, Dv, Bc>(O, P, sm.sV + ((ring0 + j) % kStages) * Cfg::kVElems);
    wgmma_commit();
  };

  RowStats stats;
  uint32_t P[Cfg::kTilesS / 2][4];  // P_{j-1}, the A operand of the next P·V
  if (j_end > j0) {
    if (kPingpong && warpgroup == W - 1) named_barrier_arrive(Cfg::kTurnBarrier, Cfg::kTurnThreads);
    mbarrier_wait(sm.q_full, q_count & 1);
    wait_full(sm.k_full, j0);
    float S[Cfg::kTilesS][4];
    take_turn();
    wgmma_fence();
    issue_qk(S, j0);
    pass_turn(j0);
    wgmma_wait<0>();
    fence_accumulators(S);
    release(sm.k_empty, j0);
    mask_scores(S, p, j0 * Bc, w.q_start, row0, row0 + 8, lane % 4);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);  // O is still zero: no rescale
    pack_p_fragments<T>(P, S);
  }

  for (int j = j0 + 1; j < j_end; ++j) {
    wait_full(sm.k_full, j);
    wait_full(sm.v_full, j - 1);  // both before the turn: a warpgroup never holds it waiting on a copy
    float S[Cfg::kTilesS][4];
    take_turn();
    wgmma_fence();
    issue_qk(S, j);
    issue_pv(P, j - 1);
    pass_turn(j);
    wgmma_wait<1>();  // S_j is done; the P·V may still run
    fence_accumulators(S);
    release(sm.k_empty, j);
    mask_scores(S, p, j * Bc, w.q_start, row0, row0 + 8, lane % 4);
    float alpha[2];
    online_softmax_scores(S, stats, scale_log2, alpha);
    wgmma_wait<0>();
    fence_accumulators(O);
    release(sm.v_empty, j - 1);
    rescale_output(O, alpha);
    pack_p_fragments<T>(P, S);
  }

  if (j_end > j0) {
    if (lane == 0) mbarrier_arrive(sm.q_empty);  // every Q·Kᵀ of the tile is done: the producer may load the next Q
    wait_full(sm.v_full, j_end - 1);  // the last P·V
    wgmma_fence();
    issue_pv(P, j_end - 1);
    wgmma_wait<0>();
    fence_accumulators(O);
    release(sm.v_empty, j_end - 1);
  }
  ring.advance(ring0, j0, j_end);

  // NEW (split, tile_order.cuh): a piece of an item that several blocks share.
  constexpr int kThreads = Cfg::kComputeWarps * 32;
  const int tid = threadIdx.x;  // the compute warps come first
  if (j_end < kv_tiles_for_query_tile(p, w.q_start, Br, Bc)) {  // its state, for the block that ends the item
    kv_split_store_partial<Cfg::kTilesO, kThreads>(split, blockIdx.x, O, stats, tid, Cfg::kSplitBarrier);
    return;
  }
  if (j0 > 0) {  // the piece that ends it: the states of the blocks before, merged in block order
    // This piece holds the block's first unit (a piece that starts later starts an item).
    const int first = order.split_begin(blockIdx.x, gridDim.x) - j0;  // the item's first unit
    auto for_each_owner = [&](auto&& f) {
      for (int u = first; u < first + j0;) {
        const int b = order.split_owner(u, gridDim.x);
        f(b);
        u = order.split_begin(b + 1, gridDim.x);
      }
    };
    if (tid == 0) for_each_owner([&](int b) { kv_split_wait(split, b); });
    named_barrier_sync(Cfg::kSplitBarrier, kThreads);
    for_each_owner([&](int b) { kv_split_merge_partial<Cfg::kTilesO, kThreads>(split, b, O, stats, scale_log2, tid); });
  }
  store_output<T>(O, stats, p, w.head, row0, /*col0=*/0, lane % 4, /*write_lse=*/true, o, lse);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
