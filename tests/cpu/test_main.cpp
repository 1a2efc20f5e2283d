#include <cstdio>

#include "testing.h"

int main() {
  int passed = 0, failed = 0;
  for (const auto& c : attnlab_test::registry()) {
    attnlab_test::current_failures() = 0;
    c.fn();
    if (attnlab_test::current_failures() == 0) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAILED: %s\n", c.name);
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
