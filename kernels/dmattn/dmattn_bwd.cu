// ============================================================================
// Dynamic-mask attention, backward (flash-dmattn semantics) with tile skipping
// ============================================================================
// FlashAttention-2's backward order (Dao, 2023, Algorithm 2) with the forward's
// skip test: one block per (64-key tile j, KV head, batch) holds K_j, V_j in
// shared memory and dK_j, dV_j in registers, and walks the query tiles i of
// every query head that reads this KV head (GQA), skipping before any load a
// tile whose 64 x 64 mask is all zero (the tile bits of dmattn_tiles.cuh):
//   Sᵀ = K_j Q_iᵀ;  Pᵀ = exp(scale·Sᵀ + bias (softcap) − LSE), 0 where masked
//   dPᵀ = V_j dO_iᵀ;  dSᵀ = Pᵀ ∘ (dPᵀ − Δ) ∘ softcap',  Δ = rowsum(dO ∘ O)
//   dV_j += Pᵀ dO_i;  dK_j += scale·dSᵀ Q_i;  dQ_i += scale·dS K_j;  dBias += dS
// dQ and dBias are summed in fp32 (atomics; on the wgmma core dQ by TMA
// tensor reductions) and converted to the input dtype at the end.
// Query chunks: a sparse mask can put nearly all active tiles in a few key
// tiles, so each key tile's (query tile, head) slots are dealt round-robin to
// `chunks` blocks, which add dK, dV into fp32 accumulators; after the mask
// pass a plan kernel drops the chunks where the work turns out even
// (dma_backward_resolve_chunks). Deterministic mode (bitwise identical runs):
// one chunk, dQ from a second kernel per query tile (dma_bwd_dq_kernel) and
// dBias copies summed in a fixed order, so no sum depends on block order.
// The wgmma core (sm_90a): the five products as warpgroup MMAs; the next active
// tile's Q, dO arrive (TMA) in a second slot while this one is computed.
// Design, budget and measurements: docs/dmattn_backward.md.
//
// Tiles (DmaBwdConfig, checked below): Br = Bc = 64, 4 warps (one warpgroup).
//   core     D    Q/dO slots  queries per Sᵀ slice  blocks/SM bound  smem bytes
//   mma     32    1           32                    -                30208
//   mma     64    1           32                    -                46592
//   mma     96    1           32                    -                62976
//   mma    128    1           32                    -                79360
//   wgmma   64    2           64                    3                59392
//   wgmma  128    2           32                    -               108544
// Registers: docs/dmattn_backward.md (ptxas, sm_90a).
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128} (wgmma: 64, 128); any Nq,
// Nk; H % Hkv == 0; the forward's masks (bytes or bits) and bias broadcasts,
// dBias; softcap; causal (bottom-right); deterministic mode.
//
// Run: build/flash_attn_mma --B 1 --H 2 --Hkv 1 --N 2048 --D 128 --causal --mask topk --window 512 --bias --bwd --check
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_tiles.cuh"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"

