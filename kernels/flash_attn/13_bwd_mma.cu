// ============================================================================
// Rung 13 — the backward, on mma.sync (FlashAttention-2, Algorithm 2)
// ============================================================================
// What changes against the forward ladder: the gradients dQ, dK, dV of a loss
// whose gradient in O is dO. Nothing of P is stored by the forward but LSE, so P is
// recomputed from it: a pre-pass (common/bwd_prepost.cuh) gives LSE_i·log2e and
// Δ_i = rowsum(dO_i ∘ O_i); then one block per (Bc-key tile j, KV head, batch)
// keeps K_j, V_j in shared memory and dK_j, dV_j in registers and walks every
// query tile i of every query head of its group that can see the tile:
//   Sᵀ = K_j Q_iᵀ    Pᵀ = exp(scale·Sᵀ − LSE_i)    dPᵀ = V_j dO_iᵀ
//   dSᵀ = Pᵀ ∘ (dPᵀ − Δ_i)    dV_j += Pᵀ dO_i    dK_j += dSᵀ Q_i (·scale at the end)
//   dQ_i += scale·dS K_j     fp32 atomics into the workspace; a last pass converts
// Warp w owns keys 16w..16w+15, so it computes Sᵀ (keys are the MMA rows): Pᵀ
// and dSᵀ are then A fragments already, for dV and dK, without a trip through
// shared memory. dQ needs dS summed over all Bc keys, across warps: dSᵀ goes to
// shared memory and is read back transposed (ldmatrix.trans). Q_i, dO_i, LSE_i
// and Δ_i of the next query tile land in a second slot while this one runs.
// Where it is slower than the forward: five GEMMs for two, and dQ's atomics.
// "+deterministic": no atomics; dQ from a second kernel per query tile that
// recomputes S and dP over its key tiles in order (two of the GEMMs again).
//
//   sK, sV: [Bc, D + 8] halves;  sQ, sdO: [2 slots][Br, D + 8] halves
//   sdSᵀ:   [Bc, Br + 8] halves; sLSE, sΔ: [2 slots][Br] fp32
//   Sᵀ, dPᵀ: [16 keys, kSlice queries] per warp; dK, dV: [16 keys, D] per warp
//
// Tiles (BwdMmaConfig, BwdDqConfig; checked below). Main kernel: 8 warps x 16
// keys, queries in slices of 64, two Q/dO slots; a warp's share of dQ_i is "dQ
// rows" x "dQ cols". dQ pass (+deterministic): Br = Bc = 64, 4 warps x 16 rows.
//   D     Br   Bc  slice  dQ rows x cols  smem main  smem dQ pass
//   32   128  128     64       32 x 16       98304         30720
//   64   128  128     64       32 x 32      147456         55296
//   96    64  128     64       16 x 48      125952         79872
//  128    64  128     64       32 x 32      158720        104448
// Registers: see docs/13_bwd_mma.md (ptxas, sm_90a and sm_80).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128}; GQA/MQA; any Nq, Nk >= 1;
// causal (bottom-right aligned) or not. sm_80 and newer.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 128 --bwd --variant 'bwd*'
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/bwd_prepost.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {
namespace {

// LSE·log2e, Δ and dQ's accumulator hold each head's rows padded to whole
// tiles of kRowPad (common/bwd_prepost.cuh): a multiple of every Br below.
constexpr int kRowPad = 128;

template <int kHeadDim>
struct BwdMmaTiles;  // Br: FlashAttention-2's kBlockM at d = 64 and 128 (its kBlockN is 128 too)
template <> struct BwdMmaTiles<32>  { static constexpr int kBr = 128; };
template <> struct BwdMmaTiles<64>  { static constexpr int kBr = 128; };
template <> struct BwdMmaTiles<96>  { static constexpr int kBr = 64; };
template <> struct BwdMmaTiles<128> { static constexpr int kBr = 64; };

template <int kHeadDim_>
struct BwdMmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kBc = 16 * kWarps;  // one m16 tile of keys per warp
  static constexpr int kBr = BwdMmaTiles<kHeadDim>::kBr;
  // Queries per Sᵀ slice: Sᵀ and dPᵀ of a slice (kSlice registers per thread)
  // sit next to dK and dV (D registers) in one thread's 255.
  static constexpr int kSlice = 64;
  // K_j's and V_j's A fragments kept in registers (2·D/4 per thread) rather
  // than reloaded for every query tile: where they fit beside dK, dV, Sᵀ, dPᵀ.
  static constexpr bool kKVInRegs = kHeadDim <= 64;
  static constexpr int kSlots = 2;  // Q_i/dO_i/LSE_i/Δ_i slots: the next tile lands during this one
  static constexpr int kStride = kHeadDim + 8;  // padded rows: ldmatrix hits 8 bank groups
  static constexpr int kDsStride = kBr + 8;
  static constexpr int kSmemBytes =
      (2 * kBc * kStride + kSlots * 2 * kBr * kStride + kBc * kDsStride) * 2 + kSlots * 2 * kBr * 4;
  // dQ_i = dS K_j: the Br x D tile split over the warps in kDqRows-row groups;
  // 32 rows (two m16 tiles sharing each K fragment, FlashAttention-2's 2-D
  // warp tiles) where the columns still come in whole 16-column steps.
  static constexpr int kDqRows = (kHeadDim / (kWarps / (kBr / 32))) % 16 == 0 ? 32 : 16;
  static constexpr int kDqRowGroups = kBr / kDqRows;
  static constexpr int kDqCols = kHeadDim / (kWarps / kDqRowGroups);
  static_assert(kBr % kSlice == 0 && kSlice % 16 == 0, "whole slices of k16 steps");
  static_assert(kWarps % kDqRowGroups == 0 && kDqCols % 16 == 0, "dQ: whole 16-column steps per warp");
  static_assert(kHeadDim % 16 == 0, "k16 steps over the head dim");
  static_assert(kRowPad % kBr == 0 && kBr % 8 == 0, "query tiles inside the padded rows, 16-byte stat copies");
};

// The deterministic dQ pass: one block per (Br-query tile, head, batch), warp w
// owning query rows 16w..16w+15, K_j and V_j in two slots.
template <int kHeadDim_>
struct BwdDqConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBr = 64, kBc = 64, kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kSmemBytes = (2 * kBr + 2 * 2 * kBc) * kStride * 2;  // Q, dO; 2 slots of K, V
  static_assert(kBr == 16 * kWarps, "one m16 row tile per warp");
  static_assert(kRowPad % kBr == 0, "query tiles inside the padded rows");
};

