// attnlab: dynamic-mask attention — the fp32 GPU references (forward and
// backward), the top-W dynamic mask builder and the bit-packer. All are
// deliberately simple (one block per query row) and follow
// kernels/reference/masked_reference_cpu.cpp exactly.
// Run: build/test_dmattn_reference (against the CPU double reference); the
// harness's --check in the dmattn mode compares the kernels against them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "common/block_reduce.cuh"
#include "dmattn/dmattn.h"
#include "host/device.h"
#include "reference/dtype_cast.cuh"
#include "reference/reference.h"

namespace attnlab {
namespace {


// An operand the kernels can index: sizes full or 1, its head count H, Hkv or 1.
bool operand_ok(const BroadcastOperand& op, const DynamicMaskProblem& p) {
  if (!op.data) return true;
  return (op.b == 1 || op.b == p.B) && (op.h == 1 || op.h == p.H || op.h == p.Hkv) && (op.q == 1 || op.q == p.Nq) &&
         op.head_group >= 1 && (op.h == 1 || op.h * op.head_group == p.H) &&
         (&op != &p.mask || dma_mask_bits_unsupported(p).empty());
}

// Largest dynamic shared memory one block of `kernel` may use on the current
// device, or 0 (with the error cleared) when it cannot be asked.
template <typename Kernel>
size_t max_dynamic_smem(Kernel kernel) {
  const size_t optin = device_smem_optin_bytes();
  cudaFuncAttributes fa{};
  if (optin == 0 || cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return optin > fa.sharedSizeBytes ? optin - fa.sharedSizeBytes : 0;
}

// ---- the fp32 reference ---------------------------------------------------------

constexpr int kRefThreads = 256;
constexpr int kRefWarps = kRefThreads / 32;
constexpr int kRefColsPerThread = kMaxReferenceHeadDim / kRefThreads;  // O columns a thread owns


// One block per query row (grid: Nq, H, B); the row's scores live in dynamic
// shared memory, so one max and one sum cover the row. s_j = scale·q·k_j + bias,
// softcapped, -inf where the mask or the causal rule hides key j (keys past the
// causal limit are never computed). With `low_precision`, s and p are rounded to
// T before use, as an unfused 16-bit implementation would.
template <typename T>
__global__ void __launch_bounds__(kRefThreads)
dma_reference_kernel(const T* q, const T* k, const T* v, float* o, float* lse, DynamicMaskProblem p,
                     AttnProblem dense, bool low_precision) {
  extern __shared__ float s[];  // Nk scores, then probabilities
  __shared__ float q_row[kMaxReferenceHeadDim];
  __shared__ float scratch[kRefWarps];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.H / p.Hkv);
  const int64_t row = (int64_t(b) * p.H + h) * p.Nq + i;
  const T* Q = q + row * p.D;
  const T* K = k + (int64_t(b) * p.Hkv + hk) * p.Nk * p.D;
  const T* V = v + (int64_t(b) * p.Hkv + hk) * p.Nk * p.D;
  const T* bias = p.bias.data ? static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, i) : nullptr;
  for (int d = threadIdx.x; d < p.D; d += kRefThreads) q_row[d] = to_float(Q[d]);
  const int n_keys = int(visible_keys(i, dense));  // the causal rule hides keys >= n_keys
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();

  for (int j = warp; j < n_keys; j += kRefWarps) {  // one warp per key: lanes split D
    float x = -INFINITY;
    if (p.mask_allows(b, h, i, j)) {
      const T* Kj = K + int64_t(j) * p.D;
      float dot = 0.f;
      for (int d = lane; d < p.D; d += 32) dot += q_row[d] * to_float(Kj[d]);
      for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      x = p.scale * dot;
      if (bias) x += to_float(bias[j]);
      if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
      if (low_precision) x = round_to<T>(x);
    }
    if (lane == 0) s[j] = x;
  }
  __syncthreads();

  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < n_keys; j += kRefThreads) local_max = fmaxf(local_max, s[j]);
  const float m = block_allreduce<kRefWarps>(local_max, scratch, true);
  float* O = o + row * p.D;
  if (m == -INFINITY) {  // no visible key (or every score is -inf): O = 0, LSE = -inf
    for (int d = threadIdx.x; d < p.D; d += kRefThreads) O[d] = 0.f;
    if (threadIdx.x == 0) lse[row] = -INFINITY;
    return;
  }
  float local_sum = 0.f;
  for (int j = threadIdx.x; j < n_keys; j += kRefThreads) {
    float pj = expf(s[j] - m);  // 0 for a hidden key
    if (low_precision) pj = round_to<T>(pj);
    s[j] = pj;
    local_sum += pj;
  }
  const float l = block_allreduce<kRefWarps>(local_sum, scratch, false);  // also orders the s[] writes

