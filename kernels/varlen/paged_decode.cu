// ============================================================================
// Paged-KV decoding — flash-decoding over a block table, GQA packed into rows
// ============================================================================
// What changes against rung 02 (`split-q+stage2`, whose mma.sync tile code it
// reuses: the Q·Kᵀ slices, the online softmax, P·V from registers):
//   NEW (pack GQA): the g = H / Hkv query heads of one KV head and the Nq new
//        tokens are the rows of one tile, row r = token (r / g), head
//        hk·g + r % g (FlashAttention-3's pack_gqa): at Nq = 1 a tile of one
//        head would be one row in 64; packed, the K and V a block reads serve g
//        rows;
//   NEW (paged K and V): key j of sequence b is row j % page_size of page
//        block_table[b][j / page_size] of the cache. The tile copy looks each
//        key's page up (any page size: a 16-byte chunk never crosses a row);
//   NEW (flash-decoding): a sequence's keys are split over `splits` blocks,
//        each writing its rows' O and LSE in fp32; a second kernel merges them,
//        w_s = exp(LSE_s − max LSE), O = Σ w_s·O_s / Σ w_s (Dao et al., 2023;
//        the merge the dynamic-mask decode and rung 12's stream-K use too).
// Decoding reads each key once per KV head: the kernel is bound by memory,
// and mma.sync (sm_80 and newer) keeps its tensor-core time far below the reads.
//
// Per block: 64 packed rows (4 warps x 16), key tiles of 64 in two stages.
//   D = Dv     rows  Bc  warps  smem (bytes)
//   64          64   64    4     46080
//   128         64   64    4     87040
//   256         64   64    4    168960
// Supports: fp16, bf16; the D above; GQA/MQA; any Nq >= 1 (speculative
// decoding: 1–16), page size and lengths; causal (bottom-right) or not.
// Run: build/test_paged_decode; python: attnlab.decode
// ============================================================================

#include "varlen/paged_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/row_fragments.cuh"
#include "common/smem_layout.cuh"
#include "host/device.h"
#include "host/launch.h"
#include "host/rung_host.cuh"

namespace attnlab {
namespace {

template <int kHeadDim_>
struct DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;  // packed (token, head) rows per block, 16 per warp
  static constexpr int kBc = 64;             // keys per tile
  static constexpr int kStages = 2;
  using Layout = PaddedRows<kHeadDim>;       // +8 halves per row: ldmatrix free of bank conflicts
  static constexpr int kStride = Layout::kStride;
  static constexpr int kSmemBytes = (kRows + 2 * kStages * kBc) * kStride * 2;
  static constexpr int kTilesS = kBc / 8, kTilesO = kHeadDim / 8;
  static_assert(kHeadDim % 16 == 0, "D a multiple of the MMA's K");
};
static_assert(DecodeConfig<64>::kSmemBytes == 46080, "header: D=64");
static_assert(DecodeConfig<128>::kSmemBytes == 87040, "header: D=128");
static_assert(DecodeConfig<256>::kSmemBytes == 168960, "header: D=256");
static_assert(DecodeConfig<128>::kRows == 64 && DecodeConfig<128>::kBc == 64 && DecodeConfig<128>::kWarps == 4,
              "header: 64 rows, 64 keys, 4 warps");

using DecodeHeadDims = EqualHeadDims<64, 128, 256>;

// What the split kernel reads of the cache.
struct DecodeArgs {
  const int* block_table;
  const int* cache_seqlens;
  int page_size, max_pages, num_pages;
  int splits, m_tiles;  // blocks per sequence's keys; row tiles per KV head
};

// Sequence b's keys: cache_seqlens[b], clamped into what its block table holds.
__device__ __forceinline__ int decode_keys(const DecodeArgs& a, int b) {
  const int n = a.cache_seqlens[b], most = a.max_pages * a.page_size;
  return n < 0 ? 0 : (n > most ? most : n);
}

// One block: row tile mt of KV head hk of sequence b, against split s of its keys.
template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
paged_decode_kernel(const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                    float* __restrict__ o_part, float* __restrict__ lse_part, const AttnProblem p, const DecodeArgs a) {
  constexpr int D = Cfg::kHeadDim, Bc = Cfg::kBc, kRows = Cfg::kRows, kStride = Cfg::kStride;
  using Layout = typename Cfg::Layout;
  const int split = blockIdx.x, hk = blockIdx.y / a.m_tiles, mt = blockIdx.y % a.m_tiles, b = blockIdx.z;
  const int g = p.H / p.kv_heads(), rows = g * p.Nq;  // packed rows of this KV head
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
  const int L = decode_keys(a, b);

  // This split's key tiles.
  const int n_tiles = (L + Bc - 1) / Bc, per = (n_tiles + a.splits - 1) / a.splits;
  const int tile0 = split * per, tile1 = min(n_tiles, tile0 + per);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);     // [kRows, kStride]
  T* sK = sQ + kRows * kStride;               // [kStages][Bc, kStride]
  T* sV = sK + Cfg::kStages * Bc * kStride;   // [kStages][Bc, kStride]

