// ============================================================================
// Rung 11 — two passes: the scores pass stores unnormalised probabilities,
//           the output pass is a plain GEMM (large head dims, up to 1024)
// ============================================================================
// What changes against rung 10: rung 10 keeps FlashAttention's one pass, so at
// D = 1024 two SMs split O of 64 query rows and swap partial scores every
// 64-key tile, in lock step, with one K/V slot. Here the pass is cut in two:
//   NEW pass 1 (scores): a block owns 128 query rows and walks the keys in
//        256-key tiles; per tile S = Q·Kᵀ is a 128 x 256 x D GEMM (Q and K in
//        64-column chunks through a kStages-deep TMA ring), then the online
//        softmax keeps a per-row reference max m_ref and sum l and writes
//        P̃ = exp(S - m_ref), in the input dtype, to a workspace, with m_ref per
//        (row, tile). m_ref moves only when a tile's max passes it by more than
//        kRefSlack (FlashAttention-4's conditional rescaling). Pass 1 writes
//        LSE. Row blocks run in pairs (a cluster) that multicast K; P̃ leaves
//        by TMA store; stage4 also overlaps exponentials with the next MMAs.
//   NEW pass 2 (output): O[128 rows, 256 columns] = Σ_keys P̃·V, a GEMM whose
//        operands both arrive by TMA; where pass 1 moved a row's m_ref (a flag
//        per 64 rows and tile) O is rescaled first; at the end O / l. No block
//        holds more than 128 x 256 fp32 of O, whatever Dv, and none waits for
//        another: the exchange rung 10 pays every 64 keys is gone.
// Where it is slower: P̃ is Nq·Nk values per head, written once and read Dv/256
// times (mostly from L2). At D = 1024 that is ~1000 MMA FLOPs per byte, compute
// bound like a GEMM; at D = 64 ~60, memory bound: use the one-pass rungs there.
// TMA, mbarrier rings, setmaxnreg: docs/hopper_primer.md.
//
// Tile configurations (constexprs in TwoPassConfig, checked below); both passes
// run 2 compute warpgroups of 64 rows + 1 producer warpgroup = 384 threads:
//   variant          Br  keys/tile  chunk  O cols  smem pass 1 / pass 2 (with slack)
//   two-pass+stage2  128    256       64     256       132128 /  99360
//   two-pass+stage4  128    256       64     256       230464 / 197696
// Registers: 168 at launch; setmaxnreg gives the producer 40, the compute 232.
//
// Supports: fp16, bf16; D a multiple of 64 up to 1024, Dv ∈ {256, 512, 768,
// 1024}; GQA/MQA (H a multiple of Hkv); any Nq, Nk >= 1; causal (bottom-right)
// or not; writes O and LSE. Needs sm_90, sm_90a code, cuTensorMapEncodeTiled
// and a workspace (TwoPassLayout, at most kWorkspaceCap; more runs in rounds).
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 1024 --variant 'two-pass*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "host/attn_problem.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "host/variant.h"

