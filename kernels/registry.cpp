#include <cuda_runtime.h>

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

}  // namespace attnlab
