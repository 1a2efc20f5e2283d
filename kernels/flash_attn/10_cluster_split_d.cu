// ============================================================================
// Rung 10 — rung 09 on a cluster of two blocks that split D = 1024
// ============================================================================
// What changes against rung 09: at D = 1024 the output of 64 query rows is
// 64 x 1024 fp32 = 256 KiB, the whole register file of one SM, so no block can
// own a row block's O; rung 09 stops at D = 512, and below it only rungs
// 05 and 06 (mma.sync) run D = 1024. So
//   NEW: a thread-block cluster of 2 blocks shares the same 64 query rows of
//        one head; block r owns head-dim columns [512r, 512r + 512) of Q, K, V
//        and O and runs rung 09's D = 512 tile on them (split_d_tile.cuh;
//        the producer's TMA boxes start at column 512r);
//   NEW: S = Q·Kᵀ needs all 1024 columns. Each block sums its two warpgroups'
//        partials into Σ_r and the blocks swap Σ through distributed shared
//        memory; every warpgroup of both blocks then holds S = Σ_0 + Σ_1, the
//        same float (addition commutes exactly), hence the same m_i, l_i and P:
//        rung 08's trick one level up. P·V needs no exchange; block 0 writes LSE.
// Two variants swap Σ differently (details at ClusterSlots below):
//   pull (cluster-split-d+stage1): each block leaves Σ_r in its own shared
//        memory, signals, and the partner reads it with ld.shared::cluster — a
//        signal, then a round trip over the SM-to-SM network;
//   push (+push): each block writes Σ_r into the partner's shared memory with
//        st.async, whose bytes complete on the partner's mbarrier as a TMA
//        load's do — one one-way crossing, half the bytes, no signal first.
// Where it is slower than rung 09 per SM: the two blocks run in lock step (a
// stall of either stalls both), and nothing else runs while Σ crosses.
// TMA, mbarriers, setmaxnreg: docs/hopper_primer.md; the Σ exchange: docs/10_cluster_split_d.md.
//
// Tile configuration per block (constexprs in ClusterSplitDConfig, checked below):
//   D (per block)  Br   Bc  warpgroups           stages  smem (+1024 alignment slack)
//  1024 (512)      64   64   2 + 1 producer = 384     1      229448
// sQ, sK, sV [64, 512] and sRed [2][64, 64] fp32 as rung 09, 9 mbarriers; Σ
// (16 KiB per tile) reuses sRed[0], since a separate buffer would not fit.
// Registers: 168 per thread at launch; setmaxnreg 40 (producer) / 232 (compute).
//
// Supports: fp16, bf16; D = Dv = 1024 (512: rung 09); GQA/MQA (H a multiple of
// Hkv); any Nq, Nk >= 1 (TMA zero-fills past the end); causal (bottom-right) or
// not; writes O and LSE. Needs sm_90, an sm_90a build, cuTensorMapEncodeTiled.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 1024 --variant 'cluster*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flash_attn/split_d_tile.cuh"
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {

namespace {

// Why it should beat the mma.sync rungs at D = 1024: each SM runs rung 09's
// D = 512 tile (wgmma from 128B-swizzled shared memory, TMA, no copy
// instructions on the compute warps); what is added per 64-key tile is the
// exchange of a 16 KiB Σ against 8.4 MFLOP of wgmma per block.
// Sources: the cluster / distributed shared memory model of the CUDA C++
// Programming Guide ("Thread Block Clusters", "Distributed Shared Memory");
// PTX ISA 8.x, "mapa", "ld" (.shared::cluster), "st.async", "mbarrier"
// (.release/.acquire .cluster, complete_tx), "Memory Consistency Model";
// CUTLASS's cutlass/arch/barrier.h (ClusterBarrier::arrive(cta_id)) for remote
// arrivals; FlashAttention-3 (arXiv:2407.08608) for the producer warpgroup and
// setmaxnreg.
constexpr int kClusterBlocks = 2;  // NEW: blocks per cluster, each owning D / 2 columns

template <int kHeadDim_, int kStages_>
struct ClusterSplitDConfig : SplitDTiles<kHeadDim_ / kClusterBlocks>,  // a block's tiles: rung 09's at D = 512
                             ProducerWarpgroupSplit<SplitDTiles<kHeadDim_ / kClusterBlocks>::kWarpgroups> {  // rung 09's warps
  static constexpr int kHeadDim = kHeadDim_;  // the problem's D (SplitDTiles' is the block's share)
  static constexpr int kBlockCols = kHeadDim / kClusterBlocks;
  static constexpr int kStages = kStages_;
  static_assert(ClusterSplitDConfig::kLaunchRegs == 168, "header: 168 registers at launch");
  static constexpr int kBarriers = 9;  // Q full, K full/empty, V full/empty, NEW: s_ready, red_free, recv_full, recv_read
  static constexpr int kSmemBytes = ClusterSplitDConfig::kTileBytes + 8 * kBarriers + 1024;  // + alignment slack
  static constexpr int kBoxesPerTile = kBlockCols / 64;  // TMA boxes of 64 rows x 64 columns per tile
  static constexpr int kSumThreads = 128 * kClusterBlocks;  // NEW: s_ready's arrivals: warpgroup 0 of each block
  static_assert(kSumThreads < (1 << 20), "an mbarrier counts at most 2^20 - 1 arrivals");
  static constexpr int kSumBytes = ClusterSplitDConfig::kBr * ClusterSplitDConfig::kBc * 4;  // Σ of one tile, fp32
  static_assert(ClusterSplitDConfig::kTilesS * 128 * 16 == kSumBytes, "push: 128 threads x kTilesS float4 = Σ");
  static_assert(kStages == 1, "one K and one V slot: a second would not fit");
  static_assert(kBlockCols * kClusterBlocks == kHeadDim, "the cluster's blocks split D evenly");
  static_assert(ClusterSplitDConfig::kBr == ClusterSplitDConfig::kBc, "Q and K/V boxes share one shape");
  static_assert(kBoxesPerTile * ClusterSplitDConfig::kBc * 64 * 2 == ClusterSplitDConfig::kTileBytesQKV,
                "a tile is whole boxes");
};
using Cfg1024 = ClusterSplitDConfig<1024, 1>;
static_assert(Cfg1024::kTileBytes + 8 * Cfg1024::kBarriers == 229448, "header: D=1024 shared memory per block");
static_assert(Cfg1024::kSmemBytes <= 232448, "fits the 227 KiB a block may have on sm_90");
static_assert(Cfg1024::kTileBytes + 8 * Cfg1024::kBarriers + Cfg1024::kBr * Cfg1024::kBc * 4 + 1024 > 232448,
              "header: a separate 16 KiB exchange buffer would not fit, so Σ reuses sRed[0]");
static_assert(Cfg1024::kSumBytes == 16384, "header: 16 KiB of Σ per block per tile");
static_assert(Cfg1024::kThreads == 384, "header: 2 compute warpgroups + 1 producer warpgroup");
static_assert(Cfg1024::kBr == 64 && Cfg1024::kBc == 64 && Cfg1024::kWarpgroups == 2 && Cfg1024::kBlockCols == 512,
              "header: a block's tile is Br 64 x Bc 64 over 512 columns of D, 2 compute warpgroups");
static_assert(Cfg1024::kSmemBytes - Cfg1024::kTileBytes - 8 * Cfg1024::kBarriers == 1024,
              "header: +1024 alignment slack");
static_assert(Cfg1024::kComputeRegs == 232 && Cfg1024::kProducerRegs == 40,
              "header: 232 / 40 registers after setmaxnreg");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The copy pipeline and the score sum of one block (split_d_tile.cuh's
// hooks). The slots are rung 09's without multicast: a slot is full when its
// mbarrier's phase for tile j has completed (parity j % 2); thread 0 hands it
// back after the compute threads' barrier. Nobody waits for the release of the
// last tile: not sent.
// The barriers are addressed from one base (bars[0] is Q full) and the
// cluster rank is read again where it is needed: six pointers and the rank
// held through the loop would make the compute threads spill.
//
// Two ways to get the partner's Σ (kPush):
//   pull  — each block stores its Σ in its own sRed[0]; after s_ready every
//           warpgroup of the partner reads it with ld.shared::cluster: a
//           signal across the SM-to-SM network, then a read that crosses it
//           twice (request, reply), 32 KiB per block per tile;
//   push  — NEW: each block stores its Σ straight into the partner's sRed[0]
//           with st.async, whose bytes complete on the partner's recv_full
//           mbarrier (as a TMA load's do); the receiver waits on its own
//           barrier: one crossing, 16 KiB per block per tile. Each warpgroup
//           forms and sends Σ for half of the key columns (S tiles n < 4 or
//           n >= 4), so all 256 threads share the work.
template <bool kPush>
struct ClusterSlots {
  uint64_t* bars;
  int n_tiles;

  __device__ __forceinline__ uint64_t* k_full() const { return bars + 1; }
  __device__ __forceinline__ uint64_t* k_empty() const { return bars + 2; }
  __device__ __forceinline__ uint64_t* v_full() const { return bars + 3; }
  __device__ __forceinline__ uint64_t* v_empty() const { return bars + 4; }
  __device__ __forceinline__ uint64_t* s_ready() const { return bars + 5; }   // pull: both blocks' Σ of tile j written
  // pull: the partner has read our Σ of tile j (out of our sRed[0]);
  // push: the partner has read what we sent it for tile j (out of its sRed[0])
  __device__ __forceinline__ uint64_t* red_free() const { return bars + 6; }
  __device__ __forceinline__ uint64_t* recv_full() const { return bars + 7; }  // push: the partner's Σ of tile j arrived
  // push: every compute thread of this block has read the partner's Σ of tile j
  // (block scope; the producer thread relays it to the partner's red_free)
  __device__ __forceinline__ uint64_t* recv_read() const { return bars + 8; }

  __device__ __forceinline__ void sync() const { named_barrier_sync(1, 256); }  // the compute warps only
  __device__ __forceinline__ void wait_k(int j) const { mbarrier_wait(k_full(), j & 1); }
  __device__ __forceinline__ void release_k(int j) const {
    if (threadIdx.x == 0 && j + 1 < n_tiles) mbarrier_arrive(k_empty());
  }
  __device__ __forceinline__ void wait_v(int j) const { mbarrier_wait(v_full(), j & 1); }
  // Called by every compute thread after the tile's last sync(): V_j is no
  // longer read.
  __device__ __forceinline__ void release_v(int j) const {
    if (threadIdx.x == 0 && j + 1 < n_tiles) mbarrier_arrive(v_empty());
  }
  // After a thread's last read of the Σ it was given for tile j: the
  // partner may overwrite it (pull: its own sRed[0]; push: ours). Every thread
  // that read it arrives itself (release.cluster orders its own reads), as on
  // s_ready. One arrival by thread 0 after the block barrier would be correct
  // only through the barrier's cumulativity, which compute-sanitizer's
  // racecheck does not follow: it would report the partner's next write as a
  // race with these reads.
  __device__ __forceinline__ void release_sum(int j) const {
    if (j + 1 < n_tiles) mbarrier_arrive_cluster(red_free(), cluster_cta_rank() ^ 1u);
  }

  // S over all 1024 columns. On entry S is this warpgroup's partial (its 256
  // columns), on exit Σ_0 + Σ_1, where Σ_r = partial 0 + partial 1 of block r.
  // sRed[w]: [kTilesS][128 threads][4] fp32 in fragment order, so a thread
  // finds its own entries of every partial at the same index.
  template <int kTilesS, typename T, typename Pipeline>
  __device__ __forceinline__ void operator()(float (&S)[kTilesS][4], const SplitDSmem<T>& sm, Pipeline& pipe,
                                             int j) const {
    if constexpr (kPush)
      push_sum(S, sm, pipe, j);
    else
      pull_sum(S, sm, pipe, j);
  }

  template <int kTilesS, typename T, typename Pipeline>
  __device__ __forceinline__ void pull_sum(float (&S)[kTilesS][4], const SplitDSmem<T>& sm, Pipeline& pipe,
                                           int j) const {
    const int warpgroup = threadIdx.x / 128, tid_in_wg = threadIdx.x % 128;
    float* red_sum = sm.sRed + tid_in_wg * 4;                           // sRed[0]: Σ of this block
    float* red_wg1 = sm.sRed + (kTilesS * 128 + tid_in_wg) * 4;         // sRed[1]: warpgroup 1's partial
    if (warpgroup == 1) {
#pragma unroll
      for (int n = 0; n < kTilesS; ++n)
        *reinterpret_cast<float4*>(red_wg1 + n * 128 * 4) = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
    }
    pipe.sync();  // warpgroup 1's partial written; K_j no longer read
    pipe.release_k(j);
    if (warpgroup == 0) {
      // The partner read Σ of tile j-1 out of sRed[0] before releasing it.
      if (j > 0) mbarrier_wait_cluster(red_free(), (j - 1) & 1);
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) {
        const float4 p1 = *reinterpret_cast<const float4*>(red_wg1 + n * 128 * 4);
        S[n][0] += p1.x;  // Σ = partial 0 + partial 1
        S[n][1] += p1.y;
        S[n][2] += p1.z;
        S[n][3] += p1.w;
        *reinterpret_cast<float4*>(red_sum + n * 128 * 4) = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
      }
      // Each thread releases its own stores, to this block and to the partner.
#pragma unroll
      for (uint32_t r = 0; r < kClusterBlocks; ++r) mbarrier_arrive_cluster(s_ready(), r);
    }
    mbarrier_wait_cluster(s_ready(), j & 1);  // Σ_0 and Σ_1 written (and visible: acquire.cluster)
    if (warpgroup == 1) {  // warpgroup 0 holds this block's Σ already
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) {
        const float4 mine = *reinterpret_cast<const float4*>(red_sum + n * 128 * 4);
        S[n][0] = mine.x, S[n][1] = mine.y, S[n][2] = mine.z, S[n][3] = mine.w;
      }
    }
    const uint32_t partner_sum = map_shared_rank(red_sum, cluster_cta_rank() ^ 1u);
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      const float4 other = ld_shared_cluster_f4(partner_sum + n * 128 * 16);
      S[n][0] += other.x;  // Σ_0 + Σ_1 in block 0, Σ_1 + Σ_0 in block 1: the same float
      S[n][1] += other.y;
      S[n][2] += other.z;
      S[n][3] += other.w;
    }
    release_sum(j);
  }

  // NEW (push). sRed[1] first carries the partial halves the other warpgroup
  // sums, then this block's Σ halves (each thread overwrites the entries it
  // has just read); sRed[0] receives the partner's Σ.
  template <int kTilesS, typename T, typename Pipeline>
  __device__ __forceinline__ void push_sum(float (&S)[kTilesS][4], const SplitDSmem<T>& sm, Pipeline& pipe,
                                           int j) const {
    constexpr int kHalf = kTilesS / 2;
    const int warpgroup = threadIdx.x / 128, tid_in_wg = threadIdx.x % 128;
    // S tile n is summed by warpgroup n / kHalf. (A predicate on every n, not
    // a loop from a run-time start: S must stay in registers.)
    auto summed_here = [&](int n) { return n / kHalf == warpgroup; };
    float* recv = sm.sRed + tid_in_wg * 4;                     // sRed[0]: the partner's Σ lands here
    float* share = sm.sRed + (kTilesS * 128 + tid_in_wg) * 4;  // sRed[1]: partials, then Σ, per half
    const uint32_t partner = cluster_cta_rank() ^ 1u;
    auto entry = [](float* base, int n) { return reinterpret_cast<float4*>(base + n * 128 * 4); };
    // 1. Hand the other warpgroup the half of this partial that it sums.
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
      if (!summed_here(n)) *entry(share, n) = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
    if (threadIdx.x == 0) mbarrier_arrive_expect_tx(recv_full(), kTilesS * 128 * 16);  // the partner's whole Σ
    pipe.sync();  // the partials' halves written; K_j no longer read
    pipe.release_k(j);
    // 2. Σ of this block over my half: my partial + the other warpgroup's.
    // 3. Send it to the partner once it has read the previous tile's, and
    //    leave it in sRed[1] for the other warpgroup.
    if (j > 0) mbarrier_wait_cluster(red_free(), (j - 1) & 1);
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      if (!summed_here(n)) continue;
      const float4 other = *entry(share, n);
      S[n][0] += other.x;  // Σ = partial 0 + partial 1 (in either warpgroup: the same float)
      S[n][1] += other.y;
      S[n][2] += other.z;
      S[n][3] += other.w;
      const float4 sum = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
      st_async_f4(entry(recv, n), recv_full(), partner, sum);
      *entry(share, n) = sum;
    }
    pipe.sync();  // both halves of this block's Σ in sRed[1]
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      if (summed_here(n)) continue;
      const float4 sum = *entry(share, n);
      S[n][0] = sum.x, S[n][1] = sum.y, S[n][2] = sum.z, S[n][3] = sum.w;
    }
    mbarrier_wait_cluster(recv_full(), j & 1);  // the partner's Σ in sRed[0] (its bytes counted)
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      const float4 other = *entry(recv, n);
      S[n][0] += other.x;  // Σ_0 + Σ_1 in block 0, Σ_1 + Σ_0 in block 1: the same float
      S[n][1] += other.y;
      S[n][2] += other.z;
      S[n][3] += other.w;
    }
    // The partner may send tile j+1 once every thread here has read this one:
    // each reader arrives on the block-local recv_read (a block-scope release,
    // no cluster fence on the compute warps); one thread of the producer
    // warpgroup (warp kProducerWarp + 1) waits for all 256 and sends one
    // release.cluster arrival to the partner's red_free (relay_release). Were
    // every reader to arrive on red_free itself, each compute warp would stall
    // in the cluster-scope fence (MEMBAR.ALL.GPU + ERRBAR in the SASS).
    if (j + 1 < n_tiles) mbarrier_arrive(recv_read());
  }
  // push, the relay thread: after this block has read the partner's Σ of
  // tile j, release the partner's buffer (acquire at block scope, then a
  // cluster-scope release: cumulative over what the readers released to us).
  __device__ __forceinline__ void relay_release(int j) const {
    mbarrier_wait(recv_read(), j & 1);
    mbarrier_arrive_cluster(red_free(), cluster_cta_rank() ^ 1u);
  }
};
#endif