namespace attnlab {

namespace {

// Per block (both passes): 2 compute warpgroups (64 rows each) + 1 producer
// warpgroup whose first thread issues the TMA copies.
//   pass 1: S [64, 256] fp32 per warpgroup (128 registers); per stage
//           sA: Q [128 rows, 64 columns] (Sw128Blocks, 16 KiB) and
//           sB: K [256 keys, 64 columns] (Sw128Blocks, 32 KiB; 128 keys from
//               each block of the pair, by multicast);
//           once: sOut [2 warpgroups][64, 128] (P̃ on its way out by TMA, 32 KiB;
//               written with stmatrix)
//   pass 2: O [64, 256] fp32 per warpgroup (128 registers); per stage
//           sA: P̃ [128 rows, 64 keys] (16 KiB), sB: V [64 keys, 256 columns]
//               (4 Sw128 blocks, 32 KiB)
//   2·kStages mbarriers (full: the producer's expect_tx + bytes; empty: one
//   arrival per compute warp, in pass 1 of both blocks of the pair).
// Sources: the safe-softmax two-pass formulation (FlashAttention, arXiv:
// 2205.14135, §2 and its Algorithm 0, which also materialises P); the
// threshold on the running max: FlashAttention-4 (T. Dao et al., 2025), whose
// softmax rescales O only when the running max grows past a threshold; the
// warp-specialised TMA/wgmma GEMM mainloop: FlashAttention-3 (arXiv:2407.08608,
// §3.1) and CUTLASS's PipelineTmaAsync (full/empty barrier per stage); the
// next tile's MMAs issued while this tile's softmax runs: FlashAttention-3's
// intra-warpgroup overlap (§3.2, there with a second accumulator); the
// multicast of an operand to the blocks of a cluster that share it, each
// loading a slice: CUTLASS's SM90 TMA GEMMs (a cluster shape, SM90_TMA_LOAD_
// MULTICAST, a consumer's arrival on every block's empty barrier).
constexpr int kTwoPassWarpgroups = 2;  // compute warpgroups, 64 query rows each

template <int kStages_>
struct TwoPassConfig : ProducerWarpgroupSplit<kTwoPassWarpgroups> {  // rung 09's warps: + 1 producer warpgroup
  static constexpr int kStages = kStages_;
  static constexpr int kWarpgroups = kTwoPassWarpgroups;
  static constexpr int kBr = 64 * kWarpgroups;  // 128 query rows per block (both passes)
  static constexpr int kBcScores = 256;         // pass 1: keys per score tile (wgmma N)
  static constexpr int kBk = 64;                // the reduction step: D columns (pass 1), keys (pass 2)
  static constexpr int kBv = 256;               // pass 2: output columns per block (wgmma N)
  static constexpr int kChunksPerScoreTile = kBcScores / kBk;
  // NEW: pass 1 runs in clusters of kScoresCluster row blocks of one head; each
  // block loads kKHalfRows of a K chunk's keys and multicasts them to both.
  static constexpr int kScoresCluster = 2;
  static constexpr int kKHalfRows = kBcScores / kScoresCluster;  // 128 keys
  static constexpr int kKHalfBytes = kKHalfRows * kBk * 2;  // 16 KiB, 1024-aligned in the slot
  static constexpr int kABytes = kBr * kBk * 2;         // Q or P̃ chunk
  static constexpr int kBBytes = kBcScores * kBk * 2;   // K chunk [256, 64] or V chunk [64, 256]
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBarriers = 2 * kStages;          // full and empty per stage
  // NEW: pass 1 stages P̃ in shared memory, half a score tile per warpgroup at
  // a time, and stores it with TMA (one instruction per 64 x 64 box) instead
  // of 64 scattered 4-byte stores per thread and tile.
  static constexpr int kStoreCols = kBcScores / 2;
  static constexpr int kStoreBytes = kWarpgroups * 64 * kStoreCols * 2;  // sOut: [2][64, 128], Sw128Blocks
  static constexpr int kSmemScores = kStages * kStageBytes + kStoreBytes + 8 * kBarriers + 1024;  // + alignment slack
  static constexpr int kSmemOutput = kStages * kStageBytes + 8 * kBarriers + 1024;
  static constexpr int kSmemBytes = kSmemScores > kSmemOutput ? kSmemScores : kSmemOutput;
  static constexpr int kTilesS = kBcScores / 8;
  static constexpr int kTilesO = kBv / 8;
  static constexpr int kVBoxes = kBv / 64;               // TMA boxes of 64 keys x 64 columns per V chunk
  // NEW: m_ref moves only when a tile's max exceeds it by more than this (exp2
  // units): P̃ <= 2^8 = 256, far inside fp16's 65504.
  static constexpr float kRefSlack = 8.f;
  // NEW: once half 0 of a tile's P̃ has left its accumulator registers
  // (keys 0..127, 64 of the 128), the next tile's first kEarlyChunks chunks
  // are issued for those keys into them, so the tensor cores work while half
  // 1's exponentials run; their keys 128..255 follow as the tile's first
  // MMAs, and each such chunk holds its stage until both halves are done.
  // Then every chunk's MMAs run as two N = 128 wgmmas, one per half of the
  // keys: with N = 256 and N = 128 wgmmas on the same registers ptxas
  // serialises every wgmma of one instantiation or the other (C7511). stage2:
  // none, since two early chunks would hold both its stages.
  static constexpr int kEarlyChunks = kStages >= 4 ? 2 : 0;
  static_assert(kBcScores == kBv && kBBytes == kBk * kBv * 2, "one B slot holds a K chunk or a V chunk");
  static_assert(TwoPassConfig::kLaunchRegs == 168 && TwoPassConfig::kComputeRegs == 232 &&
                    TwoPassConfig::kProducerRegs == 40,
                "header: 168 registers at launch, 232 / 40 after setmaxnreg");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0 && kKHalfBytes % 1024 == 0,
                "Sw128 tiles start 1024-byte aligned");
  static_assert(kScoresCluster * kKHalfBytes == kBBytes, "a K chunk is two halves, one per block of a pair");
  static_assert(kStageBytes == 48 * 1024 && kABytes + kKHalfBytes == 32 * 1024,
                "header: L2 -> SM bytes per stage 48 -> 32 KiB with K multicast");
  static_assert(kStages >= 2, "the ring overlaps a chunk's copy with the previous chunk's MMAs");
  static_assert(kChunksPerScoreTile * kBk == kBcScores, "pass 2's chunks tile pass 1's score tiles");
  static_assert(kTilesS * 8 == kBcScores && kTilesO * 8 == kBv && kVBoxes * 64 == kBv, "fragment and box counts");
  static_assert(kRefSlack > 0.f && kRefSlack <= 15.f, "P̃ <= 2^kRefSlack must fit fp16 (65504)");
  static_assert(kEarlyChunks < kStages, "the producer keeps a stage to prefetch into while early chunks hold theirs");
};
static_assert(TwoPassConfig<2>::kSmemScores == 132128 && TwoPassConfig<2>::kSmemOutput == 99360,
              "header: stage2 shared memory");
static_assert(TwoPassConfig<4>::kSmemScores == 230464 && TwoPassConfig<4>::kSmemOutput == 197696,
              "header: stage4 shared memory");
static_assert(TwoPassConfig<4>::kSmemBytes <= 232448, "fits the 227 KiB a block may have on sm_90");
static_assert(TwoPassConfig<2>::kThreads == 384, "header: 2 compute warpgroups + 1 producer warpgroup");
static_assert(TwoPassConfig<2>::kBr == 128 && TwoPassConfig<2>::kBcScores == 256 && TwoPassConfig<2>::kBk == 64 &&
                  TwoPassConfig<2>::kBv == 256,
              "header: stage2 is Br 128, 256 keys per score tile, 64-wide chunks, 256 output columns");
static_assert(TwoPassConfig<4>::kBr == 128 && TwoPassConfig<4>::kBcScores == 256 && TwoPassConfig<4>::kBk == 64 &&
                  TwoPassConfig<4>::kBv == 256,
              "header: stage4 is Br 128, 256 keys per score tile, 64-wide chunks, 256 output columns");

// NEW: the workspace of one round: `slots` row blocks of 128 rows, each with
//   P̃:     [128][nk_pad]          input dtype, keys past Nk (and masked) = 0
//   m_ref:  [128][score_tiles]     fp32, exp2 units, after each score tile
//   inv_l:  [128]                  fp32, 1 / l (0 for a row that sees no key)
//   moved:  [2][score_tiles]       4 bytes per (warpgroup, tile): byte w != 0 if
//                                  a row of warp w moved its m_ref in that tile
// stored array by array (all P̃ first), so P̃ is one [slots·128, nk_pad] matrix.
struct TwoPassLayout {
  int nk_pad = 0;
  int score_tiles = 0;
  int64_t row_blocks_per_head = 0;
  int64_t row_blocks = 0;  // of the whole problem
  size_t bytes_per_slot = 0;
};

constexpr size_t kWorkspaceCap = size_t(2) << 30;  // 2 GiB: B=1 H=8 N=8192 runs in one round

TwoPassLayout two_pass_layout(const AttnProblem& p) {
  constexpr int Br = TwoPassConfig<2>::kBr, Bc = TwoPassConfig<2>::kBcScores;
  TwoPassLayout L;
  L.nk_pad = (p.Nk + Bc - 1) / Bc * Bc;
  L.score_tiles = L.nk_pad / Bc;
  L.row_blocks_per_head = (p.Nq + Br - 1) / Br;
  L.row_blocks = L.row_blocks_per_head * p.heads();
  L.bytes_per_slot = size_t(Br) * L.nk_pad * 2 + size_t(Br) * L.score_tiles * 4 + size_t(Br) * 4 +
                     size_t(2) * L.score_tiles * 4;
  return L;
}

// Device view of one round's workspace.
template <typename T>
struct TwoPassWorkspace {
  T* p_tilde;
  float* m_ref;
  float* inv_l;
  uint32_t* moved;
  int nk_pad;
  int score_tiles;
  int64_t first_row_block;  // of this round
  int64_t row_blocks_per_head;
};

template <typename T>
TwoPassWorkspace<T> carve_workspace(void* base, const TwoPassLayout& L, int64_t slots, int64_t first_row_block) {
  constexpr int Br = TwoPassConfig<2>::kBr;
  TwoPassWorkspace<T> w;
  char* c = static_cast<char*>(base);
  w.p_tilde = reinterpret_cast<T*>(c);
  c += size_t(slots) * Br * L.nk_pad * 2;
  w.m_ref = reinterpret_cast<float*>(c);
  c += size_t(slots) * Br * L.score_tiles * 4;
  w.inv_l = reinterpret_cast<float*>(c);
  c += size_t(slots) * Br * 4;
  w.moved = reinterpret_cast<uint32_t*>(c);
  w.nk_pad = L.nk_pad;
  w.score_tiles = L.score_tiles;
  w.first_row_block = first_row_block;
  w.row_blocks_per_head = L.row_blocks_per_head;
  return w;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The stage ring both passes share: stage s = it % kStages holds sA and sB of
// chunk `it` (counted across the block's whole loop); full[s] completes when
// the producer's bytes have landed (phase it / kStages), empty[s] when every
// compute warp is done reading it.
template <typename Cfg>
struct StageRing {
  unsigned char* base;  // 1024-byte aligned
  uint64_t* bars;       // full[0..kStages), empty[0..kStages)

  __device__ __forceinline__ unsigned char* a(int it) const { return base + (it % Cfg::kStages) * Cfg::kStageBytes; }
  __device__ __forceinline__ unsigned char* b(int it) const { return a(it) + Cfg::kABytes; }
  __device__ __forceinline__ uint64_t* full(int it) const { return bars + it % Cfg::kStages; }
  __device__ __forceinline__ uint64_t* empty(int it) const { return bars + Cfg::kStages + it % Cfg::kStages; }
  __device__ __forceinline__ uint32_t phase(int it) const { return uint32_t(it / Cfg::kStages) & 1u; }

  // Producer: wait until chunk it - kStages has left the slot, announce the bytes.
  __device__ __forceinline__ void acquire(int it) const {
    if (it >= Cfg::kStages) mbarrier_wait(empty(it), phase(it) ^ 1u);
    mbarrier_arrive_expect_tx(full(it), Cfg::kStageBytes);
  }
  // Compute warps.
  __device__ __forceinline__ void wait(int it) const { mbarrier_wait(full(it), phase(it)); }
  __device__ __forceinline__ void release(int it) const {
    if (threadIdx.x % 32 == 0) mbarrier_arrive(empty(it));  // one arrival per warp
  }
  // NEW (pass 1, K multicast): in a cluster of `ncta` blocks whose producers
  // each load part of a chunk into every block's slot, the slot is free only
  // when the compute warps of all of them are done: each warp arrives on the
  // empty barrier of every block (`shared`). A chunk only this block loaded
  // (the longer block's last tiles under a causal mask) is released by its own
  // warps alone, each arriving ncta times, so every phase counts the same.
  __device__ __forceinline__ void release_in_cluster(int it, bool shared, int ncta) const {
    if (threadIdx.x % 32 != 0) return;
    for (int r = 0; r < ncta; ++r) {
      if (shared) mbarrier_arrive_remote(empty(it), uint32_t(r));
      else mbarrier_arrive(empty(it));
    }
  }
};

// kGapBytes: what the kernel keeps between the stages and the barriers (1024-aligned).
// ncta: the blocks of the cluster that write into each other's slots (1: none;
// then each empty barrier waits for this block's compute warps only).
template <typename Cfg, int kGapBytes>
__device__ __forceinline__ StageRing<Cfg> make_ring(unsigned char* smem_raw, int ncta = 1) {
  static_assert(kGapBytes % 1024 == 0, "the gap keeps its own tiles aligned");
  const uint32_t raw = smem_addr(smem_raw);
  StageRing<Cfg> r;
  r.base = smem_raw + (((raw + 1023) & ~1023u) - raw);
  r.bars = reinterpret_cast<uint64_t*>(r.base + Cfg::kStages * Cfg::kStageBytes + kGapBytes);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(r.bars + s, 1);                                     // full: the producer's expect_tx
      mbarrier_init(r.bars + Cfg::kStages + s, Cfg::kComputeWarps * ncta);  // empty: every compute warp
    }
    fence_mbarrier_init();
  }
  // No copy or arrival, from this block or a partner, may reach an uninitialised barrier.
  if (ncta > 1) cluster_sync();
  else __syncthreads();
  return r;
}

