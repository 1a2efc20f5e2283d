// attnlab: the GPU block-mask builder (block_mask_gpu.h).
#include "blocksparse/block_mask_gpu.h"

#include <utility>
#include <vector>

#include "host/launch.h"

namespace attnlab {
namespace {

constexpr int kClassifyThreads = 256;  // 8 warps: warp w takes rows w, w + 8, ...; lanes the keys

int ceil_div(int a, int b) { return (a + b - 1) / b; }
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// The keep predicates the classifier evaluates: a mask_mod, a dense mask, or
// a tensor mask_mod's bit-packed words.
struct KeepMod {
  MaskMod mod;
  __device__ bool operator()(int b, int h, int q, int k) const { return mod(b, h, q, k); }
};
struct KeepDense {
  const uint8_t* keep;
  int mask_B, mask_H, Nq, Nk;
  __device__ bool operator()(int b, int h, int q, int k) const {
    const int64_t head = int64_t(mask_B == 1 ? 0 : b) * mask_H + (mask_H == 1 ? 0 : h);
    return keep[(head * Nq + q) * Nk + k] != 0;
  }
};
struct KeepWords {
  MaskMod mod;  // kTensor
};

// The threads' scan of one block's in-bounds pairs (q0 .. q_end - 1 by k0 ..
// k_end - 1), per pair: warp w takes rows w, w + 8, ...; lanes the keys.
template <typename Keep>
__device__ __forceinline__ void scan_block(const Keep& keep, int b, int h, int q0, int q_end, int k0, int k_end,
                                           bool& kept, bool& dropped) {
  for (int q = q0 + int(threadIdx.x) / 32; q < q_end; q += kClassifyThreads / 32)
    for (int k = k0 + int(threadIdx.x) % 32; k < k_end; k += 32) {
      const bool keep_it = keep(b, h, q, k);
      kept |= keep_it;
      dropped |= !keep_it;
    }
}
// kTensor a word at a time: a thread per (row, 32-key word) of the block, the
// word's bits outside k0 .. k_end - 1 left out (32 pairs per load and compare).
__device__ __forceinline__ void scan_block(const KeepWords& keep, int b, int h, int q0, int q_end, int k0, int k_end,
                                           bool& kept, bool& dropped) {
  const uint32_t* bits = static_cast<const uint32_t*>(keep.mod.bits.data);
  const int w0 = k0 >> 5, words = ((k_end - 1) >> 5) - w0 + 1;
  for (int item = int(threadIdx.x); item < (q_end - q0) * words; item += kClassifyThreads) {
    const int q = q0 + item / words, w = w0 + item % words;
    const int lo = max(k0 - 32 * w, 0), hi = min(k_end - 32 * w, 32);  // the block's bits of word w
    const uint32_t in_block = (hi == 32 ? ~0u : (1u << hi) - 1u) & ~((1u << lo) - 1u);
    const uint32_t word = bits[keep.mod.bits.row_offset(b, h, q) + w];
    kept |= (word & in_block) != 0u;
    dropped |= (~word & in_block) != 0u;
  }
}

// Block (n, m, b·H + h): the kind of key block n of query block m, from every
// pair inside the sequence bounds (the boundary rule of block_mask.h).
template <typename Keep>
__global__ void __launch_bounds__(kClassifyThreads) classify_kernel(Keep keep, BlockMaskView bm) {
  const int n = blockIdx.x, m = blockIdx.y, bh = blockIdx.z;
  const int b = bh / bm.H, h = bh % bm.H;
  const int q0 = m * bm.block_q, k0 = n * bm.block_kv;
  const int q_end = min(bm.Nq, q0 + bm.block_q), k_end = min(bm.Nk, k0 + bm.block_kv);
  bool kept = false, dropped = false;
  scan_block(keep, b, h, q0, q_end, k0, k_end, kept, dropped);
  const int any_kept = __syncthreads_or(kept), any_dropped = __syncthreads_or(dropped);
  if (threadIdx.x == 0)
    bm.kinds[(int64_t(bh) * bm.m_blocks + m) * bm.n_blocks + n] =
        int8_t(!any_kept ? BlockKind::kEmpty : any_dropped ? BlockKind::kPartial : BlockKind::kFull);
}

// One thread per (b, h, m): its partial and full key blocks, ascending.
__global__ void rows_kernel(BlockMaskView bm) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= int64_t(bm.B) * bm.H * bm.m_blocks) return;
  int partial = 0, full = 0;
  for (int n = 0; n < bm.n_blocks; ++n) {
    const int8_t kind = bm.kinds[r * bm.n_blocks + n];
    if (kind == int8_t(BlockKind::kPartial)) bm.kv_index[r * bm.n_blocks + partial++] = n;
    if (kind == int8_t(BlockKind::kFull)) bm.full_index[r * bm.n_blocks + full++] = n;
  }
  bm.kv_count[r] = partial;
  bm.full_count[r] = full;
}

