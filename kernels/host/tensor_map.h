// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the tensor maps that TMA copies through (common/tma.cuh), encoded on
// the host. A CUtensorMap (128 bytes) holds a tensor's shape, strides, box size
// and shared-memory swizzle; a kernel takes it as a __grid_constant__ parameter.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums: types only, nothing is linked against libcuda
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>
#include <string>

#include "host/attn_problem.h"
#include "host/launch.h"

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

// Why a map of `heads` [rows, cols] matrices of elem_bytes-byte elements at
// `base`, row r of head h at base + (h·head_stride + r·row_stride) elements,
// read in boxes of box_cols x box_rows with the 128-byte swizzle, breaks the
// rules of cuTensorMapEncodeTiled ("" when it keeps them; the CUDA driver
// API's reference): the base 16-byte aligned, every stride a multiple of 16
// bytes below 2^40, every dimension in [1, 2^32], box sides in [1, 256], and a
// swizzled box row of exactly 128 bytes here. `what` names the tensor in the
// reason ("dO's row stride 2056 bytes is not a multiple of 16").
inline std::string strided_boxes_rule_broken(const char* what, const void* base, int elem_bytes, int64_t heads,
                                             int64_t rows, int64_t cols, int64_t row_stride, int64_t head_stride,
                                             int box_cols, int box_rows) {
  const std::string name = what;
  const int64_t row_bytes = row_stride * elem_bytes, head_bytes = head_stride * elem_bytes;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return name + "'s base address " + std::to_string(reinterpret_cast<uintptr_t>(base)) +
           " is not 16-byte aligned";
  if (heads < 1 || rows < 1 || cols < 1 || heads > (int64_t(1) << 32) || rows > (int64_t(1) << 32))
    return name + "'s dimensions (" + std::to_string(heads) + " heads of " + std::to_string(rows) + " x " +
           std::to_string(cols) + ") must each be in [1, 2^32]";
  if (row_bytes % 16 != 0)
    return name + "'s row stride " + std::to_string(row_bytes) + " bytes is not a multiple of 16";
  if (row_bytes >= (int64_t(1) << 40))
    return name + "'s row stride " + std::to_string(row_bytes) + " bytes is not below 2^40";
  if (head_bytes % 16 != 0)
    return name + "'s head stride " + std::to_string(head_bytes) + " bytes is not a multiple of 16";
  if (head_bytes >= (int64_t(1) << 40))
    return name + "'s head stride " + std::to_string(head_bytes) + " bytes is not below 2^40";
  if (box_rows < 1 || box_rows > 256 || box_cols < 1 || box_cols > 256 || box_cols * elem_bytes != 128)
    return name + "'s box " + std::to_string(box_cols) + " x " + std::to_string(box_rows) +
           " breaks the 128-byte swizzle's rule (a 128-byte row, sides <= 256)";
  if (cols % box_cols != 0)
    return name + "'s " + std::to_string(cols) + " columns are not whole boxes of " + std::to_string(box_cols);
  return "";
}

// The same for `heads` row-major [rows, cols] matrices stored back to back.
inline std::string head_boxes_rule_broken(const char* what, const void* base, int elem_bytes, int64_t heads,
                                          int64_t rows, int64_t cols, int box_cols, int box_rows) {
  return strided_boxes_rule_broken(what, base, elem_bytes, heads, rows, cols, cols, rows * cols, box_cols, box_rows);
}

// cuTensorMapEncodeTiled is a driver call, and it needs a CUDA context current
// on the calling thread: without one it fails with CUDA_ERROR_INVALID_CONTEXT.
// The runtime makes the device's primary context current lazily, at a
// thread's first runtime call that needs it; a thread whose first CUDA work is
// one of our launches has none yet — torch's autograd thread, say, when the
// caching allocator already holds every tensor a backward needs, so that
// torch made no CUDA call on that thread before ours. cudaSetDevice on the
// current device makes its primary context current (CUDA 12 and newer), as
// the launch that follows the encoding would have. False when it cannot.
inline bool make_device_context_current() {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess && cudaSetDevice(device) == cudaSuccess;
}

