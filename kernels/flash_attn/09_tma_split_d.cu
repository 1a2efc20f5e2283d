// ============================================================================
// Rung 09 — rung 08 fed by TMA from a producer warpgroup, optionally multicast
//           to a cluster of two blocks (D = 512)
// ============================================================================
// What changes against rung 08: the compute is the same (split_d_tile.cuh:
// two warpgroups share 64 query rows and split the head dim), but K_j and V_j
// no longer come through cp.async issued by the 256 compute threads — 16
// copies per thread per 64 KiB tile, with their swizzled addresses and bounds
// checks, in the middle of the softmax. Instead
//   NEW: a producer warpgroup issues the copies with the Tensor Memory Accelerator:
//        one cp.async.bulk.tensor per 64-column block of a tile, landing
//        already 128-byte swizzled (common/tma.cuh). Completion is counted in
//        bytes on a "full" mbarrier the compute threads wait on; they hand the
//        slot back through an "empty" one (FlashAttention-3's producer/consumer
//        split; CUTLASS's PipelineTmaAsync). The producer is a whole third
//        warpgroup so that setmaxnreg can move its registers to the compute
//        warpgroups (a ninth warp alone would cap every thread at 168);
//   NEW (+multicast): two blocks with neighbouring query tiles of the same head
//        form a cluster; each loads half of every K/V tile and multicasts it to
//        both, so each K/V byte leaves L2 once per 128 query rows, not per 64.
//        Where it is slower: a slot is refilled only when both blocks have
//        released it, so the two run in step, and that costs more than the
//        saved traffic (docs/09_tma_split_d.md).
// TMA boxes, expect_tx and parity waits, setmaxnreg: docs/hopper_primer.md.
//
// Per block: sQ, sK, sV [64, 512] (Sw128Blocks, 64 KiB each), sRed [2][64, 64]
// fp32 (32 KiB), 5 mbarriers (Q full; K and V full/empty).
// Tile configuration (constexprs in TmaSplitDConfig, checked below):
//   D     Br   Bc  warpgroups           stages  smem (+1024 alignment slack)
//  512    64   64   2 + 1 producer = 384     1      229416
// Registers: 168 per thread at launch; setmaxnreg gives the producer 40 and
// the compute threads 232 (ptxas: docs/09_tma_split_d.md). Cluster: 1 block
// (tma-split-d+stage1) or 2 (+multicast).
//
// Supports: fp16, bf16; D = Dv = 512; GQA/MQA (H a multiple of Hkv); any Nq,
// Nk >= 1; causal (bottom-right) or not; writes O and LSE. Needs an sm_90 GPU,
// an sm_90a build and cuTensorMapEncodeTiled (a CUDA 12+ driver).
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 512 --variant '*split-d*' --check --show-all
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

template <int kHeadDim_, int kStages_>
// NEW: the warps split into 2 compute warpgroups and a producer warpgroup
// (common/wgmma.cuh's ProducerWarpgroupSplit): after setmaxnreg the producer
// keeps 40 registers and the compute threads get 232, enough for rung 08's
// tile without spills.
struct TmaSplitDConfig : SplitDTiles<kHeadDim_>,  // tile shapes: split_d_tile.cuh
                         ProducerWarpgroupSplit<SplitDTiles<kHeadDim_>::kWarpgroups> {
  static constexpr int kStages = kStages_;
  static_assert(TmaSplitDConfig::kLaunchRegs == 168 && TmaSplitDConfig::kComputeRegs == 232 &&
                    TmaSplitDConfig::kProducerRegs == 40,
                "header: 168 registers at launch, 232 / 40 after setmaxnreg");
  static constexpr int kBarriers = 5;  // Q full, K full, K empty, V full, V empty
  static constexpr int kSmemBytes = TmaSplitDConfig::kTileBytes + 8 * kBarriers + 1024;  // + alignment slack
  static constexpr int kBoxBytes = TmaSplitDConfig::kBc * 64 * 2;  // one TMA box: 64 rows x 64 columns
  static constexpr int kBoxesPerTile = kHeadDim_ / 64;
  static_assert(kStages == 1, "one K and one V slot: a second would not fit");
  static_assert(TmaSplitDConfig::kBr == TmaSplitDConfig::kBc, "Q and K/V boxes share one shape");
  static_assert(kBoxesPerTile * kBoxBytes == TmaSplitDConfig::kTileBytesQKV, "a tile is whole boxes");
};
static_assert(TmaSplitDConfig<512, 1>::kTileBytes + 8 * TmaSplitDConfig<512, 1>::kBarriers == 229416,
              "header: D=512 shared memory");
