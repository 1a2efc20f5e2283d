#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "host/variant.h"

namespace attnlab {

#define ATTNLAB_RUNG(x) std::vector<Variant> make_##x##_variants();
#define ATTNLAB_BWD_RUNG(x) std::vector<BwdVariant> make_##x##_variants();
#include "registry.inc"
#undef ATTNLAB_RUNG
#undef ATTNLAB_BWD_RUNG

namespace {
// Appends a rung's variants to `all` when they are of V's direction (a rung
// makes forward or backward variants, and only that direction's list calls it).
template <typename V, typename RungVariant>
void append_rung(std::vector<V>& all, std::vector<RungVariant> (*make_variants)()) {
  if constexpr (std::is_same_v<V, RungVariant>)
    for (RungVariant& v : make_variants()) all.push_back(std::move(v));
}
}  // namespace

template <typename V>
const std::vector<V>& registered_variants() {
  static const std::vector<V> variants = [] {
    std::vector<V> all;
#define ATTNLAB_RUNG(x) append_rung(all, make_##x##_variants);
#define ATTNLAB_BWD_RUNG(x) append_rung(all, make_##x##_variants);
#include "registry.inc"
#undef ATTNLAB_RUNG
#undef ATTNLAB_BWD_RUNG
    return all;
  }();
  return variants;
}
template const std::vector<Variant>& registered_variants<Variant>();
template const std::vector<BwdVariant>& registered_variants<BwdVariant>();

namespace {
bool glob_match_one(const std::string& pattern, const std::string& text) {
  size_t p = 0, t = 0, star = std::string::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}
}  // namespace

bool glob_match(const std::string& patterns, const std::string& text) {
  size_t begin = 0;
  while (true) {  // comma-separated alternatives (variant names have no commas)
    const size_t end = patterns.find(',', begin);
    if (glob_match_one(patterns.substr(begin, end == std::string::npos ? std::string::npos : end - begin), text))
      return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}

}  // namespace attnlab