namespace attnlab {
namespace {

template <int kHeadDim_, bool kWgmma_ = false>
struct DmaBwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  // The blocks per SM the registers are bounded for (launch bounds): the
  // wgmma core at D = 64 three (168 registers, 60 bytes spilled; 12 warps per
  // SM instead of 8: faster on dense and causal masks than two blocks, and
  // than two 32-query slices without the spill; docs/experiments.md).
  // Elsewhere 1: dK, dV alone take 2·D/2 registers per thread, so D = 128
  // stays at 248, two blocks.
  static constexpr int kMinBlocks = kWgmma_ && kHeadDim_ == 64 ? 3 : 1;
  // kWgmma: the five products as warpgroup MMAs (sm_90a; see the kernel).
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kBr = 64, kBc = 64, kWarps = 4, kThreads = 32 * kWarps;
  // mma.sync: rows padded by 8 halves; wgmma: dense rows in the 128-byte
  // swizzle (Sw128Blocks<64>), tiles 1024-byte aligned (+ 1024 bytes slack).
  static constexpr int kStride = kWgmma ? kHeadDim : kHeadDim + 8;
  static constexpr int kDsStride = kWgmma ? kBr : kBr + 8;
  // wgmma: two slots for Q_i, dO_i (and LSE, Δ): the next active slot's
  // tiles are copied while this one is computed, instead of every tile
  // starting with a wait for its loads (latency: two blocks per SM).
  static constexpr int kQdoStages = kWgmma ? 2 : 1;
  // wgmma: dQ of a tile (64 x D fp32, scaled) is staged in the tile's own Q/dO
  // slot, dead once dK and dV are done (the next tile's tiles are in the other
  // slot) — 64·D·4 bytes, exactly the slot's Q and dO — as D/32 boxes of 32
  // columns in the 128-byte swizzle, and added to dq_accum by one TMA tensor
  // reduction per box, all issued by one thread: fewer issues than one bulk
  // reduction per row from 64 threads (serialised lane by lane, with the
  // tile's end waiting on a barrier behind them) or than fp32 atomics.
  static constexpr bool kDqTma = kWgmma;
  static constexpr int kDqBoxCols = 32;  // fp32 columns per 128-byte swizzle row
  static_assert(kDqBoxCols * 4 == 128, "a dQ box row is the 128-byte swizzle's span");
  static constexpr int kQdoSlotElems = 2 * 64 * kStride;  // Q, dO, 16-bit
  static_assert(!kDqTma || kBr * kHeadDim * 4 == kQdoSlotElems * 2, "dQ's fp32 boxes fill a Q/dO slot");
  static_assert(kQdoSlotElems * 2 % 1024 == 0, "slots keep the 128-byte swizzle's 1024-byte alignment");
  static constexpr int kSmemBytes = (2 * 64 * kStride + kQdoStages * kQdoSlotElems + kBc * kDsStride) * 2 +
                                    kQdoStages * 2 * kBr * 4 + (kWgmma ? 1024 : 0);
  // Queries per Sᵀ slice: two halves of 32 (registers: Sᵀ and dPᵀ next to dK
  // and dV), or with wgmma at D = 64 all 64 at once (m64n64; two slices
  // there, one's dV, dK under the other's score code as at D = 128, are
  // slower).
  static constexpr int kHalf = kWgmma && kHeadDim <= 64 ? kBr : kBr / 2;
  static constexpr int kTilesS = kHalf / 8;  // n8 tiles across the queries of a slice
  static constexpr int kTilesO = kHeadDim / 8;
  static constexpr int kDqParts = kHeadDim >= 128 ? 2 : 1;  // dQ columns in parts (registers)
  // wgmma at D = 128: both dQ parts' products issued before the first wait
  // (two commit groups), so part 1's runs under part 0's stores into the
  // staging boxes; at that point only dK, dV and both dQ parts are live
  // (248 registers instead of 228, no spill, still two blocks per SM): faster
  // on dense, causal and GQA shapes, the same on a sparse top-W mask.
  static constexpr bool kDqPartsTogether = kWgmma && kHeadDim == 128;
  static_assert(!kDqPartsTogether || kHeadDim / 64 == 2, "the kernel holds two dQ parts of 64 columns");
  static_assert(kTilesO % (2 * kDqParts) == 0, "dQ parts of whole 16-column steps");
};
static_assert(DmaBwdConfig<64, true>::kSmemBytes == 59392 && DmaBwdConfig<128, true>::kSmemBytes == 108544,
              "header: the wgmma core's shared memory");
static_assert(DmaBwdConfig<32>::kSmemBytes == 30208 && DmaBwdConfig<64>::kSmemBytes == 46592 &&
                  DmaBwdConfig<96>::kSmemBytes == 62976 && DmaBwdConfig<128>::kSmemBytes == 79360,
              "header: the mma.sync core's shared memory");
static_assert(DmaBwdConfig<64>::kBr == 64 && DmaBwdConfig<64>::kBc == 64 && DmaBwdConfig<64>::kWarps == 4 &&
                  DmaBwdConfig<64, true>::kBr == 64 && DmaBwdConfig<64, true>::kBc == 64 &&
                  DmaBwdConfig<64, true>::kWarps == 4,
              "header: Br = Bc = 64, 4 warps on both cores");
static_assert(DmaBwdConfig<64>::kQdoStages == 1 && DmaBwdConfig<64, true>::kQdoStages == 2 &&
                  DmaBwdConfig<128, true>::kQdoStages == 2,
              "header: one Q/dO slot on mma.sync, two on wgmma");
static_assert(DmaBwdConfig<32>::kHalf == 32 && DmaBwdConfig<128>::kHalf == 32 && DmaBwdConfig<64, true>::kHalf == 64 &&
                  DmaBwdConfig<128, true>::kHalf == 32,
              "header: queries per Sᵀ slice");
static_assert(DmaBwdConfig<64, true>::kMinBlocks == 3 && DmaBwdConfig<128, true>::kMinBlocks == 1 &&
                  DmaBwdConfig<64>::kMinBlocks == 1 && DmaBwdConfig<128>::kMinBlocks == 1,
              "header: the blocks per SM the registers are bounded for");

template <typename T>
__device__ __forceinline__ float as_float(T x);
template <>
__device__ __forceinline__ float as_float<half>(half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float as_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// One score of the backward, recomputed: visible (in range, causal, mask —
// the mask byte or bit read only when the tile is not all ones), the logit
// scale·s + bias and its softcap, P = exp(logit - LSE) (0 where not visible),
// and the softcap's derivative dcap = 1 - tanh² for dS.
struct ScoreProb {
  float p, dcap;
  bool visible;
};
// `bias_given`: the caller has loaded this score's bias element already
// (`bias_value`, the same element converted the same way: the same float).
// kMaskBits: the mask is bit-packed (DmaMaskFormat::kBits; the kernels'
// template flag: one kernel for both formats cost 4-7 registers, and spills
// on the mma.sync core at D = 128).
template <typename T, bool kMaskBits>
__device__ __forceinline__ ScoreProb score_prob(const DynamicMaskProblem& p, int b, int h, int qi, int key, float s,
                                                float lse, bool mask_full, bool bias_given = false,
                                                float bias_value = 0.f) {
  bool visible = key < p.Nk && qi < p.Nq && (!p.causal || key <= qi + (p.Nk - p.Nq));
  if (visible && !mask_full) {
    if constexpr (kMaskBits)  // the byte of the row (little-endian words) that holds the key's bit
      visible = (__ldg(static_cast<const uint8_t*>(p.mask.data) + 4 * p.mask.row_offset(b, h, qi) +
                       (unsigned(key) >> 3)) >> (key & 7) & 1u) != 0u;
    else
      visible = __ldg(static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, qi) + key) != 0;
  }
  float x = s * p.scale;
  if (p.bias.data != nullptr && visible)
    x += bias_given ? bias_value
                    : as_float(__ldg(static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, qi) + key));
  float dcap = 1.f;
  if (p.softcap > 0.f) {
    const float th = tanhf(x / p.softcap);
    x = p.softcap * th;
    dcap = 1.f - th * th;
  }
  return {visible ? exp2_approx((x - lse) * kLog2e) : 0.f, dcap, visible};
}

