// ============================================================================
// Rung 15 — the backward at D = 256: two warpgroups split by role, not by keys
// ============================================================================
// What changes against rung 14 (`bwd-ws`): there each compute warpgroup owns
// 64 keys and their dK and dV in registers — D fp32 registers per thread,
// which at D = 256 is more than a thread has. Here both warpgroups share one
// tile of Bc = 64 keys and each keeps one gradient (hopper/bwd_roles_mainloop.cuh):
//   NEW (roles): warpgroup 0 the P chain — Sᵀ = K·Qᵀ, Pᵀ, dV += Pᵀ·dO;
//        warpgroup 1 the dS chain — dPᵀ = V·dOᵀ, dSᵀ = Pᵀ∘(dPᵀ − Δ),
//        dK += dSᵀ·Q. Each does the same MMA work; Pᵀ goes from the first to
//        the second through shared memory (fp32, in fragment order), dSᵀ to
//        both for dQ = dS·K, each warpgroup taking D/2 of its columns;
//   NEW (dQ staged in the ring): no room is left for a dQ buffer, so once
//        both gradient MMAs have read the tile's slot, the P chain stages its
//        half of dQ over the slot's Q and the dS chain over its dO (64 x 128
//        fp32 each: the same bytes); rung 14's dQ writers (a warp per slot)
//        add them by bulk reduce-add and only then free the slot.
// Unchanged: the producer thread and its Q/dO/LSE/Δ ring, the walk (one block
// per key tile and KV head), `+deterministic`'s turns (a counter per dQ tile,
// key-tile order), the pre-pass and dQ's cast (hopper/bwd_host.cuh).
// Where it is slower than it could be: the dS chain waits for the P chain's
// exponentials, and a 64-key tile adds dQ twice as often per FLOP as 128 keys.
//
// Per block: sK [Bc, D], sV [Bc, Dv], sQ, sdO [kStages][Br, D | Dv]
// (Sw128Blocks), sdSᵀ [Bc, Br], sP [Bc·Br] fp32, 1 + 2·kStages mbarriers.
// Tiles (BwdRolesConfig, checked by static_assert):
//   D / Dv     Br  Bc  stages  smem (+1024)  dQ columns per warpgroup
//   256        64  64   2      222248        128
// Registers (setmaxnreg): producer / compute 24 / 240; at peak a chain holds
// its gradient (128), its half of dQ (64) and Pᵀ or dSᵀ in 16 bits (16).
//
// Supports: fp16, bf16; D = Dv = 256; GQA/MQA (dK, dV summed over a KV head's
// query heads in the block); any Nq, Nk >= 1; causal (bottom-right) or not;
// rows that see no key get dQ = 0. sm_90a, 16-byte aligned tensors.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 256 --bwd --variant 'bwd*'
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "hopper/bwd_host.cuh"
#include "hopper/bwd_kernel.cuh"
#include "hopper/bwd_roles_mainloop.cuh"

namespace attnlab {
namespace {

constexpr int kBwdRolesStages = 2;
template <int D, int Dv>
using Config = BwdRolesConfig<D, Dv, kBwdRolesStages>;

// The header's table.
static_assert(Config<256, 256>::kBr == 64 && Config<256, 256>::kBc == 64 && Config<256, 256>::kStages == 2 &&
                  Config<256, 256>::kSmemBytes - 1024 == 222248 && Config<256, 256>::kThreads == 384,
              "header: D=256");
static_assert(Config<256, 256>::kProducerRegs == 24 && Config<256, 256>::kComputeRegs == 240,
              "header: 24 / 240 registers");

template <typename Cfg, typename T, bool kDeterministic>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
bwd_roles_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                 const __grid_constant__ CUtensorMap tma_v, const __grid_constant__ CUtensorMap tma_do,
                 float* __restrict__ dq_accum, const float* __restrict__ lse2,
                 const float* __restrict__ delta, int* __restrict__ dq_turns, T* __restrict__ dk,
                 T* __restrict__ dv, const AttnProblem p, int nq_pad, const BwdOrder order) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bwd_ws_block<Cfg, T, kDeterministic>(
      smem_raw, p, &tma_q, &tma_k, &tma_v, &tma_do, lse2, delta, nq_pad, order,
      [&](const BwdShared<Cfg, T>& sm, const BwdWork& w, int writer) {
        bwd_roles_write_dq<Cfg, T, kDeterministic>(sm, p, w, dq_accum, nq_pad, dq_turns, writer);
      },
      [&](const BwdShared<Cfg, T>& sm, const BwdWork& w) {
        const BwdCausalScores scores{p, p.scale * kLog2e};
        if (threadIdx.x < 128)
          bwd_roles_chain<Cfg, T, true>(sm, p, w, scores, dv);
        else
          bwd_roles_chain<Cfg, T, false>(sm, p, w, scores, dk);
      });
#endif
}

// ---- host --------------------------------------------------------------------------

using BwdRolesHeadDims = HeadDimList<HeadDims<256, 256>>;

template <bool kDeterministic>
BwdVariant make_variant() {
  return bwd_ws_variant<BwdRolesHeadDims, Config, kDeterministic>(
      "bwd-roles", "15_bwd_ws_roles",
      [](auto cfg, auto type) { return bwd_roles_kernel<decltype(cfg), decltype(type), kDeterministic>; },
      "sm_90a wgmma, rung 14's producer; both warpgroups on one 64-key tile, one the P chain (S, P, dV), one the dS "
      "chain (dP, dS, dK), dQ staged in the ring slot and added by bulk reduce-add",
      [] {
        using Cfg = Config<256, 256>;
        return "stages=" + std::to_string(kBwdRolesStages) + "; D=256: Br=" + std::to_string(Cfg::kBr) +
               " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) +
               " smem=" + std::to_string(Cfg::kSmemBytes) + "B; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
      });
}

}  // namespace

std::vector<BwdVariant> make_bwd_ws_roles_variants() { return {make_variant<false>(), make_variant<true>()}; }

}  // namespace attnlab
