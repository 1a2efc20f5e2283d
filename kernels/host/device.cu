// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the device queries of host/device.h.
#include "host/device.h"

#include <cuda_runtime.h>

#include "host/tensor_map.h"

namespace attnlab {

namespace {
// attribute of the current device, or `fallback` when there is none to ask.
int current_device_attribute(cudaDeviceAttr attribute, int fallback) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess)
    return fallback;
  return value;
}

// Built, like every kernel of the library, for the configured architectures:
// the code the device would run for it (sm_90a or PTX of an older one) is the
// code it would run for the Hopper kernels.
__global__ void arch_check_kernel() {}
}  // namespace

int device_sm_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount, 132); }

size_t device_smem_optin_bytes() {
  return size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
}

size_t device_l2_bytes() {
  static const size_t bytes = size_t(current_device_attribute(cudaDevAttrL2CacheSize, 0));
  return bytes;
}

bool device_is_sm90_or_newer() {
  static const bool yes = current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9;
  return yes;
}

std::string hopper_wgmma_unsupported() {
  const int major = current_device_attribute(cudaDevAttrComputeCapabilityMajor, 0);
  if (major == 0) return "no CUDA device";
  if (major != 9) return "needs an sm_90 (Hopper) GPU for wgmma; this one is sm_" + std::to_string(major) + "x";
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, arch_check_kernel) != cudaSuccess || attr.ptxVersion < 90)
    return "this build has no sm_90a code (configure with CMAKE_CUDA_ARCHITECTURES including 90a)";
  return "";
}

std::string hopper_tma_unsupported() {
  std::string reason = hopper_wgmma_unsupported();
  if (reason.empty() && !tensor_map_encoder()) reason = "the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12+)";
  return reason;
}

}  // namespace attnlab
