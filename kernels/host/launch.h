// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: how a kernel is launched and what a failed launch says.
//
// launch_kernel returns the launch's own status. The familiar
// `kernel<<<...>>>(...); return cudaGetLastError();` does not: cudaGetLastError
// returns the last error of ANY runtime call in the calling thread that nobody
// read, so a launch that succeeded reports an earlier, unrelated failure — one
// that another library in the process (torch, say) left behind.
//
// A launch that fails for a reason its cudaError_t does not name (a tensor map
// that breaks the hardware's rules, which of several kernels failed) writes
// the reason to launch_detail(); a variant's last_error reads it, and the
// harness and the Python module print it in place of the bare code.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

namespace attnlab {

// kernel<<<grid, block, smem_bytes, stream>>>(args...), through
// cudaLaunchKernelEx: the status of this launch alone (a configuration it
// refuses, or an earlier kernel's sticky fault), never a stale error.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The calling thread's reason for its last failed launch ("" when none was given).
inline std::string& launch_detail() {
  thread_local std::string detail;
  return detail;
}

// Fails a launch with a reason: records it and returns `err`.
inline cudaError_t launch_failed(cudaError_t err, std::string why) {
  launch_detail() = std::move(why);
  return err;
}

// Fails a launch at the step `what` ("the pre-pass", "the main kernel") with
// the CUDA error `err` (success passes through, recording nothing).
inline cudaError_t launch_step(cudaError_t err, const std::string& what) {
  return err == cudaSuccess ? err : launch_failed(err, what + ": " + cudaGetErrorString(err));
}

}  // namespace attnlab
