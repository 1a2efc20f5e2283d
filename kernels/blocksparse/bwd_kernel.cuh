// attnlab: the block-sparse backward's kernel and its launch for one pair of
// head dims (blocksparse_bwd_dims<D, Dv, kDeterministic>), compiled in a file
// of its own per pair (instances/bwd_*.cu) so that the head dims build side
// by side; the host API that dispatches to them (and runs the deterministic
// mode's ranks pre-pass), and the tile table these constants are checked
// against, are in blocksparse_bwd.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "blocksparse/block_mask_gpu.h"
#include "blocksparse/bwd_mods.cuh"
#include "blocksparse/bwd_scheduler.cuh"
#include "blocksparse/mods.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "hopper/bwd_dq_writer.cuh"
#include "hopper/bwd_host.cuh"
#include "hopper/bwd_kernel.cuh"
#include "hopper/bwd_mainloop.cuh"
#include "hopper/bwd_roles_mainloop.cuh"
#include "hopper/bwd_scheduler.h"

namespace attnlab {
namespace bs_bwd {


// The query tile per (D, Dv), its slices, the early dV and the buffers:
// rung 14's choices (14_bwd_ws.cu explains them), but at D = 64 Sᵀ and dPᵀ in
// two slices of 64 queries: in one of 128 they hold 128 registers, and with
// the mask_mod and score_mod beside them ptxas spills (and softcap's division
// calls its slow path with a stack frame). Br divides 128, so that
// FlexAttention's default 128 x 128 blocks are whole tiles.
template <int kHeadDim, int kHeadDimV>
struct BsBwdTile;
template <> struct BsBwdTile<64, 64>   { static constexpr int kBr = 128, kSliceQ = 64,  kDsBuffers = 2, kDqBuffers = 1; static constexpr bool kEarlyDv = false; };
template <> struct BsBwdTile<128, 128> { static constexpr int kBr = 64,  kSliceQ = 64,  kDsBuffers = 2, kDqBuffers = 2; static constexpr bool kEarlyDv = true; };
template <> struct BsBwdTile<192, 128> { static constexpr int kBr = 64,  kSliceQ = 32,  kDsBuffers = 1, kDqBuffers = 1; static constexpr bool kEarlyDv = false; };

constexpr int kBsBwdStages = 2;
template <int D, int Dv>
struct ConfigOf {
  using type = BwdWsConfig<D, Dv, BsBwdTile<D, Dv>::kBr, BsBwdTile<D, Dv>::kSliceQ, BsBwdTile<D, Dv>::kEarlyDv,
                           BsBwdTile<D, Dv>::kDsBuffers, BsBwdTile<D, Dv>::kDqBuffers, kBsBwdStages>;
};
template <>
struct ConfigOf<256, 256> {  // rung 15's two chains: 64 keys per block
  using type = BwdRolesConfig<256, 256, kBsBwdStages>;
};
template <int D, int Dv>
using Config = typename ConfigOf<D, Dv>::type;
template <typename Cfg>
constexpr bool kRoles = false;  // a config of rung 15's engine
template <int D, int Dv, int S>
constexpr bool kRoles<BwdRolesConfig<D, Dv, S>> = true;

// kTensorMods: the instance for a tensor mask_mod or a bias score_mod
// (apply_mods.cuh says why they have their own).
template <typename Cfg, typename T, bool kDeterministic, bool kTensorMods>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
blocksparse_bwd_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                       const __grid_constant__ CUtensorMap tma_v, const __grid_constant__ CUtensorMap tma_do,
                       float* __restrict__ dq_accum, const float* __restrict__ lse2, const float* __restrict__ delta,
                       int* __restrict__ dq_turns, T* __restrict__ dk, T* __restrict__ dv, const AttnProblem p,
                       int nq_pad, const BwdOrder order, const BlockSparseBwdLists lists,
                       const __grid_constant__ MaskMod mask,
                       const __grid_constant__ ScoreMod score) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bwd_ws_block_walk<Cfg, T>(
      smem_raw, p, &tma_q, &tma_k, &tma_v, &tma_do, lse2, delta, nq_pad,
      [&] {  // NEW (walk): item blockIdx.x's key tile over the query tiles its lists name
        const BwdItem it = bwd_block_item(p, order);
        return bs_bwd_work(lists, p, Cfg::kBr, Cfg::kBc, it.j_tile, it.hk, it.b, kDeterministic);
      },
      [&](const BwdShared<Cfg, T>& sm, const BsBwdWork& w, int writer) {  // NEW (turns): w.turn
        if constexpr (kRoles<Cfg>)
          bwd_roles_write_dq<Cfg, T, kDeterministic>(sm, p, w, dq_accum, nq_pad, dq_turns, writer);
        else
          bwd_write_dq<Cfg, T, kDeterministic>(sm, p, w, dq_accum, nq_pad, dq_turns, writer);
      },
      [&](const BwdShared<Cfg, T>& sm, const BsBwdWork& w) {
        const BsBwdScores<kTensorMods> scores{p, mask, score, w.b};  // NEW (mods)
        if constexpr (kRoles<Cfg>) {
          if (threadIdx.x < 128)
            bwd_roles_chain<Cfg, T, true>(sm, p, w, scores, dv);
          else
            bwd_roles_chain<Cfg, T, false>(sm, p, w, scores, dk);
        } else {
          bwd_compute_walk<Cfg, T>(sm, p, w, scores, dk, dv);
        }
      });
#endif
}

}  // namespace bs_bwd

