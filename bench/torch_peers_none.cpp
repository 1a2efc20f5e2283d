// attnlab: the torch peers in a build without libtorch.
#include "torch_peers.h"

namespace attnlab {

bool have_torch() { return false; }
std::string torch_version() { return "none"; }
std::vector<Variant> make_torch_unfused_peers() { return {}; }
std::vector<Variant> make_sdpa_peers() { return {}; }
std::vector<BwdVariant> make_torch_unfused_backward_peers() { return {}; }
std::vector<BwdVariant> make_sdpa_backward_peers() { return {}; }
std::string torch_reference(const AttnProblem&, const void*, const void*, const void*, float*, float*, cudaStream_t) {
  return "this build has no torch";
}

std::vector<MaskedTorchPeer> make_masked_torch_peers(const DynamicMaskProblem&, const void*, const void*,
                                                     const void*, std::string* setup_error, const void*,
                                                     bool) {
  *setup_error = "this build has no torch";
  return {};
}

}  // namespace attnlab
