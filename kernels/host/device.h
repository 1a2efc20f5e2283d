// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: every question the library asks of the GPU, in one place — its
// multiprocessor count, shared-memory opt-in, L2 size and architecture, and
// whether this process can run the Hopper kernels. Each asks the device
// current on the calling thread; where there is none, it answers as its
// comment says (the host-side plans and their CPU tests then see one machine).
#pragma once

#include <cstddef>
#include <string>

namespace attnlab {

// Multiprocessors: 132 (an H200's) when there is no GPU.
int device_sm_count();

// Dynamic shared memory a block may opt into, in bytes: 0 when there is no GPU.
size_t device_smem_optin_bytes();

// The L2 cache, in bytes: 0 when there is no GPU.
size_t device_l2_bytes();

// True on an sm_90 or newer device (programmatic dependent launch, wgmma, TMA).
bool device_is_sm90_or_newer();

// "" when this process can run the wgmma kernels, else the reason a variant
// prints as "unsupported: ...": an sm_90 device, and a binary whose kernels
// were built for sm_90a (an sm_80-only build JIT-compiled for an sm_90 GPU
// would run the empty bodies that the kernels' #if leaves).
std::string hopper_wgmma_unsupported();

// The same for wgmma kernels that copy through TMA: also a driver that
// provides cuTensorMapEncodeTiled (host/tensor_map.h).
std::string hopper_tma_unsupported();

}  // namespace attnlab
