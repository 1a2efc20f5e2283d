// ============================================================================
// Rung 14 — the backward on Hopper: rung 13's algorithm on rung 12's engine
//           (TMA from a producer warp, wgmma in two compute warpgroups)
// ============================================================================
// What changes against rung 13 (`bwd-mma`, FlashAttention-2's backward in
// mma.sync): the same walk — a block per key tile, K_j, V_j, dK_j, dV_j on
// chip, the visible query tiles streamed past — on FlashAttention-3's
// structure (Shah et al. 2024, §3; hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp):
//   NEW (ws): a producer thread issues Q_i, dO_i (TMA boxes) and LSE_i, Δ_i
//        (bulk copies) into a ring of kStages slots with full/empty mbarriers;
//        two compute warpgroups own 64 keys each (setmaxnreg 24 / 240);
//   NEW (wgmma, transposed): Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, so that Pᵀ and dSᵀ are
//        already the register A operands of dV += Pᵀ·dO and dK += dSᵀ·Q — P
//        never goes through shared memory; dSᵀ does, once, for dQ = dS·K over
//        both warpgroups' keys (bwd_ws_mainloop.cuh);
//   NEW (dQ by bulk reduce-add): dQ writer warps (one per staging buffer) add
//        each tile's dQ, staged in shared memory in the fp32 accumulator's own
//        tile layout, by one bulk reduction instead of per-element atomics;
//        `+deterministic` adds a dQ tile's parts in key-tile order (a counter
//        per dQ tile), walking the query tiles last first.
// Before and after (common/bwd_prepost.cuh): Δ = rowsum(dO ∘ O), LSE·log2e; dQ's cast.
//
// Per block: Bc = 128 keys + 1 producer warpgroup; sK [Bc, D], sV [Bc, Dv],
// sQ, sdO [kStages][Br, D | Dv], sdS [bufs][Bc, Br], sdQ [bufs][Br, D] fp32
// (Sw128Blocks); 1 + 2·kStages mbarriers. dQ's MMA split between the warpgroups
// by rows (Br = 128) or columns. Tiles (BwdWsTile, checked by static_assert):
//   D / Dv     Br  slice  Bc  stages  dQ split  dV early  dSᵀ/dQ bufs  smem (+1024)
//   64        128   128  128   2       rows      no        2 / 1        198696
//   128        64    64  128   2       columns   yes       2 / 2        230440
//   192 / 128  64    32  128   2       columns   no        1 / 1        230440
// Registers (setmaxnreg): producer / compute 24 / 240 (FlashAttention-3's).
//
// Supports: fp16, bf16; the (D, Dv) above (not 256: dK, dV of 64 keys would
// take 256 registers per thread; rung 15 runs it); GQA/MQA (dK, dV summed
// over a KV head's query heads in the block); any Nq, Nk >= 1; causal
// (bottom-right) or not; rows that see no key get dQ = 0. sm_90a,
// cuTensorMapEncodeTiled, 16-byte aligned tensors.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 128 --bwd --variant 'bwd*'
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flash_attn/bwd_ws_host.cuh"
#include "flash_attn/bwd_ws_mainloop.cuh"

