// attnlab: PyTorch as a peer, in the same process, on the same device buffers.
//
// Built only when CMake finds libtorch (bench/torch_peers.cpp); otherwise
// bench/torch_peers_none.cpp says so and returns no rows.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "../kernels/common/variant.h"

namespace attnlab {

// True when this build links libtorch.
bool have_torch();
std::string torch_version();

// `torch(unfused)`: q @ kᵀ · scale, masked_fill, softmax, @ v (eager PyTorch).
std::vector<Variant> make_torch_unfused_peers();
// `sdpa(flash)` (FlashAttention-2), `sdpa(cudnn)`, `sdpa(efficient)` (memory-
// efficient): torch's SDPA backends, each called directly so a backend that
// cannot run a shape reports torch's own reason.
std::vector<Variant> make_sdpa_peers();

// O_ref and LSE_ref from torch's math SDPA on fp32 copies of the inputs, with an
// explicit bottom-right causal mask (for `--reference torch`).
std::string torch_reference(const AttnProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                            float* lse_ref, cudaStream_t stream);

}  // namespace attnlab