  float acc[kRefColsPerThread] = {};
  for (int j = 0; j < n_keys; ++j) {
    const float pj = s[j];
    if (pj == 0.f) continue;  // hidden (or underflowed) key: adds nothing
    const T* Vj = V + int64_t(j) * p.D;
#pragma unroll
    for (int c = 0; c < kRefColsPerThread; ++c) {
      const int d = threadIdx.x + c * kRefThreads;
      if (d < p.D) acc[c] += pj * to_float(Vj[d]);
    }
  }
#pragma unroll
  for (int c = 0; c < kRefColsPerThread; ++c) {
    const int d = threadIdx.x + c * kRefThreads;
    if (d < p.D) O[d] = acc[c] / l;
  }
  if (threadIdx.x == 0) lse[row] = m + logf(l);
}

template <typename T>
cudaError_t launch_reference(const DynamicMaskProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                             float* lse_ref, bool low_precision, cudaStream_t stream) {
  const size_t smem = size_t(p.Nk) * sizeof(float);
  cudaError_t err =
      cudaFuncSetAttribute(dma_reference_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(unsigned(p.Nq), unsigned(p.H), unsigned(p.B));
  dma_reference_kernel<T><<<grid, kRefThreads, smem, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                                 static_cast<const T*>(v), o_ref, lse_ref, p,
                                                                 p.dense(), low_precision);
  return cudaGetLastError();
}

// ---- the fp32 reference backward ---------------------------------------------------