template <typename Cfg, typename T, bool kPush>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
cluster_split_d_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                       const __grid_constant__ CUtensorMap tma_v, T* __restrict__ o, float* __restrict__ lse,
                       const AttnProblem p) {
  static_assert(Cfg::kProducerWarp % 4 == 0, "the producer warp starts a warpgroup");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc, kSlice = Cfg::kSliceCols;
  static_assert(Cfg::kComputeThreads == 256, "ClusterSlots::sync counts 256 compute threads");

  // NEW: both blocks of a cluster take the same query tile; the rank picks the
  // columns (read again where needed rather than held in a register).
  const int m_block = gridDim.x / kClusterBlocks - 1 - blockIdx.x / kClusterBlocks;  // longest (causal) first
  const int head = blockIdx.z * p.H + blockIdx.y;
  const int kv_head = int(p.kv_head(head));  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);  // the same in both blocks

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const SplitDSmem<T> sm = carve_split_d_smem<Cfg, T>(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm.end);
  uint64_t* q_full = bars;
  const ClusterSlots<kPush> slots{bars, n_tiles};

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);  // full: the producer's one arrive_expect_tx (+ the bytes)
    mbarrier_init(slots.k_full(), 1);
    mbarrier_init(slots.v_full(), 1);
    mbarrier_init(slots.k_empty(), 1);  // empty: this block's thread 0
    mbarrier_init(slots.v_empty(), 1);
    mbarrier_init(slots.s_ready(), Cfg::kSumThreads);  // pull: warpgroup 0 of both blocks
    // pull: every compute thread of the partner; push: the partner's producer thread
    mbarrier_init(slots.red_free(), kPush ? 1 : Cfg::kComputeThreads);
    mbarrier_init(slots.recv_full(), 1);  // push: thread 0's arrive_expect_tx (+ the partner's bytes)
    mbarrier_init(slots.recv_read(), Cfg::kComputeThreads);  // push: every compute thread of this block
    fence_mbarrier_init();
  }
  // No thread of the partner may arrive on a barrier here before it is initialised.
  cluster_sync();

  if (warp >= Cfg::kProducerWarp) {
    // ---- the producer: rung 09's, loading this block's columns of Q, K and V ------
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp && lane == 0) {
      prefetch_tensor_map(&tma_q);
      prefetch_tensor_map(&tma_k);
      prefetch_tensor_map(&tma_v);
      const int col0 = int(cluster_cta_rank()) * Cfg::kBlockCols;  // NEW: this block's first column of D
      auto load_tile = [&](T* tile, const CUtensorMap* map, uint64_t* full, int row, int plane) {
        mbarrier_arrive_expect_tx(full, Cfg::kTileBytesQKV);
        for (int b = 0; b < Cfg::kBoxesPerTile; ++b)
          tma_load_3d(tile + b * Br * 64, map, full, col0 + b * 64, row, plane);  // NEW: col0
      };
      if (n_tiles > 0) load_tile(sm.sQ, &tma_q, q_full, q_start, head);
      for (int j = 0; j < n_tiles; ++j) {  // in the order the compute warps free the slots
        if (j > 0) mbarrier_wait(slots.k_empty(), (j - 1) & 1);
        load_tile(sm.sK, &tma_k, slots.k_full(), j * Bc, kv_head);
        if (j > 0) mbarrier_wait(slots.v_empty(), (j - 1) & 1);
        load_tile(sm.sV, &tma_v, slots.v_full(), j * Bc, kv_head);
      }
    } else if (kPush && warp == Cfg::kProducerWarp + 1 && lane == 0) {
      // push: the next warp's first thread relays "tile j's Σ read here" to the
      // partner (it may send tile j+1), apart from the loads' thread.
      for (int j = 0; j + 1 < n_tiles; ++j) slots.relay_release(j);
    }
    __syncwarp();
  } else {
    // ---- the two compute warpgroups: rung 09's tile, S summed across the cluster ----
    warpgroup_reg_alloc<Cfg::kComputeRegs>();
    const int warpgroup = threadIdx.x / 128;
    const int row0 = q_start + (warp % 4) * 16 + lane / 4;
    float O[Cfg::kTilesO][4] = {};
    RowStats stats;
    const float scale_log2 = p.scale * kLog2e;
    if (n_tiles > 0) mbarrier_wait(q_full, 0);
    for (int j = 0; j < n_tiles; ++j)
      split_d_kv_tile<Cfg>(O, stats, sm, p, j, q_start, row0, scale_log2, slots, slots);  // NEW: slots sum S
    const uint32_t rank = cluster_cta_rank();
    store_output<T>(O, stats, p, head, row0, /*col0=*/int(rank) * Cfg::kBlockCols + warpgroup * kSlice, lane % 4,
                    /*write_lse=*/rank == 0 && warpgroup == 0, o, lse);
  }
  // A block leaves only when its partner no longer reads its shared memory or
  // arrives on its barriers.
  cluster_sync();
