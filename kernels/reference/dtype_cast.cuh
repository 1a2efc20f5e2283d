// attnlab: the 16-bit input dtypes to and from fp32 on the device, for the
// reference kernels (and the rounding that the same-precision paths apply):
// to_float<T>, from_float<T> (round to nearest even) and round_to<T>, x as
// the dtype stores it. float passes through to_float, for kernels that take
// fp32 and 16-bit buffers alike.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace attnlab {

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<half>(half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ half from_float<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// x rounded to T (round to nearest even) and back.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_float<T>(from_float<T>(x)); }

}  // namespace attnlab
