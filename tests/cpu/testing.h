// attnlab: a minimal test framework (no dependencies, so the same tests build
// on the CPU machines and on the GPU machine). TEST_CASE(name) registers a
// case; test_main.cpp runs them all or by name and prints "N passed, M failed".
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace attnlab_test {

struct Case {
  const char* name;
  std::function<void()> fn;
};
inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
inline int& current_failures() {
  static int n = 0;
  return n;
}
struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

}  // namespace attnlab_test

#define ATTN_CAT2(a, b) a##b
#define ATTN_CAT(a, b) ATTN_CAT2(a, b)
#define TEST_CASE(name)                                                                   \
  static void name();                                                                     \
  static attnlab_test::Registrar ATTN_CAT(registrar_, name)(#name, name);                 \
  static void name()

#define EXPECT_TRUE(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::printf("  %s:%d: expected %s\n", __FILE__, __LINE__, #cond);                   \
      ++attnlab_test::current_failures();                                                 \
    }                                                                                     \
  } while (0)

#define EXPECT_EQ(a, b)                                                                   \
  do {                                                                                    \
    const auto va = (a);                                                                  \
    const auto vb = (b);                                                                  \
    if (!(va == vb)) {                                                                    \
      std::printf("  %s:%d: expected %s == %s\n", __FILE__, __LINE__, #a, #b);            \
      ++attnlab_test::current_failures();                                                 \
    }                                                                                     \
  } while (0)

#define EXPECT_NEAR(a, b, tol)                                                            \
  do {                                                                                    \
    const double va = double(a), vb = double(b);                                          \
    if (!(std::fabs(va - vb) <= double(tol))) {                                           \
      std::printf("  %s:%d: %s = %.10g, %s = %.10g, differ by more than %g\n", __FILE__, \
                  __LINE__, #a, va, #b, vb, double(tol));                                 \
      ++attnlab_test::current_failures();                                                 \
    }                                                                                     \
  } while (0)

// A string contains a substring.
#define EXPECT_CONTAINS(haystack, needle) EXPECT_TRUE(std::string(haystack).find(needle) != std::string::npos)
