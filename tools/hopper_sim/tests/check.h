// A tiny test harness for the simulator's unit tests: CHECK/CHECK_EQ count failures, main() ends
// with the plain "N passed, M failed" line and exits non-zero on any failure.
#pragma once
#include <cstdio>
#include <cstdint>
#include <cstring>

namespace hsim_test {
inline int& passed() { static int n = 0; return n; }
inline int& failed() { static int n = 0; return n; }
inline int finish() {
  std::printf("%d passed, %d failed\n", passed(), failed());
  return failed() ? 1 : 0;
}
}  // namespace hsim_test

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (cond) ++hsim_test::passed();                                                  \
    else { ++hsim_test::failed(); std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
  } while (0)

#define CHECK_EQ(a, b)                                                                \
  do {                                                                                \
    auto _va = (a); auto _vb = (b);                                                   \
    if (_va == _vb) ++hsim_test::passed();                                            \
    else { ++hsim_test::failed(); std::printf("FAIL %s:%d: %s == %s (0x%llx vs 0x%llx)\n", __FILE__, \
           __LINE__, #a, #b, (unsigned long long)_va, (unsigned long long)_vb); }    \
  } while (0)
