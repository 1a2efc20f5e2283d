// attnlab: flash_attn_mma's variable-length mode, selected by --varlen: the
// variable-length forward (kernels/varlen/) on one packed batch of sequences,
// beside rung 12's engine on the same batch padded to its longest sequence.
// See varlen_mode.cpp for the rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"
#include "system_info.h"
#include "table.h"

namespace attnlab {

// The columns the variable-length rows add to the results CSV's, after them:
// the lengths as given (commas as ';'), the key lengths ("" when they are the
// queries'), the packed row counts, and 1 for a run of the unverified kernel.
constexpr const char* kVarlenCsvColumns = ",lengths,lengths_k,total_q,total_k,unverified";

// The lengths `l` gives: its list, or for random:B,MEAN B lengths uniform in
// [1, 2·MEAN − 1] (mean MEAN), drawn from `seed` and a stream of their own
// (`salt`: the queries', the keys' or the caches').
std::vector<int> draw_lengths(const VarlenLengths& l, uint64_t seed, uint64_t salt);

// The query and key lengths of one run: --varlen's list, or the B lengths
// random:B,MEAN draws from `seed` (uniform in [1, 2·MEAN - 1]); the key
// lengths are --varlen-k's, drawn apart from the queries' (random:), or else
// the query lengths.
void varlen_lengths(const VarlenOptions& v, uint64_t seed, std::vector<int>* q, std::vector<int>* k);

// Why the program does not start on these options ("" when it does), found
// without a GPU, so before the harness looks for one (exit 2): the kernel has
// not run on a GPU yet, so it runs only with --unverified.
std::string varlen_options_unsupported(const VarlenOptions& v);

// --list with --varlen: ours and the padded yardstick.
std::vector<ListEntry> varlen_list();

// The lengths in one short line: every one when there are few, else the
// first ones, the count, the smallest, the largest and the mean.
std::string varlen_lengths_summary(const std::vector<int>& lengths);

// Runs, checks (unless --no-check) and times one packed batch; returns the
// process exit code (kExitOk; kExitBadOptions when the kernel refuses the
// problem, found before any launch; kExitFailed on a failed check, a GPU
// error or a lost CSV write).
int run_varlen_mode(const CommonOptions& opt, const VarlenOptions& v, const SystemInfo& sys, uint64_t seed,
                    cudaStream_t stream);

}  // namespace attnlab