// One block per query row (grid: Nq, H, B), shared memory 3·Nk floats (the
// pre-softcap logits, P, dP). With L = Σ O ⊙ dO:
//   dP_j = dO·v_j;  D_i = Σ_j P_j dP_j;  dS_j = P_j (dP_j - D_i) · (1 - tanh²(x_j/c) with softcap)
//   dq_i = scale Σ_j dS_j k_j  (this block);  dk_j += scale dS_j q_i;  dv_j += P_j dO_i;
//   dbias(b, h, i, j) += dS_j   (atomics; a broadcast dimension sums by itself)
// Deliberately simple; the fp32 atomics make the last bits order-dependent.
template <typename T>
__global__ void __launch_bounds__(kRefThreads, 1)
dma_reference_backward_kernel(const T* q, const T* k, const T* v, const T* dout, float* dq, float* dk, float* dv,
                              float* dbias, DynamicMaskProblem p, AttnProblem dense, bool low_precision) {
  // low_precision: S (after bias and softcap), P, dP and dS rounded to the
  // input dtype where an unfused fp16/bf16 backward would store them.
  const auto rounded = [low_precision](float x) { return low_precision ? round_to<T>(x) : x; };
  extern __shared__ float smem[];
  float* pre = smem;           // [Nk] x_j = scale·q·k_j + bias (before softcap)
  float* P = smem + p.Nk;      // [Nk] logits, then probabilities
  float* dP = P + p.Nk;        // [Nk]
  __shared__ float q_row[kMaxReferenceHeadDim], do_row[kMaxReferenceHeadDim], dq_acc[kMaxReferenceHeadDim];
  __shared__ float scratch[kRefWarps];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.H / p.Hkv);
  const int64_t row = (int64_t(b) * p.H + h) * p.Nq + i;
  const int64_t kv_base = (int64_t(b) * p.Hkv + hk) * p.Nk;
  const T* bias = p.bias.data ? static_cast<const T*>(p.bias.data) + p.bias.row_offset(b, h, i) : nullptr;
  float* dbias_row = (dbias && p.bias.data) ? dbias + p.bias.row_offset(b, h, i) : nullptr;
  for (int d = threadIdx.x; d < p.D; d += kRefThreads) {
    q_row[d] = to_float(q[row * p.D + d]);
    do_row[d] = to_float(dout[row * p.D + d]);
    dq_acc[d] = 0.f;
  }
  const int n_keys = int(visible_keys(i, dense));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();

  for (int j = warp; j < n_keys; j += kRefWarps) {
    float x = -INFINITY, sj = -INFINITY;
    if (p.mask_allows(b, h, i, j)) {
      const T* Kj = k + (kv_base + j) * p.D;
      float dot = 0.f;
      for (int d = lane; d < p.D; d += 32) dot += q_row[d] * to_float(Kj[d]);
      for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      x = p.scale * dot + (bias ? to_float(bias[j]) : 0.f);
      sj = rounded(p.softcap > 0.f ? p.softcap * tanhf(x / p.softcap) : x);
    }
    if (lane == 0) {
      pre[j] = x;
      P[j] = sj;
    }
  }
  __syncthreads();
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < n_keys; j += kRefThreads) local_max = fmaxf(local_max, P[j]);
  const float m = block_allreduce<kRefWarps>(local_max, scratch, true);
  if (m == -INFINITY) {  // the row sees no key: it contributes nothing, dq_i = 0
    for (int d = threadIdx.x; d < p.D; d += kRefThreads) dq[row * p.D + d] = 0.f;
    return;
  }
  float local_sum = 0.f;
  for (int j = threadIdx.x; j < n_keys; j += kRefThreads) {
    P[j] = expf(P[j] - m);
    local_sum += P[j];
  }
  const float l = block_allreduce<kRefWarps>(local_sum, scratch, false);
  for (int j = threadIdx.x; j < n_keys; j += kRefThreads) P[j] = rounded(P[j] / l);
  __syncthreads();

  // dP_j and dv_j += P_j dO_i (one warp per key, lanes over D).
  for (int j = warp; j < n_keys; j += kRefWarps) {
    const float pj = P[j];
    float dot = 0.f;
    if (pj != 0.f) {
      const T* Vj = v + (kv_base + j) * p.D;
      for (int d = lane; d < p.D; d += 32) {
        dot += do_row[d] * to_float(Vj[d]);
        atomicAdd(&dv[(kv_base + j) * p.D + d], pj * do_row[d]);
      }
    }
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0) dP[j] = rounded(dot);
  }
  __syncthreads();
  float local_pdp = 0.f;
  for (int j = threadIdx.x; j < n_keys; j += kRefThreads) local_pdp += P[j] * dP[j];
  const float Di = block_allreduce<kRefWarps>(local_pdp, scratch, false);

  // dS_j, then dk_j, dbias_j (atomics) and this row's dq (shared accumulator).
  for (int j = warp; j < n_keys; j += kRefWarps) {
    const float pj = P[j];
    if (pj == 0.f) continue;
    float ds = pj * (dP[j] - Di);
    if (p.softcap > 0.f) {
      const float th = tanhf(pre[j] / p.softcap);
      ds *= 1.f - th * th;
    }
    ds = rounded(ds);
    const T* Kj = k + (kv_base + j) * p.D;
    for (int d = lane; d < p.D; d += 32) {
      atomicAdd(&dk[(kv_base + j) * p.D + d], p.scale * ds * q_row[d]);
      atomicAdd(&dq_acc[d], p.scale * ds * to_float(Kj[d]));
    }
    if (lane == 0 && dbias_row) atomicAdd(&dbias_row[j], ds);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < p.D; d += kRefThreads) dq[row * p.D + d] = dq_acc[d];
}

template <typename T>
cudaError_t launch_reference_backward(const DynamicMaskProblem& p, const void* q, const void* k, const void* v,
                                      const void* dout, float* dq, float* dk, float* dv, float* dbias,
                                      bool low_precision, cudaStream_t stream) {
  const size_t smem = 3 * size_t(p.Nk) * sizeof(float);
  cudaError_t err = cudaFuncSetAttribute(dma_reference_backward_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(unsigned(p.Nq), unsigned(p.H), unsigned(p.B));
  dma_reference_backward_kernel<T><<<grid, kRefThreads, smem, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(dout), dq,
      dk, dv, dbias, p, p.dense(), low_precision);
  return cudaGetLastError();
}

// ---- the top-W mask builder -----------------------------------------------------

constexpr int kTopkThreads = 256;
constexpr int kTopkWarps = kTopkThreads / 32;

// Order-preserving key of a fp16 or bf16 bit pattern (both sign-magnitude):
// a larger value has a larger key; -0 and +0 share one key, as they compare equal.
__device__ __forceinline__ unsigned order_key(uint16_t bits) {
  if ((bits & 0x7FFFu) == 0) bits = 0;
  return (bits & 0x8000u) ? unsigned(uint16_t(~bits)) : unsigned(bits | 0x8000u);
}

