#include "cli_values.h"

#include <cerrno>
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