  // Packed row r (of this KV head): token r / g, query head hk·g + r % g.
  auto q_row = [&](int r) { return (int64_t(b) * p.Nq + r / g) * p.H + hk * g + r % g; };  // row of q, o
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kRows * kChunks; c += Cfg::kThreads) {
    const int i = c / kChunks, col = (c % kChunks) * 8, r = mt * kRows + i;
    const bool valid = r < rows;
    cp_async_16(sQ + Layout::offset(i, col), valid ? q + q_row(r) * D + col : q, valid);
  }
  // Key tile j's K and V rows, each through its page.
  auto load_kv = [&](int j) {
    T* dk = sK + (j % Cfg::kStages) * Bc * kStride;
    T* dv = sV + (j % Cfg::kStages) * Bc * kStride;
    for (int c = threadIdx.x; c < Bc * kChunks; c += Cfg::kThreads) {
      const int i = c / kChunks, col = (c % kChunks) * 8, key = j * Bc + i;
      const bool valid = key < L;
      int page = valid ? a.block_table[int64_t(b) * a.max_pages + key / a.page_size] : 0;
      page = page < 0 ? 0 : (page >= a.num_pages ? a.num_pages - 1 : page);
      const int64_t row = (int64_t(page) * a.page_size + key % a.page_size) * p.kv_heads() + hk;
      cp_async_16(dk + Layout::offset(i, col), valid ? k_cache + row * D + col : k_cache, valid);
      cp_async_16(dv + Layout::offset(i, col), valid ? v_cache + row * D + col : v_cache, valid);
    }
    cp_async_commit();
  };
  if (tile0 < tile1) load_kv(tile0);
  else cp_async_commit();  // (Q's copies, in a group of their own)

  // The keys each of this thread's two rows sees: causal, token t sees keys up
  // to L − Nq + t; rows past the tile's end see none (and are not stored).
  const int r0 = mt * kRows + warp * 16 + lane / 4, r1 = r0 + 8;
  auto limit = [&](int r) {
    if (r >= rows) return 0;
    return p.causal ? max(0, min(L, L - p.Nq + r / g + 1)) : L;
  };
  const int limit0 = limit(r0), limit1 = limit(r1);

  float O[1][Cfg::kTilesO][4] = {};
  RowStats stats;
  const float scale_log2 = p.scale * kLog2e;
  for (int j = tile0; j < tile1; ++j) {
    if (j + 1 < tile1) load_kv(j + 1);
    else cp_async_commit();
    cp_async_wait<1>();  // tile j (and Q) landed
    __syncthreads();
    const T* sKj = sK + (j % Cfg::kStages) * Bc * kStride;
    float S[1][Cfg::kTilesS][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t frag[1][4];
      load_a_fragment<Layout>(frag[0], sQ, warp * 16, kk * 16, lane);
      qk_slice<T, 1, Cfg::kTilesS, Layout>(S, frag, sKj, kk * 16, lane);
    }
    const int key0 = j * Bc;
    if (key0 + Bc > min(limit0, limit1)) {  // a tile that the causal rule or the end of the keys crosses
#pragma unroll
      for (int n = 0; n < Cfg::kTilesS; ++n) {
        const int key = key0 + n * 8 + 2 * t4;
        if (key >= limit0) S[0][n][0] = -INFINITY;
        if (key + 1 >= limit0) S[0][n][1] = -INFINITY;
        if (key >= limit1) S[0][n][2] = -INFINITY;
        if (key + 1 >= limit1) S[0][n][3] = -INFINITY;
      }
    }
    online_softmax_update(S[0], O[0], stats, scale_log2);
    pv_tile<T, 1, Cfg::kTilesS, Cfg::kTilesO, Layout>(O, S, sV + (j % Cfg::kStages) * Bc * kStride, 0, lane);
    __syncthreads();  // every warp is done with this tile's slot before it is refilled
  }
  cp_async_wait<0>();

  // The split's O (normalised) and LSE, fp32, for the merge.
  float row_lse[2];
  online_softmax_finalize(O[0], stats, p.scale, row_lse);
  const int64_t all_rows = int64_t(p.B) * p.Nq * p.H;
  const int rr[2] = {r0, r1};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rr[h] >= rows) continue;
    const int64_t at = split * all_rows + q_row(rr[h]);
