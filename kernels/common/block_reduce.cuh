// attnlab: a block-wide max or sum of one float per thread, for the reference
// kernels (one block per query row).
#pragma once

namespace attnlab {

// Every thread of a kWarps-warp block calls it with its value and gets the max
// (is_max) or the sum over the block. `scratch` holds kWarps floats of shared
// memory. Ends with a barrier, so shared memory written before the call is
// visible to every thread after it, and scratch can be reused at once.
template <int kWarps>
__device__ __forceinline__ float block_allreduce(float x, float* scratch, bool is_max) {
  for (int off = 16; off > 0; off /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, off);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

}  // namespace attnlab