// dQ, dK, dV (and a bias's dBias) of p on the kernel of head dims (D, Dv),
// rung 14's launch around it (bwd_ws_launch: the pre-pass, the kernel, dQ's
// cast); `lists` with their ranks when deterministic (blocksparse_bwd checks
// the problem and the mods first).
template <int D, int Dv>
cudaError_t blocksparse_bwd_dims(const AttnProblem& p, const AttnGradBuffers& b, const BlockSparseBwdLists& lists,
                                 const MaskMod& mask, const ScoreMod& score, bool deterministic,
                                 cudaStream_t stream) {
  using namespace bs_bwd;
  auto launch = [&](auto mode) {
    constexpr bool kDeterministic = decltype(mode)::value;
    return bwd_ws_launch<HeadDimList<HeadDims<D, Dv>>, Config, kDeterministic>(
        p, b, stream, true,
        [&](auto cfg, auto type) {
          using C = decltype(cfg);
          using T = decltype(type);
          return has_tensor_mods(mask, score) ? blocksparse_bwd_kernel<C, T, kDeterministic, true>
                                              : blocksparse_bwd_kernel<C, T, kDeterministic, false>;
        },
        lists, mask, score);
  };
  return deterministic ? launch(std::true_type{}) : launch(std::false_type{});
}

// Compiled in instances/bwd_*.cu, one pair of head dims each.
extern template cudaError_t blocksparse_bwd_dims<64, 64>(const AttnProblem&, const AttnGradBuffers&,
                                                            const BlockSparseBwdLists&, const MaskMod&,
                                                            const ScoreMod&, bool, cudaStream_t);
extern template cudaError_t blocksparse_bwd_dims<128, 128>(const AttnProblem&, const AttnGradBuffers&,
                                                            const BlockSparseBwdLists&, const MaskMod&,
                                                            const ScoreMod&, bool, cudaStream_t);
extern template cudaError_t blocksparse_bwd_dims<192, 128>(const AttnProblem&, const AttnGradBuffers&,
                                                            const BlockSparseBwdLists&, const MaskMod&,
                                                            const ScoreMod&, bool, cudaStream_t);
extern template cudaError_t blocksparse_bwd_dims<256, 256>(const AttnProblem&, const AttnGradBuffers&,
                                                            const BlockSparseBwdLists&, const MaskMod&,
                                                            const ScoreMod&, bool, cudaStream_t);

}  // namespace attnlab