// One row of the header's table.
template <int D, int Br, int DqRows, int DqCols, int kSmem, int kDqSmem>
constexpr bool header_row() {
  using M = BwdMmaConfig<D>;
  using Q = BwdDqConfig<D>;
  return M::kBr == Br && M::kBc == 128 && M::kWarps == 8 && M::kSlice == 64 && M::kSlots == 2 &&
         M::kDqRows == DqRows && M::kDqCols == DqCols && M::kSmemBytes == kSmem && Q::kBr == 64 && Q::kBc == 64 &&
         Q::kWarps == 4 && Q::kSmemBytes == kDqSmem;
}
static_assert(header_row<32, 128, 32, 16, 98304, 30720>(), "header: D=32");
static_assert(header_row<64, 128, 32, 32, 147456, 55296>(), "header: D=64");
static_assert(header_row<96, 64, 16, 48, 125952, 79872>(), "header: D=96");
static_assert(header_row<128, 64, 32, 32, 158720, 104448>(), "header: D=128");

// Sets to -inf the entries of a warp's Sᵀ (16 keys x queries) whose key is past
// Nk or, if causal, after the query's diagonal (query i sees key j iff
// j <= i + Nk - Nq). Queries past Nq need nothing: their LSE is +inf, P = 0.
// key0: key of c0, c1 (c2, c3: key0 + 8); query0: query of column 0; t = lane % 4.
template <int kTilesS>
__device__ __forceinline__ void mask_scores_transposed(float (&St)[kTilesS][4], const AttnProblem& p, int key0,
                                                       int query0, int t) {
  const int causal_offset = p.Nk - p.Nq;
#pragma unroll
  for (int n = 0; n < kTilesS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + 8 * (e / 2), query = query0 + n * 8 + 2 * t + (e & 1);
      if (key >= p.Nk || (p.causal && key > query + causal_offset)) St[n][e] = -INFINITY;
    }
}

