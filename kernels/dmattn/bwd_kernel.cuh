// attnlab: the dynamic-mask backward's main kernel, dma_bwd_kernel
// (dmattn_bwd.cu's header says what it does; docs/dmattn_backward.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/bwd_config.cuh"
#include "dmattn/bwd_epilogue.cuh"
#include "dmattn/bwd_scheduler.cuh"
#include "dmattn/bwd_scores.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace {

// Where a block adds its dBias: one fp32 accumulator in the bias's shape, or
// (deterministic mode, bias broadcast over the batch and/or the KV heads) one
// copy per batch and/or KV head, so that no element is shared by two blocks.
struct DbiasTarget {
  float* base = nullptr;  // nullptr: no bias
  int64_t copy_elems = 0;
  bool per_batch = false, per_kv_head = false;
  int batches = 1, Hkv = 1;
  int copies() const { return (per_batch ? batches : 1) * (per_kv_head ? Hkv : 1); }
  __device__ float* for_block(int b, int hk) const {
    if (base == nullptr) return nullptr;
    const int c = (per_batch ? b : 0) * (per_kv_head ? Hkv : 1) + (per_kv_head ? hk : 0);
    return base + int64_t(c) * copy_elems;
  }
};

// The main backward kernel: block (j·chunks + c, KV head, batch) holds key
// tile j and walks chunk c's share of the key tile's (query head, query tile)
// slots (see the file's opening comment: query chunks).
template <typename Cfg, typename T, bool kMaskBits>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
dma_bwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
               float* __restrict__ dq_accum, const __grid_constant__ CUtensorMap tma_dq,
               const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_do, bool qdo_tma,
               T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ dkv_accum, DbiasTarget dbias_target,
               const DynamicMaskProblem p, const MaskSummary summary, int chunks,
               const unsigned long long* __restrict__ chunk_plan, bool rotate_slots) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kStride;
  constexpr int kDs = Cfg::kDsStride;
  // The chunks this key tile's slots are dealt to: `chunks` as launched, or
  // the chunk plan's decision (dma_bwd_chunk_plan_kernel: 1 where the mask
  // pass found the active slots even over the key tiles). Blocks of the other
  // chunks leave at once; with one live chunk dK, dV are stored directly.
  const int live_chunks = chunk_plan != nullptr ? int(chunk_plan[kPlanLiveChunks]) : chunks;
  // Block -> (key tile, chunk, KV head, batch). As launched: chunks of one key
  // tile neighbours in grid.x (they run at the same time and share K_j, V_j
  // through L2; the causal range's long columns start first). Where the plan
  // drops the chunks, chunk is the slowest index of the whole grid instead,
  // so that the dropped chunks' blocks come last: they leave at once, but each
  // still takes an SM's one block place while it starts. Not where the chunks
  // stay: chunk-major is slower there (docs/experiments.md).
  int j_tile, chunk, hk, b;
  if (live_chunks == chunks) {
    j_tile = blockIdx.x / chunks, chunk = blockIdx.x % chunks, hk = blockIdx.y, b = blockIdx.z;
  } else {
    const int key_tiles = gridDim.x / chunks;
    const int64_t per_chunk = int64_t(key_tiles) * gridDim.y * gridDim.z;
    const int64_t linear = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    const int64_t rest = linear % per_chunk;
    chunk = int(linear / per_chunk);
    j_tile = int(rest % key_tiles), hk = int(rest / key_tiles % gridDim.y), b = int(rest / key_tiles / gridDim.y);
  }
  if (chunk >= live_chunks) return;  // uniform: the whole block
  const int kv0 = j_tile * Bc;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group = p.H / p.Hkv;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  if constexpr (Cfg::kWgmma) {  // 1024-byte aligned: the period of the 128-byte swizzle
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    sK = reinterpret_cast<T*>(smem_raw + (((raw + 1023) & ~1023u) - raw));
  }
  // The tiles' layout: padded rows (mma.sync) or Sw128Blocks<64> (wgmma; Br = Bc = 64).
  using Layout = std::conditional_t<Cfg::kWgmma, Sw128Blocks<64>, StridedRows<kStride>>;
  static_assert(Br == 64 && Bc == 64, "one layout for all four tiles");
  constexpr int kStages = Cfg::kQdoStages;
  T* sV = sK + Bc * kStride;
  T* const sQ_slots = sV + Bc * kStride;  // slot s: Q at sQ_slots + s·kQdoSlotElems, dO after it
  T* sdS = sQ_slots + kStages * Cfg::kQdoSlotElems;  // [Bc keys][kDs] dSᵀ
  float* const sLSE_slots = reinterpret_cast<float*>(sdS + Bc * kDs);  // slot s: LSE, then Δ (2·Br floats)
  // The tiles of the slot being computed (reassigned per tile; scores reads sLSE, sDelta).
  // kDqTma: the slot then holds the tile's dQ, D/32 boxes of [Br][32] fp32.
  T* sQ = sQ_slots;
  T* sdO = sQ + Br * kStride;
  float* sLSE = sLSE_slots;
  float* sDelta = sLSE + Br;
  // Skip bits of this block's next kThreads slots: [0] any, [1] all ones; one word per warp.
  __shared__ uint32_t s_bits[2][Cfg::kWarps];

  const int64_t kv_head = int64_t(b) * p.Hkv + hk;
  float* dbias_accum = dbias_target.for_block(b, hk);
  const bool dq_here = dq_accum != nullptr;  // deterministic mode: dQ is the dQ kernel's
  // A bias broadcast over queries depends on (b, head, key) only: each thread
  // loads its two keys' elements once per tile instead of once per score.
  const bool bias_by_key = p.bias.data != nullptr && p.bias.stride_q == 0;

  float dK[Cfg::kTilesO][4] = {}, dV[Cfg::kTilesO][4] = {};
  const int key_row[2] = {kv0 + warp * 16 + g, kv0 + warp * 16 + g + 8};  // keys of c0,c1 / c2,c3
  static_assert(Br == kDmaBr, "first_query_tile's tiles");
  const int m_first = first_query_tile(p, kv0);  // query tiles that can see a key of this tile
  const int n_q_tiles = (p.Nq + Br - 1) / Br;
  // Slots of this key tile: with several chunks query tile major, s = (m -
  // m_first)·group + hq, chunk c taking s = c, c + chunks, ... — interleaved,
  // since active tiles come in runs of neighbouring query tiles, which a
  // contiguous range would give to one chunk, and query tile major, so that
  // the heads sharing a mask row are split too. One chunk (the deterministic
  // mode's) walks head-major, s = hq·n_m + (m - m_first).
  const int n_m = max(0, n_q_tiles - m_first), n_slots = n_m * group;
  const int slot_major = chunks > 1 ? group : n_m;  // s = major·slot_major + minor
  // DmaBackwardArgs::rotate_slots (the default): key tile j walks its query
  // tiles from m_first + j mod n_m on, wrapping, instead of from m_first, so
  // that the key tiles' blocks, which run in step, reduce their dQ into
  // different query tiles at a time instead of all into the same one
  // (faster on a sparse top-W mask; dense shapes unchanged).
  const int m_rot = rotate_slots && n_m > 0 ? j_tile % n_m : 0;
  auto slot_head = [&](int s, int& m, int& h) {
    const int major = s / slot_major, minor = s % slot_major;
    const int mi = chunks > 1 ? major : minor;
    m = m_first + (mi + m_rot < n_m ? mi + m_rot : mi + m_rot - n_m);
    h = hk * group + (chunks > 1 ? minor : major);
  };
  // P, dS (in place of Sᵀ, dPᵀ) and dBias of a slice of queries (bwd_scores.cuh).
  const DmaBwdScores<Cfg, T, kMaskBits> scores{p, b, kv0, t, key_row, dbias_accum, bias_by_key, sLSE, sDelta};

  // K_j, V_j are loaded with the first active tile: a chunk without one (most
  // blocks of a sparse mask) reads nothing but its skip bits.
  bool kv_loaded = false;
  // wgmma with qdo_tma (uniform: the host built the maps of Q and dO): a slot's
  // Q_i, dO_i arrive by TMA — one thread issues 2·D/64 boxes of 64 x 64 onto
  // the slot's mbarrier — instead of 2·64·D·2/16 cp.async copies spread over
  // the threads, each with its address arithmetic. Slot s's phase k
  // completes with its k-th load; every load is waited for exactly once (a
  // prefetch never crosses a batch), so one parity bit per slot follows it.
  [[maybe_unused]] __shared__ alignas(8) uint64_t qdo_full[2];
  [[maybe_unused]] uint32_t qdo_parity = 0;  // bit s: the parity of slot s's next wait
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (Cfg::kWgmma) {
    if (qdo_tma && threadIdx.x == 0) {
      mbarrier_init(&qdo_full[0], 1);
      mbarrier_init(&qdo_full[1], 1);
      fence_mbarrier_init();  // before the batch loop's first barrier, ahead of any use
    }
  }
