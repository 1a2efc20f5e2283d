// attnlab: flash_attn_mma's dense backward, selected by --bwd without --mask
// or --mask-mod: every backward rung (all_bwd_variants()) and torch's
// backward peers on one dense shape, checked and timed as the forward's rows
// are (bench/table.h). See bwd_mode.cpp for the rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cli.h"
#include "host/variant.h"
#include "runner.h"
#include "system_info.h"
#include "table.h"

namespace attnlab {

// The rows: the peers first (those of the groups --torch / --sdpa pick, none
// with --no-peers), then the backward rungs whose name matches --variant
// (with --deterministic, only the deterministic ones).
// *rungs: how many of them are rungs.
std::vector<const BwdVariant*> backward_rows(const CommonOptions& opt, const DenseOptions& dense, size_t* rungs);

// One row run once (into poisoned gradients) and, unless --no-check, checked
// against `ref`; a deterministic variant then repeated and compared bit for
// bit. Unsupported shapes give a row that says why. The block-sparse mode's
// backward rows are made here too.
TableRow backward_row(const CommonOptions& opt, const BwdVariant& v, const AttnProblem& p, const GradBuffers& bufs,
                      const GradReference& ref, cudaStream_t stream);

// Runs, checks (unless --no-check) and times the rows on the shape of the
// options; returns the process exit code (kExitOk; kExitFailed on a failed
// check, a GPU error or a lost CSV write).
int run_dense_backward_mode(const CommonOptions& opt, const DenseOptions& dense,
                            const std::vector<const BwdVariant*>& rows, const SystemInfo& sys, uint64_t seed,
                            cudaStream_t stream);

}  // namespace attnlab