__device__ int block_sum(int x, int* scratch) {
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  int r = 0;
  for (int w = 0; w < kTopkWarps; ++w) r += scratch[w];
  __syncthreads();
  return r;
}

// How many threads below this one (in thread order) have `flag` set; *total: how
// many in the whole block.
__device__ int block_exclusive_count(bool flag, int* scratch, int* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) scratch[warp] = __popc(ballot);
  __syncthreads();
  int before = __popc(ballot & ((1u << lane) - 1u)), sum = 0;
  for (int w = 0; w < kTopkWarps; ++w) {
    before += w < warp ? scratch[w] : 0;
    sum += scratch[w];
  }
  __syncthreads();
  *total = sum;
  return before;
}

// One block per (query i, bias head hb, batch b) row (grid: Nq, bias.h, bias.b).
// Keeps the `keep` largest bias values among the causally allowed keys (a prefix
// [0, n_allowed)), ties to the lower index, i.e. the first `keep` of a stable
// descending sort: t = the keep-th largest key, found bit by bit from the top
// (16 counting passes over the row), then every key > t and the lowest-index keys
// == t until `keep` are kept. Then, with block_size > 0, each key block is kept
// whole (its allowed keys) when more than half of its keys were kept, else dropped.
//
// Where the row's order keys live: kKeysInSmem, staged once in shared memory
// (Nk·2 bytes, so Nk up to ~116K on an H200); otherwise recomputed from the bias
// row in global memory on each of the 18 passes (a row of Nk·2 bytes stays in
// L2), so any Nk works. The 0/1 kept flags go straight to the output row, which
// the smoothing then reads back and overwrites block by block.
template <bool kKeysInSmem>
__global__ void __launch_bounds__(kTopkThreads)
topk_mask_kernel(const uint16_t* __restrict__ bias, BroadcastOperand bs, AttnProblem dense, int window,
                 int block_size, uint8_t* out) {
  extern __shared__ uint16_t smem_keys[];  // kKeysInSmem: [n_allowed] order keys
  __shared__ int scratch[kTopkWarps];
  const int i = blockIdx.x, hb = blockIdx.y, b = blockIdx.z, Nk = dense.Nk;
  const uint16_t* brow = bias + int64_t(b) * bs.stride_b + int64_t(hb) * bs.stride_h + int64_t(i) * bs.stride_q;
  uint8_t* orow = out + ((int64_t(b) * bs.h + hb) * dense.Nq + i) * Nk;
  const int n_allowed = int(visible_keys(i, dense));
  const int keep = min(n_allowed, max(window, 0));
  if (keep == 0) {  // nothing kept, so no block has a majority either
    for (int j = threadIdx.x; j < Nk; j += kTopkThreads) orow[j] = 0;
    return;
  }
  if constexpr (kKeysInSmem) {
    for (int j = threadIdx.x; j < n_allowed; j += kTopkThreads) smem_keys[j] = uint16_t(order_key(brow[j]));
    __syncthreads();
  }
  auto key = [&](int j) -> unsigned {  // j < n_allowed
    if constexpr (kKeysInSmem) return smem_keys[j];
    else return order_key(brow[j]);
  };

  // t: the largest key with #(keys >= t) >= keep, i.e. the keep-th largest key.
  unsigned t = 0;
  for (int bit = 15; bit >= 0; --bit) {
    const unsigned cand = t | (1u << bit);
    int n = 0;
    for (int j = threadIdx.x; j < n_allowed; j += kTopkThreads) n += key(j) >= cand ? 1 : 0;
    if (block_sum(n, scratch) >= keep) t = cand;
  }
  int n_greater = 0;
  for (int j = threadIdx.x; j < n_allowed; j += kTopkThreads) n_greater += key(j) > t ? 1 : 0;
  const int keep_equal = keep - block_sum(n_greater, scratch);  // >= 1: keys == t kept, lowest index first

  // Chunks of kTopkThreads keys in index order; each thread writes only its own key.
  int equal_before = 0;
  for (int j0 = 0; j0 < Nk; j0 += kTopkThreads) {
    const int j = j0 + threadIdx.x;
    const unsigned k = j < n_allowed ? key(j) : 0u;
    const bool equal = j < n_allowed && k == t;
    int equal_in_chunk;
    const int rank = equal_before + block_exclusive_count(equal, scratch, &equal_in_chunk);
    const bool kept = (j < n_allowed && k > t) || (equal && rank < keep_equal);
    if (j < Nk) orow[j] = kept ? 1 : 0;  // the final mask, or the flags the smoothing votes on
    equal_before += equal_in_chunk;
  }
  if (block_size <= 0) return;
  __syncthreads();  // every flag written before any key block is counted

  // Block smoothing (block_size <= Nk, clamped by the launcher). Small blocks: a
  // thread per key block; larger ones: a warp per key block. Each key block is
  // read whole before it is overwritten, by the thread or warp that owns it.
  if (block_size < 32) {
    for (int j0 = threadIdx.x * block_size; j0 < Nk; j0 += kTopkThreads * block_size) {
      const int j1 = min(Nk, j0 + block_size);
      int n = 0;
      for (int j = j0; j < j1; ++j) n += orow[j];
      const bool majority = 2 * n > j1 - j0;
      for (int j = j0; j < j1; ++j) orow[j] = majority && j < n_allowed ? 1 : 0;
    }
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t j0 = int64_t(warp) * block_size; j0 < Nk; j0 += int64_t(kTopkWarps) * block_size) {
      const int j1 = int(min(int64_t(Nk), j0 + block_size));
      int n = 0;
      for (int j = int(j0) + lane; j < j1; j += 32) n += orow[j];
      for (int off = 16; off > 0; off /= 2) n += __shfl_xor_sync(0xffffffffu, n, off);  // all lanes have read
      const bool majority = 2 * n > j1 - int(j0);
      for (int j = int(j0) + lane; j < j1; j += 32) orow[j] = majority && j < n_allowed ? 1 : 0;
    }
  }
}

