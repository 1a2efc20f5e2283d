// ============================================================================
// Variable-length backward — a packed batch on rung 14's engine
// ============================================================================
// What changes against rung 14 (`bwd-ws`): the same block (producer thread,
// dQ writer warps, two compute warpgroups), mainloop and dQ reduce-add, but
//   NEW (layout): Q, dO, dQ [total_q, H, ·] and K, V, dK, dV [total_k, Hkv, ·]
//        packed, FlashAttention's varlen layout; each read through one
//        strided tensor map (host/tensor_map.h, encode_strided_tiles);
//   NEW (a walk per sequence): an item is one (key tile, KV head) of one
//        sequence, walked as rung 14 walks a dense one (bwd_work on the
//        sequence's own lengths, its masks unchanged); VarlenBwdWork adds
//        where its rows sit — the sequence's first rows in the packed tensors
//        and in the padded statistics, its dK, dV rows — through the engine's
//        layout hooks (hopper/bwd_scheduler.h: bwd_q_row0, bwd_kv_row0,
//        bwd_stats_row0, bwd_dkv_row);
//   NEW (padded rows): LSE·log2e, Δ and dQ's fp32 accumulator hold each
//        sequence in whole query tiles from row (q0 / Br + b)·Br of a head
//        (FlashAttention-3's padded offsets), so that a tile's statistics are
//        one bulk copy and its dQ one bulk reduce-add, as in the dense
//        backward; the pre-pass and dQ's cast (below) map packed rows to them;
//   NEW (order, varlen_prepare.cuh): the key tiles sorted on the device by the
//        query tiles that see them, longest walk first, one block each.
//
// Tiles: rung 14's (BwdWsTile, hopper/bwd_tile.h), checked below:
//   D / Dv     Br   Bc  warpgroups
//   64        128  128   2 + 1
//   128        64  128   2 + 1
//   192 / 128  64  128   2 + 1
// Supports: fp16, bf16; the (D, Dv) above (not D = 256, rung 15's); GQA/MQA;
// sequences of any length, 0 included; causal or not. sm_90a.
// Run: build/test_varlen (the backward cases), python tests/python/test_varlen.py
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/bwd_prepost.cuh"
#include "common/tma.cuh"
#include "hopper/bwd_dq_writer.cuh"
#include "hopper/bwd_host.cuh"
#include "hopper/bwd_kernel.cuh"
#include "hopper/bwd_mainloop.cuh"
#include "hopper/bwd_scheduler.h"
#include "hopper/bwd_tile.h"
#include "host/device.h"
#include "host/rung_host.cuh"
#include "host/tensor_map.h"
#include "varlen/varlen.h"
#include "varlen/varlen_prepare.cuh"
#include "varlen/varlen_schedule.h"

