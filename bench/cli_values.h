// attnlab: the values of flash_attn_mma's options, parsed strictly: the whole
// text, in range, or one line that names the flag and what it expected.
// Each returns "" on success, else that line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// One of `allowed`, spelled as given.
std::string parse_choice(const std::string& flag, const std::string& text, const std::vector<std::string>& allowed,
                         std::string* out);

}  // namespace attnlab