// A map of `heads` [rows, cols] matrices, row r of head h at base +
// (h·head_stride + r·row_stride) elements, read (or reduced into) in boxes of
// box_cols x box_rows of one head, with the 128-byte swizzle (box_cols ·
// elem_bytes must be 128). Rows past `rows` are zero-filled on loads and not
// written by reductions. False on failure, with the reason (the broken rule,
// or the driver's error) in launch_detail().
inline bool encode_strided_boxes(CUtensorMap* map, const void* base, CUtensorMapDataType type, int elem_bytes,
                                 int64_t heads, int64_t rows, int cols, int64_t row_stride, int64_t head_stride,
                                 int box_cols, int box_rows, const char* what = "a tensor") {
  const auto encode = tensor_map_encoder();
  if (!encode) return launch_failed(cudaErrorNotSupported, "the driver has no cuTensorMapEncodeTiled"), false;
  if (!make_device_context_current())
    return launch_failed(cudaErrorInvalidDevice, "no CUDA context could be made current for the tensor maps"), false;
  if (std::string why = strided_boxes_rule_broken(what, base, elem_bytes, heads, rows, cols, row_stride,
                                                  head_stride, box_cols, box_rows);
      !why.empty())
    return launch_failed(cudaErrorInvalidValue, "the tensor map of " + why), false;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads)};  // innermost first
  const cuuint64_t strides[2] = {cuuint64_t(row_stride) * elem_bytes, cuuint64_t(head_stride) * elem_bytes};  // bytes
  const cuuint32_t box[3] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, type, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return launch_failed(cudaErrorInvalidValue, std::string("cuTensorMapEncodeTiled refused ") + what +
                                                    "'s map (CUresult " + std::to_string(int(r)) + ")"),
           false;
  return true;
}

// The same for `heads` row-major [rows, cols] matrices stored back to back.
inline bool encode_head_boxes(CUtensorMap* map, const void* base, CUtensorMapDataType type, int elem_bytes,
                              int64_t heads, int rows, int cols, int box_cols, int box_rows,
                              const char* what = "a tensor") {
  return encode_strided_boxes(map, base, type, elem_bytes, heads, rows, cols, cols, int64_t(rows) * cols, box_cols,
                              box_rows, what);
}

// 16-bit elements (Q, K or V of every (batch, head)) in boxes of 64 columns x
// kBoxRows rows: 64 columns are 128 bytes, so a box lands in shared memory
// exactly as one column block of Sw128Blocks<kBoxRows> (common/wgmma.cuh) —
// row r at 128·r bytes, 16-byte chunk c at chunk c ^ (r % 8) — given a
// 1024-byte-aligned destination.
template <int kBoxRows>
inline bool encode_head_tiles(CUtensorMap* map, const void* base, DType dtype, int64_t heads, int rows, int cols,
                              const char* what = "a tensor") {
  return encode_head_boxes(map, base,
                           dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                           2, heads, rows, cols, 64, kBoxRows, what);
}

// 16-bit elements in boxes of 64 columns x kBoxRows rows, as encode_head_tiles,
// over a strided layout: the packed [rows, heads, cols] of a variable-length
// batch (kernels/varlen/) is row_stride = heads·cols, head_stride = cols.
template <int kBoxRows>
inline bool encode_strided_tiles(CUtensorMap* map, const void* base, DType dtype, int64_t heads, int64_t rows,
                                 int cols, int64_t row_stride, int64_t head_stride, const char* what = "a tensor") {
  return encode_strided_boxes(map, base,
                              dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                              2, heads, rows, cols, row_stride, head_stride, 64, kBoxRows, what);
}

// fp32 elements (the dmattn backward's dq_accum) in boxes of 32 columns x
// kBoxRows rows: 32 floats are 128 bytes, the same swizzle span.
template <int kBoxRows>
inline bool encode_f32_head_tiles(CUtensorMap* map, const float* base, int64_t heads, int rows, int cols,
                                  const char* what = "dQ's accumulator") {
  return encode_head_boxes(map, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, heads, rows, cols, 32, kBoxRows, what);
}

// Q, K and V maps of a dense problem: Q in boxes of kQRows rows over its B·H
// heads, K and V of kKVRows over their B·Hkv heads (a block's boxes may start
// at any column).
template <int kQRows, int kKVRows>
inline bool encode_qkv_maps(CUtensorMap (&maps)[3], const AttnProblem& p, const void* q, const void* k,
                            const void* v) {
  const int64_t kv_heads = int64_t(p.B) * p.kv_heads();
  return encode_head_tiles<kQRows>(&maps[0], q, p.dtype, p.heads(), p.Nq, p.D, "Q") &&
         encode_head_tiles<kKVRows>(&maps[1], k, p.dtype, kv_heads, p.Nk, p.D, "K") &&
         encode_head_tiles<kKVRows>(&maps[2], v, p.dtype, kv_heads, p.Nk, p.Dv, "V");
}

}  // namespace attnlab
