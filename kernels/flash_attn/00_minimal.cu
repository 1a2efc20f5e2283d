// ============================================================================
// Rung 00 — the minimal fused kernel: FlashAttention's loop in plain FP32
// ============================================================================
// What changes against the unfused baseline: S = Q·Kᵀ is never written to
// memory. Each thread owns one query row and walks the keys tile by tile,
// keeping only a running max m, a running sum l and an unnormalised output
// row O (the online softmax of docs/00_online_softmax.md). Every operation is
// an ordinary FP32 multiply-add: no tensor cores, no fragments, no
// asynchronous copies, so the algorithm is all there is to read.
// Where it is slower: everywhere. Each score costs D shared-memory reads and
// D scalar FMAs, where rung 01 uses 16 × 8 × 16 tensor-core MMAs; it is the
// slowest fused rung and exists to be read first.
//
// Per block: Br query rows (one thread each), loop over Bc-key tiles.
//   sQ: [Br, D + 1]  floats, Q · scale · log2(e), loaded once (+1: thread r
//                    reads row r, so the 32 rows of a warp hit 32 banks)
//   sK: [Bc, D]      floats, the current key tile (every thread reads the
//   sV: [Bc, D]      floats,  same element: a broadcast)
//   per thread in registers: s[Bc] scores, o[D], m, l
//
// Tile configuration (constexprs in MinimalConfig, checked below):
//   D     Br   Bc  threads   smem
//   32    64   16     64     12544
//   64    64   16     64     24832
//   96    64   16     64     37120
//  128    64   16     64     49408
//
// Supports: fp16, bf16 in, FP32 math; D = Dv ∈ {32, 64, 96, 128}; GQA/MQA (H a
// multiple of Hkv); any Nq, Nk >= 1; causal (bottom-right aligned) or not;
// writes O and LSE.
//
// Run: build/flash_attn_mma --B 1 --H 8 --N 1024 --D 64 --variant 'minimal' --check --show-all
// ============================================================================

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "common/online_softmax.cuh"
#include "host/attn_problem.h"
#include "host/rung_host.cuh"
#include "host/variant.h"

