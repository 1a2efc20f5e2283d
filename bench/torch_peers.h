// attnlab: PyTorch as a peer, in the same process, on the same device buffers.
//
// Built only when CMake finds libtorch (bench/torch_peers.cpp); otherwise
// bench/torch_peers_none.cpp says so and returns no rows.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "dmattn/dmattn.h"
#include "host/variant.h"

namespace attnlab {

// True when this build links libtorch.
bool have_torch();
std::string torch_version();

// `torch(unfused)`: q @ kᵀ · scale, masked_fill, softmax, @ v (eager PyTorch;
// GQA: k and v repeated to H heads in the timed call).
std::vector<Variant> make_torch_unfused_peers();
// `sdpa(flash)` (FlashAttention-2), `sdpa(cudnn)`, `sdpa(efficient)` (memory-
// efficient): torch's SDPA backends, each called directly so a backend that
// cannot run a shape reports torch's own reason (GQA: K and V of Hkv heads,
// as SDPA's enable_gqa=True passes them).
std::vector<Variant> make_sdpa_peers();

// The backward peers, rows "<name> bwd" of the dense backward (flash_attn_mma
// --bwd): torch's autograd on the same Q, K, V and dO, without a mask.
// `torch(unfused)`: eager matmul, softmax, matmul (causal: our bottom-right
// rule by masked_fill). `sdpa(flash)`, `sdpa(cudnn)`, `sdpa(efficient)`: the
// backends called directly, causal by torch's flag, which is aligned top-left:
// a causal row with Nq != Nk is unsupported, never given a mask. GQA: K and V
// repeated to H heads inside the graph, so that their gradients sum over the
// group. `launch` builds the forward graph (when the buffers or the problem
// changed since its last call), runs one backward and copies dQ, dK, dV into
// the buffers; `launch_timed` is the backward alone through that graph
// (retain_graph; the gradients set to none first, as zero_grad does).
std::vector<BwdVariant> make_torch_unfused_backward_peers();
std::vector<BwdVariant> make_sdpa_backward_peers();

// O_ref and LSE_ref from torch's math SDPA on fp32 copies of the inputs (K and
// V repeated to H heads for GQA), with an explicit bottom-right causal mask
// (for `--reference torch`).
std::string torch_reference(const AttnProblem& p, const void* q, const void* k, const void* v, float* o_ref,
                            float* lse_ref, cudaStream_t stream);

// Torch on a dynamic-mask problem. K, V are repeated to H heads (GQA), once,
// before timing, as flash-dmattn's benchmark does. Each peer's `run` makes
// one call on `stream` and returns "" or torch's reason.
// With a mask or a bias: the mask, the bias and the causal rule become one
// additive float mask [B, H, Nq, Nk] in the input dtype, built once. Rows:
// sdpa(efficient)+mask, sdpa(cudnn)+mask, torch(unfused)+mask,
// sdpa(default)+mask, and "sdpa(cudnn) (no mask: dense speed of light)":
// cuDNN on the same Q, K, V without the mask or bias, what a dense kernel
// costs at this shape (`masked` false).
// Without either: plain SDPA, no additive mask — sdpa(flash),
// sdpa(efficient), sdpa(cudnn), torch(unfused), sdpa(default) — causal by
// torch's flag, top-left aligned, so that a causal SDPA row with Nq != Nk is
// unsupported (torch(unfused) masks bottom-right itself).
// `setup_error` is set when the additive mask itself cannot be built (e.g.
// out of memory). With `dout`, the rows are the backward of each (" bwd"):
// the first call builds the forward graph, every call runs one backward of
// L = Σ O ⊙ dout through it. `fa2_reference` (backward, with a mask or bias)
// adds "sdpa(flash) bwd, no mask": FA2's backward on the same Q, K, V, dout
// without the mask or bias — the dense reference for a mask that leaves every
// pair active, so the caller asks for it only then (the same pair count).
struct MaskedTorchPeer {
  std::string name;
  std::function<std::string(cudaStream_t)> run;
  std::string about;    // added to the row's note, e.g. which backend torch's own choice runs
  bool masked = true;   // given the mask and bias (false: plain, unmasked attention)
};
std::vector<MaskedTorchPeer> make_masked_torch_peers(const DynamicMaskProblem& p, const void* q, const void* k,
                                                     const void* v, std::string* setup_error,
                                                     const void* dout = nullptr, bool fa2_reference = false);

}  // namespace attnlab