// Δ_q = Σ_d dO[q][d] · O[q][d], and the row of dq_accum that the main kernel
// adds into set to 0 (dq_accum nullptr: the deterministic mode, which has
// none), in one pass instead of a memset and a pass: four lanes per row,
// 16-byte loads (eight elements) interleaved so that a warp's load reads 64
// contiguous bytes of each of its eight rows. Where O or dO is not 16-byte
// aligned, the warp-per-row kernel below and a memset instead.
template <typename T, int kD>
__global__ void dma_bwd_delta_vec_kernel(const T* __restrict__ o, const T* __restrict__ dout,
                                         float* __restrict__ delta, float* __restrict__ dq_accum, int64_t rows) {
  constexpr int kLanes = 4, kPieces = kD / (8 * kLanes);  // 16-byte pieces per lane
  static_assert(kD % (8 * kLanes) == 0, "head dims are multiples of 32");
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  if (row >= rows) return;  // a row's four lanes leave together
  const int l = threadIdx.x % kLanes;
  const unsigned group = 0xfu << (threadIdx.x % 32 / kLanes * kLanes);  // this row's lanes
  const uint4* o4 = reinterpret_cast<const uint4*>(o + row * kD);
  const uint4* d4 = reinterpret_cast<const uint4*>(dout + row * kD);
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kPieces; ++c) {
    const uint4 a = __ldg(o4 + c * kLanes + l), b = __ldg(d4 + c * kLanes + l);
    const T* pa = reinterpret_cast<const T*>(&a);
    const T* pb = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += as_float(pa[i]) * as_float(pb[i]);
  }
  acc += __shfl_xor_sync(group, acc, 1);
  acc += __shfl_xor_sync(group, acc, 2);
  if (l == 0) delta[row] = acc;
  if (dq_accum != nullptr) {
    float4* q4 = reinterpret_cast<float4*>(dq_accum + row * kD);
#pragma unroll
    for (int c = l; c < kD / 4; c += kLanes) q4[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// dQ in the input dtype from its fp32 accumulator: four elements per thread
// per step (one 16-byte load, one 8-byte store; n % 4 == 0, out 8-byte
// aligned), the same rounding as sum_copies_to_dtype_kernel with one copy.
template <typename T>
__global__ void f32_to_dtype_vec4_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 x = reinterpret_cast<const float4*>(in)[i];
    T y[4] = {T(x.x), T(x.y), T(x.z), T(x.w)};
    reinterpret_cast<uint2*>(out)[i] = *reinterpret_cast<const uint2*>(y);
  }
}

// Δ_q = Σ_d dO[q][d] · O[q][d], one warp per row (any alignment).
template <typename T>
__global__ void dma_bwd_delta_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta,
                                     int64_t rows, int D) {
  const int64_t row = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += as_float(o[row * D + d]) * as_float(dout[row * D + d]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) delta[row] = acc;
}

// out[i] = scale · Σ_c in[c·n + i] over `copies` fp32 copies, in copy order (a
// fixed order: deterministic), converted to the input dtype. (scale = 1 is
// exact: the same value as no multiply.)
// The backward's chunk plan, 64-bit words (dma_bwd_chunk_plan_kernel below).
enum : int { kPlanBusiest = 0, kPlanTotal, kPlanDone, kPlanLiveChunks, kPlanWords };

// The first query tile that can see a key of the key tile starting at kv0:
// q >= kv0 - (Nk - Nq) under the causal rule (bottom-right aligned). The
// chunk plan counts exactly the slots the main kernel walks from it.
__device__ __forceinline__ int first_query_tile(const DynamicMaskProblem& p, int kv0) {
  return (p.causal ? max(0, kv0 - (p.Nk - p.Nq)) : 0) / kDmaBr;
}

// skip_if_one: the backward's chunk plan (nullptr: none); a decision of one
// chunk means the kernel stored `out` itself, and this pass has nothing to do.
template <typename T>
__global__ void sum_copies_to_dtype_kernel(const float* __restrict__ in, int copies, T* __restrict__ out, int64_t n,
                                           float scale = 1.f, const unsigned long long* skip_if_one = nullptr) {
  if (skip_if_one != nullptr && skip_if_one[kPlanLiveChunks] == 1) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = in[i];
    for (int c = 1; c < copies; ++c) acc += in[int64_t(c) * n + i];
    out[i] = T(scale * acc);
  }
}

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

// Deterministic mode's dQ: one block per (64-query tile m, head h, batch b);
// warp w owns query rows 16w..16w+15 and, over the active key tiles j in
// order, recomputes S = Q K_jᵀ and dP = dO V_jᵀ (as the forward computes S),
// forms dS exactly as the main kernel does, and accumulates dQ += dS K_j in
// registers (dS is already an A fragment's values, as P is in the forward's
// P·V). The same four 64-row tiles of shared memory as the main kernel.
template <typename Cfg, typename T, bool kMaskBits>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
dma_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                  T* __restrict__ dq, const DynamicMaskProblem p, const MaskSummary summary) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStride = Cfg::kStride;
  constexpr int kTilesS = Bc / 8;
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = m * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t q_head = int64_t(b) * p.H + h;
  const int64_t kv_head = int64_t(b) * p.Hkv + h / (p.H / p.Hkv);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + Bc * kStride;
  T* sQ = sV + Bc * kStride;
  T* sdO = sQ + Br * kStride;

  load_tile_async<Br, D, kStride, Cfg::kThreads>(sQ, q + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
  load_tile_async<Br, D, kStride, Cfg::kThreads>(sdO, dout + (q_head * p.Nq + q0) * D, D, p.Nq - q0);
  cp_async_commit();
  const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float row_lse[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = rows[r] < p.Nq ? lse[q_head * p.Nq + rows[r]] : -INFINITY;
    row_lse[r] = l == -INFINITY ? INFINITY : l;  // P = 0 for rows that saw no key
    row_delta[r] = rows[r] < p.Nq ? delta[q_head * p.Nq + rows[r]] : 0.f;
  }

  const int n_tiles = kv_tiles_for_query_tile(p.dense(), q0, Br, Bc);
  float dQ[Cfg::kTilesO][4] = {};
  for (int j = 0; j < n_tiles; ++j) {
    if (!summary.tile_any(p, b, h, m, j)) continue;  // uniform
    const bool mask_full = summary.tile_all(p, b, h, m, j);
    const int kv0 = j * Bc;
    load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sK, k + (kv_head * p.Nk + kv0) * D, D,
                                                                      p.Nk - kv0);
    load_tile_async_rolled<Bc, D, StridedRows<kStride>, Cfg::kThreads>(sV, v + (kv_head * p.Nk + kv0) * D, D,
                                                                      p.Nk - kv0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float S[kTilesS][4] = {}, dP[kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      load_a_fragment<kStride>(a, sQ + (warp * 16) * kStride + kk * 16, lane);
      qk_slice<T, kTilesS, kStride>(S, a, sK + kk * 16, lane);
      load_a_fragment<kStride>(a, sdO + (warp * 16) * kStride + kk * 16, lane);
      qk_slice<T, kTilesS, kStride>(dP, a, sV + kk * 16, lane);
    }
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const ScoreProb sp =
            score_prob<T, kMaskBits>(p, b, h, rows[e / 2], kv0 + n * 8 + 2 * t + (e & 1), S[n][e], row_lse[e / 2], mask_full);
        S[n][e] = sp.p * (dP[n][e] - row_delta[e / 2]) * sp.dcap;  // dS
      }
    pv_tile<T, kTilesS, Cfg::kTilesO, kStride>(dQ, S, sK, lane);  // dQ += dS K_j
    __syncthreads();  // sK, sV are refilled next
  }
  cp_async_wait<0>();  // Q, dO copies (if no key tile ran) finish before the block exits
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= p.Nq) continue;
    T* row = dq + (q_head * p.Nq + rows[r]) * D;
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(row + n * 8 + 2 * t) = pack2<T>(p.scale * dQ[n][2 * r], p.scale * dQ[n][2 * r + 1]);
  }
}