static_assert(TmaSplitDConfig<512, 1>::kThreads == 384, "header: 2 compute warpgroups + 1 producer warpgroup");
static_assert(TmaSplitDConfig<512, 1>::kBr == 64 && TmaSplitDConfig<512, 1>::kBc == 64 &&
                  TmaSplitDConfig<512, 1>::kWarpgroups == 2,
              "header: D=512 is Br 64 x Bc 64, 2 compute warpgroups");
static_assert(TmaSplitDConfig<512, 1>::kSmemBytes - TmaSplitDConfig<512, 1>::kTileBytes -
                      8 * TmaSplitDConfig<512, 1>::kBarriers ==
                  1024,
              "header: +1024 alignment slack");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The copy pipeline seen by the compute threads (split_d_tile.cuh's
// hooks): a slot is full when its mbarrier's phase for tile j has completed
// (parity j % 2); thread 0 releases it, after the compute threads' barrier, by
// arriving on the slot's empty barrier in every block of the cluster — a slot
// is refilled once all kCluster blocks are done with it. Nobody waits for the
// release of the last tile, and a partner may already have exited: not sent.
template <int kCluster>
struct TmaSlots {
  uint64_t* k_full;
  uint64_t* k_empty;
  uint64_t* v_full;
  uint64_t* v_empty;
  int n_tiles;

  __device__ __forceinline__ void release(uint64_t* empty, int j) const {
    if (threadIdx.x != 0 || j + 1 >= n_tiles) return;
    if constexpr (kCluster == 1) {
      mbarrier_arrive(empty);
    } else {
#pragma unroll
      for (int r = 0; r < kCluster; ++r) mbarrier_arrive_cluster(empty, r);
    }
  }
  __device__ __forceinline__ void sync() const { named_barrier_sync(1, 256); }  // the compute warps only
  __device__ __forceinline__ void wait_k(int j) const { mbarrier_wait(k_full, j & 1); }
  __device__ __forceinline__ void release_k(int j) const { release(k_empty, j); }
  __device__ __forceinline__ void wait_v(int j) const { mbarrier_wait(v_full, j & 1); }
  __device__ __forceinline__ void release_v(int j) const { release(v_empty, j); }
};
#endif

template <typename Cfg, typename T, int kCluster>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
tma_split_d_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                   const __grid_constant__ CUtensorMap tma_v, T* __restrict__ o, float* __restrict__ lse,
                   const AttnProblem p) {
  static_assert(kCluster == 1 || kCluster == 2, "a block and at most one partner");
  static_assert(Cfg::kProducerWarp % 4 == 0, "the producer warp starts a warpgroup");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int Br = Cfg::kBr, Bc = Cfg::kBc, kSlice = Cfg::kSliceCols;
  static_assert(Cfg::kComputeThreads == 256, "TmaSlots::sync counts 256 compute threads");

  const int m_block = gridDim.x - 1 - blockIdx.x;  // gridDim.x is a multiple of kCluster
  const int head = blockIdx.z * p.H + blockIdx.y;
  const int kv_head = int(p.kv_head(head));  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // NEW: a padding block (q_start >= Nq, when the row tiles do not pair up)
  // computes nothing; the blocks of a cluster stream the same kv tiles, as many
  // as the one of them that needs more (causal: one more, at most).
  const int n_mine = q_start < p.Nq ? kv_tiles_for_query_tile(p, q_start, Br, Bc) : 0;
  int n_pair = n_mine;
  if (kCluster == 2) {
    const int partner_start = (m_block ^ 1) * Br;
    if (partner_start < p.Nq) n_pair = max(n_pair, kv_tiles_for_query_tile(p, partner_start, Br, Bc));
  }

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const SplitDSmem<T> sm = carve_split_d_smem<Cfg, T>(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm.end);
  uint64_t* q_full = bars;
  const TmaSlots<kCluster> slots{bars + 1, bars + 2, bars + 3, bars + 4, n_pair};

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);  // full: the producer's one arrive_expect_tx (+ the bytes)
    mbarrier_init(slots.k_full, 1);
    mbarrier_init(slots.v_full, 1);
    mbarrier_init(slots.k_empty, kCluster);  // empty: thread 0 of every block of the cluster
    mbarrier_init(slots.v_empty, kCluster);
    fence_mbarrier_init();
  }
  // No copy may signal a barrier, here or in the partner, before it is initialised.
  if constexpr (kCluster > 1) cluster_sync();
  else __syncthreads();

  if (warp >= Cfg::kProducerWarp) {
    // ---- NEW: the producer: one thread issues every copy of the block ------------
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp && lane == 0) {
      prefetch_tensor_map(&tma_q);
      prefetch_tensor_map(&tma_k);
      prefetch_tensor_map(&tma_v);
      if (n_mine > 0) {
        mbarrier_arrive_expect_tx(q_full, Cfg::kTileBytesQKV);
        for (int b = 0; b < Cfg::kBoxesPerTile; ++b)
          tma_load_3d(sm.sQ + b * Br * 64, &tma_q, q_full, b * 64, q_start, head);
      }
      // This block's share of each tile's boxes: all of them, or half (multicast to both).
      const int rank = kCluster > 1 ? int(cluster_cta_rank()) : 0;
      constexpr int kMyBoxes = Cfg::kBoxesPerTile / kCluster;
      auto load_tile = [&](T* slot, const CUtensorMap* map, uint64_t* full, uint64_t* empty, int j) {
        if (j > 0) mbarrier_wait(empty, (j - 1) & 1);  // every block has released tile j-1 from this slot
        mbarrier_arrive_expect_tx(full, Cfg::kTileBytesQKV);  // the whole tile lands here, both halves
        for (int b = rank * kMyBoxes; b < (rank + 1) * kMyBoxes; ++b) {
          if constexpr (kCluster > 1)
            tma_load_3d_multicast(slot + b * Bc * 64, map, full, b * 64, j * Bc, kv_head,
                                  uint16_t((1 << kCluster) - 1));
          else
            tma_load_3d(slot + b * Bc * 64, map, full, b * 64, j * Bc, kv_head);
        }
      };
      for (int j = 0; j < n_pair; ++j) {  // in the order the compute warps free the slots
        load_tile(sm.sK, &tma_k, slots.k_full, slots.k_empty, j);
        load_tile(sm.sV, &tma_v, slots.v_full, slots.v_empty, j);
      }
    }
    __syncwarp();
  } else {
    // ---- the two compute warpgroups: rung 08's tile, fed by the slots -------------
    warpgroup_reg_alloc<Cfg::kComputeRegs>();
    const int warpgroup = threadIdx.x / 128;
    const int row0 = q_start + (warp % 4) * 16 + lane / 4;  // both warpgroups: the same rows
    float O[Cfg::kTilesO][4] = {};
    RowStats stats;
    const float scale_log2 = p.scale * kLog2e;
    if (n_mine > 0) mbarrier_wait(q_full, 0);
    for (int j = 0; j < n_pair; ++j) {
      if (j < n_mine) {
        split_d_kv_tile<Cfg>(O, stats, sm, p, j, q_start, row0, scale_log2, slots);
      } else if (threadIdx.x == 0) {  // the partner's extra tile: take it and hand it back unread
        slots.wait_k(j);
        slots.release_k(j);
        slots.wait_v(j);
        slots.release_v(j);
      }
    }
    store_output<T>(O, stats, p, head, row0, /*col0=*/warpgroup * kSlice, lane % 4, /*write_lse=*/warpgroup == 0,
                    o, lse);
  }
  // A block leaves only when its partner no longer signals it or copies into it.
  if constexpr (kCluster > 1) cluster_sync();
