// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the backward kernel's skeleton, in the roles of FlashAttention-3's
// backward kernel (hopper/flash_bwd_kernel_sm90.h): the block's shared memory
// and barriers, its walk (hopper/bwd_scheduler.h), and its warps' roles — the
// producer thread (bwd_load, hopper/bwd_mainloop.cuh), the dQ writer warps
// (hopper/bwd_dq_writer.cuh) and the compute warpgroups (the caller's: rung
// 14's bwd_compute, rung 15's by roles, the block-sparse one with its mods).
#pragma once

#include <cuda.h>

#include "common/ptx.cuh"
#include "common/tma.cuh"
#include "hopper/bwd_mainloop.cuh"
#include "hopper/bwd_scheduler.h"
#include "host/attn_problem.h"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// What a Hopper backward kernel's block does (rungs 14 and 15, the block-sparse
// backward): its shared memory and barriers, its walk (make_work(): the key
// tile and its query tiles), and the warps' roles with their registers
// (setmaxnreg): the producer thread (bwd_load), the dQ writer warps
// (write_dq(sm, w, k)) and the compute warpgroups (compute(sm, w)).
template <typename Cfg, typename T, typename MakeWork, typename WriteDq, typename Compute>
__device__ __forceinline__ void bwd_ws_block_walk(unsigned char* smem_raw, const AttnProblem& p,
                                                  const CUtensorMap* tma_q, const CUtensorMap* tma_k,
                                                  const CUtensorMap* tma_v, const CUtensorMap* tma_do,
                                                  const float* lse2, const float* delta, int nq_pad,
                                                  MakeWork&& make_work, WriteDq&& write_dq, Compute&& compute) {
  const BwdShared<Cfg, T> sm(smem_raw);
  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();  // no copy may signal a barrier before it is initialised

  const auto w = make_work();
  const int warp = threadIdx.x / 32;
  if (warp >= Cfg::kProducerWarp) {
    warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kProducerWarp && threadIdx.x % 32 == 0 && w.n_slots > 0) {
      prefetch_tensor_map(tma_q);
      prefetch_tensor_map(tma_do);
      bwd_load<Cfg, T>(sm, p, w, tma_q, tma_k, tma_v, tma_do, lse2, delta, nq_pad);
    } else if (warp >= Cfg::kDqWriterWarp && warp < Cfg::kDqWriterWarp + Cfg::kDqWriters) {
      write_dq(sm, w, warp - Cfg::kDqWriterWarp);
    }
    __syncwarp();
    return;
  }
  warpgroup_reg_alloc<Cfg::kComputeRegs>();
  compute(sm, w);
}
// Rungs 14 and 15: the walk of the block's item (its key tile and KV head)
// over every query tile that sees the key tile.
template <typename Cfg, typename T, bool kDeterministic, typename WriteDq, typename Compute>
__device__ __forceinline__ void bwd_ws_block(unsigned char* smem_raw, const AttnProblem& p, const CUtensorMap* tma_q,
                                             const CUtensorMap* tma_k, const CUtensorMap* tma_v,
                                             const CUtensorMap* tma_do, const float* lse2, const float* delta,
                                             int nq_pad, const BwdOrder& order, WriteDq&& write_dq,
                                             Compute&& compute) {
  bwd_ws_block_walk<Cfg, T>(
      smem_raw, p, tma_q, tma_k, tma_v, tma_do, lse2, delta, nq_pad,
      [&] {
        const BwdItem it = bwd_block_item(p, order);
        return bwd_work<Cfg::kBr, Cfg::kBc>(p, it.j_tile, it.hk, it.b, kDeterministic);
      },
      write_dq, compute);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