// The (head, first query row, round slot) of this block's row block. Row
// blocks run from the last one of a head to the first, so that under a causal
// mask the longest ones start first.
struct RowBlock {
  int64_t head;
  int q_start;
  int64_t slot;  // index in this round's workspace
};
template <typename T>
__device__ __forceinline__ RowBlock row_block_of(const TwoPassWorkspace<T>& w, int64_t slot) {
  const int64_t g = w.first_row_block + slot;
  RowBlock rb;
  rb.head = g / w.row_blocks_per_head;
  rb.q_start = int(w.row_blocks_per_head - 1 - g % w.row_blocks_per_head) * 128;
  rb.slot = slot;
  return rb;
}
#endif

// ---- pass 1: S = Q·Kᵀ per 256-key tile, P̃ = exp(S - m_ref) to the workspace ----
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
two_pass_scores_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                       const __grid_constant__ CUtensorMap tma_p_store, const TwoPassWorkspace<T> w,
                       float* __restrict__ lse, const AttnProblem p, const bool early_mma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBcScores, Bk = Cfg::kBk;
  static_assert(Br == 128, "row_block_of counts 128-row blocks");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // NEW: launched in clusters of 2 where it can be (two row blocks of one
  // head, neighbours in the grid), the two blocks read the same K chunks: each
  // loads half of every chunk (128 keys) and multicasts it to both, cutting
  // the L2 -> SM traffic per stage from 48 to 32 KiB (Q 16 + K 16).
  const int ncta = int(cluster_num_ctas());
  const StageRing<Cfg> ring = make_ring<Cfg, Cfg::kStoreBytes>(smem_raw, ncta);
  T* sOut = reinterpret_cast<T*>(ring.base + Cfg::kStages * Cfg::kStageBytes);  // [2 warpgroups][64, 128]
  const RowBlock rb = row_block_of(w, blockIdx.x);
  const int kv_head = int(p.kv_head(rb.head));  // K: the KV head it reads (GQA: shared by H / Hkv heads)
  const int n_tiles = kv_tiles_for_query_tile(p, rb.q_start, Br, Bc);
  // Tiles both blocks of the cluster walk (under a causal mask they may differ
  // by one): those K chunks are multicast, the longer block loads the rest alone.
  const int shared_tiles =
      ncta > 1 ? min(n_tiles, kv_tiles_for_query_tile(p, row_block_of(w, blockIdx.x ^ 1u).q_start, Br, Bc)) : 0;
  const int d_chunks = p.D / Bk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp >= Cfg::kProducerWarp) {
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp && lane == 0) {
      prefetch_tensor_map(&tma_q);
      prefetch_tensor_map(&tma_k);
      const int rank = int(cluster_cta_rank());
      int it = 0;
      for (int t = 0; t < n_tiles; ++t)
        for (int c = 0; c < d_chunks; ++c, ++it) {
          ring.acquire(it);
          tma_load_3d(ring.a(it), &tma_q, ring.full(it), c * Bk, rb.q_start, int(rb.head));  // Q[128, 64]
          if (t < shared_tiles) {  // K[256, 64]: this block's 128 keys, to both blocks
            tma_load_3d_multicast(ring.b(it) + rank * Cfg::kKHalfBytes, &tma_k, ring.full(it), c * Bk,
                                  t * Bc + rank * Cfg::kKHalfRows, kv_head, uint16_t((1u << ncta) - 1));
          } else {  // K[256, 64]: both halves, to this block only
            for (int h = 0; h < Cfg::kScoresCluster; ++h)
              tma_load_3d(ring.b(it) + h * Cfg::kKHalfBytes, &tma_k, ring.full(it), c * Bk,
                          t * Bc + h * Cfg::kKHalfRows, kv_head);
          }
        }
    }
    __syncwarp();
    // A block leaves only when no partner multicasts into it or arrives on its barriers.
    if (ncta > 1) cluster_sync();
    return;
  }

  warpgroup_reg_alloc<Cfg::kComputeRegs>();
  const int warpgroup = threadIdx.x / 128;
  const int r_local = warpgroup * 64 + (warp % 4) * 16 + lane / 4;  // rows r_local, r_local + 8 of the block
  const int row0 = rb.q_start + r_local;
  const float scale_log2 = p.scale * kLog2e;
  float m_ref[2] = {-INFINITY, -INFINITY};  // exp2 units: scale_log2 · S
  float l[2] = {0.f, 0.f};                  // this lane's share of Σ P̃ (relative to m_ref)
  T* sOut_mine = sOut + warpgroup * 64 * Cfg::kStoreCols;
  const int st_row = (warp % 4) * 16 + lane % 8;  // the row this lane addresses for stmatrix (+8: odd matrices)
  const bool store_thread = threadIdx.x % 128 == 0;  // issues the warpgroup's TMA stores
  float* ref_rows = w.m_ref + (rb.slot * Br + r_local) * int64_t(w.score_tiles);
  uint8_t* moved = reinterpret_cast<uint8_t*>(w.moved + (rb.slot * 2 + warpgroup) * int64_t(w.score_tiles));

  // S[64, 256] and its two halves (keys 0..127, 128..255): the accumulator
  // layout of an N = 256 wgmma is that of two N = 128 ones side by side.
  float S[Cfg::kTilesS][4];
  float(&S_lo)[Cfg::kTilesS / 2][4] = *reinterpret_cast<float(*)[Cfg::kTilesS / 2][4]>(&S[0]);
  float(&S_hi)[Cfg::kTilesS / 2][4] = *reinterpret_cast<float(*)[Cfg::kTilesS / 2][4]>(&S[Cfg::kTilesS / 2]);
  const bool early_on = early_mma && d_chunks >= Cfg::kEarlyChunks;
  // A chunk's MMAs of 64 columns of D: for all 256 keys, or for one half.
  auto chunk_mmas = [&](auto which_constant, int it_c, int c) {
    constexpr int which = decltype(which_constant)::value;  // 0: keys 0..127, 1: 128..255, 2: all
    const uint64_t desc_q = make_sw128_desc(ring.a(it_c) + warpgroup * 64 * 128, 0, 1024);
    const uint64_t desc_k = make_sw128_desc(ring.b(it_c) + (which == 1 ? Cfg::kKHalfBytes : 0), 0, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bk / 16; ++kk) {  // 16 columns per step: 32 bytes into each 128-byte row
      const uint64_t a = advance_desc(desc_q, kk * 32), b = advance_desc(desc_k, kk * 32);
      if constexpr (which == 2 && Cfg::kEarlyChunks == 0) {
        wgmma_ss<T, Bc>(S, a, b, (c | kk) != 0);
      } else {  // with early chunks, always as two N = 128 wgmmas (see kEarlyChunks)
        if constexpr (which != 1) wgmma_ss<T, Bc / 2>(S_lo, a, b, (c | kk) != 0);
        if constexpr (which != 0)
          wgmma_ss<T, Bc / 2>(S_hi, a, which == 2 ? advance_desc(b, Cfg::kKHalfBytes) : b, (c | kk) != 0);
      }
    }
    wgmma_commit();
  };

  int it = 0;
  int early = 0;  // chunks of tile t whose keys 0..127 the previous tile's epilogue issued
  for (int t = 0; t < n_tiles; ++t) {
    // ---- S[64, 256] = Q[warpgroup's 64 rows, :] · K_tᵀ, 64 columns of D per chunk ----
    int c = 0;
    if constexpr (Cfg::kEarlyChunks > 0) {
      if (early > 0) {  // keys 128..255 of the early chunks (their stages were waited for then)
#pragma unroll
        for (; c < Cfg::kEarlyChunks; ++c, ++it) {
          chunk_mmas(std::integral_constant<int, 1>{}, it, c);
          if (c > 0) {
            wgmma_wait<1>();  // chunk it - 1 is done: its slot may be refilled
            ring.release_in_cluster(it - 1, t < shared_tiles, ncta);
          }
        }
      }
    }
    for (; c < d_chunks; ++c, ++it) {
      ring.wait(it);
      chunk_mmas(std::integral_constant<int, 2>{}, it, c);
      if (c > 0) {
        wgmma_wait<1>();
        ring.release_in_cluster(it - 1, t < shared_tiles, ncta);
      }
    }
    wgmma_wait<0>();
    ring.release_in_cluster(it - 1, t < shared_tiles, ncta);
    fence_accumulators(S);

    // ---- NEW: the tile's max moves m_ref only past the slack; P̃ = exp2(s·S - m_ref) ----
    mask_scores(S, p, t * Bc, rb.q_start, row0, row0 + 8, lane % 4);
    bool moved_here = false;
    float ref_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n) mx = fmaxf(mx, fmaxf(S[n][2 * r], S[n][2 * r + 1]));
      mx = quad_allreduce_max(mx) * scale_log2;
      if (mx > m_ref[r] + Cfg::kRefSlack) {  // -inf + slack: the row's first visible key
        l[r] *= exp2_approx(m_ref[r] - mx);  // exp2(-inf) = 0: l was 0 anyway
        m_ref[r] = mx;
        moved_here = true;
      }
      ref_use[r] = m_ref[r] == -INFINITY ? 0.f : m_ref[r];  // a row with no visible key yet: P̃ = 0, not NaN
    }
    // m_ref after this tile, and whether it moved, for pass 2 (here, before
    // the early chunks' MMAs: see store_half's branches).
    if (lane % 4 == 0) {
      ref_rows[t] = m_ref[0];
      ref_rows[8 * w.score_tiles + t] = m_ref[1];
    }
    const bool warp_moved = __any_sync(0xffffffffu, moved_here);
    if (lane == 0) moved[t * 4 + warp % 4] = warp_moved ? 1 : 0;
    // P̃ to the workspace through sOut, 128 columns at a time: every thread
    // writes its fragments (swizzled: conflict-free), one thread of the
    // warpgroup stores the two 64 x 64 boxes with TMA, and the next writes to
    // sOut wait until that store has read it. NEW: each half's P̃ is computed
    // just before it is written, so half 1's exponentials run while the TMA
    // engine reads half 0 out of sOut.
    // A half's P̃, packed two to a register. S itself is only read: no
    // instruction but a wgmma may write registers that the early chunks'
    // MMAs, running meanwhile, or the next tile's MMAs write.
    auto exp_half = [&](auto half_constant, uint32_t(&packed)[Cfg::kTilesS / 2][2]) {
      constexpr int half = decltype(half_constant)::value;
#pragma unroll
      for (int j = 0; j < Cfg::kTilesS / 2; ++j) {
        const float* s = S[half * Cfg::kTilesS / 2 + j];
        float e[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) e[i] = exp2_approx(fmaf(s[i], scale_log2, -ref_use[i / 2]));
        l[0] += e[0] + e[1];
        l[1] += e[2] + e[3];
        packed[j][0] = pack2<T>(e[0], e[1]);
        packed[j][1] = pack2<T>(e[2], e[3]);
      }
    };
    auto store_half = [&](auto half_constant, const uint32_t(&packed)[Cfg::kTilesS / 2][2]) {
      constexpr int half = decltype(half_constant)::value;
      if (t > 0 || half > 0) {
        // Only the store thread has bulk stores in flight; in the others this
        // returns at once. Unconditional: ptxas would wait for the early
        // chunks' MMAs before a branch (C7517).
        bulk_wait_read();
        named_barrier_sync(1 + warpgroup, 128);
      }
      // NEW: two 8-column tiles (four 8 x 8 matrices) per stmatrix; lane l
      // addresses row l % 8 of matrix l / 8: rows +8 for odd matrices, the
      // next tile for matrices 2 and 3.
#pragma unroll
      for (int j = 0; j < Cfg::kTilesS / 2; j += 2) {
        const int row = st_row + ((lane >> 3) & 1) * 8, col = (j + (lane >> 4)) * 8;
        stmatrix_x4(sOut_mine + Sw128Blocks<64>::offset(row, col), packed[j][0], packed[j][1], packed[j + 1][0],
                    packed[j + 1][1]);
      }
      fence_proxy_async_shared();
      named_barrier_sync(1 + warpgroup, 128);
      // One thread stores; every thread commits (an empty group elsewhere):
      // no branch either.
#pragma unroll
      for (int b = 0; b < Cfg::kStoreCols / 64; ++b)
        tma_store_3d_if(store_thread, &tma_p_store, sOut_mine + b * 64 * 64, t * Bc + half * Cfg::kStoreCols + b * 64,
                        int(rb.slot * Br) + warpgroup * 64, 0);
      bulk_commit();
    };
    uint32_t packed[Cfg::kTilesS / 2][2];
    exp_half(std::integral_constant<int, 0>{}, packed);
    store_half(std::integral_constant<int, 0>{}, packed);
    if constexpr (Cfg::kEarlyChunks > 0) {
      // NEW: half 0 has left S_lo; the next tile's first chunks run on the
      // tensor cores, for keys 0..127, while half 1's exponentials run.
      early = t + 1 < n_tiles && early_on ? Cfg::kEarlyChunks : 0;
      if (early > 0) {
#pragma unroll
        for (int c = 0; c < Cfg::kEarlyChunks; ++c) {
          ring.wait(it + c);
          chunk_mmas(std::integral_constant<int, 0>{}, it + c, c);
        }
      }
    }
    exp_half(std::integral_constant<int, 1>{}, packed);
    store_half(std::integral_constant<int, 1>{}, packed);
    // The early chunks' MMAs are not carried across the loop's back edge (ptxas
    // would wait for them there, and serialise every wgmma to do so).
    if constexpr (Cfg::kEarlyChunks > 0) {
      wgmma_wait<0>();
      fence_accumulators(S_lo);
    }
  }

  if (store_thread) bulk_wait();  // sOut must outlive the stores' reads

  // ---- LSE = ln 2 · (m_ref + log2 l); pass 2 divides by l ----
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float lr = quad_allreduce_sum(l[r]);
    if (lane % 4 != 0) continue;
    w.inv_l[rb.slot * Br + r_local + 8 * r] = lr > 0.f ? 1.f / lr : 0.f;
    if (row0 + 8 * r < p.Nq)
      lse[rb.head * p.Nq + row0 + 8 * r] = lr > 0.f ? (m_ref[r] + __log2f(lr)) * kLn2 : -INFINITY;
  }
  __syncwarp();
  if (ncta > 1) cluster_sync();  // with the producer warpgroup: see there