// ---- the main kernel: dK_j, dV_j of one key tile; dQ by atomics ---------------
// dq_accum nullptr (+deterministic): no dSᵀ, no dQ; bwd_dq_kernel does it.
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
bwd_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               const T* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ delta,
               float* __restrict__ dq_accum, T* __restrict__ dk, T* __restrict__ dv, const AttnProblem p,
               int nq_pad) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kStride, kDs = Cfg::kDsStride;
  constexpr int kSlice = Cfg::kSlice, kTilesS = kSlice / 8, kTilesD = D / 8;
  using Rows = StridedRows<kStride>;

  const int kv0 = blockIdx.x * Bc;  // causal: the long columns (small j) start first
  const int hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group = p.H / p.kv_heads();  // query heads per KV head
  const int64_t kv_head = int64_t(b) * p.kv_heads() + hk;
  const int causal_offset = p.Nk - p.Nq;
  const float scale_log2 = p.scale * kLog2e;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);                      // [Bc, kStride]
  T* sV = sK + Bc * kStride;                                    // [Bc, kStride]
  T* sQdO = sV + Bc * kStride;                                  // [kSlots][Q, dO][Br, kStride]
  T* sdSt = sQdO + Cfg::kSlots * 2 * Br * kStride;              // [Bc, kDs]: dSᵀ, keys x queries
  float* sStats = reinterpret_cast<float*>(sdSt + Bc * kDs);    // [kSlots][LSE·log2e, Δ][Br]

  // The query tiles that can see a key of this tile: all, or under the causal
  // mask those with a row i >= kv0 - (Nk - Nq). At least one: the last query
  // row sees every key.
  const int m_first = p.causal ? max(0, kv0 - causal_offset) / Br : 0;
  const int n_m = (p.Nq + Br - 1) / Br - m_first;
  const int n_slots = group * n_m;  // (query head, query tile) pairs, head-major

  // Q_i, dO_i, LSE_i·log2e, Δ_i of pair s into slot `slot`, one cp.async group.
  // Rows past Nq: zeros, with the pre-pass's LSE = +inf and Δ = 0 (P = dS = 0).
  auto load_pair = [&](int s, int slot) {
    const int q0 = (m_first + s % n_m) * Br;
    const int64_t q_head = int64_t(b) * p.H + hk * group + s / n_m;
    T* dst = sQdO + slot * 2 * Br * kStride;
    load_tile_async_rolled<Br, D, Rows, Cfg::kThreads>(dst, q + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
    load_tile_async_rolled<Br, D, Rows, Cfg::kThreads>(dst + Br * kStride, dout + (q_head * p.Nq + q0) * D, D,
                                                       p.Nq - q0);
    if (threadIdx.x < Br / 2) {  // Br/4 threads copy LSE·log2e, Br/4 Δ, four rows each
      const int half = threadIdx.x / (Br / 4), r = threadIdx.x % (Br / 4) * 4;
      cp_async_16(sStats + (slot * 2 + half) * Br + r, (half == 0 ? lse2 : delta) + q_head * nq_pad + q0 + r, true);
    }
    cp_async_commit();
  };

  load_tile_async_rolled<Bc, D, Rows, Cfg::kThreads>(sK, k + (kv_head * p.Nk + kv0) * D, D, p.Nk - kv0);
  load_tile_async_rolled<Bc, D, Rows, Cfg::kThreads>(sV, v + (kv_head * p.Nk + kv0) * D, D, p.Nk - kv0);
  load_pair(0, 0);  // K_j and V_j join its group

  float dK[kTilesD][4] = {}, dV[kTilesD][4] = {};  // [16 keys, D] per warp, fp32
  const int key0 = kv0 + warp * 16 + g;             // key of c0, c1 (c2, c3: key0 + 8)
  // The warp's 16 rows of K and V as MMA A fragments, loaded once (they are
  // the same for every query tile) where registers allow.
  constexpr bool kKVInRegs = Cfg::kKVInRegs;
  uint32_t kA[kKVInRegs ? D / 16 : 1][4], vA[kKVInRegs ? D / 16 : 1][4];
  if constexpr (kKVInRegs) {
    cp_async_wait<0>();  // K_j, V_j (and pair 0)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      load_a_fragment<kStride>(kA[kk], sK + warp * 16 * kStride + kk * 16, lane);
      load_a_fragment<kStride>(vA[kk], sV + warp * 16 * kStride + kk * 16, lane);
    }
  }

