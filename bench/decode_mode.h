// attnlab: flash_attn_mma's paged-decoding mode, selected by --decode: the new
// tokens of a batch of sequences against their KV caches, kept in pages
// through a block table (kernels/varlen/paged_decode.h), beside a
// device-to-device copy as the yardstick of memory bandwidth. See
// decode_mode.cpp for the rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"
#include "system_info.h"
#include "table.h"

namespace attnlab {

// The columns the paged-decoding rows add to the results CSV's, after them:
// the cache lengths (as given; for random: also what was drawn), the page
// size, the bytes the row moves, their rate in GB/s and its fraction of the
// copy row's, and 1 for a run of the unverified kernel.
constexpr const char* kDecodeCsvColumns = ",lengths,page_size,bytes,gbps,copy_fraction,unverified";

// Pages in the cache that no sequence reads, besides the sequences' own.
constexpr int kDecodeSparePages = 3;

// The cache lengths of one run: --decode's list, or the B lengths
// random:B,MEAN draws from `seed` (uniform in [1, 2·MEAN - 1]).
std::vector<int> decode_lengths(const DecodeOptions& d, uint64_t seed);

// The paged cache of these lengths, without its contents: sequence b's keys
// fill ceil(L_b / page_size) pages; the block table is as wide as the longest
// sequence needs (one column at least); the cache holds every sequence's
// pages and kDecodeSparePages more. num_pages may pass int32's range: the
// mode refuses such a cache.
struct DecodeCacheShape {
  int max_pages = 1;      // the block table's columns
  int64_t num_pages = 0;  // the cache's pages
};
DecodeCacheShape decode_cache_shape(const std::vector<int>& lengths, int page_size);

// The block table of that cache, B x max_pages, row-major: sequence b's pages
// in key order, each page of the cache read by one sequence at most, their
// places a random permutation of the cache's pages from `seed` (a sequence's
// pages lie anywhere, as in a server's cache after many requests); -1 where
// no sequence reads.
std::vector<int> decode_block_table(const std::vector<int>& lengths, int page_size, int max_pages, int num_pages,
                                    uint64_t seed);

// Why the program does not start on these options ("" when it does), found
// without a GPU, so before the harness looks for one (exit 2): the kernel has
// not run on a GPU yet, so it runs only with --unverified.
std::string decode_options_unsupported(const DecodeOptions& d);

// --list with --decode: ours and the copy yardstick.
std::vector<ListEntry> decode_list();

// Builds, checks (unless --no-check) and times one batch; returns the process
// exit code (kExitOk; kExitBadOptions when the kernel refuses the problem,
// found before any launch; kExitFailed on a failed check, a GPU error or a
// lost CSV write).
int run_decode_mode(const CommonOptions& opt, const DecodeOptions& d, const SystemInfo& sys, uint64_t seed,
                    cudaStream_t stream);

}  // namespace attnlab
