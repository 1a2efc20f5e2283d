// attnlab: enqueue_gpu_delay (host/gpu_delay.h).
#include "host/gpu_delay.h"

#include <cstdint>

#include "host/launch.h"

namespace attnlab {

namespace {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

}  // namespace

cudaError_t enqueue_gpu_delay(cudaStream_t stream, unsigned microseconds) {
  return launch_kernel(spin_kernel, dim3(1), dim3(1), 0, stream, uint64_t(microseconds) * 1000u);
}

}  // namespace attnlab