// The backward's chunk plan (automatic count, with a mask, where the key
// tiles alone give every SM 4 blocks: dma_backward_plans_chunks). Block (j,
// hk, b) counts the active slots of key tile j — the query tiles m >= m_first(j)
// of the group's query heads whose 64x64 tile the mask pass marked active —
// into plan[kPlanBusiest] (maximum) and plan[kPlanTotal] (sum); the last block
// to finish (plan[kPlanDone]) writes the decision, plan[kPlanLiveChunks]: 1
// when the busiest key tile holds at most 5/4 of the mean (a dense mask, not
// causal: every key tile the same work, the chunks only cost — K, V loaded
// once per chunk, dK and dV through fp32 atomics, a zeroing and a sum pass),
// else the launched count (causal, dense or sparse: the busiest key tile holds
// about twice the mean or more — the work the chunks spread). The plan is
// zeroed by the host. One block per key tile, its threads over the slots.
__global__ void __launch_bounds__(128)
dma_bwd_chunk_plan_kernel(const DynamicMaskProblem p, const MaskSummary summary, int chunks,
                          unsigned long long* plan) {
  const int j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = p.H / p.Hkv;
  const int m_first = first_query_tile(p, j * kDmaBc);
  const int n_m = max(0, (p.Nq + kDmaBr - 1) / kDmaBr - m_first);
  unsigned int count = 0;
  for (int s = threadIdx.x; s < n_m * group; s += blockDim.x)
    count += summary.tile_any(p, b, hk * group + s / n_m, m_first + s % n_m, j) ? 1u : 0u;
  for (int off = 16; off > 0; off /= 2) count += __shfl_xor_sync(0xffffffffu, count, off);
  __shared__ unsigned int warp_counts[4];
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned long long total =
      (unsigned long long)warp_counts[0] + warp_counts[1] + warp_counts[2] + warp_counts[3];
  if (total > 0) {
    atomicMax(plan + kPlanBusiest, total);
    atomicAdd(plan + kPlanTotal, total);
  }
  // The last block decides (threadfence reduction, CUDA programming guide):
  // every block's sums are visible before its count is.
  __threadfence();
  const unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(plan + kPlanDone, 1ull) != blocks - 1) return;
  __threadfence();
  const unsigned long long busiest = atomicAdd(plan + kPlanBusiest, 0ull), all = atomicAdd(plan + kPlanTotal, 0ull);
  plan[kPlanLiveChunks] = 4 * busiest * blocks <= 5 * all ? 1ull : (unsigned long long)chunks;
}

