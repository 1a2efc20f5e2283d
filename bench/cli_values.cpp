#include "cli_values.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace attnlab {
namespace {

bool all_digits(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t i = from; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

// An optional '-' and decimal digits into *out; false for anything else or
// past the range of long long.
bool read_integer(const std::string& text, long long* out) {
  if (!all_digits(text, !text.empty() && text[0] == '-' ? 1 : 0)) return false;
  errno = 0;
  *out = std::strtoll(text.c_str(), nullptr, 10);
  return errno != ERANGE;
}

// `text` cut at every comma ("" gives one empty piece).
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> pieces;
  size_t start = 0;
  for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1)
    pieces.push_back(text.substr(start, comma - start));
  pieces.push_back(text.substr(start));
  return pieces;
}

// Lengths as a list or random:B,MEAN (parse_varlen_lengths); `int32_sum`:
// they must sum to at most INT32_MAX rows (every draw of random:, too).
std::string parse_lengths(const std::string& flag, const std::string& text, long max_len, long max_count,
                          bool int32_sum, VarlenLengths* out) {
  const std::string form =
      flag + " takes lengths separated by commas (8192,1,517,3000) or random:B,MEAN, got '" + text + "'";
  const std::string int32_rows =
      " rows, more than the " + std::to_string(INT_MAX) + " that int32 offsets (cu_seqlens) address";
  VarlenLengths v;
  v.text = text;
  if (text.rfind("random:", 0) == 0) {
    const std::vector<std::string> args = split_commas(text.substr(7));
    long long B = 0, mean = 0;
    if (args.size() != 2 || !read_integer(args[0], &B) || !read_integer(args[1], &mean)) return form;
    if (B < 1 || B > max_count)
      return flag + " random:B,MEAN takes B from 1 to " + std::to_string(max_count) + " sequences, got " + args[0];
    if (mean < 1 || mean > max_len)
      return flag + " random:B,MEAN takes a mean length MEAN from 1 to " + std::to_string(max_len) + ", got " + args[1];
    const long long longest = 2 * mean - 1;  // lengths are uniform in [1, 2·MEAN − 1]
    if (int32_sum && B * longest > INT_MAX)
      return flag + " " + text + ": " + std::to_string(B) + " lengths of up to " + std::to_string(longest) +
             " may sum to " + std::to_string(B * longest) + int32_rows;
    v.random_count = int(B);
    v.random_mean = int(mean);
    *out = v;
    return "";
  }
  long long sum = 0;
  for (const std::string& item : split_commas(text)) {
    long long len = 0;
    if (!read_integer(item, &len)) return form;
    if (len < 0) return flag + ": sequence length " + item + " is negative (a length is 0 or more)";
    if (len > max_len) return flag + ": sequence length " + item + " is more than " + std::to_string(max_len);
    if (long(v.lengths.size()) == max_count) return flag + " takes at most " + std::to_string(max_count) + " lengths";
    v.lengths.push_back(int(len));
    sum += len;
  }
  if (int32_sum && sum > INT_MAX) return flag + ": the lengths sum to " + std::to_string(sum) + int32_rows;
  *out = v;
  return "";
}

}  // namespace

std::string parse_int(const std::string& flag, const std::string& text, long lo, long hi, int* out) {
  if (!all_digits(text, !text.empty() && text[0] == '-' ? 1 : 0))
    return flag + " expects an integer, got '" + text + "'";
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi)
    return flag + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + text;
  *out = int(v);
  return "";
}

std::string parse_int_list(const std::string& flag, const std::string& text, long lo, long hi, std::vector<int>* out) {
  std::vector<int> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int v = 0;
    if (std::string e = parse_int(flag, item, lo, hi, &v); !e.empty()) return e;
    values.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  *out = values;
  return "";
}

std::string parse_varlen_lengths(const std::string& flag, const std::string& text, long max_len, long max_count,
                                 VarlenLengths* out) {
  return parse_lengths(flag, text, max_len, max_count, true, out);
}

std::string parse_cache_lengths(const std::string& flag, const std::string& text, long max_len, long max_count,
                                VarlenLengths* out) {
  return parse_lengths(flag, text, max_len, max_count, false, out);
}

std::string parse_seed(const std::string& text, uint64_t* out) {
  if (!all_digits(text, 0)) return "--seed expects a non-negative integer, got '" + text + "'";
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return "--seed must be at most " + std::to_string(UINT64_MAX) + ", got " + text;
  *out = v;
  return "";
}

std::string parse_number(const std::string& flag, const std::string& text, double lo, double hi, float* out) {
  const std::string expects = flag + " expects a number from 0 to 1e6 (0: off), got '" + text + "'";
  if (text.empty() || !((text[0] >= '0' && text[0] <= '9') || text[0] == '.') ||
      text.find_first_not_of("0123456789.eE+-") != std::string::npos)
    return expects;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno == ERANGE || !std::isfinite(v) || v < lo || v > hi) return expects;
  *out = float(v);
  return "";
}

std::string parse_choice(const std::string& flag, const std::string& text, const std::vector<std::string>& allowed,
                         std::string* out) {
  std::string words;  // "a, b or c"
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (allowed[i] == text) {
      *out = text;
      return "";
    }
    words += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
  }
  return flag + " must be " + words + ", got '" + text + "'";
}

}  // namespace attnlab
