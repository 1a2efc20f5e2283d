// kernels/flash_attn/: used by rungs 08–10 alone, so it sits beside them.
// attnlab: one KV tile of the D = 512 wgmma rungs (08, 09; rung 10 runs it on
// each block's half of D = 1024), where the two warpgroups of a block share 64
// query rows and split the head dim (docs/08_wgmma_split_d.md). The rungs differ only in how K_j and V_j reach
// shared memory — rung 08 copies them with cp.async from every thread, rung 09
// with TMA from a producer warpgroup — so the tile's compute lives here and takes
// the rung's copy pipeline as a parameter with five hooks:
//   wait_k(j)     K_j is in shared memory, visible to this thread
//   release_k(j)  every consumer thread is done reading K_j (after sync())
//   wait_v(j), release_v(j)   the same for V_j
//   sync()        a barrier over the 256 threads of the two warpgroups
// and, optionally, how the warpgroups' partial scores become S: by default
// BlockScoreSum (the two partials of the block, through sRed); rung 10 passes
// its own, which also adds the partner block's sum across a cluster.
#pragma once

#include "common/online_softmax.cuh"
#include "common/row_fragments.cuh"
#include "common/wgmma.cuh"

namespace attnlab {

// Tile shapes shared by rungs 08, 09 and 10 (their configs add stages, warps and
// shared-memory totals).
template <int kHeadDim_>
struct SplitDTiles {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpgroups = 2;                      // split the head dim
  static constexpr int kBr = 64;                             // one m64 row block, shared by both warpgroups
  static constexpr int kBc = 64;
  static constexpr int kSliceCols = kHeadDim / kWarpgroups;  // head-dim columns per warpgroup
  static constexpr int kComputeThreads = 128 * kWarpgroups;
  static constexpr int kTileElems = 64 * kHeadDim;           // Q, K or V tile (Br = Bc = 64)
  static constexpr int kTileBytesQKV = kTileElems * 2;
  static constexpr int kRedFloats = kWarpgroups * kBr * kBc;
  static constexpr int kTileBytes = 3 * kTileBytesQKV + kRedFloats * 4;  // sQ, sK, sV, sRed
  static constexpr int kTilesS = kBc / 8;
  static constexpr int kTilesO = kSliceCols / 8;
  static_assert(kHeadDim % 64 == 0, "Sw128Blocks stores 64-column blocks");
  static_assert(kSliceCols % 64 == 0 && kSliceCols <= 256, "wgmma N (the slice of O) is at most 256");
};

// The block's shared-memory tiles, carved from the dynamic allocation with the
// tiles 1024-byte aligned (the 128-byte swizzle repeats every 1024 bytes).
//   sQ, sK, sV: [64, D] Sw128Blocks      sRed: [2 warpgroups][kTilesS][128 threads][4] fp32
template <typename T>
struct SplitDSmem {
  T* sQ;
  T* sK;
  T* sV;
  float* sRed;
  unsigned char* end;  // first byte after sRed (rungs 09 and 10 put their mbarriers there)
};

template <typename Tiles, typename T>
__device__ __forceinline__ SplitDSmem<T> carve_split_d_smem(unsigned char* smem_raw) {
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  SplitDSmem<T> s;
  s.sQ = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  s.sK = s.sQ + Tiles::kTileElems;
  s.sV = s.sK + Tiles::kTileElems;
  s.sRed = reinterpret_cast<float*>(s.sV + Tiles::kTileElems);
  s.end = reinterpret_cast<unsigned char*>(s.sRed + Tiles::kRedFloats);
  return s;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// S over the whole head dim from the two warpgroups' partials (rungs 08, 09).
// S: on entry this warpgroup's partial, on exit partial 0 + partial 1. Each
// thread stores its partial in fragment order to sRed[warpgroup], the block
// meets at pipe.sync() (which also ends the reads of K_j: release_k), and reads
// the other's. a + b == b + a exactly, so both warpgroups agree bit for bit.
struct BlockScoreSum {
  template <int kTilesS, typename T, typename Pipeline>
  __device__ __forceinline__ void operator()(float (&S)[kTilesS][4], const SplitDSmem<T>& sm, Pipeline& pipe,
                                             int j) const {
    const int warpgroup = threadIdx.x / 128, tid_in_wg = threadIdx.x % 128;
    float* red_mine = sm.sRed + (warpgroup * kTilesS * 128 + tid_in_wg) * 4;
    const float* red_other = sm.sRed + ((1 - warpgroup) * kTilesS * 128 + tid_in_wg) * 4;
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
      *reinterpret_cast<float4*>(red_mine + n * 128 * 4) = make_float4(S[n][0], S[n][1], S[n][2], S[n][3]);
    pipe.sync();  // both partials written; K_j no longer read
    pipe.release_k(j);
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) {
      const float4 other = *reinterpret_cast<const float4*>(red_other + n * 128 * 4);
      S[n][0] += other.x;
      S[n][1] += other.y;
      S[n][2] += other.z;
      S[n][3] += other.w;
    }
  }
};

// One KV tile j for a thread of the two compute warpgroups (threadIdx.x < 256):
//   S   = Q·K_jᵀ summed over both halves of the head dim
//   P   = exp(S - m_new), m_i and l_i updated, O rescaled
//   O  += P·V_j over this warpgroup's half of the head dim
// row0: the global query row of the thread's c0/c1 accumulator entries.
template <typename Tiles, typename T, typename Pipeline, typename ScoreSum = BlockScoreSum>
__device__ __forceinline__ void split_d_kv_tile(float (&O)[Tiles::kTilesO][4], RowStats& stats,
                                                const SplitDSmem<T>& sm, const AttnProblem& p, int j, int q_start,
                                                int row0, float scale_log2, Pipeline& pipe,
                                                const ScoreSum& sum_scores = {}) {
  constexpr int Br = Tiles::kBr, Bc = Tiles::kBc, kSlice = Tiles::kSliceCols;
  constexpr int kBlocksPerSlice = kSlice / 64;  // 64-column Sw128 blocks per warpgroup
  const int warpgroup = threadIdx.x / 128;
  const int first_block = warpgroup * kBlocksPerSlice;  // this warpgroup's slice of the head dim

  // ---- partial S over this warpgroup's half of the head dim ---------------
  pipe.wait_k(j);
  float S[Tiles::kTilesS][4];
  const uint64_t desc_q = opaque(make_sw128_desc(sm.sQ + first_block * Br * 64, 0, 1024));
  const uint64_t desc_k = opaque(make_sw128_desc(sm.sK + first_block * Bc * 64, 0, 1024));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSlice / 16; ++kk) {  // block kk/4 of the slice, 32 bytes per step inside it
    wgmma_ss<T, Bc>(S, advance_desc(desc_q, (kk / 4) * Br * 128 + (kk % 4) * 32),
                    advance_desc(desc_k, (kk / 4) * Bc * 128 + (kk % 4) * 32), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(S);
  sum_scores(S, sm, pipe, j);  // calls pipe.sync() and pipe.release_k(j)
  const int lane = threadIdx.x % 32;
  mask_scores(S, p, j * Bc, q_start, row0, row0 + 8, lane % 4);
  online_softmax_update(S, O, stats, scale_log2);
  uint32_t P[Tiles::kTilesS / 2][4];
  pack_p_fragments<T>(P, S);

  // ---- O[:, slice] += P · V_j[:, slice] ------------------------------------------
  pipe.wait_v(j);
  const uint64_t desc_v = opaque(make_sw128_desc(sm.sV + first_block * Bc * 64, Bc * 128, 1024));
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk)  // 16 rows of V per step: 2048 bytes
    wgmma_rs_vt<T, kSlice>(O, P[kk], advance_desc(desc_v, kk * 16 * 128));
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(O);
  pipe.sync();  // V_j and the partials are no longer read
  pipe.release_v(j);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attnlab