// dK, dV's fp32 accumulators zeroed where the chunks stay (plan: nullptr, or
// the chunk plan's decision above 1).
__global__ void zero_dkv_accum_kernel(float* __restrict__ a, int64_t n, const unsigned long long* __restrict__ plan) {
  if (plan != nullptr && plan[kPlanLiveChunks] == 1) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4; i += int64_t(gridDim.x) * blockDim.x)
    reinterpret_cast<float4*>(a)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

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
  // The tiles of the slot being computed (reassigned per tile; scores_to_ds reads sLSE, sDelta).
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
  // ---- P, dS (in place of Sᵀ, dPᵀ) and dBias, for a slice of Cfg::kHalf queries
  // from column qh of query tile q0 (head h): the same code for both cores.
  auto scores_to_ds = [&](float (&St)[Cfg::kTilesS][4], float (&dPt)[Cfg::kTilesS][4], int qh, int q0, int h,
                          bool mask_full, const float (&key_bias)[2]) {
    float bias_row_sum[2] = {0.f, 0.f};
    // The fast path (uniform, as in the forward: no test, load or branch
    // per score): every score of this half tile is visible — the tile's
    // mask is all ones, its keys and queries are in range and none is past
    // the causal diagonal — its bias, if any, is the key's (loaded once
    // per tile), and there is no softcap. Then P = exp(scale·s + bias −
    // LSE) and dS = P·(dP − Δ), the same operations score_prob does there.
    const int q_half0 = q0 + qh;
    const bool fast = mask_full && kv0 + Bc <= p.Nk && q_half0 + Cfg::kHalf <= p.Nq &&
                      (!p.causal || kv0 + Bc - 1 <= q_half0 + (p.Nk - p.Nq)) &&
                      (p.bias.data == nullptr || bias_by_key) && !(p.softcap > 0.f);
    if (fast) {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qc = qh + n * 8 + 2 * t + (e & 1);  // query column in the tile
          const float x = St[n][e] * p.scale + key_bias[e / 2];
          const float prob = exp2_approx((x - sLSE[qc]) * kLog2e);
          const float ds = prob * (dPt[n][e] - sDelta[qc]);
          St[n][e] = prob;
          dPt[n][e] = ds;
          bias_row_sum[e / 2] += ds;  // used only with a bias
        }
    } else {
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key_row[e / 2];
          const int qc = qh + n * 8 + 2 * t + (e & 1);  // query column in the tile
          const int qi = q0 + qc;
          const ScoreProb sp =
              score_prob<T, kMaskBits>(p, b, h, qi, key, St[n][e], sLSE[qc], mask_full, bias_by_key, key_bias[e / 2]);
          const float ds = sp.p * (dPt[n][e] - sDelta[qc]) * sp.dcap;
          St[n][e] = sp.p;
          dPt[n][e] = ds;
          if (p.bias.data != nullptr && sp.visible) {
            if (p.bias.stride_q == 0) bias_row_sum[e / 2] += ds;
            else atomicAdd(dbias_accum + p.bias.row_offset(b, h, qi) + key, ds);
          }
        }
    }
    if (bias_by_key) {  // one add per key per half tile
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = bias_row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0 && key_row[r] < p.Nk && sum != 0.f)
          atomicAdd(dbias_accum + p.bias.row_offset(b, h, 0) + key_row[r], sum);
      }
    }
  };

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
          // (Descriptors from one opaque base each, advanced per k-step: otherwise
          // the compiler keeps every step's descriptor in registers, as in rung 08.)
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
            {
              const uint64_t dk = opaque(make_sw128_desc(sK, 0, 1024));
              const uint64_t dq = opaque(make_sw128_desc(sQ + qh * 64, 0, 1024));
#pragma unroll
              for (int kk = 0; kk < D / 16; ++kk) {  // k-step kk: 64-column block kk/4, 32 bytes on inside it
                const uint32_t off = (kk / 4) * 64 * 128 + (kk % 4) * 32;
                wgmma_ss<T, Cfg::kHalf>(St[sl], advance_desc(dk, off), advance_desc(dq, off), kk > 0);
              }
            }
            {
              const uint64_t dv = opaque(make_sw128_desc(sV, 0, 1024));
              const uint64_t ddo = opaque(make_sw128_desc(sdO + qh * 64, 0, 1024));
#pragma unroll
              for (int kk = 0; kk < D / 16; ++kk) {
                const uint32_t off = (kk / 4) * 64 * 128 + (kk % 4) * 32;
                wgmma_ss<T, Cfg::kHalf>(dPt[sl], advance_desc(dv, off), advance_desc(ddo, off), kk > 0);
              }
            }
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

            scores_to_ds(St[sl], dPt[sl], qh, q0, h, mask_full, key_bias);

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
            {
              const uint64_t ddo = opaque(make_sw128_desc(sdO + qh * 64, Br * 128, 1024));
#pragma unroll
              for (int kk = 0; kk < Cfg::kTilesS / 2; ++kk)  // 16 query rows per k-step
                wgmma_rs_vt<T, D>(dV, Pa[kk], advance_desc(ddo, kk * 16 * 128));
              const uint64_t dq = opaque(make_sw128_desc(sQ + qh * 64, Br * 128, 1024));
#pragma unroll
              for (int kk = 0; kk < Cfg::kTilesS / 2; ++kk)
                wgmma_rs_vt<T, D>(dK, dSa[kk], advance_desc(dq, kk * 16 * 128));
            }
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
              const uint64_t ds = opaque(make_sw128_desc(sdS, Bc * 128, 1024));
              const uint64_t dk = opaque(make_sw128_desc(sK + part * Bc * 64, Bc * 128, 1024));
#pragma unroll
              for (int kk = 0; kk < Bc / 16; ++kk)  // 16 keys per k-step
                wgmma_ss_tt<T, 64>(acc, advance_desc(ds, kk * 16 * 128), advance_desc(dk, kk * 16 * 128), kk > 0);
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

            scores_to_ds(St, dPt, qh, q0, h, mask_full, key_bias);

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

  // ---- dK_j, dV_j of this KV head (keys < Nk) -------------------------------------------
  if (dkv_accum == nullptr || live_chunks == 1) {  // one chunk: this block owns the key tile; scale now
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (key_row[r] >= p.Nk) continue;
      T* dk_row = dk + (kv_head * p.Nk + key_row[r]) * D;
      T* dv_row = dv + (kv_head * p.Nk + key_row[r]) * D;
#pragma unroll
      for (int n = 0; n < Cfg::kTilesO; ++n) {
        *reinterpret_cast<uint32_t*>(dk_row + n * 8 + 2 * t) =
            pack2<T>(p.scale * dK[n][2 * r], p.scale * dK[n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(dv_row + n * 8 + 2 * t) = pack2<T>(dV[n][2 * r], dV[n][2 * r + 1]);
      }
    }
  } else if (kv_loaded) {  // several chunks: add the partial sums (unscaled; a chunk with no tile adds nothing)
    const int64_t kv_elems = int64_t(p.B) * p.Hkv * p.Nk * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (key_row[r] >= p.Nk) continue;
      float* dk_row = dkv_accum + (kv_head * p.Nk + key_row[r]) * D;
      float* dv_row = dk_row + kv_elems;
#pragma unroll
      for (int n = 0; n < Cfg::kTilesO; ++n) {
        atomic_add2(dk_row + n * 8 + 2 * t, dK[n][2 * r], dK[n][2 * r + 1]);
        atomic_add2(dv_row + n * 8 + 2 * t, dV[n][2 * r], dV[n][2 * r + 1]);
      }
    }
  }
}

#define DMA_BWD_HEAD_DIMS 32, 64, 96, 128
#define DMA_BWD_WGMMA_HEAD_DIMS 64, 128  // the wgmma wrappers' N (the head dim of dV, dK, dQ)

}  // namespace

std::string dma_backward_core_name(const DynamicMaskProblem& p, DmaCore requested) {
  if (requested == DmaCore::kMma) return "mma";
  static const bool hopper = hopper_wgmma_unsupported().empty();
  const bool wgmma = hopper && dispatch_head_dim<DMA_BWD_WGMMA_HEAD_DIMS>(p.D, [](auto) {});
  if (requested == DmaCore::kWgmma || requested == DmaCore::kWgmmaCpAsync) return wgmma ? "wgmma" : "";
  return wgmma ? "wgmma" : "mma";
}

std::string dma_backward_unsupported(const DynamicMaskProblem& p) {
  if (std::string e = dma_forward_unsupported(p); !e.empty() && e.find("head dim") == std::string::npos) return e;
  if (!dispatch_head_dim<DMA_BWD_HEAD_DIMS>(p.D, [](auto) {}))
    return "backward: head dim " + std::to_string(p.D) + " not in " + head_dim_list<DMA_BWD_HEAD_DIMS>();
  if ((p.Nk + 63) / 64 > 2147483647) return "Nk too large";
  return "";
}