// One thread per (b, h, n): the query blocks that see key block n, ascending.
__global__ void columns_kernel(BlockMaskView bm) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= int64_t(bm.B) * bm.H * bm.n_blocks) return;
  const int64_t bh = c / bm.n_blocks;
  const int n = int(c % bm.n_blocks);
  int partial = 0, full = 0;
  for (int m = 0; m < bm.m_blocks; ++m) {
    const int8_t kind = bm.kinds[(bh * bm.m_blocks + m) * bm.n_blocks + n];
    if (kind == int8_t(BlockKind::kPartial)) bm.q_index[c * bm.m_blocks + partial++] = m;
    if (kind == int8_t(BlockKind::kFull)) bm.full_q_index[c * bm.m_blocks + full++] = m;
  }
  bm.q_count[c] = partial;
  bm.full_q_count[c] = full;
}

template <typename Keep>
cudaError_t build(const Keep& keep, const BlockMaskView& bm, cudaStream_t stream) {
  if (!block_mask_gpu_unsupported(bm.B, bm.H, bm.Nq, bm.Nk, bm.block_q, bm.block_kv).empty())
    return cudaErrorInvalidValue;
  const int64_t rows = int64_t(bm.B) * bm.H * bm.m_blocks, cols = int64_t(bm.B) * bm.H * bm.n_blocks;
  // The index slots past each count are zero, as in the CPU builders.
  for (auto [at, count] : {std::pair{bm.kv_index, rows * bm.n_blocks}, std::pair{bm.full_index, rows * bm.n_blocks},
                           std::pair{bm.q_index, cols * bm.m_blocks}, std::pair{bm.full_q_index, cols * bm.m_blocks}})
    if (cudaError_t e = cudaMemsetAsync(at, 0, size_t(count) * 4, stream); e != cudaSuccess) return e;
  const dim3 grid(unsigned(bm.n_blocks), unsigned(bm.m_blocks), unsigned(bm.B * bm.H));
  if (cudaError_t e = launch_kernel(classify_kernel<Keep>, grid, dim3(kClassifyThreads), 0, stream, keep, bm); e != cudaSuccess)
    return e;
  if (cudaError_t e = launch_kernel(rows_kernel, dim3(unsigned((rows + 127) / 128)), dim3(128), 0, stream, bm);
      e != cudaSuccess)
    return e;
  return launch_kernel(columns_kernel, dim3(unsigned((cols + 127) / 128)), dim3(128), 0, stream, bm);
}

}  // namespace

size_t block_mask_device_bytes(int B, int H, int Nq, int Nk, int block_q, int block_kv) {
  const size_t heads = size_t(B) * H, m = size_t(ceil_div(Nq, block_q)), n = size_t(ceil_div(Nk, block_kv));
  const size_t rows = heads * m, cols = heads * n;
  return 2 * align256(rows * 4) + 2 * align256(rows * n * 4) + 2 * align256(cols * 4) + 2 * align256(cols * m * 4) +
         align256(rows * n);
}

BlockMaskView block_mask_view(void* base, int B, int H, int Nq, int Nk, int block_q, int block_kv) {
  BlockMaskView v;
  v.B = B, v.H = H, v.Nq = Nq, v.Nk = Nk, v.block_q = block_q, v.block_kv = block_kv;
  v.m_blocks = ceil_div(Nq, block_q);
  v.n_blocks = ceil_div(Nk, block_kv);
  const size_t rows = size_t(B) * H * v.m_blocks, cols = size_t(B) * H * v.n_blocks;
  char* at = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* p = at;
    at += align256(bytes);
    return p;
  };
  v.kv_count = reinterpret_cast<int32_t*>(take(rows * 4));
  v.full_count = reinterpret_cast<int32_t*>(take(rows * 4));
  v.kv_index = reinterpret_cast<int32_t*>(take(rows * v.n_blocks * 4));
  v.full_index = reinterpret_cast<int32_t*>(take(rows * v.n_blocks * 4));
  v.q_count = reinterpret_cast<int32_t*>(take(cols * 4));
  v.full_q_count = reinterpret_cast<int32_t*>(take(cols * 4));
  v.q_index = reinterpret_cast<int32_t*>(take(cols * v.m_blocks * 4));
  v.full_q_index = reinterpret_cast<int32_t*>(take(cols * v.m_blocks * 4));
  v.kinds = reinterpret_cast<int8_t*>(take(rows * v.n_blocks));
  return v;
}

