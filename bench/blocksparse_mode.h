// attnlab: flash_attn_mma's block-sparse mode, selected by --mask-mod: the
// block-sparse forward (kernels/blocksparse/) on one shape, its block mask
// built on the GPU from the mask_mod, beside torch's SDPA where SDPA can say
// the same mask. See blocksparse_mode.cpp for the rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"
#include "system_info.h"
#include "table.h"

namespace attnlab {

// The columns the block-sparse rows add to the results CSV's, after them.
constexpr const char* kBlocksparseCsvColumns = ",mask,score";

// Why the kernel cannot take these options ("" when it can), found without a
// GPU, so before the harness looks for one (exit 2): head dims no kernel has,
// --block-size not a multiple of the kernel's tile, a block mask past the
// builder's grid.
std::string blocksparse_options_unsupported(const CommonOptions& opt, const BlocksparseOptions& bs);

// --list with --mask-mod: the rows this mode can run (peers as --sdpa and
// --no-peers pick them; --bwd --deterministic: our deterministic row alone).
std::vector<ListEntry> blocksparse_list(const CommonOptions& opt);

// Document ids [B][L] for --mask-mod document:K: per batch, L cut into K
// documents at K - 1 distinct random points (uniform, from `seed`); id d
// for the tokens of document d.
std::vector<int32_t> random_document_ids(int B, int L, int K, uint64_t seed);

// Runs, checks (unless --no-check) and times one block-sparse shape; returns
// the process exit code (kExitOk; kExitBadOptions for a problem or block size
// the kernel refuses, found before any launch; kExitFailed on a failed check,
// a GPU error or a lost CSV write).
int run_blocksparse_mode(const CommonOptions& opt, const BlocksparseOptions& bs, const SystemInfo& sys, uint64_t seed,
                         cudaStream_t stream);

}  // namespace attnlab