namespace {
// Workspace layout (floats, each part 16-byte aligned): dq_accum [rows·D]
// (default mode only), Δ [rows], dBias accumulator copies, the mask summary,
// and with more than one query chunk the dK and dV accumulators
// [B·Hkv·Nk·D] each.
struct BwdWorkspace {
  size_t dq = 0, delta = 0, dbias = 0, summary = 0, plan = 0, dkv = 0;  // offsets in floats
  size_t total_floats = 0;
  DbiasTarget target;
};
size_t round4(size_t n) { return (n + 3) / 4 * 4; }
BwdWorkspace plan_workspace(const DynamicMaskProblem& p, bool deterministic, int chunks) {
  BwdWorkspace w;
  const size_t rows = size_t(p.B) * p.H * p.Nq;
  size_t at = 0;
  w.dq = at;
  at += deterministic ? 0 : round4(rows * p.D);
  w.delta = at;
  at += round4(rows);
  w.dbias = at;
  if (p.bias.data != nullptr) {
    w.target.copy_elems = p.bias.elems(p.Nk);
    w.target.per_batch = deterministic && p.bias.b == 1 && p.B > 1;
    w.target.per_kv_head = deterministic && p.bias.h == 1 && p.Hkv > 1;
    w.target.batches = p.B;
    w.target.Hkv = p.Hkv;
    at += round4(size_t(w.target.copies()) * size_t(w.target.copy_elems));
  }
  w.summary = at;
  at += round4(dma_mask_summary_bytes(p) / sizeof(float));
  w.plan = at;  // the chunk plan: kPlanWords 64-bit words (dma_bwd_chunk_plan_kernel)
  at += round4(2 * kPlanWords);
  w.dkv = at;
  if (chunks > 1) at += 2 * round4(size_t(p.B) * p.Hkv * p.Nk * p.D);
  w.total_floats = at;
  return w;
}
constexpr int kMaxChunks = 4096;  // a forced count above this is refused
// The automatic rule's slots per block with a mask (dma_backward_resolve_chunks):
// narrow = the key tiles alone give fewer blocks than SMs, wide = at least one per SM.
constexpr int kDmaBwdSlotsPerChunkNarrow = 16;
constexpr int kDmaBwdSlotsPerChunkWide = 32;
}  // namespace

// The automatic query-chunk count.
//  - Deterministic mode: 1, always (dK, dV then never see a floating-point
//    atomic; their sums keep one order).
//  - Forced (> 0): as given (blocks without a slot add nothing).
//  - Without a mask every slot is active, so the work per key tile is known:
//    1 when the unsplit grid (key tiles · Hkv · B blocks) already gives every
//    SM two blocks (the kernel fits two per SM: 240 registers x 128 threads,
//    ~80 KB shared memory at D = 128), else enough chunks for two blocks per
//    SM, keeping at least 4 slots per chunk (the forward's split-KV rule).
//  - With a mask the host cannot see how the active tiles spread over the key
//    tiles, and a causal top-W mask of a query-broadcast bias puts nearly all
//    of them in a few key tiles (at L = 16K, in the first ~48 of 256): one
//    block per key tile then walks them serially while the rest of the GPU
//    idles. So chunk by the worst case: at most a fixed number of slots per
//    block (ceil(slots / that), slots = group · query tiles, the longest
//    column's): kDmaBwdSlotsPerChunkNarrow = 16 while the key tiles alone (the
//    unsplit grid) give fewer blocks than the GPU has SMs — the chunks must
//    then make the parallelism as well as break the skew — and
//    kDmaBwdSlotsPerChunkWide = 32 once they give at least one per SM, where
//    the chunks only break the skew and each extra one is a block that adds
//    its dK, dV once more (each count against its neighbours:
//    docs/experiments.md). What chunks cost when the mask is in fact
//    dense: each block adds 2·64·D floats of dK, dV once per >= 32 tiles,
//    while every tile already adds 64·D floats of dQ, i.e. at most 2/32 more
//    atomic traffic (half the operations on sm_90, vector reductions), plus a
//    memset and a conversion pass over 2·B·Hkv·Nk·D floats.
//    Caps: at most 64 chunks and at most 64 blocks per SM in all (32 waves at
//    two resident blocks per SM), because a block whose slots are all inactive
//    still costs a launch and one round trip to read its skip bits (at L =
//    32K the cap gives 16 chunks, the fastest count there).
//    --bwd-chunks overrides it.
//  - The chunk plan (dma_backward_plans_chunks): with a mask and at least 4
//    blocks per SM from the key tiles alone, the count is launched as above,
//    but dma_bwd_chunk_plan_kernel counts every key tile's active slots after
//    the mask pass, and where the busiest key tile holds at most 5/4 of the
//    mean the blocks deal the slots to one chunk (dma_bwd_kernel's
//    live_chunks; the other chunks' blocks leave at once, dK and dV stored
//    directly). The host cannot tell a dense mask from a skewed sparse one
//    with as many active key-tile blocks; the mask pass can. A causal mask
//    keeps its chunks (its busiest key tile holds twice the mean), where
//    they are faster than one.
namespace {
// The unsplit grid: one block per (64-key tile, KV head, batch).
int64_t key_tile_blocks(const DynamicMaskProblem& p) { return int64_t((p.Nk + kDmaBc - 1) / kDmaBc) * p.Hkv * p.B; }
}  // namespace

int dma_backward_resolve_chunks(const DynamicMaskProblem& p, bool deterministic, int requested) {
  if (deterministic) return 1;
  if (requested > 0) return requested;
  const int sms = device_sm_count();
  const int64_t unsplit = key_tile_blocks(p);
  const int64_t slots = int64_t(p.H / p.Hkv) * ((p.Nq + kDmaBr - 1) / kDmaBr);
  int64_t want;
  if (p.mask.data == nullptr) {
    if (unsplit >= 2 * int64_t(sms)) return 1;
    want = std::min<int64_t>((2 * int64_t(sms) + unsplit - 1) / unsplit, slots / 4);
  } else {
    const int64_t per_chunk = unsplit >= sms ? kDmaBwdSlotsPerChunkWide : kDmaBwdSlotsPerChunkNarrow;
    want = (slots + per_chunk - 1) / per_chunk;
  }
  const int64_t grid_cap = std::max<int64_t>(1, 64 * int64_t(sms) / std::max<int64_t>(1, unsplit));
  return int(std::max<int64_t>(1, std::min<int64_t>({want, 64, grid_cap, slots})));
}