// dma_pack_mask_bits: one thread per output word (32 keys of one row), block
// row blockIdx.x of the byte mask's own (b, h, q) rows; two 16-byte loads
// where the row's bytes are 16-byte aligned, else byte loads. Keys >= Nk
// (the row's padding to whole 64-key tiles) get 0 bits.
__global__ void __launch_bounds__(256)
pack_mask_bits_kernel(const uint8_t* __restrict__ mask, BroadcastOperand m, int Nk, int64_t row_words,
                      uint32_t* __restrict__ out) {
  const int64_t r = blockIdx.x;  // (b, h, q) of the mask's own shape, q fastest
  const int q = int(r % m.q), h = int(r / m.q % m.h), b = int(r / m.q / m.h);
  const int64_t w = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (w >= row_words) return;
  const uint8_t* row = mask + int64_t(b) * m.stride_b + int64_t(h) * m.stride_h + int64_t(q) * m.stride_q;
  const int64_t k0 = 32 * w;
  uint32_t bits = 0u;
  if (k0 + 32 <= Nk && reinterpret_cast<uintptr_t>(row + k0) % 16 == 0) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(row + k0));
    const uint4 hi = __ldg(reinterpret_cast<const uint4*>(row + k0) + 1);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int i = 0; i < 32; ++i) bits |= uint32_t(((words[i / 4] >> (8 * (i % 4))) & 0xffu) != 0u) << i;
  } else {
    for (int i = 0; i < 32 && k0 + i < Nk; ++i) bits |= uint32_t(__ldg(row + k0 + i) != 0) << i;
  }
  out[r * row_words + w] = bits;
}

}  // namespace

cudaError_t dma_pack_mask_bits(const DynamicMaskProblem& p, uint32_t* bits_out, cudaStream_t stream) {
  if (p.mask.data == nullptr) return cudaSuccess;
  if (p.mask_format != DmaMaskFormat::kBytes || bits_out == nullptr || !operand_ok(p.mask, p) || p.Nk < 1 ||
      reinterpret_cast<uintptr_t>(bits_out) % 8 != 0)
    return cudaErrorInvalidValue;
  const int64_t rows = int64_t(p.mask.b) * p.mask.h * p.mask.q, row_words = dma_mask_bit_row_words(p.Nk);
  const int64_t word_blocks = (row_words + 255) / 256;
  if (rows > 2147483647 || word_blocks > 65535) return cudaErrorInvalidValue;
  pack_mask_bits_kernel<<<dim3(unsigned(rows), unsigned(word_blocks)), 256, 0, stream>>>(
      static_cast<const uint8_t*>(p.mask.data), p.mask, p.Nk, row_words, bits_out);
  return cudaGetLastError();
}