namespace attnlab {

// A key tile's walk in a packed batch: rung 14's walk of the sequence (b = 0:
// its heads are the packed tensors' heads) and where the sequence's rows sit.
struct VarlenBwdWork : BwdWork {
  int q_row0 = 0, kv_row0 = 0;  // the sequence's first rows of Q, dO and of K, V
  int64_t stats_row0 = 0;       // its first padded row of LSE·log2e, Δ, dQ's accumulator
  int len_q = 0, len_k = 0;     // its lengths (len_k = 0: no item, nothing to store)
};
ATTNLAB_HOST_DEVICE inline int bwd_q_row0(const VarlenBwdWork& w) { return w.q_row0; }
ATTNLAB_HOST_DEVICE inline int bwd_kv_row0(const VarlenBwdWork& w) { return w.kv_row0; }
ATTNLAB_HOST_DEVICE inline int64_t bwd_stats_row0(const VarlenBwdWork& w) { return w.stats_row0; }
// dK, dV [total_k, Hkv, ·]: key `key` of the sequence, KV head hk.
ATTNLAB_HOST_DEVICE inline int64_t bwd_dkv_row(const AttnProblem& p, const VarlenBwdWork& w, int key) {
  return (int64_t(w.kv_row0) + key) * p.kv_heads() + w.hk;
}

// Sequence b's first padded row (a multiple of Br): (q0 / Br + b)·Br, which
// leaves every sequence ceil(len_q / Br) whole tiles before the next one's.
ATTNLAB_HOST_DEVICE inline int64_t varlen_padded_row0(int q0, int b, int Br) { return (int64_t(q0) / Br + b) * Br; }
// The padded rows of one head: (total_q / Br + B)·Br.
inline int64_t varlen_padded_rows(int total_q, int B, int Br) { return (int64_t(total_q) / Br + B) * Br; }

namespace {

template <int D, int Dv>
using Config = BwdWsEngineConfig<D, Dv>;

// The header's table.
static_assert(Config<64, 64>::kBr == 128 && Config<64, 64>::kBc == 128 && Config<64, 64>::kThreads == 384,
              "header: D=64");
static_assert(Config<128, 128>::kBr == 64 && Config<128, 128>::kBc == 128 && Config<128, 128>::kThreads == 384,
              "header: D=128");
static_assert(Config<192, 128>::kBr == 64 && Config<192, 128>::kBc == 128 && Config<192, 128>::kThreads == 384,
              "header: D=192, Dv=128");

using VarlenBwdHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<128, 128>, HeadDims<192, 128>>;

// What the kernels read of the batch.
struct VarlenBwdArgs {
  const int* cu_q;
  const int* cu_k;
  int B, total_q, total_k;
  int64_t padded_rows;  // per head
  const VarlenTile* tiles;
  const int* n_items;
};

// The sequence holding query row r (r < total_q): the last b with cu_q[b] <= r.
__device__ __forceinline__ int varlen_row_seq(const int* cu_q, int B, int r) {
  int lo = 0, hi = B - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_q[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// ---- the pre-pass: Δ and LSE·log2e per padded row, the accumulator zeroed ------------
// kLanes lanes per (head, padded row), as bwd_row_stats_kernel (common/bwd_prepost.cuh):
// a padded row that holds no query of its sequence gets LSE·log2e = +inf (P = 0)
// and Δ = 0.
template <typename T, int kLanes, int Br>
__global__ void __launch_bounds__(256)
varlen_bwd_row_stats(const T* __restrict__ o, const T* __restrict__ dout, const float* __restrict__ lse,
                     float* __restrict__ lse2, float* __restrict__ delta, int H, int Dv, VarlenBwdArgs a,
                     float4* __restrict__ zero, int64_t zero_quads) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t z = x; z < zero_quads; z += int64_t(gridDim.x) * blockDim.x) zero[z] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t row = x / kLanes;  // h · padded_rows + r
  const int lane = threadIdx.x % kLanes;
  const bool in_range = row < int64_t(H) * a.padded_rows;
  const int h = int(row / a.padded_rows);
  const int64_t r = row % a.padded_rows;
  // The sequence whose padded rows hold r: the last b with padded_row0(b) <= r.
  int lo = 0, hi = a.B - 1;
  while (in_range && lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (varlen_padded_row0(varlen_seq(a.cu_q, a.cu_k, mid, a.total_q, a.total_k).q0, mid, Br) <= r) lo = mid;
    else hi = mid - 1;
  }
  const VarlenSeq s = varlen_seq(a.cu_q, a.cu_k, lo, a.total_q, a.total_k);
  const int64_t i = r - varlen_padded_row0(s.q0, lo, Br);
  const bool valid = in_range && i < s.len_q;  // (every lane stays for the shuffles)
  float dot = 0.f, lse_i = INFINITY;
  if (valid) {
    const int64_t q = s.q0 + i;
    const int64_t at = (q * H + h) * Dv;
    for (int c = lane * 8; c < Dv; c += kLanes * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + at + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(dout + at + c);
      const T* oe = reinterpret_cast<const T*>(&ov);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += float(oe[e]) * float(de[e]);
    }
    const float l = lse[int64_t(h) * a.total_q + q];
    lse_i = l == -INFINITY ? INFINITY : l * kLog2e;
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (lane == 0 && in_range) {
    delta[row] = valid ? dot : 0.f;
    lse2[row] = lse_i;
  }
}

// ---- dQ's cast: the accumulator's padded tiles to the packed dQ ------------------------
// One thread per 8 columns of a packed row (r, h): 32 contiguous bytes of the
// accumulator's tile layout (dq_tile_offset), one 16-byte store.
template <typename T, int Br>
__global__ void __launch_bounds__(256)
varlen_bwd_dq_convert(const float* __restrict__ acc, T* __restrict__ dq, int H, int D, VarlenBwdArgs a,
                      int64_t octs) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one 8-element group of dq
  if (x >= octs) return;
  const int64_t e = x * 8, row = e / D;  // row = r·H + h
  const int d = int(e % D), h = int(row % H), r = int(row / H);
  const int b = varlen_row_seq(a.cu_q, a.B, r);
  const VarlenSeq s = varlen_seq(a.cu_q, a.cu_k, b, a.total_q, a.total_k);
  const int i = r - s.q0;
  const int64_t tile0 = int64_t(h) * a.padded_rows + varlen_padded_row0(s.q0, b, Br) + i - i % Br;
  const int64_t at = tile0 * D + dq_tile_offset(i % Br, d / 8, 0, Br);
  const float4 lo = *reinterpret_cast<const float4*>(acc + at);
  const float4 hi = *reinterpret_cast<const float4*>(acc + at + 4);
  uint4 out;
  out.x = pack2<T>(lo.x, lo.y);
  out.y = pack2<T>(lo.z, lo.w);
  out.z = pack2<T>(hi.x, hi.y);
  out.w = pack2<T>(hi.z, hi.w);
  *reinterpret_cast<uint4*>(dq + e) = out;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The block's item: (key tile, KV head) of one sequence from the prepared
// order, walked on the sequence's own lengths; past the last item, a walk of
// nothing (no slots, no keys to store).
template <typename Cfg>
__device__ __forceinline__ VarlenBwdWork varlen_bwd_work(const AttnProblem& p, const VarlenBwdArgs& a, int item) {
  VarlenBwdWork w;
  static_cast<BwdWork&>(w) = bwd_work<Cfg::kBr, Cfg::kBc>(varlen_seq_problem(p, VarlenSeq{0, 0, 0, 0}), 0, 0, 0, false);
  if (item >= *a.n_items) return w;
  const int hkv = p.kv_heads();
  const VarlenTile tile = a.tiles[item / hkv];
  const VarlenSeq s = varlen_seq(a.cu_q, a.cu_k, tile.seq, a.total_q, a.total_k);
  static_cast<BwdWork&>(w) = bwd_work<Cfg::kBr, Cfg::kBc>(varlen_seq_problem(p, s), tile.tile, item % hkv, 0, false);
  w.q_row0 = s.q0;
  w.kv_row0 = s.k0;
  w.stats_row0 = varlen_padded_row0(s.q0, tile.seq, Cfg::kBr);
  w.len_q = s.len_q;
  w.len_k = s.len_k;
  return w;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
varlen_bwd_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                  const __grid_constant__ CUtensorMap tma_v, const __grid_constant__ CUtensorMap tma_do,
                  float* __restrict__ dq_accum, const float* __restrict__ lse2, const float* __restrict__ delta,
                  T* __restrict__ dk, T* __restrict__ dv, const AttnProblem p, const VarlenBwdArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int padded = int(a.padded_rows);
  bwd_ws_block_walk<Cfg, T>(
      smem_raw, p, &tma_q, &tma_k, &tma_v, &tma_do, lse2, delta, padded,
      [&] { return varlen_bwd_work<Cfg>(p, a, int(blockIdx.x)); },
      [&](const BwdShared<Cfg, T>& sm, const VarlenBwdWork& w, int writer) {
        bwd_write_dq<Cfg, T, false>(sm, p, w, dq_accum, padded, nullptr, writer);
      },
      [&](const BwdShared<Cfg, T>& sm, const VarlenBwdWork& w) {
        AttnProblem ps = p;  // the sequence's problem: its masks and bounds
        ps.B = 1, ps.Nq = w.len_q, ps.Nk = w.len_k;
        bwd_compute_walk<Cfg, T>(sm, ps, w, BwdCausalScores{ps, ps.scale * kLog2e}, dk, dv);
      });
#endif
}

void tile_of(int D, int Dv, int& Br, int& Bc, int& smem) {
  Br = Bc = smem = 0;
  VarlenBwdHeadDims::dispatch(D, Dv, [&](auto dims) {
    using Cfg = Config<decltype(dims)::D, decltype(dims)::Dv>;
    Br = Cfg::kBr, Bc = Cfg::kBc, smem = Cfg::kSmemBytes;
  });
}

// The workspace's parts: the order, then LSE·log2e, Δ, dQ's accumulator (256-byte aligned each).
struct BwdParts {
  VarlenWorkspace order;
  float *lse2 = nullptr, *delta = nullptr, *dq_accum = nullptr;
  size_t bytes = 0, accum_bytes = 0;
};
BwdParts bwd_parts(const VarlenProblem& vp, int Br, int Bc, void* base) {
  const AttnProblem& p = vp.shape;
  const int64_t rows = varlen_padded_rows(vp.total_q, p.B, Br) * p.H;
  const size_t order = VarlenWorkspace::bytes(p.B, varlen_max_tiles(vp.total_k, p.B, Bc));
  const size_t stats = VarlenWorkspace::align(size_t(rows) * 4);
  BwdParts w;
  w.accum_bytes = VarlenWorkspace::align(size_t(rows) * p.D * 4);
  w.bytes = order + 2 * stats + w.accum_bytes;
  if (base != nullptr) {
    char* at = static_cast<char*>(base);
    w.order = VarlenWorkspace::at(at, p.B);
    w.lse2 = reinterpret_cast<float*>(at + order);
    w.delta = reinterpret_cast<float*>(at + order + stats);
    w.dq_accum = reinterpret_cast<float*>(at + order + 2 * stats);
  }
  return w;
}

}  // namespace

std::string varlen_bwd_unsupported(const VarlenProblem& vp) {
  static const std::string hopper = hopper_tma_unsupported();
  if (!hopper.empty()) return hopper;
  const AttnProblem& p = vp.shape;
  int Br, Bc, smem;
  tile_of(p.D, p.Dv, Br, Bc, smem);
  if (Br == 0) return VarlenBwdHeadDims::not_in(p.D, p.Dv) + " (the variable-length backward runs rung 14's tiles)";
  if (std::string why = kv_heads_unsupported(p); !why.empty()) return why;
  if (p.B < 1 || vp.total_q < 0 || vp.total_k < 0) return "a packed batch needs B >= 1 and row counts >= 0";
  if (varlen_max_tiles(vp.total_k, p.B, Bc) * p.kv_heads() >= (int64_t(1) << 31))
    return "more than 2^31 (key tile, KV head) items";
  if (varlen_padded_rows(vp.total_q, p.B, Br) * p.H >= (int64_t(1) << 31))
    return "more than 2^31 padded query rows over the heads";
  return smem_unsupported(size_t(smem));
}

size_t varlen_bwd_workspace_bytes(const VarlenProblem& vp) {
  int Br, Bc, smem;
  tile_of(vp.shape.D, vp.shape.Dv, Br, Bc, smem);
  return Br == 0 ? 0 : bwd_parts(vp, Br, Bc, nullptr).bytes;
}

cudaError_t varlen_bwd(const VarlenProblem& vp, const VarlenGradBuffers& b, cudaStream_t stream) {
  const AttnProblem& p = vp.shape;
  if (b.workspace == nullptr || b.workspace_bytes < varlen_bwd_workspace_bytes(vp))
    return launch_failed(cudaErrorInvalidValue, "the variable-length backward needs varlen_bwd_workspace_bytes of "
                                                "workspace");
  cudaError_t err = cudaErrorInvalidValue;
  VarlenBwdHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    constexpr int Br = Cfg::kBr, Bc = Cfg::kBc;
    err = dispatch_dtype(p.dtype, [&](auto type) -> cudaError_t {
      using T = decltype(type);
      if (vp.total_q == 0 && vp.total_k == 0) return cudaSuccess;  // nothing to write
      const BwdParts w = bwd_parts(vp, Br, Bc, b.workspace);
      const int hkv = p.kv_heads();
      const VarlenBwdArgs args{b.cu_seqlens_q, b.cu_seqlens_k, p.B, vp.total_q, vp.total_k,
                               varlen_padded_rows(vp.total_q, p.B, Br), w.order.tiles, w.order.n_items};
      // The tensor maps; an empty Q (or K) side is mapped over the other, never read.
      const void* q = vp.total_q > 0 ? b.q : b.k;
      const void* dout = vp.total_q > 0 ? b.dout : b.k;
      const void* k = vp.total_k > 0 ? b.k : b.q;
      const void* v = vp.total_k > 0 ? b.v : b.q;
      const int rows_q = vp.total_q > 0 ? vp.total_q : 1, rows_k = vp.total_k > 0 ? vp.total_k : 1;
      BwdMaps m;
      if (!encode_strided_tiles<Br>(&m.q, q, p.dtype, p.H, rows_q, D, int64_t(p.H) * D, D, "Q") ||
          !encode_strided_tiles<Br>(&m.dout, dout, p.dtype, p.H, rows_q, Dv, int64_t(p.H) * Dv, Dv, "dO") ||
          !encode_strided_tiles<Bc>(&m.k, k, p.dtype, hkv, rows_k, D, int64_t(hkv) * D, D, "K") ||
          !encode_strided_tiles<Bc>(&m.v, v, p.dtype, hkv, rows_k, Dv, int64_t(hkv) * Dv, Dv, "V"))
        return cudaErrorInvalidValue;
      cudaError_t e = launch_kernel(varlen_prepare<VarlenTiles::kKey, Br, Bc>, dim3(1), dim3(kVarlenPrepareThreads),
                                    size_t(0), stream, p, b.cu_seqlens_q, b.cu_seqlens_k, p.B, vp.total_q, vp.total_k,
                                    hkv, w.order);
      if (e != cudaSuccess) return launch_step(e, "the prepare kernel");
      // The pre-pass: the lanes of a row as many as cover Dv in one step of 8 columns, at most a warp.
      const int64_t stat_rows = int64_t(p.H) * args.padded_rows;
      auto row_stats = [&](auto kernel, int lanes) {
        return launch_kernel(kernel, dim3(unsigned((stat_rows * lanes + 255) / 256)), dim3(256), size_t(0), stream,
                             static_cast<const T*>(b.o), static_cast<const T*>(b.dout), b.lse, w.lse2, w.delta, p.H,
                             Dv, args, reinterpret_cast<float4*>(w.dq_accum), int64_t(w.accum_bytes / 16));
      };
      e = Dv <= 64 ? row_stats(varlen_bwd_row_stats<T, 8, Br>, 8) : row_stats(varlen_bwd_row_stats<T, 16, Br>, 16);
      if (e != cudaSuccess) return launch_step(e, "the pre-pass (Δ, LSE·log2e)");
      // One block per (key tile, KV head) item there can be; those past the prepared count store nothing.
      const int64_t blocks = varlen_max_tiles(vp.total_k, p.B, Bc) * hkv;
      e = launch_with_smem(varlen_bwd_kernel<Cfg, T>, dim3(unsigned(blocks)), Cfg::kThreads, Cfg::kSmemBytes, stream,
                           m.q, m.k, m.v, m.dout, w.dq_accum, static_cast<const float*>(w.lse2),
                           static_cast<const float*>(w.delta), static_cast<T*>(b.dk), static_cast<T*>(b.dv), p, args);
      if (e != cudaSuccess) return launch_step(e, "the main kernel");
      if (vp.total_q == 0) return cudaSuccess;
      const int64_t octs = int64_t(vp.total_q) * p.H * D / 8;
      return launch_step(launch_kernel(varlen_bwd_dq_convert<T, Br>, dim3(unsigned((octs + 255) / 256)), dim3(256),
                                       size_t(0), stream, static_cast<const float*>(w.dq_accum),
                                       static_cast<T*>(b.dq), p.H, D, args, octs),
                         "dQ's cast");
    });
  });
  return err;
}

std::string varlen_bwd_describe() {
  std::string s;
  VarlenBwdHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D, Dv = decltype(dims)::Dv;
    using Cfg = Config<D, Dv>;
    s += "D=" + std::to_string(D) + (Dv == D ? "" : " Dv=" + std::to_string(Dv)) + ": Br=" + std::to_string(Cfg::kBr) +
         " Bc=" + std::to_string(Cfg::kBc) + " warps=" + std::to_string(Cfg::kWarps) + " smem=" +
         std::to_string(Cfg::kSmemBytes) + "B\n";
  });
  return s;
}

}  // namespace attnlab