bool dma_backward_plans_chunks(const DynamicMaskProblem& p, bool deterministic, int requested) {
  if (deterministic || requested > 0 || p.mask.data == nullptr) return false;
  // Causal with Nq > 0.4·Nk: the causal range alone puts the busiest key tile
  // above 5/4 of the mean (Nq >= Nk: twice; below, Tk / (Tk - Tq/2) in tiles),
  // so the plan could only keep the chunks; skip its kernel.
  if (p.causal && 5 * int64_t(p.Nq) > 2 * int64_t(p.Nk)) return false;
  return dma_backward_resolve_chunks(p, deterministic, requested) > 1 &&
         key_tile_blocks(p) >= 4 * int64_t(device_sm_count());
}

int dma_backward_walked_chunks(const DynamicMaskProblem& p, bool deterministic, int requested, const float* workspace) {
  const int chunks = dma_backward_resolve_chunks(p, deterministic, requested);
  if (!dma_backward_plans_chunks(p, deterministic, requested) || workspace == nullptr) return chunks;
  unsigned long long live = 0;
  const BwdWorkspace w = plan_workspace(p, deterministic, chunks);
  if (cudaMemcpy(&live, reinterpret_cast<const unsigned long long*>(workspace + w.plan) + kPlanLiveChunks, sizeof live,
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    return chunks;
  return int(live);
}

size_t dma_backward_workspace_bytes(const DynamicMaskProblem& p, bool deterministic, int q_chunks) {
  return plan_workspace(p, deterministic, dma_backward_resolve_chunks(p, deterministic, q_chunks)).total_floats *
         sizeof(float);
}

cudaError_t dma_backward(const DynamicMaskProblem& p, const DmaBackwardArgs& a, cudaStream_t stream) {
  if (!dma_backward_unsupported(p).empty()) return cudaErrorInvalidValue;
  const int chunks = dma_backward_resolve_chunks(p, a.deterministic, a.q_chunks);
  const int64_t kv_tiles = (p.Nk + kDmaBc - 1) / kDmaBc;
  const int64_t slots = int64_t(p.H / p.Hkv) * ((p.Nq + kDmaBr - 1) / kDmaBr);
  if (chunks > kMaxChunks || kv_tiles * chunks > 2147483647 || p.Hkv > 65535 || p.B > 65535 ||
      slots + int64_t(DmaBwdConfig<64>::kThreads + 1) * chunks > 2147483647)  // grid; the kernel's int slot indices
    return cudaErrorInvalidValue;
  BwdWorkspace w = plan_workspace(p, a.deterministic, chunks);
  if (a.workspace == nullptr || a.workspace_bytes < w.total_floats * sizeof(float)) return cudaErrorInvalidValue;
  // Every part 16-byte aligned: the wgmma core's tensor map of dq_accum needs it.
  if (!dma_aligned(a.workspace, 16)) return cudaErrorInvalidValue;
  // The main kernels copy Q, K, V and dO in 16-byte pieces (cp.async, TMA)
  // and store dK, dV (and the deterministic dQ) in pairs: refused, not a
  // misaligned-address fault. (O and dQ otherwise may sit anywhere: the Δ
  // pass and the dQ conversion have element-wise versions.)
  if (!dma_aligned(a.q, 16) || !dma_aligned(a.k, 16) || !dma_aligned(a.v, 16) || !dma_aligned(a.dout, 16) ||
      !dma_aligned(a.dk, 4) || !dma_aligned(a.dv, 4) || !dma_aligned(a.dq, 4))
    return cudaErrorInvalidValue;
  const int64_t rows = int64_t(p.B) * p.H * p.Nq;
  const int64_t kv_elems = int64_t(p.B) * p.Hkv * p.Nk * p.D;
  float* dq_accum = a.deterministic ? nullptr : a.workspace + w.dq;
  float* delta = a.workspace + w.delta;
  float* dkv_accum = chunks > 1 ? a.workspace + w.dkv : nullptr;  // dK [kv_elems], then dV at + kv_elems
  if (p.bias.data != nullptr) w.target.base = a.workspace + w.dbias;
  // The forward's summary where the caller passes it (same problem, same
  // mask), else this call's own pre-pass.
  MaskSummary summary;
  cudaError_t err = cudaSuccess;
  if (a.mask_summary != nullptr && p.mask.data != nullptr)
    summary = dma_mask_summary_view(p, const_cast<uint32_t*>(a.mask_summary));
  else
    err = dma_summarize_mask(p, reinterpret_cast<uint32_t*>(a.workspace + w.summary), &summary, stream);
  // Δ by 16-byte loads where O and dO allow, which also zeroes dq_accum;
  // else the warp-per-row kernel and a memset.
  const bool delta_vec = dma_aligned(a.o, 16);  // (dO: 16-byte aligned, checked above)
  if (err == cudaSuccess && dq_accum && !delta_vec)
    err = cudaMemsetAsync(dq_accum, 0, size_t(rows) * p.D * sizeof(float), stream);
  if (err == cudaSuccess && w.target.base)
    err = cudaMemsetAsync(w.target.base, 0, size_t(w.target.copies()) * w.target.copy_elems * sizeof(float), stream);
  // The automatic count with a mask, where the key tiles alone give every SM
  // two waves of two blocks: let the mask pass's counts drop the chunks on
  // the device when the active slots are spread evenly (a dense mask).
  unsigned long long* chunk_plan = nullptr;
  if (err == cudaSuccess && dma_backward_plans_chunks(p, a.deterministic, a.q_chunks)) {
    chunk_plan = reinterpret_cast<unsigned long long*>(a.workspace + w.plan);
    err = cudaMemsetAsync(chunk_plan, 0, kPlanWords * sizeof(unsigned long long), stream);
    if (err == cudaSuccess) {
      dma_bwd_chunk_plan_kernel<<<dim3(unsigned(kv_tiles), unsigned(p.Hkv), unsigned(p.B)), 128, 0, stream>>>(
          p, summary, chunks, chunk_plan);
      err = cudaGetLastError();
    }
  }
  if (err == cudaSuccess && dkv_accum) {  // both halves, dK then dV (not where the plan decides one chunk)
    zero_dkv_accum_kernel<<<1024, 256, 0, stream>>>(dkv_accum, 2 * kv_elems, chunk_plan);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return err;
  std::string core = dma_backward_core_name(p, a.core);
  if (core.empty()) return cudaErrorInvalidValue;
  // The wgmma core adds dQ by TMA tensor reductions: the map of dq_accum. (The
  // workspace is 16-byte aligned and D a multiple of 32, so this fails only
  // without the driver's encoder; then the mma.sync core, which uses atomics.)
  const int64_t q_heads = int64_t(p.B) * p.H;  // the maps' heads: rows·D blocks of dq_accum, Q, dO
  CUtensorMap tma_dq{}, tma_q{}, tma_do{};
  if (core == "wgmma" && dq_accum && !encode_f32_head_tiles<kDmaBr>(&tma_dq, dq_accum, q_heads, p.Nq, p.D)) {
    if (a.core != DmaCore::kAuto) return cudaErrorNotSupported;
    core = "mma";
  }
  // Q and dO by TMA on the wgmma core where their bases are 16-byte aligned
  // (else cp.async).
  const bool qdo_tma = core == "wgmma" && encode_head_tiles<kDmaBr>(&tma_q, a.q, p.dtype, q_heads, p.Nq, p.D) &&
                       encode_head_tiles<kDmaBr>(&tma_do, a.dout, p.dtype, q_heads, p.Nq, p.D);
  auto run = [&](auto main_cfg) {
    using Cfg = decltype(main_cfg);                     // the main kernel's core
    using MmaCfg = DmaBwdConfig<Cfg::kHeadDim, false>;  // the deterministic dQ kernel is mma.sync
    err = dispatch_dtype(p.dtype, [&](auto type) {
      using T = decltype(type);
      if (delta_vec)
        dma_bwd_delta_vec_kernel<T, Cfg::kHeadDim><<<unsigned((rows + 63) / 64), 256, 0, stream>>>(
            static_cast<const T*>(a.o), static_cast<const T*>(a.dout), delta, dq_accum, rows);
      else
        dma_bwd_delta_kernel<T><<<unsigned((rows + 3) / 4), 128, 0, stream>>>(
            static_cast<const T*>(a.o), static_cast<const T*>(a.dout), delta, rows, p.D);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      // Chunks of one key tile are neighbours in grid.x (j·chunks + c): they run
      // at the same time and share K_j, V_j through L2, and the key tiles of
      // the causal range's long columns (small j) start first. (Where the chunk
      // plan drops the chunks the kernel reads the grid chunk-major: dma_bwd_kernel.)
      const dim3 grid(unsigned(kv_tiles * chunks), unsigned(p.Hkv), unsigned(p.B));
      const bool bits = p.mask_format == DmaMaskFormat::kBits;
      e = launch_with_smem(bits ? dma_bwd_kernel<Cfg, T, true> : dma_bwd_kernel<Cfg, T, false>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                           static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                           static_cast<const T*>(a.dout), static_cast<const float*>(a.lse),
                           static_cast<const float*>(delta), dq_accum, tma_dq, tma_q, tma_do, qdo_tma,
                           static_cast<T*>(a.dk), static_cast<T*>(a.dv), dkv_accum, w.target, p, summary, chunks,
                           static_cast<const unsigned long long*>(chunk_plan), a.rotate_slots);
      if (e != cudaSuccess) return e;
      if (dkv_accum) {  // dK = scale · Σ chunks, dV = Σ chunks, in the input dtype
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(dkv_accum, 1, static_cast<T*>(a.dk), kv_elems,
                                                                p.scale, chunk_plan);
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(dkv_accum + kv_elems, 1, static_cast<T*>(a.dv),
                                                                kv_elems, 1.f, chunk_plan);
      }
      if (a.deterministic) {
        const dim3 dq_grid(unsigned((p.Nq + MmaCfg::kBr - 1) / MmaCfg::kBr), unsigned(p.H), unsigned(p.B));
        e = launch_with_smem(bits ? dma_bwd_dq_kernel<MmaCfg, T, true> : dma_bwd_dq_kernel<MmaCfg, T, false>, dq_grid, MmaCfg::kThreads, MmaCfg::kSmemBytes, stream,
                             static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                             static_cast<const T*>(a.dout), static_cast<const float*>(a.lse),
                             static_cast<const float*>(delta), static_cast<T*>(a.dq), p, summary);
        if (e != cudaSuccess) return e;
      } else if (dma_aligned(a.dq, 8)) {  // rows·D is a multiple of 4 (D of 32)
        f32_to_dtype_vec4_kernel<T><<<1024, 256, 0, stream>>>(dq_accum, static_cast<T*>(a.dq), rows * p.D);
      } else {
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(dq_accum, 1, static_cast<T*>(a.dq), rows * p.D);
      }
      if (w.target.base && a.dbias)
        sum_copies_to_dtype_kernel<T><<<1024, 256, 0, stream>>>(w.target.base, w.target.copies(),
                                                                static_cast<T*>(a.dbias), w.target.copy_elems);
      return cudaGetLastError();
    });
  };
  if (core == "wgmma")
    dispatch_head_dim<DMA_BWD_WGMMA_HEAD_DIMS>(p.D, [&](auto d) { run(DmaBwdConfig<decltype(d)::value, true>{}); });
  else
    dispatch_head_dim<DMA_BWD_HEAD_DIMS>(p.D, [&](auto d) { run(DmaBwdConfig<decltype(d)::value>{}); });
  return err;
}

}  // namespace attnlab
