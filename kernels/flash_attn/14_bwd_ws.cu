// ============================================================================
// Rung 14 — the backward on Hopper: rung 13's algorithm on rung 12's engine
//           (TMA from a producer warpgroup, wgmma in two compute warpgroups)
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
//        both warpgroups' keys (hopper/bwd_mainloop.cuh);
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
// by rows (Br = 128) or columns. Tiles (BwdWsTile, hopper/bwd_tile.h, checked by static_assert):
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
#include "hopper/bwd_dq_writer.cuh"
#include "hopper/bwd_host.cuh"
#include "hopper/bwd_kernel.cuh"
#include "hopper/bwd_mainloop.cuh"
#include "hopper/bwd_tile.h"

namespace attnlab {
namespace {

// The tile per (D, Dv), BwdWsTile, and the ring's kBwdWsStages:
// hopper/bwd_tile.h, shared with the variable-length backward; the block
// around it (its shared memory, barriers, dQ split): BwdWsConfig, hopper/bwd_mainloop.cuh.
template <int D, int Dv>
using Config = BwdWsEngineConfig<D, Dv>;

// The header's table.
static_assert(bwd_ws_table_row<Config<64, 64>>(128, 128, 128, true, false, 2, 1, 198696), "header: D=64");
static_assert(bwd_ws_table_row<Config<128, 128>>(64, 64, 128, false, true, 2, 2, 230440), "header: D=128");
static_assert(bwd_ws_table_row<Config<192, 128>>(64, 32, 128, false, false, 1, 1, 230440), "header: D=192, Dv=128");
static_assert(kBwdWsStages == 2 && Config<64, 64>::kProducerRegs == 24 && Config<64, 64>::kComputeRegs == 240,
              "header: two stages, 24 / 240 registers");

template <typename Cfg, typename T, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
bwd_ws_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
              const __grid_constant__ CUtensorMap tma_v, const __grid_constant__ CUtensorMap tma_do,
              float* __restrict__ dq_accum, const float* __restrict__ lse2,
              const float* __restrict__ delta, int* __restrict__ dq_turns, T* __restrict__ dk, T* __restrict__ dv,
              const AttnProblem p, int nq_pad, const BwdOrder order) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bwd_ws_block<Cfg, T, kDeterministic>(
      smem_raw, p, &tma_q, &tma_k, &tma_v, &tma_do, lse2, delta, nq_pad, order,
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
      "sm_90a wgmma, Q/dO/LSE/Δ by TMA from a producer warpgroup, Sᵀ and dPᵀ so that P and dS stay in registers, dQ by "
      "bulk reduce-add",
      describe_tiles);
}

}  // namespace

std::vector<BwdVariant> make_bwd_ws_variants() { return {make_variant<false>(), make_variant<true>()}; }

}  // namespace attnlab