#pragma unroll
    for (int n = 0; n < Cfg::kTilesO; ++n)
      *reinterpret_cast<float2*>(o_part + at * D + n * 8 + 2 * t4) = make_float2(O[0][n][2 * h], O[0][n][2 * h + 1]);
    if (t4 == 0) lse_part[at] = row_lse[h];
  }
}

// The merge: one warp per output row R = (b·Nq + t)·H + h; O [B, Nq, H, Dv]
// in the input dtype, LSE [B, H, Nq].
template <typename T>
__global__ void __launch_bounds__(256)
paged_decode_merge(const float* __restrict__ o_part, const float* __restrict__ lse_part, T* __restrict__ o,
                   float* __restrict__ lse, int64_t all_rows, int splits, int Dv, int H, int Nq) {
  const int R = int((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32);  // all_rows < 2^31 (paged_decode_unsupported)
  const int lane = threadIdx.x % 32;
  if (R >= all_rows) return;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, lse_part[int64_t(s) * all_rows + R]);
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) sum += m == -INFINITY ? 0.f : expf(lse_part[int64_t(s) * all_rows + R] - m);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int c = lane * 2; c < Dv; c += 64) {
    float2 acc = make_float2(0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float l = lse_part[int64_t(s) * all_rows + R];
      if (l == -INFINITY) continue;  // a split that saw no key
      const float w = expf(l - m);
      const float2 x = *reinterpret_cast<const float2*>(o_part + (int64_t(s) * all_rows + R) * Dv + c);
      acc.x += w * x.x;
      acc.y += w * x.y;
    }
    *reinterpret_cast<uint32_t*>(o + int64_t(R) * Dv + c) = pack2<T>(acc.x * inv, acc.y * inv);
  }
  if (lane == 0) {
    const int h = R % H, bt = R / H, b = bt / Nq, t = bt % Nq;
    lse[(int64_t(b) * H + h) * Nq + t] = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
}

int row_tiles(const AttnProblem& p) { return (p.H / p.kv_heads() * p.Nq + 63) / 64; }

}  // namespace

std::string PagedDecodeProblem::shape_string() const {
  const AttnProblem& p = shape;
  std::string s = "decode B=" + std::to_string(p.B) + " Nq=" + std::to_string(p.Nq) + ", pages " +
                  std::to_string(num_pages) + " x " + std::to_string(page_size) + " (table " + std::to_string(p.B) +
                  " x " + std::to_string(max_pages) + "), H=" + std::to_string(p.H);
  if (p.gqa()) s += ", Hkv=" + std::to_string(p.kv_heads());
  s += ", D=" + std::to_string(p.D);
  if (p.Dv != p.D) s += ", Dv=" + std::to_string(p.Dv);
  return s + ", " + dtype_name(p.dtype) + (p.causal ? ", causal" : "");
}