#pragma unroll 1
  for (int s = 0; s < n_slots; ++s) {
    const int slot = s % Cfg::kSlots;
    const int q0 = (m_first + s % n_m) * Br;
    const int64_t q_head = int64_t(b) * p.H + hk * group + s / n_m;
    const T* sQ = sQdO + slot * 2 * Br * kStride;  // [Br, kStride]
    const T* sdO = sQ + Br * kStride;               // [Br, kStride]
    const float* sLse = sStats + slot * 2 * Br;     // [Br] LSE·log2e (+inf: P = 0)
    const float* sDelta = sLse + Br;                // [Br]

    cp_async_wait<0>();  // this pair's group
    __syncthreads();  // the pair has landed; every warp is done with the other slot and sdSᵀ
    if (s + 1 < n_slots) load_pair(s + 1, (s + 1) % Cfg::kSlots);

#pragma unroll 1
    for (int qh = 0; qh < Br; qh += kSlice) {
      // ---- Sᵀ = K_w Q_iᵀ and dPᵀ = V_w dO_iᵀ: [16 keys, kSlice queries] ----------
      float St[kTilesS][4] = {}, dPt[kTilesS][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        if constexpr (kKVInRegs) {
          qk_slice<T, kTilesS, kStride>(St, kA[kk], sQ + qh * kStride + kk * 16, lane);
          qk_slice<T, kTilesS, kStride>(dPt, vA[kk], sdO + qh * kStride + kk * 16, lane);
        } else {
          uint32_t a[4];
          load_a_fragment<kStride>(a, sK + warp * 16 * kStride + kk * 16, lane);
          qk_slice<T, kTilesS, kStride>(St, a, sQ + qh * kStride + kk * 16, lane);
          load_a_fragment<kStride>(a, sV + warp * 16 * kStride + kk * 16, lane);
          qk_slice<T, kTilesS, kStride>(dPt, a, sdO + qh * kStride + kk * 16, lane);
        }
      }
      // Only a ragged key tile or one that crosses the diagonal pays for the mask.
      if (kv0 + Bc > p.Nk || (p.causal && kv0 + Bc - 1 > q0 + qh + causal_offset))
        mask_scores_transposed(St, p, key0, q0 + qh, t);

      // ---- Pᵀ = exp2(scale·log2e·Sᵀ − LSE·log2e);  dSᵀ = Pᵀ ∘ (dPᵀ − Δ) ---------
      // Column 2t (c0, c2) and 2t+1 (c1, c3) of each n8 tile: one query each.
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) {
        const float2 l = *reinterpret_cast<const float2*>(sLse + qh + n * 8 + 2 * t);
        const float2 d = *reinterpret_cast<const float2*>(sDelta + qh + n * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float prob = exp2_approx(fmaf(St[n][e], scale_log2, -((e & 1) ? l.y : l.x)));
          St[n][e] = prob;
          dPt[n][e] = prob * (dPt[n][e] - ((e & 1) ? d.y : d.x));
        }
      }

      // ---- dV_j += Pᵀ dO_i;  dK_j += dSᵀ Q_i: A from registers, B by ldmatrix.trans
      pv_tile<T, kTilesS, kTilesD, kStride>(dV, St, sdO + qh * kStride, lane);
      pv_tile<T, kTilesS, kTilesD, kStride>(dK, dPt, sQ + qh * kStride, lane);

      // NEW: dSᵀ to shared memory, for dQ (the other warps' keys are needed there).
      if (dq_accum != nullptr) {
#pragma unroll
        for (int n = 0; n < kTilesS; ++n) {
          *reinterpret_cast<uint32_t*>(sdSt + (warp * 16 + g) * kDs + qh + n * 8 + 2 * t) =
              pack2<T>(dPt[n][0], dPt[n][1]);
          *reinterpret_cast<uint32_t*>(sdSt + (warp * 16 + g + 8) * kDs + qh + n * 8 + 2 * t) =
              pack2<T>(dPt[n][2], dPt[n][3]);
        }
      }
    }

    if (dq_accum != nullptr) {
      // ---- dQ_i += scale · dS K_j, the warp's [kDqRows, kDqCols] part ---------------
      // NEW: A = dS [queries, keys] read transposed from dSᵀ; B = K_j [keys, D]
      // through ldmatrix.trans, as V in the forward's P·V. Each K fragment
      // serves the warp's kDqRows / 16 row tiles.
      constexpr int kDqTiles = Cfg::kDqCols / 8, kRowTiles = Cfg::kDqRows / 16;
      const int dq_row0 = (warp % Cfg::kDqRowGroups) * Cfg::kDqRows;
      const int dq_col0 = (warp / Cfg::kDqRowGroups) * Cfg::kDqCols;
      __syncthreads();  // every warp's dSᵀ rows are in place
      float dQ[kRowTiles][kDqTiles][4] = {};
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        uint32_t a[kRowTiles][4];  // matrix i = lane / 8: keys 16kk + 8·(i / 2), queries 16rt + 8·(i % 2)
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt)
          ldmatrix_x4_trans(a[rt], sdSt + (kk * 16 + (lane / 16) * 8 + lane % 8) * kDs + dq_row0 + rt * 16 +
                                       ((lane / 8) % 2) * 8);
