// ============================================================================
// Rung 02 — split-Q (FlashAttention-2 style)
// ============================================================================
// What changes against rung 01 (split-KV, FlashAttention-1 style): the warps
// of a block split the *query* rows instead of the key columns. Each warp owns
// 16 whole rows of S = Q·Kᵀ, so the softmax row statistics (m_i, l_i) live in
// that warp's registers, P never leaves registers (the QKᵀ accumulator is fed
// straight back as the A operand of P·V), and no shared-memory reduction or
// __syncthreads is needed between the two matmuls. That removes the S round
// trip through shared memory that rung 01 pays on every tile.
//
// Per block: one Br-row tile of Q, loop over Bc-row tiles of K and V.
//   sQ: [Br, D + 8]              halves, loaded once
//   sK: [kStages][Bc, D + 8]     halves
//   sV: [kStages][Bc, D + 8]     halves   (+8 pads rows: ldmatrix without bank conflicts)
//   S, P: [16, Bc] per warp in registers (fp32, then packed to 16-bit for P·V)
//   O:    [16, D]  per warp in registers (fp32)
//
// stage1: one K/V buffer. V_j's copy overlaps S_j = Q·K_jᵀ, but K_{j+1} waits
//         until P_j·V_j is done.
// stage2: two K/V buffers. Tile j+1 is copied while tile j is computed.
//
// Tile configurations (every number below is a constexpr in SplitQConfig and
// checked by the static_asserts after it):
//   D     Br   Bc  warps  smem stage1  smem stage2
//   32   128   64    8      20480        30720
//   64   128   64    8      36864        55296
//   96   128   64    8      53248        79872
//  128   128   64    8      69632       104448
//  256    64   32    4      67584       101376
// Registers per thread: see `flash_attn_mma --list` (read from the compiled
// kernel) and the ptxas report of the build.
//
// Supports: fp16, bf16; D = Dv ∈ {32, 64, 96, 128, 256}; any Nq, Nk >= 1
// (ragged last tiles are zero-filled and masked); causal (bottom-right aligned)
// or not; writes O and LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 8192 --D 64 --variant 'split-q*' --check
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <vector>

#include "../common/attn_problem.h"
#include "../common/online_softmax.cuh"
#include "../common/ptx.cuh"
#include "../common/tile_copy.cuh"
#include "../common/variant.h"

namespace attnlab {
namespace {

template <int kHeadDim>
struct SplitQTiles;  // Br, Bc and warps per head dim
template <> struct SplitQTiles<32>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct SplitQTiles<64>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct SplitQTiles<96>  { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct SplitQTiles<128> { static constexpr int kBr = 128, kBc = 64, kWarps = 8; };
template <> struct SplitQTiles<256> { static constexpr int kBr = 64,  kBc = 32, kWarps = 4; };

template <int kHeadDim_, int kStages_>
struct SplitQConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr int kBr = SplitQTiles<kHeadDim>::kBr;
  static constexpr int kBc = SplitQTiles<kHeadDim>::kBc;
  static constexpr int kWarps = SplitQTiles<kHeadDim>::kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = 16;          // one m16 MMA tile of query rows
  static constexpr int kPad = 8;                   // halves appended to every shared row
  static constexpr int kRowStride = kHeadDim + kPad;
  static constexpr int kSmemBytes = (kBr + 2 * kStages * kBc) * kRowStride * 2;
  // MMA tile counts per warp.
  static constexpr int kTilesS = kBc / 8;         // n8 tiles of S across Bc keys
  static constexpr int kTilesO = kHeadDim / 8;    // n8 tiles of O across D
  static_assert(kBr == kWarps * kRowsPerWarp, "each warp owns 16 query rows");
  static_assert(kHeadDim % 16 == 0 && kBc % 16 == 0, "D and Bc must be multiples of the MMA K (16)");
  static_assert(kStages == 1 || kStages == 2, "stage1 and stage2 only");
};

// The header table, checked against the code.
static_assert(SplitQConfig<32, 1>::kSmemBytes == 20480 && SplitQConfig<32, 2>::kSmemBytes == 30720, "header: D=32");
static_assert(SplitQConfig<64, 1>::kSmemBytes == 36864 && SplitQConfig<64, 2>::kSmemBytes == 55296, "header: D=64");
static_assert(SplitQConfig<96, 1>::kSmemBytes == 53248 && SplitQConfig<96, 2>::kSmemBytes == 79872, "header: D=96");
static_assert(SplitQConfig<128, 1>::kSmemBytes == 69632 && SplitQConfig<128, 2>::kSmemBytes == 104448, "header: D=128");
static_assert(SplitQConfig<256, 1>::kSmemBytes == 67584 && SplitQConfig<256, 2>::kSmemBytes == 101376, "header: D=256");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
split_q_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
               float* __restrict__ lse, const AttnProblem p) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kStride = Cfg::kRowStride;