namespace attnlab {
namespace {

// The query tile per (D, Dv): at D = 64 Sᵀ, dPᵀ of 128 queries fit next to
// dK, dV (64 registers each); at D = 128 dK, dV take 128, so 64 queries.
template <int kHeadDim, int kHeadDimV>
struct BwdWsTile;
// kEarlyDv: dV's MMA issued before dS is computed (registers allow it at D = 128).
// kDsBuffers, kDqBuffers: dSᵀ and the dQ staging double-buffered where shared
// memory allows (else a barrier per tile, and a wait for the dQ writer's read);
// at D = 64 two dSᵀ buffers measure faster than two dQ buffers.
// kSliceQ: Sᵀ and dPᵀ in slices of this many queries (registers at D = 192).
template <> struct BwdWsTile<64, 64>   { static constexpr int kBr = 128, kSliceQ = 128, kDsBuffers = 2, kDqBuffers = 1; static constexpr bool kEarlyDv = false; };
template <> struct BwdWsTile<128, 128> { static constexpr int kBr = 64,  kSliceQ = 64,  kDsBuffers = 2, kDqBuffers = 2; static constexpr bool kEarlyDv = true; };
template <> struct BwdWsTile<192, 128> { static constexpr int kBr = 64,  kSliceQ = 32,  kDsBuffers = 1, kDqBuffers = 1; static constexpr bool kEarlyDv = false; };

template <int kHeadDim_, int kHeadDimV_, int kBr_, int kSliceQ_, bool kEarlyDv_, int kDsBuffers_, int kDqBuffers_,
          int kStages_>
struct BwdWsConfig : ProducerWarpgroupSplit<2, 24, 240> {  // 2 compute warpgroups + 1 producer warpgroup
  static constexpr int kHeadDim = kHeadDim_;    // D: Q, K, dQ, dK
  static constexpr int kHeadDimV = kHeadDimV_;  // Dv: V, O, dO, dV
  static constexpr int kBr = kBr_;
  static constexpr int kBc = 128;  // 64 keys per compute warpgroup (wgmma's M)
  static constexpr int kStages = kStages_;
  static constexpr int kSliceQ = kSliceQ_;
  static constexpr bool kEarlyDv = kEarlyDv_;
  static constexpr int kDsBuffers = kDsBuffers_;
  static constexpr int kDqBuffers = kDqBuffers_;
  static constexpr int kComputeThreads = 32 * kComputeWarps;
  // dQ = dS·K (Br x D) between the two warpgroups: by rows (64 each) when Br =
  // 128, else by columns, D/2 each, in parts that start on a 64-column block
  // or half-way into one (the descriptor's start moves by 16-byte chunks): one
  // part of kDqColsA, or at D = 192 a part of 64 and one of 32 — warpgroup 0
  // columns 0-63 and 64-95, warpgroup 1 columns 128-191 and 96-127.
  static constexpr bool kDqSplitRows = kBr == 128;
  static constexpr int kDqCols = kDqSplitRows ? kHeadDim : kHeadDim / 2;
  static constexpr int kDqColsB = kDqCols % 64 == 0 || kDqCols < 64 ? 0 : kDqCols % 64;
  static constexpr int kDqColsA = kDqCols - kDqColsB;
  // The first column of warpgroup wg's part (0: A, 1: B).
  ATTNLAB_HOST_DEVICE static constexpr int dq_part_col(int wg, int part) {
    return kDqSplitRows ? 0 : part == 0 ? wg * (kDqColsA + 2 * kDqColsB) : kDqColsA + wg * kDqColsB;
  }
  static constexpr int kKElems = kBc * kHeadDim, kVElems = kBc * kHeadDimV;
  static constexpr int kQElems = kBr * kHeadDim, kdOElems = kBr * kHeadDimV;
  static constexpr int kdSElems = kBc * kBr;
  static constexpr int kdQFloats = kBr * kHeadDim;  // one dQ staging buffer
  static constexpr int kPFloats = 0;                // (no Pᵀ handed between warpgroups)
  static constexpr int kSlotReleasers = kComputeThreads;  // q_empty: every compute thread
  static constexpr int kKVBytes = 2 * (kKElems + kVElems);                  // what kv_full expects
  static constexpr int kQdoBytes = 2 * (kQElems + kdOElems) + 2 * kBr * 4;  // q_full: Q, dO, LSE, Δ
  static constexpr int kBarriers = 1 + 2 * kStages;
  static constexpr int kTileBytes =
      2 * (kKElems + kVElems + kStages * (kQElems + kdOElems) + kDsBuffers * kdSElems) + 4 * kDqBuffers * kdQFloats +
      4 * 2 * kStages * kBr;
  static constexpr int kSmemBytes = kTileBytes + 8 * kBarriers + 1024;  // + slack to align to 1024
  // Named barriers (0 is __syncthreads'): "both compute warpgroups' dSᵀ are
  // stored" (256 threads), and per dQ staging buffer "staged" and "read by the
  // dQ writer" (the compute warps and that buffer's writer warp, 288).
  // With one dSᵀ buffer, kDsFreeBarrier: "both have read the previous dSᵀ".
  static constexpr int kDsBarrier = 1, kDqFullBarrier = 2, kDqEmptyBarrier = 4, kDsFreeBarrier = 6;
  static constexpr int kDqWriterWarp = kProducerWarp + 1;
  static constexpr int kDqWriters = kDqBuffers;  // a dQ writer warp per staging buffer
  static_assert(kComputeWarps == 8 && kComputeThreads == 256 && kBc == 64 * 2, "two compute warpgroups of 64 keys");
  static_assert(kKVBytes == 2 * kBc * (kHeadDim + kHeadDimV) && kQdoBytes == 2 * kBr * (kHeadDim + kHeadDimV + 4),
                "the bytes each full barrier expects");
  static_assert(kDsBarrier >= 1 && kDqFullBarrier == kDsBarrier + 1 && kDqEmptyBarrier == kDqFullBarrier + 2 &&
                    kDsFreeBarrier == kDqEmptyBarrier + 2 && kDsFreeBarrier <= 15,
                "hardware barriers 1..15, two per pair of dQ buffers");
  static_assert(kDqWriterWarp + kDqWriters <= kWarps, "the dQ writers are warps of the producer warpgroup");
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0, "Sw128Blocks stores 64-column blocks, one TMA box each");
  static_assert(kBr == 64 || kBr == 128, "Sᵀ's N and the dQ split");
  static_assert(kDqColsA == 64 && (kDqColsB == 0 || kDqColsB == 32), "dQ parts: m64n64 (+ m64n32) per warpgroup");
  static_assert(kDqSplitRows || (dq_part_col(1, 0) + kDqColsA == kHeadDim && dq_part_col(0, 1) == kDqColsA &&
                                 dq_part_col(1, 1) + kDqColsB == dq_part_col(1, 0)),
                "the two warpgroups' parts tile dQ's columns");
  static_assert(kHeadDim % 8 == 0, "dQ is staged in groups of 8 fp32 columns");
  static_assert((kBr * 128) % 1024 == 0 && (kBc * 128) % 1024 == 0, "every 64-column block starts 1024-aligned");
  static_assert((4 * kdQFloats) % 1024 == 0 && (2 * kdSElems) % 1024 == 0, "sdQ's boxes stay 1024-aligned");
  static_assert(kStages >= 2, "the producer fills one slot while the compute warps read the other");
  static_assert(kDsBuffers == 1 || kDsBuffers == 2, "dSᵀ in one buffer (and a barrier) or two");
  static_assert(kDqBuffers == 1 || kDqBuffers == 2, "two named barriers of each kind for the dQ buffers");
  static_assert(kBr % kSliceQ == 0 && kSliceQ % 32 == 0, "whole slices, 8-row groups of the swizzle");
  static_assert(kSliceQ == kBr || !kEarlyDv, "dV early only with one slice");
};

constexpr int kBwdWsStages = 2;
template <int D, int Dv>
using Config = BwdWsConfig<D, Dv, BwdWsTile<D, Dv>::kBr, BwdWsTile<D, Dv>::kSliceQ, BwdWsTile<D, Dv>::kEarlyDv,
                           BwdWsTile<D, Dv>::kDsBuffers, BwdWsTile<D, Dv>::kDqBuffers, kBwdWsStages>;

// The header's table.
template <int D, int Dv, int kBr, int kSlice, int kBc, bool kSplitRows, bool kEarlyDv, int kDsBufs, int kDqBufs,
          int kSmem>
constexpr bool kTableRow = Config<D, Dv>::kBr == kBr && Config<D, Dv>::kSliceQ == kSlice && Config<D, Dv>::kBc == kBc &&
                           Config<D, Dv>::kThreads == 384 && Config<D, Dv>::kDqSplitRows == kSplitRows &&
                           Config<D, Dv>::kEarlyDv == kEarlyDv && Config<D, Dv>::kDsBuffers == kDsBufs &&
                           Config<D, Dv>::kDqBuffers == kDqBufs && Config<D, Dv>::kSmemBytes - 1024 == kSmem;
static_assert(kTableRow<64, 64, 128, 128, 128, true, false, 2, 1, 198696>, "header: D=64");
static_assert(kTableRow<128, 128, 64, 64, 128, false, true, 2, 2, 230440>, "header: D=128");
static_assert(kTableRow<192, 128, 64, 32, 128, false, false, 1, 1, 230440>, "header: D=192, Dv=128");
static_assert(kBwdWsStages == 2 && Config<64, 64>::kProducerRegs == 24 && Config<64, 64>::kComputeRegs == 240,
              "header: two stages, 24 / 240 registers");

template <typename Cfg, typename T, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
bwd_ws_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
              const __grid_constant__ CUtensorMap tma_v, const __grid_constant__ CUtensorMap tma_do,
              float* __restrict__ dq_accum, const float* __restrict__ lse2,
              const float* __restrict__ delta, int* __restrict__ dq_turns, T* __restrict__ dk, T* __restrict__ dv,
              const AttnProblem p, int nq_pad) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bwd_ws_block<Cfg, T, kDeterministic>(
      smem_raw, p, &tma_q, &tma_k, &tma_v, &tma_do, lse2, delta, nq_pad,
      [&](const BwdShared<Cfg, T>& sm, const BwdWork& w, int writer) {
        bwd_write_dq<Cfg, T, kDeterministic>(sm, p, w, dq_accum, nq_pad, dq_turns, writer);
      },
      [&](const BwdShared<Cfg, T>& sm, const BwdWork& w) { bwd_compute<Cfg, T>(sm, p, w, dk, dv); });
#endif
}

// ---- host --------------------------------------------------------------------------

using BwdWsHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<192, 128>>;

std::string describe_tiles() {
  std::string s = "stages=" + std::to_string(kBwdWsStages);
  BwdWsHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    s += "; D=" + std::to_string(D) + (Dv == D ? "" : " Dv=" + std::to_string(Dv)) +
         ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
         " warps=" + std::to_string(Cfg::kWarps) + " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
  });
  return s + "; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
}

template <bool kDeterministic>
BwdVariant make_variant() {
  return bwd_ws_variant<BwdWsHeadDims, Config, kDeterministic>(
      "bwd-ws", "14_bwd_ws",
      [](auto cfg, auto type) { return bwd_ws_kernel<decltype(cfg), decltype(type), kDeterministic>; },
      "sm_90a wgmma, Q/dO/LSE/Δ by TMA from a producer warp, Sᵀ and dPᵀ so that P and dS stay in registers, dQ by "
      "bulk reduce-add",
      describe_tiles);
}

}  // namespace

std::vector<BwdVariant> make_bwd_ws_variants() { return {make_variant<false>(), make_variant<true>()}; }

}  // namespace attnlab
