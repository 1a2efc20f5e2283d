#include <cuda_runtime.h>

#include <string>

#include "host/variant.h"

namespace attnlab {

#define ATTNLAB_RUNG(x) std::vector<Variant> make_##x##_variants();
#define ATTNLAB_BWD_RUNG(x) std::vector<BwdVariant> make_##x##_variants();
#include "registry.inc"
#undef ATTNLAB_RUNG
#undef ATTNLAB_BWD_RUNG

const std::vector<Variant>& all_variants() {
  static const std::vector<Variant> variants = [] {
    std::vector<Variant> all;
    auto append = [&all](std::vector<Variant> rung) {
      for (auto& v : rung) all.push_back(std::move(v));
    };
#define ATTNLAB_RUNG(x) append(make_##x##_variants());
#define ATTNLAB_BWD_RUNG(x)
#include "registry.inc"
#undef ATTNLAB_RUNG
#undef ATTNLAB_BWD_RUNG
    return all;
  }();
  return variants;
}

const std::vector<BwdVariant>& all_bwd_variants() {
  static const std::vector<BwdVariant> variants = [] {
    std::vector<BwdVariant> all;
    auto append = [&all](std::vector<BwdVariant> rung) {
      for (auto& v : rung) all.push_back(std::move(v));
    };
#define ATTNLAB_RUNG(x)
#define ATTNLAB_BWD_RUNG(x) append(make_##x##_variants());
#include "registry.inc"
#undef ATTNLAB_RUNG
#undef ATTNLAB_BWD_RUNG
    return all;
  }();
  return variants;
}

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