namespace attnlab {
namespace {

template <int kHeadDim_>
struct MinimalConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBr = 64;               // query rows per block
  static constexpr int kBc = 16;               // keys per tile
  static constexpr int kThreads = kBr;         // one thread per query row
  static constexpr int kQStride = kHeadDim + 1;
  static constexpr int kSmemBytes = (kBr * kQStride + 2 * kBc * kHeadDim) * int(sizeof(float));
  static_assert(kThreads % 32 == 0, "whole warps");
};

// The header table, checked against the code.
static_assert(MinimalConfig<32>::kSmemBytes == 12544, "header: D=32");
static_assert(MinimalConfig<64>::kSmemBytes == 24832, "header: D=64");
static_assert(MinimalConfig<96>::kSmemBytes == 37120, "header: D=96");
static_assert(MinimalConfig<128>::kSmemBytes == 49408, "header: D=128");
static_assert(MinimalConfig<64>::kBr == 64 && MinimalConfig<64>::kBc == 16 && MinimalConfig<64>::kThreads == 64,
              "header: Br, Bc, threads");

template <typename Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads)
    minimal_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O,
                   float* __restrict__ lse, AttnProblem p) {
  constexpr int D = Cfg::kHeadDim, Br = Cfg::kBr, Bc = Cfg::kBc;
  extern __shared__ float smem[];
  float* sQ = smem;                     // [Br, D + 1]
  float* sK = sQ + Br * Cfg::kQStride;  // [Bc, D]
  float* sV = sK + Bc * D;              // [Bc, D]

  const int64_t head = int64_t(blockIdx.z) * p.H + blockIdx.y;
  const int64_t kv_head = p.kv_head(head);  // K, V: the KV head it reads (GQA: shared by H / Hkv heads)
  const T* Qh = Q + head * p.Nq * D;
  const T* Kh = K + kv_head * p.Nk * D;
  const T* Vh = V + kv_head * p.Nk * D;
  const int q0 = blockIdx.x * Br;  // the block's first query row
  const int r = threadIdx.x;       // this thread's row in the block
  const int i = q0 + r;            // ... and in the sequence

  // Q once, scaled so that exp(scale · q·k) = exp2(s): scores in log2 units.
  const float qk_scale = p.scale * kLog2e;
  for (int e = r; e < Br * D; e += Br) {
    const int row = e / D, d = e % D;
    sQ[row * Cfg::kQStride + d] = q0 + row < p.Nq ? float(Qh[int64_t(q0 + row) * D + d]) * qk_scale : 0.f;
  }

  const int my_keys = i < p.Nq ? int(visible_keys(i, p)) : 0;  // keys 0 .. my_keys-1 are visible
  const int block_keys = int(visible_keys(min(q0 + Br, p.Nq) - 1, p));  // the last row sees the most
  float m = -INFINITY;  // running max of this row's scores (log2 units)
  float l = 0.f;        // running sum of exp2(s - m)
  float o[D] = {};      // running sum of exp2(s - m) · v, normalised at the end

  for (int k0 = 0; k0 < block_keys; k0 += Bc) {
    __syncthreads();  // every thread is done with the previous tile (and, first time, sQ is written)
    for (int e = r; e < Bc * D; e += Br) {
      const int64_t key = k0 + e / D;
      sK[e] = key < p.Nk ? float(Kh[key * D + e % D]) : 0.f;
      sV[e] = key < p.Nk ? float(Vh[key * D + e % D]) : 0.f;
    }
    __syncthreads();

    // S_j = q · K_jᵀ for this row; -inf where the key is masked or past Nk.
    float s[Bc];
    float m_new = m;
#pragma unroll
    for (int c = 0; c < Bc; ++c) {
      float acc = 0.f;
#pragma unroll
      for (int d = 0; d < D; ++d) acc += sQ[r * Cfg::kQStride + d] * sK[c * D + d];
      s[c] = k0 + c < my_keys ? acc : -INFINITY;
      m_new = fmaxf(m_new, s[c]);
    }

    // Online softmax: rescale what we have by exp2(m - m_new), then add this tile.
    const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // no visible key yet: p = 0, not NaN
    const float alpha = exp2f(m - m_ref);
    l *= alpha;
#pragma unroll
    for (int d = 0; d < D; ++d) o[d] *= alpha;
#pragma unroll
    for (int c = 0; c < Bc; ++c) {
      const float pc = exp2f(s[c] - m_ref);
      l += pc;
#pragma unroll
      for (int d = 0; d < D; ++d) o[d] += pc * sV[c * D + d];
    }
    m = m_new;
  }

  if (i >= p.Nq) return;
  // O = o / l; LSE = ln(sum exp(scale · q·k)) = (m + log2 l) · ln 2. A row that sees no key: O = 0, LSE = -inf.
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  T* Oh = O + head * p.Nq * D + int64_t(i) * D;
#pragma unroll
  for (int d = 0; d < D; ++d) Oh[d] = T(o[d] * inv_l);
  lse[head * p.Nq + i] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

using MinimalHeadDims = EqualHeadDims<32, 64, 96, 128>;

cudaError_t launch(const AttnProblem& p, const AttnBuffers& b, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;  // unsupported() rejects other head dims first
  MinimalHeadDims::dispatch(p.D, p.Dv, [&](auto dims) {
    err = launch_config<MinimalConfig<decltype(dims)::D>>(p, b, stream, [](auto cfg, auto type) {
      return minimal_kernel<decltype(cfg), decltype(type)>;
    });
  });
  return err;
}

std::string unsupported(const AttnProblem& p) {
  int smem = 0;
  const bool ok = MinimalHeadDims::dispatch(
      p.D, p.Dv, [&](auto dims) { smem = MinimalConfig<decltype(dims)::D>::kSmemBytes; });
  return common_unsupported(p, ok, MinimalHeadDims::names(), size_t(smem));
}

std::string describe() {
  std::string s = "one thread per query row, FP32 FMAs, no tensor cores";
  MinimalHeadDims::for_each([&](auto dims) {
    constexpr int D = decltype(dims)::D;
    using Cfg = MinimalConfig<D>;
    s += "; D=" + std::to_string(D) + ": Br=" + std::to_string(Cfg::kBr) + " Bc=" + std::to_string(Cfg::kBc) +
         " threads=" + std::to_string(Cfg::kThreads) + " smem=" + std::to_string(Cfg::kSmemBytes) + "B";
  });
  return s + "; fp16/bf16; causal or not; GQA/MQA; any Nq, Nk";
}

}  // namespace

std::vector<Variant> make_minimal_variants() {
  Variant v;
  v.name = "minimal";
  v.rung = "00_minimal";
  v.unsupported_reason = unsupported;
  v.launch = launch;
  v.describe = describe;
  return {v};
}

}  // namespace attnlab
