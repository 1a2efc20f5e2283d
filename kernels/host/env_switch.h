// kernels/host/: host-side glue; the device primitives are in kernels/common/.
// attnlab: the ATTNLAB_* environment switches.
#pragma once

#include <cstdlib>

namespace attnlab {

// Whether the environment variable `name` is set to anything but "" or "0":
// the ATTNLAB_* switches (e.g. ATTNLAB_NO_PDL, ATTNLAB_TWO_PASS_NO_*, which
// turn one mechanism off to measure what it buys). Read once per switch by the
// caller.
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

}  // namespace attnlab
