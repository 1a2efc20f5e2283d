// attnlab: a tensor read per (query, key) pair through broadcast strides —
// dmattn's mask and bias (kernels/dmattn/dmattn.h) and the block-sparse
// engine's tensor mask_mod and bias score_mod (kernels/blocksparse/mods.h).
#pragma once

#include <cstdint>
#include <string>

#include "host/attn_problem.h"

namespace attnlab {

// A broadcast operand (mask or bias): its sizes ({B|1}, {H|Hkv|1}, {Nq|1}, Nk)
// and the element strides that follow from storing it densely in that shape.
struct BroadcastOperand {
  const void* data = nullptr;  // nullptr: the operand is absent
  int b = 1, h = 1, q = 1;     // sizes of the first three dims (each full or 1)
  int64_t stride_b = 0, stride_h = 0, stride_q = 0;  // elements; 0 where the size is 1
  int head_group = 1;          // query head h reads operand head h / head_group

  // Element offset of (batch b, query head h, query i, key 0): a broadcast
  // dimension (stride 0) reads its single element.
  ATTNLAB_HOST_DEVICE int64_t row_offset(int b_, int h_, int i_) const {
    return int64_t(b_) * stride_b + int64_t(h_ / head_group) * stride_h + int64_t(i_) * stride_q;
  }

  // Sets sizes and dense strides; `h` must be H, Hkv or 1.
  void set_shape(int b_, int h_, int q_, int Nk, int H);
  int64_t elems(int Nk) const { return int64_t(b) * h * q * Nk; }
  std::string shape_string(int Nk) const;  // "(1, 2, 1, 4096)"
};

}  // namespace attnlab