int dma_reference_max_nk() {
  return int(max_dynamic_smem(dma_reference_kernel<half>) / sizeof(float));  // both dtypes: the same static smem
}

cudaError_t dma_reference_fp32(const DynamicMaskProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                               float* lse_ref, bool low_precision, cudaStream_t stream) {
  if (p.B < 1 || p.H < 1 || p.Hkv < 1 || p.Nq < 1 || p.Nk < 1 || p.D < 1 || p.H % p.Hkv != 0 ||
      p.D > kMaxReferenceHeadDim || p.H > 65535 || p.B > 65535 || !operand_ok(p.mask, p) || !operand_ok(p.bias, p))
    return cudaErrorInvalidValue;
  if (p.Nk > dma_reference_max_nk()) return cudaErrorInvalidValue;
  if (p.dtype == DType::kFloat16) return launch_reference<half>(p, q, k, v, o_ref, lse_ref, low_precision, stream);
  return launch_reference<__nv_bfloat16>(p, q, k, v, o_ref, lse_ref, low_precision, stream);
}

int dma_reference_backward_max_nk() {
  return int(max_dynamic_smem(dma_reference_backward_kernel<half>) / (3 * sizeof(float)));
}

cudaError_t dma_reference_backward_fp32(const DynamicMaskProblem& p, const void* q, const void* k, const void* v,
                                        const void* dout, float* dq, float* dk, float* dv, float* dbias,
                                        cudaStream_t stream, bool low_precision) {
  if (p.B < 1 || p.H < 1 || p.Hkv < 1 || p.Nq < 1 || p.Nk < 1 || p.D < 1 || p.H % p.Hkv != 0 ||
      p.D > kMaxReferenceHeadDim || p.H > 65535 || p.B > 65535 || !operand_ok(p.mask, p) || !operand_ok(p.bias, p))
    return cudaErrorInvalidValue;
  if (p.Nk > dma_reference_backward_max_nk()) return cudaErrorInvalidValue;
  const size_t q_bytes = size_t(p.B) * p.H * p.Nq * p.D * sizeof(float);
  const size_t kv_bytes = size_t(p.B) * p.Hkv * p.Nk * p.D * sizeof(float);
  cudaError_t err = cudaMemsetAsync(dq, 0, q_bytes, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(dk, 0, kv_bytes, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(dv, 0, kv_bytes, stream);
  if (err == cudaSuccess && dbias && p.bias.data)
    err = cudaMemsetAsync(dbias, 0, size_t(p.bias.elems(p.Nk)) * sizeof(float), stream);
  if (err != cudaSuccess) return err;
  if (p.dtype == DType::kFloat16)
    return launch_reference_backward<half>(p, q, k, v, dout, dq, dk, dv, dbias, low_precision, stream);
  return launch_reference_backward<__nv_bfloat16>(p, q, k, v, dout, dq, dk, dv, dbias, low_precision, stream);
}

cudaError_t dma_build_topk_mask(const DynamicMaskProblem& p, int window, int block_size, uint8_t* mask_out,
                                cudaStream_t stream) {
  const BroadcastOperand& bs = p.bias;
  if (!bs.data || !mask_out || p.Nq < 1 || p.Nk < 1 || bs.b < 1 || bs.h < 1 || bs.b > 65535 || bs.h > 65535 ||
      (bs.q != 1 && bs.q != p.Nq))
    return cudaErrorInvalidValue;
  const dim3 grid(unsigned(p.Nq), unsigned(bs.h), unsigned(bs.b));
  const uint16_t* bias = static_cast<const uint16_t*>(bs.data);
  const int block = std::min(block_size, p.Nk);
  const size_t smem = size_t(p.Nk) * sizeof(uint16_t);  // the row's order keys
  if (smem <= max_dynamic_smem(topk_mask_kernel<true>)) {
    const cudaError_t err =
        cudaFuncSetAttribute(topk_mask_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
    topk_mask_kernel<true><<<grid, kTopkThreads, smem, stream>>>(bias, bs, p.dense(), window, block, mask_out);
  } else {  // too long for shared memory: keys re-read from the bias on every pass
    topk_mask_kernel<false><<<grid, kTopkThreads, 0, stream>>>(bias, bs, p.dense(), window, block, mask_out);
  }
  return cudaGetLastError();
}

}  // namespace attnlab
