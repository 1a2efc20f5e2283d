// attnlab: the dynamic-mask forward's gather core for one query row,
// dma_decode_kernel (docs/dmattn_decode.md); its split-KV partials are merged
// by combine_kernel.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/ptx.cuh"
#include "common/softcap.h"
#include "dmattn/dmattn.h"
#include "dmattn/dmattn_mask_scan.cuh"
#include "dmattn/dmattn_tiles.cuh"

namespace attnlab {
namespace {

// With Nq = 1 a 64 x 64 tile holds one real row: the tile kernel above runs
// its whole chain (K, V copy -> S -> softmax -> P·V) per active tile, and a
// top-1024 row of 512K keys leaves ~8 scattered active tiles in every split,
// one chain of latency after the other. Here a block lists the split's
// active *keys* (its row of the mask, kDecodeChunk keys per pass) and copies
// only their K and V rows, up to kDecodeBatch keys per step into shared
// memory (cp.async, the next batch's rows in flight while this one is
// computed): a sparse split is one round trip. Scores on the tensor cores —
// warp w takes keys 16w .. 16w + 15 of the step as mma.m16n8k16 with q as
// row 0 of A and the gathered K rows as B (a warp per key with a butterfly
// sum is slower than the tile kernel on dense masks) — then the online
// softmax per batch and O += p·V with each thread owning D/128 (rounded up)
// output columns. The split-KV partials and the combine are the tile
// kernel's. (The same gather appears in FlashInfer's sparse decode kernels,
// which page K/V by index.)
//   shared memory = 2 slots x 2 x kDecodeBatch x (D + 8) x 2 (K, V) + kDecodeChunk x 2 (list) + scores
//   D:  32 → 37696   64 → 54080   96 → 70464   128 → 86848   192 → 119616   256 → 152384 bytes
constexpr int kDecodeBatch = 64, kDecodeChunk = 8192, kDecodeThreads = 128;
static_assert(kDecodeBatch == 64 && kDecodeBatch == 16 * (kDecodeThreads / 32),
              "the softmax step: two keys per lane of one warp; the scores: 16 keys per warp");
// Gathered rows are padded by 8 halves (16 bytes) so that the ldmatrix of
// the scores' B operand reads eight rows from eight different bank groups.
template <int kHeadDim>
constexpr int dma_decode_smem_bytes() {
  return 2 * 2 * kDecodeBatch * (kHeadDim + 8) * 2 + kDecodeChunk * 2 + 3 * kDecodeBatch * 4 + 16 * 4;
}
static_assert(dma_decode_smem_bytes<32>() == 37696 && dma_decode_smem_bytes<64>() == 54080 &&
                  dma_decode_smem_bytes<128>() == 86848 && dma_decode_smem_bytes<256>() == 152384,
              "header: decode shared memory per head dim");
static_assert(dma_decode_smem_bytes<96>() == 70464 && dma_decode_smem_bytes<192>() == 119616,
              "header: decode shared memory per head dim");

// Step 1 of a chunk [chunk, chunk_end) of the split's keys: its active keys,
// as offsets from chunk in key order, into `list`; returns how many. Each
// thread takes its 64 mask bytes (keys chunk + 64·tid ...): a count, then a
// block-wide exclusive scan of the counts (s_warp: the warps' sums), then the
// offsets. tiles_active counts the 64-key tiles with an active key.
__device__ __forceinline__ int dma_decode_list_keys(const DynamicMaskProblem& p, const uint8_t* mrow,
                                                    const uint32_t* mrow_bits, bool mask_vec, int chunk,
                                                    int chunk_end, uint16_t* list, int* s_warp,
                                                    unsigned long long& tiles_active) {
  constexpr int kWarps = kDecodeThreads / 32;
  constexpr int kKeysPerThread = kDecodeChunk / kDecodeThreads;  // mask bytes a thread lists (one tile)
  static_assert(kKeysPerThread == kDmaBc, "a thread's keys of a chunk are one 64-key tile");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k0 = chunk + threadIdx.x * kKeysPerThread;
  uint64_t nonzero = 0;  // bit i: key k0 + i is active
  if (p.mask_format == DmaMaskFormat::kBits) {
    // The tile's 64 bits are one 8-byte load (k0 is a multiple of 64), the
    // keys at or past chunk_end cut off.
    if (k0 < chunk_end) {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(mrow_bits + k0 / 32));
      const int left = chunk_end - k0;
      nonzero = (uint64_t(x.y) << 32 | x.x) & (left >= 64 ? ~0ull : (uint64_t(1) << left) - 1ull);
    }
  } else {
    uint4 bytes[kKeysPerThread / 16];
#pragma unroll
    for (int c = 0; c < kKeysPerThread / 16; ++c) {
      const int kc = k0 + 16 * c;
      if (mask_vec && kc + 16 <= chunk_end) {
        bytes[c] = __ldg(reinterpret_cast<const uint4*>(mrow + kc));
      } else {
        uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (kc + i < chunk_end) w[i / 4] |= uint32_t(mrow[kc + i] != 0) << (8 * (i % 4));
        bytes[c] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
#pragma unroll
    for (int c = 0; c < kKeysPerThread / 16; ++c) {
      const uint32_t w[4] = {bytes[c].x, bytes[c].y, bytes[c].z, bytes[c].w};
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if ((w[i / 4] >> (8 * (i % 4))) & 0xffu) nonzero |= uint64_t(1) << (16 * c + i);
    }
  }
  const int count = __popcll(nonzero);
  int incl = count;  // inclusive scan over the warp, then over the warps
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int x = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += x;
  }
  if (lane == 31) s_warp[warp] = incl;
  tiles_active += __syncthreads_count(count > 0);
  int base = incl - count, n = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    base += w < warp ? s_warp[w] : 0;
    n += s_warp[w];
  }
  for (uint64_t bits = nonzero; bits != 0; bits &= bits - 1) list[base++] = uint16_t(k0 - chunk + __ffsll(bits) - 1);
  __syncthreads();  // the list is complete
  return n;
}

template <int kHeadDim, typename T>
__global__ void __launch_bounds__(kDecodeThreads, 2)
dma_decode_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                  float* __restrict__ lse, const DynamicMaskProblem p, unsigned long long* counters,
                  float* __restrict__ partials, int splits, bool kv_vec, bool mask_vec) {
  constexpr int D = kHeadDim, kStride = D + 8;
  constexpr int kCols = (D + kDecodeThreads - 1) / kDecodeThreads;  // O columns per thread
  griddep_wait();
  griddep_launch_dependents();

  const int h = blockIdx.x, b = blockIdx.y / splits, split = blockIdx.y % splits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_head = int64_t(b) * p.H + h;
  const int64_t kv_head = int64_t(b) * p.Hkv + h / (p.H / p.Hkv);
  const T* Kg = k + kv_head * p.Nk * D;
  const T* Vg = v + kv_head * p.Nk * D;
  // This split's keys: the tile kernel's partition of the row's causal range
  // into 64-key tiles.
  const int key_limit = mask_scan::causal_key_end(p, 0);
  const SplitTiles my_tiles = dma_split_tiles((key_limit + kDmaBc - 1) / kDmaBc, splits, split);
  const int tile_begin = my_tiles.begin, tile_end = my_tiles.end;
  const int key_begin = tile_begin * kDmaBc, key_end = min(key_limit, tile_end * kDmaBc);

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sKV = reinterpret_cast<T*>(smem_raw);  // [slot][K, V][kDecodeBatch][kStride]
  uint16_t* list = reinterpret_cast<uint16_t*>(smem_raw + 2 * 2 * kDecodeBatch * kStride * sizeof(T));
  float* s_score = reinterpret_cast<float*>(list + kDecodeChunk);
  float* s_bias = s_score + kDecodeBatch;  // [slot][kDecodeBatch]
  int* s_warp = reinterpret_cast<int*>(s_bias + 2 * kDecodeBatch);  // [0, 4): the list's scan
  float* s_stats = reinterpret_cast<float*>(s_warp + 8);             // the batch's max and sum

  const uint8_t* mrow = static_cast<const uint8_t*>(p.mask.data) + p.mask.row_offset(b, h, 0);
  const uint32_t* mrow_bits = static_cast<const uint32_t*>(p.mask.data) + p.mask.row_offset(b, h, 0);  // kBits
  const T* brow = p.bias.data != nullptr ? static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, 0) : nullptr;
  // The scores as mma.m16n8k16 with q as row 0 of A (rows 1-15 zero): lanes
  // 0-3 hold q's pairs (2t, 2t+1) and (2t+8, 2t+9) of every 16-dim k-step,
  // every other A register is zero.
  uint32_t qa[D / 16][2];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // (16-bit loads: Q need not be 4-byte aligned here)
    const uint16_t* qrow = reinterpret_cast<const uint16_t*>(q + q_head * D + kk * 16 + 2 * (lane % 4));
    const bool row0 = lane < 4;
    qa[kk][0] = row0 ? uint32_t(qrow[0]) | uint32_t(qrow[1]) << 16 : 0u;
    qa[kk][1] = row0 ? uint32_t(qrow[8]) | uint32_t(qrow[9]) << 16 : 0u;
  }
  const float softcap = p.softcap, inv_softcap = softcap > 0.f ? 1.f / softcap : 0.f;

  float m = -INFINITY, l = 0.f, acc[kCols] = {};
  unsigned long long tiles_active = 0;
  for (int chunk = key_begin; chunk < key_end; chunk += kDecodeChunk) {
    const int chunk_end = min(key_end, chunk + kDecodeChunk);
    // 1. The chunk's active keys into the list.
    const int n = dma_decode_list_keys(p, mrow, mrow_bits, mask_vec, chunk, chunk_end, list, s_warp, tiles_active);

    // 2. Batches of the listed keys: rows of batch j + 1 copied while j is computed.
    auto issue = [&](int slot, int first, int nb) {
      T* sK = sKV + slot * 2 * kDecodeBatch * kStride;
      T* sV = sK + kDecodeBatch * kStride;
      for (int c = threadIdx.x; c < nb * (D / 8); c += kDecodeThreads) {
        const int j = c / (D / 8), part = c % (D / 8);
        const int64_t key = chunk + list[first + j];
        if (kv_vec) {
          cp_async_16(sK + j * kStride + part * 8, Kg + key * D + part * 8, true);
          cp_async_16(sV + j * kStride + part * 8, Vg + key * D + part * 8, true);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            sK[j * kStride + part * 8 + e] = Kg[key * D + part * 8 + e];
            sV[j * kStride + part * 8 + e] = Vg[key * D + part * 8 + e];
          }
        }
      }
      cp_async_commit();
      if (threadIdx.x < nb)
        s_bias[slot * kDecodeBatch + threadIdx.x] = brow != nullptr ? float(brow[chunk + list[first + threadIdx.x]]) : 0.f;
    };
    if (n > 0) issue(0, 0, min(kDecodeBatch, n));
    for (int first = 0, slot = 0; first < n; first += kDecodeBatch, slot ^= 1) {
      const int nb = min(kDecodeBatch, n - first);
      if (first + kDecodeBatch < n) issue(slot ^ 1, first + kDecodeBatch, min(kDecodeBatch, n - first - kDecodeBatch));
      else cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();  // this batch's rows and biases are in
      const T* sK = sKV + slot * 2 * kDecodeBatch * kStride;
      const T* sV = sK + kDecodeBatch * kStride;
      // Warp w: keys 16w .. 16w + 15 of the step, two n8 tiles, D/16 k-steps;
      // B from the gathered K rows by ldmatrix (lane l: key 16w + 8(l/16) +
      // l%8, dims 16kk + 8((l/8)%2)). Rows past nb hold stale data: their
      // scores (columns of their own) are never stored.
      if (16 * warp < nb) {
        float sc[2][4] = {};
        const T* krow = sK + (16 * warp + (lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t bfrag[4];
          ldmatrix_x4(bfrag, krow + kk * 16);
          const uint32_t a[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
          mma_m16n8k16<T>(sc[0], a, bfrag[0], bfrag[1]);
          mma_m16n8k16<T>(sc[1], a, bfrag[2], bfrag[3]);
        }
        if (lane < 4) {  // row 0: keys 16w + 8n + 2·lane, +1
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = 16 * warp + 8 * n + 2 * lane + e;
              if (j < nb) {
                float s = fmaf(sc[n][e], p.scale, s_bias[slot * kDecodeBatch + j]);
                if (softcap > 0.f) s = apply_softcap(s, softcap, inv_softcap);
                s_score[j] = s;
              }
            }
        }
      }
      __syncthreads();  // the batch's scores
      // Warp 0, two keys per lane: the new running maximum, the batch's
      // probabilities p_j = exp(s_j - m_new) in place of the scores, their sum.
      if (warp == 0) {
        const float s0 = lane < nb ? s_score[lane] : -INFINITY, s1 = lane + 32 < nb ? s_score[lane + 32] : -INFINITY;
        float mx = fmaxf(m, fmaxf(s0, s1));  // finite: every listed key has a finite score
#pragma unroll
        for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float p0 = lane < nb ? expf(s0 - mx) : 0.f, p1 = lane + 32 < nb ? expf(s1 - mx) : 0.f;
        if (lane < nb) s_score[lane] = p0;
        if (lane + 32 < nb) s_score[lane + 32] = p1;
        float sum = p0 + p1;
#pragma unroll
        for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0) {
          s_stats[0] = mx;
          s_stats[1] = sum;
        }
      }
      __syncthreads();
      const float m_new = s_stats[0];
      const float alpha = expf(m - m_new);  // 0 on the first batch (m = -inf)
      l = l * alpha + s_stats[1];
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] *= alpha;
#pragma unroll 4
      for (int j = 0; j < nb; ++j) {
        const float pj = s_score[j];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int d = threadIdx.x + c * kDecodeThreads;
          if (d < D) acc[c] = fmaf(pj, float(sV[j * kStride + d]), acc[c]);
        }
      }
      m = m_new;
      __syncthreads();  // slot and scores are reused by the next batches
    }
  }
  if (counters != nullptr && threadIdx.x == 0) {
    atomicAdd(counters, tiles_active);
    atomicAdd(counters + 1, (unsigned long long)(tile_end - tile_begin));
  }
  // No key seen: O = 0, LSE = -inf (a split's partial likewise; the combine skips it).
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  const float row_lse = l > 0.f ? m + logf(l) : -INFINITY;
  if (splits == 1) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = threadIdx.x + c * kDecodeThreads;
      if (d < D) o[q_head * D + d] = T(acc[c] * inv_l);
    }
    if (threadIdx.x == 0) lse[q_head] = row_lse;
    return;
  }
  const int64_t rows_total = int64_t(p.B) * p.H;  // Nq = 1
  float* part_o = partials + (int64_t(split) * rows_total + q_head) * D;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int d = threadIdx.x + c * kDecodeThreads;
    if (d < D) part_o[d] = acc[c] * inv_l;
  }
  if (threadIdx.x == 0) partials[int64_t(splits) * rows_total * D + int64_t(split) * rows_total + q_head] = row_lse;
}

}  // namespace
}  // namespace attnlab
