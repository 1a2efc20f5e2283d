// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the tensor maps that TMA copies through (common/tma.cuh), encoded on
// the host. A CUtensorMap (128 bytes) holds a tensor's shape, strides, box size
// and shared-memory swizzle; a kernel takes it as a __grid_constant__ parameter.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums: types only, nothing is linked against libcuda
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>

#include "host/attn_problem.h"

namespace attnlab {

// cuTensorMapEncodeTiled is a driver API function; fetched through the runtime
// so that nothing links -lcuda. nullptr when the driver does not provide it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A map of `heads` row-major [rows, cols] matrices stored back to back, read
// (or reduced into) in boxes of box_cols x box_rows of one head, with the
// 128-byte swizzle (box_cols · elem_bytes must be 128). Rows past `rows` are
// zero-filled on loads and not written by reductions. False on failure.
inline bool encode_head_boxes(CUtensorMap* map, const void* base, CUtensorMapDataType type, int elem_bytes,
                              int64_t heads, int rows, int cols, int box_cols, int box_rows) {
  const auto encode = tensor_map_encoder();
  if (!encode || (reinterpret_cast<uintptr_t>(base) % 16) != 0 || cols % box_cols != 0) return false;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads)};  // innermost first
  const cuuint64_t strides[2] = {cuuint64_t(cols) * elem_bytes, cuuint64_t(rows) * cols * elem_bytes};  // bytes
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, type, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// 16-bit elements (Q, K or V of every (batch, head)) in boxes of 64 columns x
// kBoxRows rows: 64 columns are 128 bytes, so a box lands in shared memory
// exactly as one column block of Sw128Blocks<kBoxRows> (common/wgmma.cuh) —
// row r at 128·r bytes, 16-byte chunk c at chunk c ^ (r % 8) — given a
// 1024-byte-aligned destination.
template <int kBoxRows>
inline bool encode_head_tiles(CUtensorMap* map, const void* base, DType dtype, int64_t heads, int rows, int cols) {
  return encode_head_boxes(map, base,
                           dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                           2, heads, rows, cols, 64, kBoxRows);
}

// fp32 elements (the dmattn backward's dq_accum) in boxes of 32 columns x
// kBoxRows rows: 32 floats are 128 bytes, the same swizzle span.
template <int kBoxRows>
inline bool encode_f32_head_tiles(CUtensorMap* map, const float* base, int64_t heads, int rows, int cols) {
  return encode_head_boxes(map, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, heads, rows, cols, 32, kBoxRows);
}

// Q, K and V maps of a dense problem: Q in boxes of kQRows rows over its B·H
// heads, K and V of kKVRows over their B·Hkv heads (a block's boxes may start
// at any column).
template <int kQRows, int kKVRows>
inline bool encode_qkv_maps(CUtensorMap (&maps)[3], const AttnProblem& p, const void* q, const void* k,
                            const void* v) {
  const int64_t kv_heads = int64_t(p.B) * p.kv_heads();
  return encode_head_tiles<kQRows>(&maps[0], q, p.dtype, p.heads(), p.Nq, p.D) &&
         encode_head_tiles<kKVRows>(&maps[1], k, p.dtype, kv_heads, p.Nk, p.D) &&
         encode_head_tiles<kKVRows>(&maps[2], v, p.dtype, kv_heads, p.Nk, p.Dv);
}

}  // namespace attnlab