#endif
  int base_of_batch = chunk;  // the batch's first slot (load_q_tiles' slot numbers are batch-relative)
  // Q_i, dO_i, LSE_i, Δ_i of batch slot i into tile slot `slot`, one cp.async
  // group. LSE and Δ by 4-byte copies (a plain load would hold the thread
  // until it arrives); rows past Nq get +inf and 0 (P = 0, dS = 0) directly,
  // and an LSE of -inf (a row that saw no key) becomes +inf after the wait.
  auto load_q_tiles = [&](int i, int slot) {
    int m, h;
    slot_head(base_of_batch + i * live_chunks, m, h);
    const int q0 = m * Br;
    const int64_t q_head = int64_t(b) * p.H + h;
    T* q_dst = sQ_slots + slot * Cfg::kQdoSlotElems;
    bool by_tma = false;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (Cfg::kWgmma) {
      if (qdo_tma) {
        by_tma = true;
        if (threadIdx.x == 0) {  // column block c of a tile: Sw128Blocks<64> at c·64·64 (rows past Nq: zeros)
          uint64_t* bar = &qdo_full[slot];
          mbarrier_arrive_expect_tx(bar, 2 * Br * D * int(sizeof(T)));
#pragma unroll 1
          for (int c = 0; c < D / 64; ++c) {
            tma_load_3d(q_dst + c * Br * 64, &tma_q, bar, c * 64, q0, int(q_head));
            tma_load_3d(q_dst + Br * kStride + c * Br * 64, &tma_do, bar, c * 64, q0, int(q_head));
          }
        }
      }
    }
#endif
    if (!by_tma) {
      load_tile_async_rolled<Br, D, Layout, Cfg::kThreads>(q_dst, q + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
      load_tile_async_rolled<Br, D, Layout, Cfg::kThreads>(q_dst + Br * kStride, dout + (q_head * p.Nq + q0) * D, D,
                                                           p.Nq - q0);
    }
    if (threadIdx.x < Br) {
      float* lse_dst = sLSE_slots + slot * 2 * Br + threadIdx.x;
      const int qi = q0 + threadIdx.x;
      if (qi < p.Nq) {
        cp_async_4(lse_dst, lse + q_head * p.Nq + qi);
        cp_async_4(lse_dst + Br, delta + q_head * p.Nq + qi);
      } else {
        lse_dst[0] = INFINITY;
        lse_dst[Br] = 0.f;
      }
    }
    cp_async_commit();
  };
  // The batch slot after the one in word w whose bits are `bits` (the current
  // slot is bits' lowest set bit), or -1: the same in every thread.
  [[maybe_unused]] auto next_active = [&](int w, uint32_t bits) {
    const uint32_t rest = bits & (bits - 1);
    if (rest != 0) return w * 32 + __ffs(rest) - 1;
    for (int w2 = w + 1; w2 < Cfg::kWarps; ++w2)
      if (s_bits[0][w2] != 0) return w2 * 32 + __ffs(s_bits[0][w2]) - 1;
    return -1;
  };
  int stage = 0;              // the tile slot the next tile uses
  int prefetched = -1;        // the batch slot whose tiles are already in flight (into `stage`)
  float key_bias[2] = {0.f, 0.f};
  int key_bias_head = -1;

  // This block's slots are chunk, chunk + chunks, chunk + 2·chunks, ... taken
  // kThreads at a time: every thread reads one slot's skip bits (independent
  // loads, one round trip for the batch instead of one per slot), a ballot
  // per warp gathers them in shared memory, and the loop visits the set bits.
#pragma unroll 1
  for (int base = chunk; base < n_slots; base += Cfg::kThreads * live_chunks) {  // int: the host bounds it
    base_of_batch = base;
    prefetched = -1;  // nothing is fetched across batches
    __syncthreads();  // every thread has read the previous batch's bits
    {
      const int s = base + int(threadIdx.x) * live_chunks;
      bool any = false, all = false;
      if (s < n_slots) {
        int m, h;
        slot_head(s, m, h);
        any = summary.tile_any(p, b, h, m, j_tile);
        all = any && summary.tile_all(p, b, h, m, j_tile);
      }
      const uint32_t any_bits = __ballot_sync(0xffffffffu, any), all_bits = __ballot_sync(0xffffffffu, all);
      if (lane == 0) {
        s_bits[0][warp] = any_bits;
        s_bits[1][warp] = all_bits;
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int w = 0; w < Cfg::kWarps; ++w) {
#pragma unroll 1
      for (uint32_t bits = s_bits[0][w]; bits != 0; bits &= bits - 1) {  // the same in every thread
        const int i = w * 32 + __ffs(bits) - 1;
        const bool mask_full = s_bits[1][w] >> (i % 32) & 1u;  // no per-element mask reads
        int m, h;
        slot_head(base + i * live_chunks, m, h);
        const int q0 = m * Br;
        const int64_t q_head = int64_t(b) * p.H + h;

        // This tile's slot; the next active slot of the batch gets the other one.
        const int slot = stage;
        stage = (stage + 1) % kStages;
        sQ = sQ_slots + slot * Cfg::kQdoSlotElems;
        sdO = sQ + Br * kStride;
        sLSE = sLSE_slots + slot * 2 * Br;
        sDelta = sLSE + Br;
        // Rolled copies keep their addresses out of the registers dK and dV need.
        if (!kv_loaded) {
          load_tile_async_rolled<Bc, D, Layout, Cfg::kThreads>(sK, k + (kv_head * p.Nk + kv0) * D, D, p.Nk - kv0);
          load_tile_async_rolled<Bc, D, Layout, Cfg::kThreads>(sV, v + (kv_head * p.Nk + kv0) * D, D, p.Nk - kv0);
          kv_loaded = true;
        }
        if (prefetched != i) load_q_tiles(i, slot);  // (else in flight since the previous tile)
        if (bias_by_key && h != key_bias_head) {  // the same for every query tile of a head
          key_bias_head = h;
#pragma unroll
          for (int r = 0; r < 2; ++r)
            if (key_row[r] < p.Nk)
              key_bias[r] =
                  as_float(__ldg(static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, 0) + key_row[r]));
        }
        cp_async_wait<0>();  // this tile's group (and K, V)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (Cfg::kWgmma) {
          if (qdo_tma) {  // this tile's Q, dO (TMA)
            mbarrier_wait(&qdo_full[slot], (qdo_parity >> slot) & 1u);
            qdo_parity ^= 1u << slot;
          }
        }
#endif
        if (threadIdx.x < Br && sLSE[threadIdx.x] == -INFINITY)  // an entry this thread copied
          sLSE[threadIdx.x] = INFINITY;  // a row that saw no key: P = exp(s - inf) = 0
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (Cfg::kWgmma) fence_proxy_async_shared();  // cp.async wrote the tiles; wgmma reads via the async proxy
#endif
        // kDqTma: the previous tile's dQ reductions have read its slot (thread 0
        // issued them), so that after this barrier the slot may be refilled.
        if (Cfg::kDqTma && threadIdx.x == 0) bulk_wait_read();
        __syncthreads();
        // The next active slot's tiles into the other slot, read last by the
        // previous tile (every warp is past it: the barrier above), while this
        // tile is computed. (Issued ahead of this tile's wait instead, the
        // prefetch would need one more barrier at the previous tile's end, for
        // the slot's last readers.)
        if constexpr (kStages > 1) {
          const int next = next_active(w, bits);
          if (next >= 0) {
            load_q_tiles(next, stage);
            prefetched = next;
          }
        }

        if constexpr (Cfg::kWgmma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
          // ---- the wgmma core, per slice of Cfg::kHalf queries ------------------------
          // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: m64n(kHalf), A = K or V (keys, K-major), B = Q or
          // dO rows of the slice (K-major) — the forward's S = Q·Kᵀ, roles swapped.
          // Software-pipelined (FA3's intra-warpgroup overlap, Shah et al. 2024,
          // §3.2): slice s + 1's Sᵀ and dPᵀ are issued before slice s's dV and dK,
          // each its own commit group; groups complete in order, so waiting for
          // slice s + 1's scores leaves slice s's dV, dK running on the tensor
          // cores under slice s + 1's score code. (Issuing every slice's Sᵀ,
          // dPᵀ up front overlaps more but keeps a second slice's accumulators
          // live through the general score code: 255 registers and a spill at
          // D = 128.)
          constexpr int kSlices = Br / Cfg::kHalf;
          float St[kSlices][Cfg::kTilesS][4], dPt[kSlices][Cfg::kTilesS][4];
          auto issue_s_dp = [&](int sl) {
            const int qh = sl * Cfg::kHalf;
            wgmma_fence();
            wgmma_rows_tile<T, D, Cfg::kHalf, Bc, Br>(St[sl], sK, sQ + qh * 64);
            wgmma_rows_tile<T, D, Cfg::kHalf, Bc, Br>(dPt[sl], sV, sdO + qh * 64);
            wgmma_commit();
          };
          issue_s_dp(0);
          // Pᵀ and dSᵀ as 16-bit A fragments (rows: the warp's 16 keys; k: queries).
          // One set: slice s + 1 packs into it only after slice s's dV, dK are done.
          uint32_t Pa[Cfg::kTilesS / 2][4], dSa[Cfg::kTilesS / 2][4];
#pragma unroll
          for (int sl = 0; sl < kSlices; ++sl) {
            const int qh = sl * Cfg::kHalf;
            if (sl == 0) wgmma_wait<0>();
            else wgmma_wait<1>();  // this slice's Sᵀ, dPᵀ; the previous slice's dV, dK may run on
            fence_accumulators(St[sl]);
            fence_accumulators(dPt[sl]);

            scores.to_ds(St[sl], dPt[sl], qh, q0, h, mask_full, key_bias);

            if (sl > 0) wgmma_wait<0>();  // the previous slice's dV, dK: Pa, dSa are free again
            pack_p_fragments<T>(Pa, St[sl]);
            pack_p_fragments<T>(dSa, dPt[sl]);
            // dSᵀ to shared memory for dQ, [key][query] in Sw128Blocks<64>: fragment
            // register i of k-step kk holds keys g (+8 for odd i), queries qh + 16kk
            // + 8·(i/2) + 2t, +1 — one 32-bit store each.
            if (dq_here) {
#pragma unroll
              for (int kk = 0; kk < Cfg::kTilesS / 2; ++kk)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                  *reinterpret_cast<uint32_t*>(sdS + Sw128Blocks<64>::offset(warp * 16 + g + 8 * (i & 1),
                                                                             qh + kk * 16 + 8 * (i / 2) + 2 * t)) =
                      dSa[kk][i];
            }
            if (sl + 1 < kSlices) issue_s_dp(sl + 1);
            // dV += Pᵀ·dO and dK += dSᵀ·Q over the slice's queries: A from registers,
            // B = dO or Q rows (along the reduction dim: N-major, as V in P·V).
            wgmma_fence();
            wgmma_rows_rs<T, D, Cfg::kHalf, Br>(dV, Pa, sdO + qh * 64);
            wgmma_rows_rs<T, D, Cfg::kHalf, Br>(dK, dSa, sQ + qh * 64);
            wgmma_commit();
          }
          if (dq_here) {
            // dQ = dS·K: M = 64 queries, K = 64 keys, N = D in parts of 64 columns
            // (registers). A = dS read from dSᵀ ([key][query]: M-major), B = a
            // 64-column block of K ([key][d]: N-major): both transposed.
            fence_proxy_async_shared();  // the st.shared of dSᵀ, before the async proxy reads it
            __syncthreads();  // every warp's dSᵀ rows are in place
            // kDqTma: dQ is staged in this tile's own Q/dO slot, D/32 boxes of [Br][32] fp32.
            [[maybe_unused]] float* const sdQ = reinterpret_cast<float*>(sQ);
            constexpr bool kTogether = Cfg::kDqPartsTogether;
            [[maybe_unused]] float dQ_all[kTogether ? 2 : 1][8][4];
            auto issue_dq = [&](float (&acc)[8][4], int part) {
              wgmma_fence();
              wgmma_rows_tt<T, 64, Bc>(acc, sdS, sK + part * Bc * 64);
              wgmma_commit();
            };
            if constexpr (kTogether) {
              issue_dq(dQ_all[0], 0);
              issue_dq(dQ_all[1], 1);
            }
#pragma unroll(kTogether ? 2 : 1)
            for (int part = 0; part < D / 64; ++part) {
              float dQ[8][4];
              if constexpr (kTogether) {
                if (part == 0) wgmma_wait<1>();  // part 0 (and every slice's dV, dK before it)
                else wgmma_wait<0>();
#pragma unroll
                for (int n = 0; n < 8; ++n)
#pragma unroll
                  for (int i = 0; i < 4; ++i) dQ[n][i] = dQ_all[part][n][i];
              } else {
                issue_dq(dQ, part);
                wgmma_wait<0>();  // (and every slice's dV, dK before it)
              }
              fence_accumulators(dQ);
              // The slot's Q and dO are dead once every warp is past that wait.
              if (Cfg::kDqTma && part == 0) __syncthreads();
              // Warp w holds query rows 16w + g (+8) of the tile, columns 64·part + 8n + 2t, +1.
              if constexpr (Cfg::kDqTma) {
                // Column c of row r: box c/32, 16-byte chunk (c%32)/4 ^ (r%8) of the
                // row's 128 bytes (the map's 128-byte swizzle). A warp's 8 rows
                // then spread over all 32 banks: 2 wavefronts per 256-byte store.
                constexpr int kBoxFloats = Br * Cfg::kDqBoxCols;
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                  for (int n = 0; n < 8; ++n) {
                    const int row = warp * 16 + g + 8 * r, col = part * 64 + n * 8 + 2 * t;
                    const int in_box = col % Cfg::kDqBoxCols;
                    *reinterpret_cast<float2*>(sdQ + (col / Cfg::kDqBoxCols) * kBoxFloats + row * Cfg::kDqBoxCols +
                                               ((in_box / 4) ^ (row % 8)) * 4 + in_box % 4) =
                        make_float2(p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
                  }
              } else {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                  const int qi = q0 + warp * 16 + g + 8 * r;
                  if (qi >= p.Nq) continue;
                  float* row = dq_accum + (q_head * p.Nq + qi) * D + part * 64;
#pragma unroll
                  for (int n = 0; n < 8; ++n)
                    atomic_add2(row + n * 8 + 2 * t, p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
                }
              }
            }
            if constexpr (Cfg::kDqTma) {
              fence_proxy_async_shared();  // the st.shared of dQ, before the tensor reduction reads them
              __syncthreads();
              // One thread adds the tile's D/32 boxes (rows past Nq: not written, the
              // map's bounds). Their reads are waited for before the next tile's first
              // barrier, after which the slot takes the tile after next's Q, dO.
              if (threadIdx.x == 0) {
#pragma unroll
                for (int box = 0; box < D / Cfg::kDqBoxCols; ++box)
                  tma_reduce_add_3d(&tma_dq, sdQ + box * Br * Cfg::kDqBoxCols, box * Cfg::kDqBoxCols, q0,
                                    int(q_head));
                bulk_commit();
              }
            }
          } else {
            wgmma_wait<0>();
          }
          fence_accumulators(dK);
          fence_accumulators(dV);
          // No barrier here: sQ, sdO and sdS are rewritten only after the next
          // tile's first barrier (its dSᵀ stores, the prefetch into this slot).
#else
          __trap();  // never launched: the host picks this core only on sm_90 with sm_90a code
#endif
        } else {
          // The 64 queries in two halves of 32, so that Sᵀ and dPᵀ of a half (16 keys x
          // 32 queries per warp) fit next to dK and dV (D registers per thread).
#pragma unroll 1
          for (int half = 0; half < 2; ++half) {
            const int qh = half * Cfg::kHalf;  // first query column of this half
            // ---- Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ ---------------------------------------------
            float St[Cfg::kTilesS][4] = {}, dPt[Cfg::kTilesS][4] = {};
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
              uint32_t a[4];
              load_a_fragment<kStride>(a, sK + (warp * 16) * kStride + kk * 16, lane);
              qk_slice<T, Cfg::kTilesS, kStride>(St, a, sQ + qh * kStride + kk * 16, lane);
              load_a_fragment<kStride>(a, sV + (warp * 16) * kStride + kk * 16, lane);
              qk_slice<T, Cfg::kTilesS, kStride>(dPt, a, sdO + qh * kStride + kk * 16, lane);
            }

            scores.to_ds(St, dPt, qh, q0, h, mask_full, key_bias);

            // ---- dV += Pᵀ dO ;  dK += dSᵀ Q (scale applied at the end) --------------------
            pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(dV, St, sdO + qh * kStride, lane);
            pv_tile<T, Cfg::kTilesS, Cfg::kTilesO, kStride>(dK, dPt, sQ + qh * kStride, lane);

            // ---- dSᵀ to shared memory for dQ ------------------------------------------------
#pragma unroll
            for (int n = 0; n < Cfg::kTilesS && dq_here; ++n) {
              *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g) * kDs + qh + n * 8 + 2 * t) =
                  pack2<T>(dPt[n][0], dPt[n][1]);
              *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8) * kDs + qh + n * 8 + 2 * t) =
                  pack2<T>(dPt[n][2], dPt[n][3]);
            }
          }
          __syncthreads();
          if (dq_here) {  // (else sQ, sdO are not rewritten before the barrier above)
            // Warp w: query rows 16w..16w+15 of the tile. A = dS (queries x keys) read
            // transposed from dSᵀ; B = K (keys x D) through ldmatrix.trans, as V in P·V.
            // At D >= 128 in two column halves, to stay within the registers.
#pragma unroll 1
            for (int part = 0; part < Cfg::kDqParts; ++part) {
              constexpr int kTiles = Cfg::kTilesO / Cfg::kDqParts;
              const int col0 = part * kTiles * 8;
              float dQ[kTiles][4] = {};
#pragma unroll
              for (int kk = 0; kk < Bc / 16; ++kk) {
                uint32_t a[4];
                const int i4 = lane / 8, r = lane % 8;
                ldmatrix_x4_trans(a, sdS + (kk * 16 + (i4 / 2) * 8 + r) * kDs + warp * 16 + (i4 % 2) * 8);
#pragma unroll
                for (int nd = 0; nd < kTiles / 2; ++nd) {
                  uint32_t bfr[4];
                  ldmatrix_x4_trans(bfr, sK + (kk * 16 + lane % 16) * kStride + col0 + nd * 16 + (lane / 16) * 8);
                  mma_m16n8k16<T>(dQ[2 * nd], a, bfr[0], bfr[1]);
                  mma_m16n8k16<T>(dQ[2 * nd + 1], a, bfr[2], bfr[3]);
                }
              }
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int qi = q0 + warp * 16 + g + 8 * r;
                if (qi >= p.Nq) continue;
                float* row = dq_accum + (q_head * p.Nq + qi) * D + col0;
#pragma unroll
                for (int n = 0; n < kTiles; ++n) {
                  atomicAdd(row + n * 8 + 2 * t, p.scale * dQ[n][2 * r]);
                  atomicAdd(row + n * 8 + 2 * t + 1, p.scale * dQ[n][2 * r + 1]);
                }
              }
            }
            __syncthreads();  // sQ, sdO, sdS are rewritten by the next tile
          }
        }
      }
    }
  }

  if constexpr (Cfg::kDqTma)
    if (dq_accum != nullptr && threadIdx.x == 0) bulk_wait();  // dQ's reductions done (their thread)

  // ---- dK_j, dV_j of this KV head (bwd_epilogue.cuh) ----------------------------------
  dma_bwd_store_dkv<Cfg, T>(dK, dV, p, dk, dv, dkv_accum, live_chunks, kv_loaded, kv_head, key_row, t);
}

}  // namespace
}  // namespace attnlab
