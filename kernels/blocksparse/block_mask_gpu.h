// attnlab: the block mask (block_mask.h's format and boundary rule) built on
// the GPU, from a mask_mod or from a dense keep mask, into device arrays that
// the block-sparse kernels read. FlexAttention's create_block_mask evaluates
// the mask_mod on every pair of every block, as this does: the classification
// is exact, not sampled, and equals the CPU reference builders bit for bit.
//
//   1. one CUDA block per (b, h, query block m, key block n) evaluates the
//      mask over the block's in-bounds pairs: empty, partial or full;
//   2. one thread per (b, h, m) lists the partial and the full key blocks in
//      ascending n; one thread per (b, h, n) lists the query blocks that see
//      key block n (the backward's transpose), in ascending m.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "blocksparse/block_mask.h"
#include "blocksparse/mods.h"

namespace attnlab {

// A block mask in device memory: block_mask.h's lists, each array at the
// address below, laid out as BlockMask's vectors.
struct BlockMaskView {
  int B = 0, H = 0, Nq = 0, Nk = 0;
  int block_q = 0, block_kv = 0, m_blocks = 0, n_blocks = 0;
  int32_t *kv_count = nullptr, *kv_index = nullptr, *full_count = nullptr, *full_index = nullptr;
  int32_t *q_count = nullptr, *q_index = nullptr, *full_q_count = nullptr, *full_q_index = nullptr;
  int8_t* kinds = nullptr;  // [B][H][m_blocks][n_blocks] BlockKind, the builder's scratch
};

// Bytes of device memory a block mask of this shape takes (every array and
// the scratch, each 256-byte aligned).
size_t block_mask_device_bytes(int B, int H, int Nq, int Nk, int block_q, int block_kv);
// The view over `base` (block_mask_device_bytes of them) for this shape.
BlockMaskView block_mask_view(void* base, int B, int H, int Nq, int Nk, int block_q, int block_kv);

// Why this shape has no GPU block mask ("" when it has): sizes >= 1, the
// grid's limits (B·H and the block counts <= 65535).
std::string block_mask_gpu_unsupported(int B, int H, int Nq, int Nk, int block_q, int block_kv);

// Why the block-sparse kernels, with tiles of Br x Bc, cannot walk `bm` for
// the problem p ("" when they can): p.causal set (a causal mask is the
// `causal` mask_mod), a mask of another Nq x Nk, B or H neither p's nor 1,
// block sizes that are not multiples of the tile, block counts that do not
// match them. (Which lists a kernel reads, it checks itself.)
std::string block_mask_view_unsupported(const AttnProblem& p, const BlockMaskView& bm, int Br, int Bc);

// The block mask of `mod` into `out` (a document mask_mod's ids in device
// memory). Asynchronous on `stream`.
cudaError_t build_block_mask_from_mod(const MaskMod& mod, const BlockMaskView& out, cudaStream_t stream);
// The block mask of a dense keep mask in device memory, [mask_B][mask_H][Nq][Nk]
// bytes (1 keep, 0 drop; mask_B, mask_H 1 or B, H: broadcast).
cudaError_t build_block_mask_from_dense(const uint8_t* keep, int mask_B, int mask_H, const BlockMaskView& out,
                                        cudaStream_t stream);

// The lists of `view` copied to the host (synchronous).
BlockMask download_block_mask(const BlockMaskView& view);

}  // namespace attnlab
