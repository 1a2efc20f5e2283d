// attnlab: the two small kernels around every backward rung's main kernel
// (FlashAttention-2's backward, Dao 2023, Algorithm 2, lines 4 and 22;
// FlashAttention-3's flash_bwd_preprocess / flash_bwd_postprocess kernels).
//
//   before: Δ_i = Σ_d dO_id·O_id in fp32, the row term of dS = P ∘ (dP − Δ),
//           and LSE_i·log2(e), so that the main kernel recomputes P with one
//           ex2: P = exp2(S·scale·log2e − LSE_i·log2e). Both are stored per
//           head padded to Nq_pad rows (whole query tiles): a padding row, or
//           a row that saw no key (LSE = −inf), gets +inf, so its P is 0 and
//           it contributes nothing; its Δ is 0. Rows of a tile are then always
//           in range and 16-byte aligned for a bulk copy.
//           The same pass zeroes dQ's fp32 accumulator.
//   after:  dQ from its fp32 accumulator [B·H, Nq_pad, D] (dQ is summed over
//           the key tiles, each block adding its part) to the input dtype.
//           The accumulator is row-major, or (tile_rows > 0: the Hopper
//           rungs) in tiles of tile_rows rows, each tile in the order a tile
//           is staged in shared memory so that a block adds it by one bulk
//           copy: 8-column groups of tile_rows rows, column c of the tile's
//           row r at (c/8)·tile_rows·8 + 8r + c % 8.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "host/attn_problem.h"
#include "host/launch.h"

namespace attnlab {

// kLanes lanes per padded row (b·H + h, i), 8 columns each per step (16-byte
// loads of O and dO): Δ and LSE·log2e as described above. Dv a multiple of 8.
// The same threads zero `zero` (zero_quads float4s: dQ's accumulator), so that
// its zeroing streams beside the reads instead of as a pass of its own.
template <typename T, int kLanes>
__global__ void __launch_bounds__(256)
bwd_row_stats_kernel(const T* __restrict__ o, const T* __restrict__ dout, const float* __restrict__ lse,
                     float* __restrict__ lse2, float* __restrict__ delta, int Nq, int nq_pad, int Dv,
                     int64_t padded_rows, float4* __restrict__ zero, int64_t zero_quads) {
  static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "a row's lanes inside one warp");
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t z = x; z < zero_quads; z += int64_t(gridDim.x) * blockDim.x) zero[z] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t row = x / kLanes;
  const int lane = threadIdx.x % kLanes;
  const int64_t head = row / nq_pad;
  const int i = int(row % nq_pad);
  const bool valid = row < padded_rows && i < Nq;  // (every lane stays for the shuffles)
  float dot = 0.f, lse_i = INFINITY;
  if (valid) {
    const int64_t at = (head * Nq + i) * Dv;
    for (int c = lane * 8; c < Dv; c += kLanes * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + at + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(dout + at + c);
      const T* oe = reinterpret_cast<const T*>(&ov);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += float(oe[e]) * float(de[e]);
    }
    const float l = lse[head * Nq + i];
    lse_i = l == -INFINITY ? INFINITY : l * kLog2e;
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (lane == 0 && row < padded_rows) {
    delta[row] = valid ? dot : 0.f;
    lse2[row] = lse_i;
  }
}

// The offset of row r, column 8·group + c8 (c8 < 8) inside a tile of
// tile_rows rows in the tile layout above: the Hopper rungs stage dQ in it
// (bwd_stage_dq) and the cast below reads it. (The column comes split so
// that a caller whose columns start on a group boundary pays no division.)
ATTNLAB_HOST_DEVICE constexpr int dq_tile_offset(int r, int group, int c8, int tile_rows) {
  return group * tile_rows * 8 + r * 8 + c8;
}

// dq[head, i, :] = acc[head, i, :] for i < Nq, the accumulator row-major or
// in tiles of tile_rows rows (above); D a multiple of 8. The accumulator
// already holds scale·dS·K. One thread per 8 columns of a row: 32 contiguous
// bytes of the accumulator in either layout, one 16-byte store.
template <typename T>
__global__ void __launch_bounds__(256)
bwd_dq_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq, int Nq, int nq_pad, int D, int tile_rows,
                      int64_t octs) {
  const int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one 8-element group of dq
  if (x >= octs) return;
  const int64_t e = x * 8, row = e / D, head = row / Nq;
  const int d = int(e % D), i = int(row % Nq);
  const int64_t at = tile_rows == 0 ? (head * nq_pad + i) * D + d
                                    : (head * nq_pad + i - i % tile_rows) * D +
                                          dq_tile_offset(i % tile_rows, d / 8, 0, tile_rows);
  const float4 a = *reinterpret_cast<const float4*>(acc + at);
  const float4 c = *reinterpret_cast<const float4*>(acc + at + 4);
  uint4 out;
  out.x = pack2<T>(a.x, a.y);
  out.y = pack2<T>(a.z, a.w);
  out.z = pack2<T>(c.x, c.y);
  out.w = pack2<T>(c.z, c.w);
  *reinterpret_cast<uint4*>(dq + e) = out;
}

// The padded row count of one head: Nq rounded up to whole tiles of kBr rows.
inline int bwd_padded_rows(int Nq, int kBr) { return (Nq + kBr - 1) / kBr * kBr; }

// The pre-pass, zeroing dQ's accumulator (acc_floats of it, a multiple of 4;
// none when acc is nullptr) on the way.
template <typename T>
cudaError_t launch_bwd_row_stats(const AttnProblem& p, const AttnGradBuffers& b, float* lse2, float* delta,
                                 int nq_pad, cudaStream_t stream, float* acc = nullptr, int64_t acc_floats = 0) {
  const int64_t rows = p.heads() * nq_pad;
  auto launch = [&](auto kernel, int lanes) {
    return launch_kernel(kernel, dim3(unsigned((rows * lanes + 255) / 256)), dim3(256), 0, stream,
                         static_cast<const T*>(b.o), static_cast<const T*>(b.dout), b.lse, lse2, delta, p.Nq, nq_pad,
                         p.Dv, rows, reinterpret_cast<float4*>(acc), acc == nullptr ? int64_t(0) : acc_floats / 4);
  };
  // The lanes of a row: as many as cover Dv in one step of 8 columns each, at most a warp.
  if (p.Dv <= 32) return launch(bwd_row_stats_kernel<T, 4>, 4);
  if (p.Dv <= 64) return launch(bwd_row_stats_kernel<T, 8>, 8);
  if (p.Dv <= 128) return launch(bwd_row_stats_kernel<T, 16>, 16);
  return launch(bwd_row_stats_kernel<T, 32>, 32);
}

template <typename T>
cudaError_t launch_bwd_dq_convert(const AttnProblem& p, const float* acc, void* dq, int nq_pad, cudaStream_t stream,
                                  int tile_rows = 0) {
  const int64_t octs = p.q_elems() / 8;
  return launch_kernel(bwd_dq_convert_kernel<T>, dim3(unsigned((octs + 255) / 256)), dim3(256), 0, stream, acc,
                       static_cast<T*>(dq), p.Nq, nq_pad, p.D, tile_rows, octs);
}

}  // namespace attnlab