#pragma unroll
        for (int nd = 0; nd < kDqTiles / 2; ++nd) {
          uint32_t bk[4];  // K rows 16kk .. 16kk+15, columns dq_col0 + 16nd .. +15, transposed
          ldmatrix_x4_trans(bk, sK + (kk * 16 + lane % 16) * kStride + dq_col0 + nd * 16 + (lane / 16) * 8);
#pragma unroll
          for (int rt = 0; rt < kRowTiles; ++rt) {
            mma_m16n8k16<T>(dQ[rt][2 * nd], a[rt], bk[0], bk[1]);
            mma_m16n8k16<T>(dQ[rt][2 * nd + 1], a[rt], bk[2], bk[3]);
          }
        }
      }
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int qi = q0 + dq_row0 + rt * 16 + g + 8 * r;
          if (qi >= p.Nq) continue;
          float* row = dq_accum + (q_head * nq_pad + qi) * D + dq_col0 + 2 * t;
#pragma unroll
          for (int n = 0; n < kDqTiles; ++n)
            atomic_add2(row + n * 8, p.scale * dQ[rt][n][2 * r], p.scale * dQ[rt][n][2 * r + 1]);
        }
      // (sdSᵀ is rewritten only after the next pair's first barrier.)
    }
  }

  // ---- dK_j = scale · Σ dSᵀ Q,  dV_j = Σ Pᵀ dO, over the group's heads ----------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= p.Nk) continue;
    T* dk_row = dk + (kv_head * p.Nk + key) * D + 2 * t;
    T* dv_row = dv + (kv_head * p.Nk + key) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kTilesD; ++n) {
      *reinterpret_cast<uint32_t*>(dk_row + n * 8) = pack2<T>(p.scale * dK[n][2 * r], p.scale * dK[n][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv_row + n * 8) = pack2<T>(dV[n][2 * r], dV[n][2 * r + 1]);
    }
  }
}

