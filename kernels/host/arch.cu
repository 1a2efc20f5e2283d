// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the Hopper checks of host/arch.h.
#include "host/arch.h"

#include <cuda_runtime.h>

#include "host/tensor_map.h"

namespace attnlab {

namespace {
// Built, like every kernel of the library, for the configured architectures:
// the code the device would run for it (sm_90a or PTX of an older one) is the
// code it would run for the Hopper kernels.
__global__ void arch_check_kernel() {}
}  // namespace

std::string hopper_wgmma_unsupported() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return "no CUDA device";
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
