// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the registry of attention variants.
//
// Every rung of the ladder (kernels/flash_attn/NN_*.cu) exports one function,
// `std::vector<Variant> make_<rung>_variants()`, and is listed once in
// kernels/registry.inc. The harness, the tests and the Python bindings all walk
// the same list, so a new rung is one new .cu file plus one line.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "host/attn_problem.h"

namespace attnlab {

// What every variant has, forward or backward: `Buffers` is what its launch
// reads and writes, AttnBuffers (the forward) or AttnGradBuffers (the backward).
template <typename Buffers>
struct VariantOf {
  using Launch = std::function<cudaError_t(const AttnProblem&, const Buffers&, cudaStream_t)>;

  std::string name;  // row label, e.g. "split-q+stage2" (a backward peer's is printed with " bwd" added)
  std::string rung;  // source file stem, e.g. "02_split_q"
  // "" when the variant runs this problem; otherwise a short reason, printed as
  // "unsupported: <reason>" in the variant's row.
  std::function<std::string(const AttnProblem&)> unsupported_reason;
  // Scratch bytes the variant wants in the buffers' workspace (0 for most).
  std::function<size_t(const AttnProblem&)> workspace_bytes = [](const AttnProblem&) { return size_t(0); };
  // Enqueues the computation on `stream`; returns the launch error, if any.
  Launch launch;
  // A step of its rung's page (rung 12's steps towards the engine): run when
  // --variant names it, never in the default set ("*").
  bool on_request = false;
  // One line for `--list`: tile shape, warps, stages, shared memory, head dims.
  std::function<std::string()> describe;

  // --- optional, for peers (library baselines) ---------------------------
  // Peers are what the rungs are measured against: the unfused baseline and
  // the torch rows. Rungs get a ratio to the best peer of the same run.
  bool is_peer = false;
  // What the timed loop calls, when it differs from `launch` (e.g. a library
  // call without the copy into the buffers that `launch` does for the check).
  Launch launch_timed;
  // A readable message for the last failed launch (e.g. the library's own).
  std::function<std::string()> last_error;
};

// A forward variant: the common fields and two that only the forward's check reads.
struct Variant : VariantOf<AttnBuffers> {
  // False for a peer that has no LSE output of its own (eager PyTorch): its
  // check then judges O alone.
  bool writes_lse = true;
  // True for a peer that stores S in the input dtype before its softmax (the
  // unfused baseline): its LSE then carries S's rounding, up to u·|S| (u the
  // dtype's unit roundoff), and is held to lse_tolerance_rounded_scores
  // instead of kLseTolerance (reference.h).
  bool rounds_scores_to_input_dtype = false;
};

// A backward variant: the same registry and the same rules, on AttnGradBuffers.
// Rungs listed with ATTNLAB_BWD_RUNG(x) in kernels/registry.inc export
// `std::vector<BwdVariant> make_<x>_variants()`.
struct BwdVariant : VariantOf<AttnGradBuffers> {
  // Bitwise identical dQ, dK, dV run to run (no floating-point atomics, a
  // fixed summation order); the harness checks it over repeated runs.
  bool deterministic = false;
};

// Every registered variant of one direction (Variant or BwdVariant), in ladder order.
template <typename V>
const std::vector<V>& registered_variants();
inline const std::vector<Variant>& all_variants() { return registered_variants<Variant>(); }
inline const std::vector<BwdVariant>& all_bwd_variants() { return registered_variants<BwdVariant>(); }

// The registered variant of V's direction named `name`; nullptr when there is none.
template <typename V>
const V* find_variant(const std::string& name) {
  for (const V& v : registered_variants<V>())
    if (v.name == name) return &v;
  return nullptr;
}

// Shell-style glob match ('*', '?'), how --variant and the test programs pick
// variants by name; a comma separates alternatives ('ws*,wgmma*' matches either).
bool glob_match(const std::string& pattern, const std::string& text);

// Whether --variant `pattern` picks v: its name matches, and a variant run on
// request is named by a pattern other than the default "*".
template <typename Buffers>
bool variant_selected(const std::string& pattern, const VariantOf<Buffers>& v) {
  return glob_match(pattern, v.name) && (!v.on_request || pattern != "*");
}

}  // namespace attnlab
