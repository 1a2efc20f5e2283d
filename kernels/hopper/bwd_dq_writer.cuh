// kernels/hopper/: the warp-specialised Hopper engine that rungs 12, 14 and 15 and the
// block-sparse family compose (FlashAttention-3's design); the rungs are in kernels/flash_attn/.
// attnlab: the Hopper backward's dQ writers, in the role of FlashAttention-3's
// dQ writer warp (hopper/flash_bwd_kernel_sm90.h): warps of the producer
// warpgroup that add each query tile's dQ, staged in shared memory by the
// compute warpgroups, into the fp32 accumulator by bulk reduce-add, so that
// the compute warps never wait on the adds; and the deterministic mode's
// turns, which order the adds to one dQ tile by key tile.
#pragma once

#include <cuda.h>

#include "common/bwd_prepost.cuh"
#include "common/ptx.cuh"
#include "common/tma.cuh"
#include "hopper/bwd_mainloop.cuh"
#include "host/attn_problem.h"

namespace attnlab {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// ---- the deterministic mode's turns -----------------------------------------------
// dQ tile (q_head, m) takes its key tiles' adds in key-tile order: key tile j
// waits until the tile's counter reads w.turn(slot), the number of key tiles
// before it that add to the tile (rung 14: j, since the first visible query
// tile grows with j), adds, waits for its add to land, and counts it (the
// CUTLASS barrier's release/acquire pattern, FlashAttention-3's Deterministic
// dQ semaphore).
__device__ __forceinline__ void bwd_wait_turn(const int* counter, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != turn);
}
__device__ __forceinline__ void bwd_pass_turn(int* counter) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the TMA's adds before the generic-proxy release
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

// ---- the dQ writers ----------------------------------------------------------------
// kWriters warps of the producer warpgroup (FA3's dQ writer warp,
// hopper/flash_bwd_kernel_sm90.h), one per staging buffer: writer k takes the
// slots s ≡ k (mod kWriters). For each, once wait_staged(s) says the compute
// warps have staged its dQ tile (q_head, m) — Br rows x D fp32 in the tile
// layout of bwd_stage_dq, in kParts contiguous parts, part i at
// part_at(s, i) — one lane adds them to the accumulator, which holds each
// tile in that same layout (common/bwd_prepost.cuh), one bulk reduction per
// part, and hand_back(s) runs once the reductions have read the staging. So
// the compute warps never wait on the adds. Deterministic: key tile j first
// waits until the dQ tile's counter reads its turn; after the hand-back it waits for
// its adds to land and passes the turn on — while the other writer takes the
// next slot, so that neither the buffer nor the next add waits for a landing.
template <typename Cfg, bool kDeterministic, int kParts, typename Work, typename WaitStaged, typename PartAt,
          typename HandBack>
__device__ __forceinline__ void bwd_dq_writer(const AttnProblem& p, Work w, float* dq_accum, int nq_pad,
                                              int* dq_turns, int writer, WaitStaged&& wait_staged, PartAt&& part_at,
                                              HandBack&& hand_back) {
  constexpr int Br = Cfg::kBr, kPartFloats = Br * Cfg::kHeadDim / kParts;
  static_assert((Br * Cfg::kHeadDim) % (4 * kParts) == 0, "parts of whole 16-byte chunks");
  const int lane = threadIdx.x % 32;
#pragma unroll 1
  for (int s = writer; s < w.n_slots; s += Cfg::kDqWriters) {
    wait_staged(s);
    int* turn = nullptr;
    if (lane == 0) {
      const auto sl = w.slot(s);
      const int64_t q_head = int64_t(w.b) * p.H + sl.h;
      turn = dq_turns + q_head * (nq_pad / Br) + sl.m;
      if constexpr (kDeterministic) bwd_wait_turn(turn, w.turn(sl));
      float* tile = dq_accum + (q_head * nq_pad + bwd_stats_row0(w) + sl.m * Br) * Cfg::kHeadDim;
#pragma unroll
      for (int part = 0; part < kParts; ++part)
        bulk_reduce_add_f32(tile + part * kPartFloats, part_at(s, part), kPartFloats * 4);
      bulk_commit();
      bulk_wait_read();
    }
    __syncwarp();
    hand_back(s);
    if constexpr (kDeterministic) {
      if (lane == 0) {
        bulk_wait();  // landed, before the next key tile's turn
        bwd_pass_turn(turn);
      }
    }
  }
  if (lane == 0) bulk_wait();  // every add has landed before the block ends
}

// Rung 14's: dQ staged in its own buffers, s % kDqBuffers, handed over by
// named barriers (kDqFull + buffer, kDqEmpty + buffer).
template <typename Cfg, typename T, bool kDeterministic, typename Work>
__device__ __forceinline__ void bwd_write_dq(const BwdShared<Cfg, T>& sm, const AttnProblem& p, const Work& w,
                                             float* dq_accum, int nq_pad, int* dq_turns, int writer) {
  static_assert(Cfg::kDqWriters == Cfg::kDqBuffers, "a writer per staging buffer (its named barriers)");
  bwd_dq_writer<Cfg, kDeterministic, 1>(
      p, w, dq_accum, nq_pad, dq_turns, writer,
      [&](int s) {  // both warpgroups' parts
        named_barrier_sync(Cfg::kDqFullBarrier + Cfg::dq_barrier(s % Cfg::kDqBuffers, 0), Cfg::kDqHandoffThreads);
        named_barrier_sync(Cfg::kDqFullBarrier + Cfg::dq_barrier(s % Cfg::kDqBuffers, 1), Cfg::kDqHandoffThreads);
      },
      [&](int s, int) { return sm.sdQ + (s % Cfg::kDqBuffers) * Cfg::kdQFloats; },
      [&](int s) {  // the compute warps wait for this buffer again only for slot s + kDqBuffers
        if (s + Cfg::kDqBuffers < w.n_slots)
          for (int wg = 0; wg < 2; ++wg)
            named_barrier_arrive(Cfg::kDqEmptyBarrier + Cfg::dq_barrier(s % Cfg::kDqBuffers, wg),
                                 Cfg::kDqHandoffThreads);
      });
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
