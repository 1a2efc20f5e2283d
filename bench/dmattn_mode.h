// attnlab: flash_attn_mma's dynamic-mask mode, selected by --mask (its other
// options: the dynamic-mask section of --help). See dmattn_mode.cpp for the
// rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cli.h"
#include "system_info.h"

namespace attnlab {

// Runs, checks (with --check) and times one dynamic-mask shape; returns the
// process exit code (kExitOk; kExitFailed on a failed check, a GPU error or a
// lost CSV write; kExitBadOptions for a --dma-core this GPU cannot run,
// found before anything runs).
int run_dynamic_mask_mode(const CommonOptions& opt, const DynamicMaskOptions& dm, const SystemInfo& sys, uint64_t seed,
                          cudaStream_t stream);

}  // namespace attnlab
