// ============================================================================
// Rung 01 — split-KV (FlashAttention-2's loop, FlashAttention-1's warp split)
// ============================================================================
// What changes against rung 00: tensor cores. A block owns a Br-row tile of Q
// and streams K and V through shared memory in Bc-row tiles; the softmax is
// online (m_i, l_i per row, O_i rescaled by exp(m_old - m_new) every tile and
// divided by l_i once at the end). That loop is FlashAttention-2's
// (arXiv:2307.08691, Algorithm 1); FlashAttention-1's Algorithm 1 runs the K/V
// tiles outer and rewrites a normalised O_i in global memory every step. What
// is FlashAttention-1's here is its kernel's split of the keys between warps
// (FlashAttention-2, §3.3). Where it is slower (than rung 02): for S = Q·K_jᵀ
// the warps form a 2 (rows) x 4 (keys) grid, so no warp holds a whole row of
// S. S goes to shared memory in fp32, a barrier, a softmax pass of 4 threads
// per row, P back to shared memory, another barrier, then P·V with the warps
// re-split over rows x head-dim columns: four barriers per KV tile (rung 02:
// three), an S/P round trip through shared memory, and a softmax pass with no
// MMAs beside it to hide its latency.
//
// Per block (kWarps warps; three warp layouts per KV tile):
//   sQ: [Br, D + 8]   sK, sV: [kStages][Bc, D + 8]   halves (+8: ldmatrix conflict-free)
//   sS: [Br, Bc + 8] fp32 raw scores   sP: [Br, Bc + 8] halves   sAlpha: [Br] fp32
//   1. S = Q·K_jᵀ: 2 x 4 warps of [32 rows, 16 keys]   2. softmax: 4 threads per row
//   3. O += P·V_j: 4 x 2 warps of [16 rows, D/2 columns], O_i in registers (fp32)
// stage1: one K/V buffer (V_j lands during S_j; K_{j+1} waits for P_j·V_j);
// stage2: two K/V buffers (tile j+1 is copied while tile j is computed).
// Tile configurations (constexprs in SplitKvConfig, checked below; registers:
// docs/01_split_kv.md):
//   D     Br   Bc  warps  smem stage1  stage2
//   32    64   64    8      43264      53504
//   64    64   64    8      55552      73984
//   96    64   64    8      67840      94464
//  128    64   64    8      80128     114944
//  256    64   64    8     129280     196864   (stage2: more than an A100's 163 KB)
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128, 256}; GQA/MQA (H a multiple
// of Hkv); any Nq, Nk >= 1 (ragged last tiles are zero-filled and masked);
// causal (bottom-right aligned) or not; writes O and LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 64 --variant 'split-kv*' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/tile_copy.cuh"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {
namespace {

template <int kHeadDim_, int kStages_>
struct SplitKvConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr int kBr = 64;
  static constexpr int kBc = 64;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  // 1. S = Q·Kᵀ: a kWarpRowsS x kWarpKeysS grid of warps over the [Br, Bc] tile.
  static constexpr int kWarpRowsS = 2, kWarpKeysS = 4;
  static constexpr int kRowsPerWarpS = kBr / kWarpRowsS;  // 32 = two m16 tiles
  static constexpr int kKeysPerWarpS = kBc / kWarpKeysS;  // 16 = two n8 tiles
  // 2. softmax: kThreadsPerRow threads per row, each kBc / kThreadsPerRow scores.
  static constexpr int kThreadsPerRow = kThreads / kBr;
  // 3. O += P·V: a kWarpRowsO x kWarpColsO grid of warps over the [Br, D] output.
  static constexpr int kWarpRowsO = 4, kWarpColsO = 2;
  static constexpr int kColsPerWarpO = kHeadDim / kWarpColsO;
  static constexpr int kTilesO = kColsPerWarpO / 8;  // n8 tiles of O per warp
  // Shared memory.
  static constexpr int kPad = 8;                      // elements appended to every shared row
  static constexpr int kRowStride = kHeadDim + kPad;  // sQ, sK, sV (halves)
  static constexpr int kSStride = kBc + kPad;         // sS (floats) and sP (halves)
  static constexpr int kSmemBytes = (kBr + 2 * kStages * kBc) * kRowStride * 2  // sQ, sK, sV
                                    + kBr * kSStride * 4                        // sS
                                    + kBr * kSStride * 2                        // sP
                                    + kBr * 4;                                  // sAlpha
  static_assert(kRowsPerWarpS == 32 && kKeysPerWarpS == 16, "the S = Q·Kᵀ loop is written for 32 x 16 warp tiles");
  static_assert(kWarpRowsS * kWarpKeysS == kWarps && kWarpRowsO * kWarpColsO == kWarps, "every warp has one tile");
  static_assert(kThreadsPerRow == 4 && kBc % (2 * kThreadsPerRow) == 0, "softmax pass: a quad per row, float2 steps");
  static_assert(kBr == kWarpRowsO * 16, "P·V: each warp owns one m16 tile of rows");
  static_assert(kColsPerWarpO % 16 == 0, "P·V: ldmatrix.x4.trans covers 16 output columns at a time");
  static_assert(kHeadDim % 16 == 0 && kBc % 16 == 0, "D and Bc must be multiples of the MMA K (16)");
  static_assert(kSStride % 32 == 8, "sS stride = 8 (mod 32) banks: fragment stores and row reads conflict-free");
  static_assert(kStages == 1 || kStages == 2, "stage1 and stage2 only");
};

// The header table, checked against the code.
static_assert(SplitKvConfig<32, 1>::kSmemBytes == 43264 && SplitKvConfig<32, 2>::kSmemBytes == 53504, "header: D=32");
static_assert(SplitKvConfig<64, 1>::kSmemBytes == 55552 && SplitKvConfig<64, 2>::kSmemBytes == 73984, "header: D=64");
static_assert(SplitKvConfig<96, 1>::kSmemBytes == 67840 && SplitKvConfig<96, 2>::kSmemBytes == 94464, "header: D=96");
static_assert(SplitKvConfig<128, 1>::kSmemBytes == 80128 && SplitKvConfig<128, 2>::kSmemBytes == 114944,
              "header: D=128");
static_assert(SplitKvConfig<256, 1>::kSmemBytes == 129280 && SplitKvConfig<256, 2>::kSmemBytes == 196864,
              "header: D=256");
static_assert(SplitKvConfig<64, 1>::kBr == 64 && SplitKvConfig<64, 1>::kBc == 64 && SplitKvConfig<64, 1>::kWarps == 8,
              "header: Br, Bc, warps");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
split_kv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                float* __restrict__ lse, const AttnProblem p) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kStride = Cfg::kRowStride, kSStride = Cfg::kSStride;

  // Heaviest query tiles first: under a causal mask the last tiles see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair

  const T* Qg = q + (head * p.Nq + q_start) * D;  // [Br, D] tile of this block
  const T* Kg = k + kv_head * p.Nk * D;              // [Nk, D]
  const T* Vg = v + kv_head * p.Nk * D;              // [Nk, D]

  const int n_kv_tiles = kv_tiles_for_query_tile(p, q_start, Br, Bc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);                  // [Br, kStride]
  T* sK = sQ + Br * kStride;                               // [kStages][Bc, kStride]
  T* sV = sK + kStages * Bc * kStride;                     // [kStages][Bc, kStride]
  float* sS = reinterpret_cast<float*>(sV + kStages * Bc * kStride);  // [Br, kSStride] fp32
  T* sP = reinterpret_cast<T*>(sS + Br * kSStride);        // [Br, kSStride] halves
  float* sAlpha = reinterpret_cast<float*>(sP + Br * kSStride);  // [Br]

  // 1. S layout: this warp's [32, 16] slice of S.
  const int s_row0 = (warp / Cfg::kWarpKeysS) * Cfg::kRowsPerWarpS;  // first tile row
  const int s_key0 = (warp % Cfg::kWarpKeysS) * Cfg::kKeysPerWarpS;  // first tile key
  // 2. softmax layout: row `sm_row` of the tile, scores 2·sm_quarter + 8i (+1).
  const int sm_row = threadIdx.x / Cfg::kThreadsPerRow, sm_quarter = threadIdx.x % Cfg::kThreadsPerRow;
  // 3. P·V layout: this warp's [16, D/2] slice of O.
  const int o_row0 = (warp % Cfg::kWarpRowsO) * 16;
  const int o_col0 = (warp / Cfg::kWarpRowsO) * Cfg::kColsPerWarpO;

  float m_i = -INFINITY;  // running max of raw scores of row sm_row
  float l_i = 0.f;        // this thread's share of the running sum of that row
  float O[Cfg::kTilesO][4] = {};  // O_i: [16, D/2] per warp, fp32
  const float scale_log2 = p.scale * kLog2e;

  auto load_kv = [&](int tile) {  // K then V of `tile`, as two commit groups
    const int slot = tile % kStages;
    const int rows = p.Nk - tile * Bc;
    load_tile_async<Bc, D, kStride, Cfg::kThreads>(sK + slot * Bc * kStride, Kg + int64_t(tile) * Bc * D, D, rows);
    cp_async_commit();
    load_tile_async<Bc, D, kStride, Cfg::kThreads>(sV + slot * Bc * kStride, Vg + int64_t(tile) * Bc * D, D, rows);
    cp_async_commit();
  };

  if (n_kv_tiles > 0) {
    // Q joins the first K group: one wait covers both.
    load_tile_async<Br, D, kStride, Cfg::kThreads>(sQ, Qg, D, p.Nq - q_start);
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_kv_tiles) load_kv(s);
      else { cp_async_commit(); cp_async_commit(); }
    }
  }

  for (int j = 0; j < n_kv_tiles; ++j) {
    const int prefetch = j + kStages - 1;
    if (prefetch < n_kv_tiles) load_kv(prefetch);
    else { cp_async_commit(); cp_async_commit(); }  // empty groups keep the count uniform

    // 2·kStages groups are in flight; the oldest is K_j (and Q on the first pass).
    cp_async_wait<2 * kStages - 1>();
    __syncthreads();

    // ---- 1. S = Q · K_jᵀ   [32, 16] per warp, one m16 tile at a time, to sS ---
    // (A rolled loop: unrolled, ptxas spills a few bytes at D = 96.)
    const T* sKj = sK + (j % kStages) * Bc * kStride;
#pragma unroll 1
    for (int mt = 0; mt < Cfg::kRowsPerWarpS / 16; ++mt) {
      const int row0 = s_row0 + mt * 16 + g;  // tile row of c0,c1; c2,c3 are 8 rows below
      float S[Cfg::kKeysPerWarpS / 8][4] = {};  // [16, 16] slice: two n8 tiles
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];  // Q rows of this m16 tile, columns 16kk .. 16kk+15
        load_a_fragment<kStride>(a, sQ + (s_row0 + mt * 16) * kStride + kk * 16, lane);
        qk_slice<T, Cfg::kKeysPerWarpS / 8, kStride>(S, a, sKj + s_key0 * kStride + kk * 16, lane);
      }
      // Keys past Nk (ragged last tile) and, if causal, after the diagonal: -inf.
      mask_scores(S, p, j * Bc + s_key0, q_start + s_row0 + mt * 16, q_start + row0, q_start + row0 + 8, t);