// ---- +deterministic: dQ_i = scale · Σ_j dS_ij K_j, key tiles in order ----------
// The forward's shape: S = Q_i K_jᵀ and dP = dO_i V_jᵀ per warp row tile,
// dS = P ∘ (dP − Δ) in place of P, dQ += dS K_j as the forward's P·V.
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              const T* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ delta,
              T* __restrict__ dq, const AttnProblem p, int nq_pad) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kStride;
  constexpr int kTilesS = Bc / 8, kTilesD = D / 8;
  using Rows = StridedRows<kStride>;

  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;  // causal: the heaviest query tiles first
  const int64_t q_head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(q_head);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float scale_log2 = p.scale * kLog2e;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [Br, kStride]
  T* sdO = sQ + Br * kStride;              // [Br, kStride]
  T* sKV = sdO + Br * kStride;             // [2 slots][K, V][Bc, kStride]

  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};  // rows of c0, c1 / c2, c3
  // LSE·log2e (+inf: no key, or past Nq) and Δ, from the pre-pass's padded rows.
  const float row_lse[2] = {lse2[q_head * nq_pad + rows[0]], lse2[q_head * nq_pad + rows[1]]};
  const float row_delta[2] = {delta[q_head * nq_pad + rows[0]], delta[q_head * nq_pad + rows[1]]};

  const int n_kv_tiles = kv_tiles_for_query_tile(p, q0, Br, Bc);
  auto load_kv = [&](int j, int slot) {
    const int kv0 = j * Bc;
    T* dst = sKV + slot * 2 * Bc * kStride;
    load_tile_async_rolled<Bc, D, Rows, Cfg::kThreads>(dst, k + (kv_head * p.Nk + kv0) * D, D, p.Nk - kv0);
    load_tile_async_rolled<Bc, D, Rows, Cfg::kThreads>(dst + Bc * kStride, v + (kv_head * p.Nk + kv0) * D, D,
                                                       p.Nk - kv0);
    cp_async_commit();
  };
  if (n_kv_tiles > 0) {
    load_tile_async_rolled<Br, D, Rows, Cfg::kThreads>(sQ, q + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
    load_tile_async_rolled<Br, D, Rows, Cfg::kThreads>(sdO, dout + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
    load_kv(0, 0);  // Q and dO join its group
  }

  float dQ[kTilesD][4] = {};  // [16 rows, D] per warp, fp32
#pragma unroll 1
  for (int j = 0; j < n_kv_tiles; ++j) {
    const T* sK = sKV + (j % 2) * 2 * Bc * kStride;
    const T* sV = sK + Bc * kStride;
    cp_async_wait<0>();
    __syncthreads();  // K_j, V_j have landed; every warp is done with the other slot
    if (j + 1 < n_kv_tiles) load_kv(j + 1, (j + 1) % 2);

    float S[kTilesS][4] = {}, dP[kTilesS][4] = {};  // [16 rows, Bc keys] per warp
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a_fragment<kStride>(a, sQ + warp * 16 * kStride + kk * 16, lane);
      qk_slice<T, kTilesS, kStride>(S, a, sK + kk * 16, lane);
      load_a_fragment<kStride>(a, sdO + warp * 16 * kStride + kk * 16, lane);
      qk_slice<T, kTilesS, kStride>(dP, a, sV + kk * 16, lane);
    }
    mask_scores(S, p, j * Bc, q0, rows[0], rows[1], t);
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)  // dS = P ∘ (dP − Δ), in S's registers
        S[n][e] = exp2_approx(fmaf(S[n][e], scale_log2, -row_lse[e / 2])) * (dP[n][e] - row_delta[e / 2]);
    pv_tile<T, kTilesS, kTilesD, kStride>(dQ, S, sK, lane);  // dQ += dS K_j
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= p.Nq) continue;
    T* row = dq + (q_head * p.Nq + rows[r]) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < kTilesD; ++n)
      *reinterpret_cast<uint32_t*>(row + n * 8) = pack2<T>(p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
  }
}

using BwdMmaHeadDims = EqualHeadDims<32, 64, 96, 128>;