  // Heaviest query tiles first: under a causal mask the last tiles see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int q_start = m_block * Br;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair

  const T* Qg = q + (head * p.Nq + q_start) * D;  // [Br, D] tile of this block
  const T* Kg = k + head * p.Nk * D;              // [Nk, D]
  const T* Vg = v + head * p.Nk * D;              // [Nk, D]

  // Causal: the last row of this tile sees keys up to q_end - 1 + (Nk - Nq).
  const int q_end = min(q_start + Br, p.Nq);
  const int causal_offset = p.Nk - p.Nq;
  int n_kv_tiles = (p.Nk + Bc - 1) / Bc;
  if (p.causal) n_kv_tiles = min(n_kv_tiles, max(0, (q_end + causal_offset + Bc - 1) / Bc));

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [Br, kStride]
  T* sK = sQ + Br * kStride;               // [kStages][Bc, kStride]
  T* sV = sK + kStages * Bc * kStride;     // [kStages][Bc, kStride]

  // Rows of this warp's fragments, as global query indices.
  const int row0 = q_start + warp * Cfg::kRowsPerWarp + g;  // c0, c1
  const int row1 = row0 + 8;                                  // c2, c3

  float O[Cfg::kTilesO][4] = {};  // O_i: [16, D] per warp, fp32
  RowStats stats;
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

    // ---- S = Q · K_jᵀ   [16, Bc] per warp --------------------------------
    const T* sKj = sK + (j % kStages) * Bc * kStride;
    float S[Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];  // Q[warp rows, 16kk .. 16kk+15]
      ldmatrix_x4(a, sQ + (warp * 16 + lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nn = 0; nn < Bc / 16; ++nn) {
        uint32_t b[4];  // K rows 16nn .. 16nn+15 (two n8 tiles), columns 16kk .. 16kk+15
        ldmatrix_x4(b, sKj + (nn * 16 + (lane / 16) * 8 + lane % 8) * kStride + kk * 16 + ((lane / 8) % 2) * 8);
        mma_m16n8k16<T>(S[2 * nn], a, b[0], b[1]);
        mma_m16n8k16<T>(S[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // ---- mask: keys past Nk (ragged last tile) and, if causal, keys after the diagonal
    const int kv_start = j * Bc;
    const bool ragged = kv_start + Bc > p.Nk;
    const bool crosses_diagonal = p.causal && kv_start + Bc - 1 > q_start + causal_offset;
    if (ragged || crosses_diagonal) {
      const int limit0 = p.causal ? min(p.Nk, row0 + causal_offset + 1) : p.Nk;  // keys < limit are visible
      const int limit1 = p.causal ? min(p.Nk, row1 + causal_offset + 1) : p.Nk;
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n) {
        const int key = kv_start + n * 8 + 2 * t;
        if (key >= limit0) S[n][0] = -INFINITY;
        if (key + 1 >= limit0) S[n][1] = -INFINITY;
        if (key >= limit1) S[n][2] = -INFINITY;
        if (key + 1 >= limit1) S[n][3] = -INFINITY;
      }
    }

    // ---- online softmax: S -> P in place, rescale O ------------------------
    online_softmax_update(S, O, stats, scale_log2);

    cp_async_wait<2 * kStages - 2>();  // V_j has landed
    __syncthreads();

    // ---- O += P · V_j  (P straight from registers as the A operand) ---------
    const T* sVj = sV + (j % kStages) * Bc * kStride;
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[4];  // P[:, 16kk .. 16kk+15]: S tiles 2kk and 2kk+1
      a[0] = pack2<T>(S[2 * kk][0], S[2 * kk][1]);
      a[1] = pack2<T>(S[2 * kk][2], S[2 * kk][3]);
      a[2] = pack2<T>(S[2 * kk + 1][0], S[2 * kk + 1][1]);
      a[3] = pack2<T>(S[2 * kk + 1][2], S[2 * kk + 1][3]);
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        uint32_t b[4];  // V rows 16kk .. 16kk+15, columns 16nd .. 16nd+15, transposed
        ldmatrix_x4_trans(b, sVj + (kk * 16 + lane % 16) * kStride + nd * 16 + (lane / 16) * 8);
        mma_m16n8k16<T>(O[2 * nd], a, b[0], b[1]);
        mma_m16n8k16<T>(O[2 * nd + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with slot j % kStages before it is refilled
  }

  // ---- epilogue: O_i / l_i, LSE; rows past Nq are not written ---------------
  float row_lse[2];
  online_softmax_finalize(O, stats, p.scale, row_lse);
  T* Og = o + head * p.Nq * D;
  const int rows[2] = {row0, row1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= p.Nq) continue;
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(Og + int64_t(rows[r]) * D + n * 8 + 2 * t) =
          pack2<T>(O[n][2 * r], O[n][2 * r + 1]);
    if (t == 0) lse[head * p.Nq + rows[r]] = row_lse[r];
  }
}

template <int kHeadDim, int kStages, typename T>
cudaError_t launch_split_q(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  using Cfg = SplitQConfig<kHeadDim, kStages>;
  auto kernel = split_q_kernel<Cfg, T>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.Nq + Cfg::kBr - 1) / Cfg::kBr, p.H, p.B);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(static_cast<const T*>(b.q), static_cast<const T*>(b.k),
                                                           static_cast<const T*>(b.v), static_cast<T*>(b.o), b.lse, p);
  return cudaGetLastError();
}

template <int kHeadDim, int kStages>
cudaError_t dispatch_dtype(const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
  return p.dtype == DType::kFloat16 ? launch_split_q<kHeadDim, kStages, half>(p, b, s)
                                    : launch_split_q<kHeadDim, kStages, __nv_bfloat16>(p, b, s);
}

template <int kStages>
cudaError_t dispatch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t s) {
  switch (p.D) {
    case 32: return dispatch_dtype<32, kStages>(p, b, s);
    case 64: return dispatch_dtype<64, kStages>(p, b, s);
    case 96: return dispatch_dtype<96, kStages>(p, b, s);
    case 128: return dispatch_dtype<128, kStages>(p, b, s);
    case 256: return dispatch_dtype<256, kStages>(p, b, s);
    default: return cudaErrorInvalidValue;  // unsupported_reason() rejects it first
  }
}