#pragma unroll
      for (int n = 0; n < Cfg::kKeysPerWarpS / 8; ++n) {
        float* dst = sS + row0 * kSStride + s_key0 + n * 8 + 2 * t;
        *reinterpret_cast<float2*>(dst) = make_float2(S[n][0], S[n][1]);
        *reinterpret_cast<float2*>(dst + 8 * kSStride) = make_float2(S[n][2], S[n][3]);
      }
    }
    __syncthreads();  // sS holds the whole [Br, Bc] tile

    // ---- 2. online softmax over whole rows: sS -> sP, m_i, l_i, alpha ------
    {
      constexpr int kSteps = Bc / (2 * Cfg::kThreadsPerRow);  // float2 reads per thread
      const float* s_row = sS + sm_row * kSStride + 2 * sm_quarter;
      float2 s[kSteps];
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        s[i] = *reinterpret_cast<const float2*>(s_row + 8 * i);
        tile_max = fmaxf(tile_max, fmaxf(s[i].x, s[i].y));
      }
      const float m_new = fmaxf(m_i, quad_allreduce_max(tile_max));  // the row's 4 threads are one quad
      const float base = softmax_shift(m_new, scale_log2);            // online_softmax.cuh
      const float alpha = rescale_factor(m_i, base, scale_log2);  // exp(m_i - m_new)
      m_i = m_new;
      float row_sum = 0.f;
      T* p_row = sP + sm_row * kSStride + 2 * sm_quarter;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        const float p0 = exp2_approx(fmaf(s[i].x, scale_log2, -base));  // P = exp(scale·(S - m_new))
        const float p1 = exp2_approx(fmaf(s[i].y, scale_log2, -base));
        row_sum += p0 + p1;
        *reinterpret_cast<uint32_t*>(p_row + 8 * i) = pack2<T>(p0, p1);
      }
      l_i = l_i * alpha + row_sum;
      if (sm_quarter == 0) sAlpha[sm_row] = alpha;
    }

    cp_async_wait<2 * kStages - 2>();  // V_j has landed
    __syncthreads();                   // ... and sP, sAlpha are complete

    // ---- 3. O_i = alpha · O_i + P · V_j   [16, D/2] per warp -----------------
    {
      const float alpha0 = sAlpha[o_row0 + g], alpha1 = sAlpha[o_row0 + g + 8];
#pragma unroll
      for (int n = 0; n < Cfg::kTilesO; ++n) {
        O[n][0] *= alpha0;
        O[n][1] *= alpha0;
        O[n][2] *= alpha1;
        O[n][3] *= alpha1;
      }
      const T* sVj = sV + (j % kStages) * Bc * kStride;
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        uint32_t a[4];  // P rows o_row0 .. o_row0+15, keys 16kk .. 16kk+15
        load_a_fragment<kSStride>(a, sP + o_row0 * kSStride + kk * 16, lane);
#pragma unroll
        for (int nd = 0; nd < Cfg::kTilesO / 2; ++nd) {
          uint32_t b[4];  // V rows 16kk .. 16kk+15, columns o_col0 + 16nd .. +15, transposed
          ldmatrix_x4_trans(b, sVj + (kk * 16 + lane % 16) * kStride + o_col0 + nd * 16 + (lane / 16) * 8);
          mma_m16n8k16<T>(O[2 * nd], a, b[0], b[1]);
          mma_m16n8k16<T>(O[2 * nd + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // K/V slot j % kStages, sP and sAlpha are free again
  }

  // ---- epilogue: l_i and LSE in the softmax layout, O_i / l_i in the P·V layout
  {
    const float l = quad_allreduce_sum(l_i);
    if (sm_quarter == 0) {
      sAlpha[sm_row] = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key: O = 0
      if (q_start + sm_row < p.Nq)
        lse[head * p.Nq + q_start + sm_row] = l > 0.f ? m_i * p.scale + logf(l) : -INFINITY;
    }
  }
  __syncthreads();
  T* Og = o + head * p.Nq * p.Dv;
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // r = 0: row g (c0, c1); r = 1: row g+8 (c2, c3)
    const int row = o_row0 + g + 8 * r;
    if (q_start + row >= p.Nq) continue;
    const float inv_l = sAlpha[row];
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(Og + int64_t(q_start + row) * p.Dv + o_col0 + n * 8 + 2 * t) =
          pack2<T>(O[n][2 * r] * inv_l, O[n][2 * r + 1] * inv_l);
  }
}

using SplitKvHeadDims = EqualHeadDims<32, 64, 96, 128, 256>;

template <int kStages>
cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;  // unsupported_reason() rejects other head dims first
  SplitKvHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = SplitKvConfig<decltype(dims)::D, kStages>;
    err = launch_config<Cfg>(p, b, stream, [](auto cfg, auto type) {
      return split_kv_kernel<decltype(cfg), decltype(type)>;
    });
  });
  return err;
}

template <int kStages>
std::string describe() {
  std::string s = "stages=" + std::to_string(kStages) + "; S: 2x4 warps of [32 rows, 16 keys] through smem";
  SplitKvHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D;
    using Cfg = SplitKvConfig<D, kStages>;
    s += "; D=" + std::to_string(D) + ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
         " warps=" + std::to_string(Cfg::kWarps) + " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
  });
  return s + "; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
}

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "split-kv+stage" + std::to_string(kStages);
  v.rung = "01_split_kv";
  v.unsupported_reason = rung_unsupported<SplitKvConfig, kStages, SplitKvHeadDims>;
  v.launch = launch<kStages>;
  v.describe = describe<kStages>;
  return v;
}

}  // namespace

std::vector<Variant> make_split_kv_variants() { return {make_variant<1>(), make_variant<2>()}; }

}  // namespace attnlab
