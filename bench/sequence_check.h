// attnlab: the check of a batch sequence by sequence, which the
// variable-length mode (--varlen) and the paged-decoding mode (--decode)
// share: each sequence's Q, K, V laid out dense ([1, heads, len, D]) in
// scratch sized for the longest, its fp32 reference and the unfused
// baseline's error on it (sequence_reference), our O beside them, the
// project's rule (reference.h, check_outputs); the batch's verdict is its
// worst sequence's (worse_verdict).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "host/attn_problem.h"
#include "reference/reference.h"
#include "runner.h"

namespace attnlab {

// Scratch for one sequence at a time: Q, K, V and our O, LSE dense ([1,
// heads, len, D]), the reference's O and LSE, and the unfused baseline's
// workspace (nullptr when it did not fit: no baseline).
struct SequenceScratch {
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *lse = nullptr, *o_ref = nullptr, *lse_ref = nullptr;
  void* unfused_workspace = nullptr;
  size_t unfused_workspace_bytes = 0;
};

// The scratch in `arena`, for sequences of up to longest.Nq queries and
// longest.Nk keys (longest.B is not read); `unfused_bytes`: the largest
// unfused_workspace_granule of the sequences, 0 for none. The baseline's
// workspace is left out, not an error, when it does not fit.
std::string allocate_sequence_scratch(DeviceArena& arena, const AttnProblem& longest, size_t unfused_bytes,
                                      SequenceScratch* sc);

// Rows [row0, row0 + rows) of `heads` heads of a [total rows, heads, width]
// 16-bit tensor into dense [heads, rows, width].
cudaError_t unpack_rows(void* dense, const void* packed, int64_t row0, int rows, int heads, int width,
                        cudaStream_t s);

// The reference of one sequence, problem `sp` (B = 1), from the dense Q, K, V
// in `sc`: O_ref and LSE_ref into sc.o_ref and sc.lse_ref (O = 0 and LSE =
// -inf where it has no key), their rounding error, and the unfused baseline's
// error on it (run into sc.o and sc.lse, which the caller then overwrites
// with ours; < 0 where it cannot run). Waits for the stream.
RunError sequence_reference(const AttnProblem& sp, const SequenceScratch& sc, cudaStream_t s, ReferenceData* ref);

// Whether verdict a is worse than b: a failure before a pass, then the larger
// share of its bound (O or LSE, whichever is nearer).
bool worse_verdict(const CheckResult& a, const CheckResult& b);

// x[0], x[1] and x[n - 1] of a 16-bit tensor, as the table shows them.
void read_first_values(const void* x, int64_t n, DType dtype, float out[3]);

}  // namespace attnlab