#endif
}

using ClusterSplitDHeadDims = EqualHeadDims<1024>;

std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  return rung_unsupported<ClusterSplitDConfig, 1, ClusterSplitDHeadDims>(p);
}

template <bool kPush>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  ClusterSplitDHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = ClusterSplitDConfig<decltype(dims)::D, 1>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      // The maps cover all D columns; each block's boxes start at its column 512r.
      CUtensorMap maps[3];
      if (!encode_qkv_maps<Cfg::kBr, Cfg::kBc>(maps, p, b.q, b.k, b.v)) return cudaErrorInvalidValue;
      const int m_blocks = (p.Nq + Cfg::kBr - 1) / Cfg::kBr;
      // NEW: a cluster of kClusterBlocks per query tile
      return launch_clustered(cluster_split_d_kernel<Cfg, T, kPush>,
                              dim3(m_blocks * kClusterBlocks, p.H, p.B), Cfg::kThreads, Cfg::kSmemBytes,
                              kClusterBlocks, stream, maps[0], maps[1], maps[2], static_cast<T*>(b.o), b.lse, p);
    });
  });
  return err;
}

template <bool kPush>
Variant make_variant() {
  Variant v;
  v.name = std::string("cluster-split-d+stage1") + (kPush ? "+push" : "");
  v.rung = "10_cluster_split_d";
  v.unsupported_reason = unsupported;
  v.launch = launch<kPush>;
  v.describe = [] {
    return std::string(kPush ? "Σ pushed to the partner with st.async; " : "Σ pulled from the partner; ") +
           "sm_90a wgmma + TMA; a cluster of 2 blocks splits D = 1024 (512 columns each, rung 09's tile), "
           "partial S summed across the cluster through distributed shared memory; " +
           rung_describe<ClusterSplitDConfig, 1, ClusterSplitDHeadDims>();
  };
  return v;
}

}  // namespace

std::vector<Variant> make_cluster_split_d_variants() {
  return {make_variant<false>(), make_variant<true>()};
}

}  // namespace attnlab