// Workspace, each part at a 256-byte aligned offset: LSE·log2e and Δ per
// padded row [B·H, Nq_pad] fp32, then (atomic dQ only) dQ's accumulator
// [B·H, Nq_pad, D] fp32.
struct BwdWorkspace {
  size_t lse2 = 0, delta = 0, dq_accum = 0, bytes = 0;
};
constexpr size_t kWorkspaceAlign = 256;
size_t align_up(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
BwdWorkspace plan_workspace(const AttnProblem& p, bool deterministic) {
  const size_t rows = size_t(p.heads()) * bwd_padded_rows(p.Nq, kRowPad);
  BwdWorkspace w;
  w.delta = align_up(rows * sizeof(float));
  w.dq_accum = w.delta + align_up(rows * sizeof(float));
  w.bytes = deterministic ? w.dq_accum : w.dq_accum + rows * p.D * sizeof(float);
  return w;
}

template <bool kDeterministic, int kD>
constexpr size_t smem_bytes() {
  return kDeterministic ? std::max<size_t>(BwdMmaConfig<kD>::kSmemBytes, BwdDqConfig<kD>::kSmemBytes)
                        : size_t(BwdMmaConfig<kD>::kSmemBytes);
}

template <bool kDeterministic>
std::string unsupported(const AttnProblem& p) {
  size_t smem = 0;
  const bool ok = BwdMmaHeadDims::dispatch(
      p.D, p.Dv, [&](auto dims) { smem = smem_bytes<kDeterministic, decltype(dims)::D>(); });
  return common_unsupported(p, ok, BwdMmaHeadDims::names(), smem);
}

template <bool kDeterministic>
cudaError_t launch(const AttnProblem& p, const AttnGradBuffers& b, cudaStream_t stream) {
  const BwdWorkspace w = plan_workspace(p, kDeterministic);
  if (b.workspace == nullptr || b.workspace_bytes < w.bytes) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(b.workspace);
  float* lse2 = reinterpret_cast<float*>(base + w.lse2);
  float* delta = reinterpret_cast<float*>(base + w.delta);
  float* dq_accum = kDeterministic ? nullptr : reinterpret_cast<float*>(base + w.dq_accum);
  const int nq_pad = bwd_padded_rows(p.Nq, kRowPad);
  cudaError_t err = cudaErrorInvalidValue;
  BwdMmaHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    constexpr int D = decltype(dims)::D;
    using Cfg = BwdMmaConfig<D>;
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      const T* q = static_cast<const T*>(b.q);
      const T* k = static_cast<const T*>(b.k);
      const T* v = static_cast<const T*>(b.v);
      const T* dout = static_cast<const T*>(b.dout);
      // Δ, LSE·log2e, and dQ's accumulator zeroed
      cudaError_t e = launch_bwd_row_stats<T>(p, b, lse2, delta, nq_pad, stream, dq_accum, int64_t(p.heads()) * nq_pad * D);
      if (e != cudaSuccess) return e;
      const dim3 grid(unsigned((p.Nk + Cfg::kBc - 1) / Cfg::kBc), unsigned(p.kv_heads()), unsigned(p.B));
      e = launch_with_smem(bwd_mma_kernel<Cfg, T>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, q, k, v, dout,
                           static_cast<const float*>(lse2), static_cast<const float*>(delta), dq_accum,
                           static_cast<T*>(b.dk), static_cast<T*>(b.dv), p, nq_pad);
      if (e != cudaSuccess) return e;
      if constexpr (kDeterministic) {
        using DqCfg = BwdDqConfig<D>;
        const dim3 dq_grid(unsigned((p.Nq + DqCfg::kBr - 1) / DqCfg::kBr), unsigned(p.H), unsigned(p.B));
        return launch_with_smem(bwd_dq_kernel<DqCfg, T>, dq_grid, DqCfg::kThreads, DqCfg::kSmemBytes, stream, q, k, v,
                                dout, static_cast<const float*>(lse2), static_cast<const float*>(delta),
                                static_cast<T*>(b.dq), p, nq_pad);
      } else {
        return launch_bwd_dq_convert<T>(p, dq_accum, b.dq, nq_pad, stream);
      }
    });
  });
  return err;
}

template <bool kDeterministic>
std::string describe() {
  std::string s = kDeterministic ? "dQ by a second pass per 64-query tile (no atomics)" : "dQ by fp32 atomics";
  BwdMmaHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D;
    using Cfg = BwdMmaConfig<D>;
    s += "; D=" + std::to_string(D) + ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
         " warps=" + std::to_string(Cfg::kWarps) + " slots=" + std::to_string(Cfg::kSlots) +
         " smem=" + std::to_string(smem_bytes<kDeterministic, D>()) + "B";
  });
  return s + "; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
}

template <bool kDeterministic>
BwdVariant make_variant() {
  BwdVariant v;
  v.name = kDeterministic ? "bwd-mma+deterministic" : "bwd-mma";
  v.rung = "13_bwd_mma";
  v.unsupported_reason = unsupported<kDeterministic>;
  v.workspace_bytes = [](const AttnProblem& p) { return plan_workspace(p, kDeterministic).bytes; };
  v.launch = launch<kDeterministic>;
  v.describe = describe<kDeterministic>;
  v.deterministic = kDeterministic;
  return v;
}

}  // namespace

std::vector<BwdVariant> make_bwd_mma_variants() { return {make_variant<false>(), make_variant<true>()}; }

}  // namespace attnlab