#endif
}

using TmaSplitDHeadDims = EqualHeadDims<512>;

template <int kCluster>
std::string unsupported(const AttnProblem& p) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  return rung_unsupported<TmaSplitDConfig, 1, TmaSplitDHeadDims>(p);
}

template <int kCluster>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  TmaSplitDHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = TmaSplitDConfig<decltype(dims)::D, 1>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      // NEW: the tensor maps, built on the host at every launch.
      CUtensorMap maps[3];
      if (!encode_qkv_maps<Cfg::kBr, Cfg::kBc>(maps, p, b.q, b.k, b.v)) return cudaErrorInvalidValue;
      const int m_blocks = (p.Nq + Cfg::kBr - 1) / Cfg::kBr;
      return launch_clustered(tma_split_d_kernel<Cfg, T, kCluster>,
                              dim3((m_blocks + kCluster - 1) / kCluster * kCluster, p.H, p.B), Cfg::kThreads,
                              Cfg::kSmemBytes, kCluster, stream, maps[0], maps[1], maps[2], static_cast<T*>(b.o),
                              b.lse, p);
    });
  });
  return err;
}

template <int kCluster>
Variant make_variant() {
  Variant v;
  v.name = std::string("tma-split-d+stage1") + (kCluster > 1 ? "+multicast" : "");
  v.rung = "09_tma_split_d";
  v.unsupported_reason = unsupported<kCluster>;
  v.launch = launch<kCluster>;
  v.describe = [] {
    return "sm_90a wgmma, 2 warpgroups split the head dim of 64 rows, K/V by TMA from a producer warpgroup; cluster=" +
           std::to_string(kCluster) + (kCluster > 1 ? " (K/V multicast)" : "") + "; " +
           rung_describe<TmaSplitDConfig, 1, TmaSplitDHeadDims>();
  };
  return v;
}

}  // namespace

std::vector<Variant> make_tma_split_d_variants() { return {make_variant<1>(), make_variant<2>()}; }

}  // namespace attnlab