std::string paged_decode_tables_invalid(const PagedDecodeProblem& dp, const std::vector<int>& block_table,
                                        const std::vector<int>& cache_seqlens) {
  const int B = dp.shape.B;
  if (int64_t(block_table.size()) != int64_t(B) * dp.max_pages)
    return "block_table has " + std::to_string(block_table.size()) + " entries, not B x max_pages = " +
           std::to_string(int64_t(B) * dp.max_pages);
  if (int64_t(cache_seqlens.size()) != B)
    return "cache_seqlens has " + std::to_string(cache_seqlens.size()) + " entries, not B = " + std::to_string(B);
  for (int b = 0; b < B; ++b) {
    const int n = cache_seqlens[size_t(b)];
    if (n < 0 || n > dp.max_keys())
      return "cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(n) + " is outside [0, max_pages x page_size = " +
             std::to_string(dp.max_keys()) + "]";
    for (int j = 0; j * dp.page_size < n; ++j) {
      const int page = block_table[size_t(b) * dp.max_pages + j];
      if (page < 0 || page >= dp.num_pages)
        return "block_table[" + std::to_string(b) + "][" + std::to_string(j) + "] = " + std::to_string(page) +
               " is not a page of the cache (0 .. " + std::to_string(dp.num_pages - 1) + ")";
    }
  }
  return "";
}

std::string paged_decode_unsupported(const PagedDecodeProblem& dp) {
  const AttnProblem& p = dp.shape;
  int smem = 0;
  if (!DecodeHeadDims::dispatch(p.D, p.Dv, [&](auto dims) { smem = DecodeConfig<decltype(dims)::D>::kSmemBytes; }))
    return DecodeHeadDims::not_in(p.D, p.Dv);
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  if (p.B < 1 || p.B > 65535) return "B must be in [1, 65535] (the grid)";
  if (p.Nq < 1) return "Nq must be at least 1";
  if (dp.page_size < 1 || dp.max_pages < 1 || dp.num_pages < 1)
    return "the cache needs at least one page of at least one row, and the block table a column";
  if (int64_t(dp.max_pages) * dp.page_size >= (int64_t(1) << 31)) return "max_pages x page_size must be below 2^31";
  if (int64_t(p.kv_heads()) * row_tiles(p) > 65535) return "Hkv x ceil(H / Hkv x Nq / 64) must be <= 65535 (the grid)";
  if (int64_t(p.B) * p.Nq * p.H >= (int64_t(1) << 31) / 32) return "B x Nq x H must be below 2^26 (the merge's warps)";
  return smem_unsupported(size_t(smem));
}

int paged_decode_splits(const PagedDecodeProblem& dp, int sms) {
  // Enough blocks for two per SM, none with fewer than 4 of the longest sequence's key tiles, at most 64.
  const int64_t blocks = int64_t(dp.shape.B) * dp.shape.kv_heads() * row_tiles(dp.shape);
  const int64_t tiles = (int64_t(dp.max_keys()) + 63) / 64;
  int64_t s = (2 * int64_t(sms > 0 ? sms : 132) + blocks - 1) / blocks;
  s = std::min<int64_t>({s, (tiles + 3) / 4, 64});
  return int(std::max<int64_t>(s, 1));
}

size_t paged_decode_workspace_bytes(const PagedDecodeProblem& dp) {
  const AttnProblem& p = dp.shape;
  const size_t rows = size_t(paged_decode_splits(dp, device_sm_count())) * p.B * p.Nq * p.H;
  return (rows * p.Dv * 4 + 255) / 256 * 256 + rows * 4;
}

cudaError_t paged_decode(const PagedDecodeProblem& dp, const PagedDecodeBuffers& b, cudaStream_t stream) {
  const AttnProblem& p = dp.shape;
  if (b.workspace == nullptr || b.workspace_bytes < paged_decode_workspace_bytes(dp))
    return launch_failed(cudaErrorInvalidValue, "paged decoding needs paged_decode_workspace_bytes of workspace");
  const int splits = paged_decode_splits(dp, device_sm_count());
  const int64_t all_rows = int64_t(p.B) * p.Nq * p.H;
  float* o_part = static_cast<float*>(b.workspace);
  float* lse_part = reinterpret_cast<float*>(static_cast<char*>(b.workspace) +
                                             (size_t(splits) * all_rows * p.Dv * 4 + 255) / 256 * 256);
  const DecodeArgs args{b.block_table, b.cache_seqlens, dp.page_size, dp.max_pages, dp.num_pages, splits, row_tiles(p)};
  cudaError_t err = cudaErrorInvalidValue;
  DecodeHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    using Cfg = DecodeConfig<decltype(dims)::D>;
    err = dispatch_dtype(p.dtype, [&](auto type) -> cudaError_t {
      using T = decltype(type);
      const dim3 grid(unsigned(splits), unsigned(p.kv_heads() * args.m_tiles), unsigned(p.B));
      cudaError_t e = launch_with_smem(paged_decode_kernel<Cfg, T>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                                       static_cast<const T*>(b.q), static_cast<const T*>(b.k_cache),
                                       static_cast<const T*>(b.v_cache), o_part, lse_part, p, args);
      if (e != cudaSuccess) return launch_step(e, "the split kernel");
      return launch_step(launch_kernel(paged_decode_merge<T>, dim3(unsigned((all_rows * 32 + 255) / 256)), dim3(256),
                                       size_t(0), stream, static_cast<const float*>(o_part),
                                       static_cast<const float*>(lse_part), static_cast<T*>(b.o), b.lse, all_rows,
                                       splits, p.Dv, p.H, p.Nq),
                         "the merge");
    });
  });
  return err;
}

int64_t paged_decode_pairs_per_head(const PagedDecodeProblem& dp, const std::vector<int>& cache_seqlens) {
  int64_t pairs = 0;
  for (int n : cache_seqlens) {
    AttnProblem s = dp.shape;
    s.B = 1, s.Nk = std::max(0, std::min(n, dp.max_keys()));
    pairs += unmasked_pairs_per_head(s);
  }
  return pairs;
}

std::string paged_decode_describe() {
  std::string s;
  DecodeHeadDims::for_each([&](auto dims) {
    using Cfg = DecodeConfig<decltype(dims)::D>;
    s += "D=" + std::to_string(Cfg::kHeadDim) + ": rows=" + std::to_string(Cfg::kRows) + " (token, head) Bc=" +
         std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) + " smem=" +
         std::to_string(Cfg::kSmemBytes) + "B\n";
  });
  return s + "mma.sync, K and V by cp.async through the block table, split over the keys, merged in fp32";
}

}  // namespace attnlab