template <int kStages>
int smem_bytes(int D) {
  switch (D) {
    case 32: return SplitQConfig<32, kStages>::kSmemBytes;
    case 64: return SplitQConfig<64, kStages>::kSmemBytes;
    case 96: return SplitQConfig<96, kStages>::kSmemBytes;
    case 128: return SplitQConfig<128, kStages>::kSmemBytes;
    case 256: return SplitQConfig<256, kStages>::kSmemBytes;
    default: return 0;
  }
}

template <int kStages>
std::string unsupported(const AttnProblem& p) {
  if (p.Dv != p.D) return "needs Dv == D";
  if (smem_bytes<kStages>(p.D) == 0) return "head dim " + std::to_string(p.D) + " not in {32, 64, 96, 128, 256}";
  if (p.H > 65535 || p.B > 65535) return "B and H must be <= 65535 (grid limits)";
  const size_t limit = device_smem_optin_bytes();
  if (limit != 0 && size_t(smem_bytes<kStages>(p.D)) > limit)
    return "needs " + std::to_string(smem_bytes<kStages>(p.D)) + " B shared memory, device allows " +
           std::to_string(limit);
  return "";
}

template <typename Cfg>
std::string describe_one() {
  return "D=" + std::to_string(Cfg::kHeadDim) + ": Br=" + std::to_string(Cfg::kBr) +
         " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) +
         " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
}

template <int kStages>
std::string describe() {
  return "stages=" + std::to_string(kStages) + "; " + describe_one<SplitQConfig<32, kStages>>() + "; " +
         describe_one<SplitQConfig<64, kStages>>() + "; " + describe_one<SplitQConfig<96, kStages>>() + "; " +
         describe_one<SplitQConfig<128, kStages>>() + "; " + describe_one<SplitQConfig<256, kStages>>() +
         "; fp16/bf16; causal or not; any Nq, Nk";
}

template <int kStages>
Variant make_variant() {
  Variant v;
  v.name = "split-q+stage" + std::to_string(kStages);
  v.rung = "02_split_q";
  v.unsupported_reason = unsupported<kStages>;
  v.launch = dispatch<kStages>;
  v.describe = describe<kStages>;
  return v;
}

}  // namespace

std::vector<Variant> make_split_q_variants() { return {make_variant<1>(), make_variant<2>()}; }

}  // namespace attnlab
