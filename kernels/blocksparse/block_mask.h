// attnlab: the block mask — which key blocks each query block visits, and
// which of them need the mask_mod at all. FlexAttention's BlockMask and
// FlashAttention's BlockSparseTensors (flash_attn/cute/block_sparsity.py):
//
//   per (b, h, query block m):  kv_count[m]   partial key blocks, kv_index[m][0 .. kv_count)
//                               full_count[m] full key blocks,    full_index[m][0 .. full_count)
//   the transpose, per (b, h, key block n): q_count / q_index, full_q_count / full_q_index
//   (the backward walks key blocks, each over the query blocks that see it).
//
// Indices ascend within a list; a block is in at most one list.
//
// The boundary rule: a block's pairs outside [0, Nq) x [0, Nk) are not part
// of it. A block is *full* when the mask_mod keeps every pair inside the
// bounds, *empty* when it keeps none (it is in no list), *partial* otherwise.
// So a ragged last block can be full; every kernel applies the sequence
// bounds on every block, full or not (FlashAttention's compute_block_sparsity
// rule; torch's create_block_mask pads with False and calls such a block
// partial, which is also a valid input: partial only costs the mask_mod).
//
// Block sizes: block_q x block_kv, each a multiple of the kernel's tile (a
// 256 x 256 block covers 2 x 2 tiles of 128), not necessarily of the lengths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blocksparse/mods.h"

namespace attnlab {

struct BlockMask {
  int B = 0, H = 0, Nq = 0, Nk = 0;
  int block_q = 0, block_kv = 0;
  int m_blocks = 0, n_blocks = 0;  // ceil(Nq / block_q), ceil(Nk / block_kv)
  // Forward lists: [B][H][m_blocks] counts, [B][H][m_blocks][n_blocks] indices.
  std::vector<int32_t> kv_count, kv_index, full_count, full_index;
  // Backward lists (the transpose): [B][H][n_blocks] and [B][H][n_blocks][m_blocks].
  std::vector<int32_t> q_count, q_index, full_q_count, full_q_index;

  int64_t row(int b, int h, int m) const { return (int64_t(b) * H + h) * m_blocks + m; }
  int64_t col(int b, int h, int n) const { return (int64_t(b) * H + h) * n_blocks + n; }
  // The number of (query, key) pairs inside the bounds of the listed blocks,
  // partial and full (what a kernel that walks the lists computes).
  int64_t visited_pairs() const;
};

enum class BlockKind : int8_t { kEmpty = 0, kPartial = 1, kFull = 2 };

// The block mask of a mask_mod, every pair of every block evaluated (the
// reference builder; the GPU builder must agree with it exactly).
BlockMask block_mask_from_mod(const MaskMod& mod, int B, int H, int Nq, int Nk, int block_q, int block_kv);
// The block mask of a dense keep mask [B][H][Nq][Nk] (1 keep, 0 drop; B or H
// may be 1 and is then broadcast).
BlockMask block_mask_from_dense(const std::vector<uint8_t>& keep, int mask_B, int mask_H, int B, int H, int Nq,
                                int Nk, int block_q, int block_kv);
// The forward lists of a block-kind table [B][H][m_blocks][n_blocks], and the
// backward lists from the forward ones.
BlockMask block_mask_from_kinds(const std::vector<BlockKind>& kinds, int B, int H, int Nq, int Nk, int block_q,
                                int block_kv);
void fill_transpose(BlockMask& bm);
// The kind of block (m, n) of (b, h) as the lists say.
BlockKind listed_kind(const BlockMask& bm, int b, int h, int m, int n);

// Why a block mask given from outside (torch's BlockMask, a user's tensors)
// cannot be used for this problem, or "" when it can: shapes, counts within
// [0, n_blocks], indices in range, ascending, no block in both lists, and
// backward lists that are the transpose of the forward ones.
std::string block_mask_invalid(const BlockMask& bm, int B, int H, int Nq, int Nk);

}  // namespace attnlab