#endif
}

// ---- pass 2: O[128, 256] = Σ over 64-key chunks of P̃·V, then O / l ----------------
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
two_pass_output_kernel(const __grid_constant__ CUtensorMap tma_p, const __grid_constant__ CUtensorMap tma_v,
                       const TwoPassWorkspace<T> w, T* __restrict__ o, const AttnProblem p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int Br = Cfg::kBr, Bk = Cfg::kBk, Bv = Cfg::kBv;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const StageRing<Cfg> ring = make_ring<Cfg, 0>(smem_raw);
  // NEW: launched with programmatic stream serialization, so its blocks may
  // set up while pass 1 drains; nothing of the workspace is read before this.
  griddep_wait();
  const int dv_blocks = p.Dv / Bv;
  const RowBlock rb = row_block_of(w, blockIdx.x / dv_blocks);  // the dv_blocks blocks of a row block are neighbours
  const int kv_head = int(p.kv_head(rb.head));                    // V: the KV head it reads
  const int dv0 = (blockIdx.x % dv_blocks) * Bv;
  const int n_chunks = kv_tiles_for_query_tile(p, rb.q_start, Br, Bk);  // pass 1 wrote ceil(.. / 256) tiles: enough
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp >= Cfg::kProducerWarp) {
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp && lane == 0) {
      prefetch_tensor_map(&tma_p);
      prefetch_tensor_map(&tma_v);
      for (int c = 0; c < n_chunks; ++c) {
        ring.acquire(c);
        tma_load_3d(ring.a(c), &tma_p, ring.full(c), c * Bk, int(rb.slot * Br), 0);  // P̃[128, 64]
        for (int b = 0; b < Cfg::kVBoxes; ++b)                                       // V[64, 256]
          tma_load_3d(ring.b(c) + b * Bk * 128, &tma_v, ring.full(c), dv0 + b * 64, c * Bk, kv_head);
      }
    }
    __syncwarp();
    return;
  }

  warpgroup_reg_alloc<Cfg::kComputeRegs>();
  const int warpgroup = threadIdx.x / 128;
  const int r_local = warpgroup * 64 + (warp % 4) * 16 + lane / 4;
  const int row0 = rb.q_start + r_local;
  const uint32_t* moved = w.moved + (rb.slot * 2 + warpgroup) * int64_t(w.score_tiles);
  const float* ref_rows = w.m_ref + (rb.slot * Br + r_local) * int64_t(w.score_tiles);
  float O[Cfg::kTilesO][4] = {};
  uint32_t moved_next = Cfg::kChunksPerScoreTile < n_chunks ? moved[1] : 0u;  // read a score tile ahead
  for (int c = 0; c < n_chunks; ++c) {
    if (c > 0 && c % Cfg::kChunksPerScoreTile == 0) {
      const int t = c / Cfg::kChunksPerScoreTile;
      const uint32_t moved_now = moved_next;  // the same word for the whole warpgroup: a uniform branch
      moved_next = (t + 1) * Cfg::kChunksPerScoreTile < n_chunks ? moved[t + 1] : 0u;
      if (moved_now != 0u) {
        // NEW: some row's m_ref moved in score tile t: O, accumulated relative
        // to the old m_ref, is rescaled before the first chunk of tile t.
        wgmma_wait<0>();
        fence_accumulators(O);
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float before = ref_rows[8 * r * w.score_tiles + t - 1], after = ref_rows[8 * r * w.score_tiles + t];
          alpha[r] = before == after ? 1.f : exp2_approx(before - after);  // -inf, -inf: 1, not NaN
        }
        rescale_output(O, alpha);
      }
    }
    ring.wait(c);
    const uint64_t desc_p = make_sw128_desc(ring.a(c) + warpgroup * 64 * 128, 0, 1024);
    const uint64_t desc_v = make_sw128_desc(ring.b(c), Bk * 128, 1024);  // N-major: 64-column blocks 8 KiB apart
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bk / 16; ++kk)  // 16 keys per step: 32 bytes into P̃'s rows, 16 rows (2 KiB) of V
      wgmma_ss_vt<T, Bv>(O, advance_desc(desc_p, kk * 32), advance_desc(desc_v, kk * 16 * 128), 1);
    wgmma_commit();
    if (c > 0) {
      wgmma_wait<1>();
      ring.release(c - 1);
    }
  }
  wgmma_wait<0>();
  if (n_chunks > 0) ring.release(n_chunks - 1);
  fence_accumulators(O);

  // ---- O / l to global memory (rows < Nq) ----
  T* Og = o + rb.head * p.Nq * p.Dv;
  const int t4 = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= p.Nq) continue;
    const float inv = w.inv_l[rb.slot * Br + r_local + 8 * r];
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(Og + int64_t(row) * p.Dv + dv0 + n * 8 + 2 * t4) =
          pack2<T>(O[n][2 * r] * inv, O[n][2 * r + 1] * inv);
  }
