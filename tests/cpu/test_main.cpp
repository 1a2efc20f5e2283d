// The CPU test runner:
//   test_cpu                 every case
//   test_cpu NAME|GLOB ...   the cases whose name matches one of them ('cli_*')
//   test_cpu --list          the names of the cases, one a line
// Prints each failing case and "N passed, M failed"; exits 1 when a case
// fails or when the names match no case.
#include <fnmatch.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "testing.h"

namespace {

bool selected(const char* name, const std::vector<const char*>& patterns) {
  if (patterns.empty()) return true;
  for (const char* p : patterns)
    if (fnmatch(p, name, 0) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  bool list = false;
  std::vector<const char*> patterns;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "usage: %s [--list] [NAME|GLOB ...]\n", argv[0]);
      return 2;
    } else {
      patterns.push_back(argv[i]);
    }
  }

  int passed = 0, failed = 0;
  for (const auto& c : attnlab_test::registry()) {
    if (!selected(c.name, patterns)) continue;
    if (list) {
      std::printf("%s\n", c.name);
      ++passed;
      continue;
    }
    attnlab_test::current_failures() = 0;
    c.fn();
    if (attnlab_test::current_failures() == 0) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAILED: %s\n", c.name);
    }
  }
  if (passed + failed == 0) {
    if (patterns.empty()) std::fprintf(stderr, "no test case is registered\n");
    else {
      std::fprintf(stderr, "no test case matches");
      for (const char* p : patterns) std::fprintf(stderr, " '%s'", p);
      std::fprintf(stderr, " (--list names them)\n");
    }
    return 1;
  }
  if (list) return 0;
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
