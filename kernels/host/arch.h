// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: whether this process can run the Hopper kernels. Each check returns
// "" when it can, otherwise the reason a variant prints as "unsupported: ...".
#pragma once

#include <string>

namespace attnlab {

// wgmma kernels: an sm_90 device, and a binary whose kernels were built for
// sm_90a (an sm_80-only build JIT-compiled for an sm_90 GPU would run the
// empty bodies that the kernels' #if leaves).
std::string hopper_wgmma_unsupported();

// wgmma kernels that copy through TMA: the same, and a driver that provides
// cuTensorMapEncodeTiled (host/tensor_map.h).
std::string hopper_tma_unsupported();

}  // namespace attnlab