std::string block_mask_view_unsupported(const AttnProblem& p, const BlockMaskView& bm, int Br, int Bc) {
  if (p.causal) return "p.causal is set: a causal mask is the `causal` mask_mod and its block mask here";
  if (bm.Nq != p.Nq || bm.Nk != p.Nk)
    return "block mask for Nq x Nk = " + std::to_string(bm.Nq) + " x " + std::to_string(bm.Nk) + ", problem " +
           std::to_string(p.Nq) + " x " + std::to_string(p.Nk);
  if ((bm.B != 1 && bm.B != p.B) || (bm.H != 1 && bm.H != p.H))
    return "block mask for B, H = " + std::to_string(bm.B) + ", " + std::to_string(bm.H) + ": must be the problem's or 1";
  if (bm.block_q <= 0 || bm.block_kv <= 0 || bm.block_q % Br != 0 || bm.block_kv % Bc != 0)
    return "block size " + std::to_string(bm.block_q) + " x " + std::to_string(bm.block_kv) +
           " is not a multiple of the kernel tile " + std::to_string(Br) + " x " + std::to_string(Bc);
  if (bm.m_blocks != (p.Nq + bm.block_q - 1) / bm.block_q || bm.n_blocks != (p.Nk + bm.block_kv - 1) / bm.block_kv)
    return "block mask's block counts do not match its block sizes";
  return "";
}

std::string block_mask_gpu_unsupported(int B, int H, int Nq, int Nk, int block_q, int block_kv) {
  if (B < 1 || H < 1 || Nq < 1 || Nk < 1 || block_q < 1 || block_kv < 1)
    return "B, H, Nq, Nk and the block sizes must be >= 1";
  if (int64_t(B) * H > 65535 || ceil_div(Nq, block_q) > 65535)
    return "B·H and the query blocks must be <= 65535 (the builder's grid)";
  return "";
}

cudaError_t build_block_mask_from_mod(const MaskMod& mod, const BlockMaskView& out, cudaStream_t stream) {
  if (mod.kind == MaskModKind::kTensor) return build(KeepWords{mod}, out, stream);
  return build(KeepMod{mod}, out, stream);
}

cudaError_t build_block_mask_from_dense(const uint8_t* keep, int mask_B, int mask_H, const BlockMaskView& out,
                                        cudaStream_t stream) {
  if ((mask_B != 1 && mask_B != out.B) || (mask_H != 1 && mask_H != out.H)) return cudaErrorInvalidValue;
  return build(KeepDense{keep, mask_B, mask_H, out.Nq, out.Nk}, out, stream);
}

BlockMask download_block_mask(const BlockMaskView& view) {
  BlockMask bm;
  bm.B = view.B, bm.H = view.H, bm.Nq = view.Nq, bm.Nk = view.Nk;
  bm.block_q = view.block_q, bm.block_kv = view.block_kv, bm.m_blocks = view.m_blocks, bm.n_blocks = view.n_blocks;
  const size_t rows = size_t(bm.B) * bm.H * bm.m_blocks, cols = size_t(bm.B) * bm.H * bm.n_blocks;
  auto get = [](std::vector<int32_t>& dst, const int32_t* src, size_t n) {
    dst.resize(n);
    cudaMemcpy(dst.data(), src, n * 4, cudaMemcpyDeviceToHost);
  };
  get(bm.kv_count, view.kv_count, rows);
  get(bm.full_count, view.full_count, rows);
  get(bm.kv_index, view.kv_index, rows * bm.n_blocks);
  get(bm.full_index, view.full_index, rows * bm.n_blocks);
  get(bm.q_count, view.q_count, cols);
  get(bm.full_q_count, view.full_q_count, cols);
  get(bm.q_index, view.q_index, cols * bm.m_blocks);
  get(bm.full_q_index, view.full_q_index, cols * bm.m_blocks);
  return bm;
}

}  // namespace attnlab
