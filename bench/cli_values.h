// attnlab: the values of flash_attn_mma's options, parsed strictly: the whole
// text, in range, or one line that names the flag and what it expected.
// Each returns "" on success, else that line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli.h"

namespace attnlab {

// An optional '-' and decimal digits, nothing else (no spaces, no '+', no
// suffix), in [lo, hi].
std::string parse_int(const std::string& flag, const std::string& text, long lo, long hi, int* out);

// Comma-separated integers, each as parse_int takes it.
std::string parse_int_list(const std::string& flag, const std::string& text, long lo, long hi, std::vector<int>* out);

// --seed: decimal digits only, up to 2^64 - 1.
std::string parse_seed(const std::string& text, uint64_t* out);

// A finite decimal number in [lo, hi] ("30", "0.5", "1e3"): no spaces, no
// sign, no nan/inf, no hex.
std::string parse_number(const std::string& flag, const std::string& text, double lo, double hi, float* out);

// Sequence lengths for --varlen, --varlen-k: "L0,L1,..." (each in [0, max_len],
// at most max_count of them) or "random:B,MEAN" (B in [1, max_count], MEAN in
// [1, max_len]); either way the lengths must sum to at most INT32_MAX rows, the
// most that int32 offsets (cu_seqlens) address — for random:, every draw must.
std::string parse_varlen_lengths(const std::string& flag, const std::string& text, long max_len, long max_count,
                                 VarlenLengths* out);

// The cache lengths of --decode, in the same forms and bounds, but for the
// sum: a paged cache has no offsets, and paged decoding counts its pages
// itself when it starts (bench/decode_mode.cpp).
std::string parse_cache_lengths(const std::string& flag, const std::string& text, long max_len, long max_count,
                                VarlenLengths* out);

// One of `allowed`, spelled as given.
std::string parse_choice(const std::string& flag, const std::string& text, const std::vector<std::string>& allowed,
                         std::string* out);

}  // namespace attnlab