#endif
}

std::string unsupported(const AttnProblem& p, int smem_bytes) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  if (p.D % 64 != 0 || p.D > 1024) return "head dim " + std::to_string(p.D) + " is not a multiple of 64 up to 1024";
  if (p.Dv % 256 != 0 || p.Dv > 1024) return "Dv " + std::to_string(p.Dv) + " not in {256, 512, 768, 1024}";
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  return smem_unsupported(size_t(smem_bytes));
}

size_t workspace_bytes(const AttnProblem& p) {
  const TwoPassLayout L = two_pass_layout(p);
  const int64_t fit = std::max<int64_t>(1, int64_t(kWorkspaceCap / L.bytes_per_slot));
  return size_t(std::min(L.row_blocks, fit)) * L.bytes_per_slot;
}

// The rounds: equal ones of `slots` row blocks each, as many as `fit` in the
// workspace allows. Returns the blocks per pass-1 cluster: kScoresCluster (K
// multicast) when every pair of neighbouring row blocks of a round belongs to
// one head — the rounds are then made even where the workspace holds one row
// block more — else 1. ATTNLAB_TWO_PASS_NO_MULTICAST=1 forces 1, to measure
// what multicast buys.
template <typename Cfg>
int plan_rounds(const TwoPassLayout& L, int64_t fit, int64_t* slots) {
  static_assert(Cfg::kScoresCluster == 2, "pairs: a block's partner is blockIdx.x ^ 1");
  static const bool disabled = env_switch_on("ATTNLAB_TWO_PASS_NO_MULTICAST");
  constexpr int c = Cfg::kScoresCluster;
  const int64_t rounds = (L.row_blocks + fit - 1) / fit;
  *slots = (L.row_blocks + rounds - 1) / rounds;
  if (disabled || L.row_blocks_per_head % c != 0) return 1;
  if (*slots % c != 0 && *slots + 1 <= fit) ++*slots;
  // Row blocks per head even: so is every round, the last one included.
  return *slots % c == 0 ? c : 1;
}

// Whether pass 1 issues early chunks (where its config has them):
// ATTNLAB_TWO_PASS_NO_EARLY_MMA=1 turns them off, to measure what they buy.
bool early_mma() {
  static const bool disabled = env_switch_on("ATTNLAB_TWO_PASS_NO_EARLY_MMA");
  return !disabled;
}

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  using Cfg = TwoPassConfig<kStages>;
  const TwoPassLayout L = two_pass_layout(p);
  const int64_t fit = b.workspace == nullptr ? 0 : int64_t(b.workspace_bytes / L.bytes_per_slot);
  if (fit < 1) return cudaErrorMemoryAllocation;  // the harness sizes it with workspace_bytes()
  int64_t slots = 0;
  const int cluster = plan_rounds<Cfg>(L, fit, &slots);
  return dispatch_dtype(p.dtype, [&](auto type) -> cudaError_t {
    using T = decltype(type);
    // P̃ of a round is one [slots·128, nk_pad] matrix: stored (pass 1) in boxes
    // of 64 rows, one warpgroup's, and loaded (pass 2) in boxes of 128.
    CUtensorMap map_q, map_k, map_v, map_p_store, map_p;
    const int64_t kv_heads = int64_t(p.B) * p.kv_heads();
    if (!encode_head_tiles<Cfg::kBr>(&map_q, b.q, p.dtype, p.heads(), p.Nq, p.D) ||
        !encode_head_tiles<Cfg::kKHalfRows>(&map_k, b.k, p.dtype, kv_heads, p.Nk, p.D) ||
        !encode_head_tiles<Cfg::kBk>(&map_v, b.v, p.dtype, kv_heads, p.Nk, p.Dv) ||
        !encode_head_tiles<64>(&map_p_store, b.workspace, p.dtype, 1, int(slots * Cfg::kBr), L.nk_pad) ||
        !encode_head_tiles<Cfg::kBr>(&map_p, b.workspace, p.dtype, 1, int(slots * Cfg::kBr), L.nk_pad))
      return cudaErrorInvalidValue;
    for (int64_t first = 0; first < L.row_blocks; first += slots) {
      const int64_t n = std::min(slots, L.row_blocks - first);
      const TwoPassWorkspace<T> w = carve_workspace<T>(b.workspace, L, slots, first);
      // Pass 1 rewrites the workspace pass 2 of the round before read: an ordinary launch.
      cudaError_t err = launch_clustered(two_pass_scores_kernel<Cfg, T>, dim3(unsigned(n)), Cfg::kThreads,
                                         Cfg::kSmemScores, cluster, stream, map_q, map_k,
                                         map_p_store, w, b.lse, p, early_mma());
      if (err != cudaSuccess) return err;
      err = launch_with_smem_overlapped(two_pass_output_kernel<Cfg, T>, dim3(unsigned(n * (p.Dv / Cfg::kBv))),
                                        Cfg::kThreads, Cfg::kSmemOutput, stream, map_p, map_v, w,
                                        static_cast<T*>(b.o), p);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  });
}

template <int kStages>
Variant make_variant() {
  using Cfg = TwoPassConfig<kStages>;
  Variant v;
  v.name = "two-pass+stage" + std::to_string(kStages);
  v.rung = "11_two_pass";
  v.unsupported_reason = [](const AttnProblem& p) { return unsupported(p, Cfg::kSmemBytes); };
  v.workspace_bytes = workspace_bytes;
  v.launch = launch<kStages>;
  v.describe = [] {
    return "sm_90a wgmma + TMA; pass 1: S per 128 x 256 tile (row blocks in pairs that multicast K), P̃ = exp(S - m_ref) "
           "to a workspace; pass 2: O = P̃·V "
           "per 128 x 256 tile; stages=" +
           std::to_string(kStages) + "; Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBcScores) +
           " warps=" + std::to_string(Cfg::kWarps) + " smem=" + std::to_string(Cfg::kSmemBytes) +
           "B; D multiple of 64 up to 1024, Dv in {256, 512, 768, 1024}; fp16/bf16; causal or not; GQA/MQA; "
           "any Nq, Nk";
  };
  return v;
}

}  // namespace

std::vector<Variant> make_two_pass_variants() { return {make_variant<2>(), make_variant<4>()}; }

}  // namespace attnlab
