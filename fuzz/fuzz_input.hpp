// The byte decoding and failure reporting every fuzz target shares.
//
// Sizes are drawn mostly small and valid, sometimes at the edges where integer code
// breaks: non-positive values, anything (2^63 - 1 included), just below 2^63 - 1 and
// around 2^62 (where doubling overflows). A broken invariant aborts with its text, which
// libFuzzer reports as a crash.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace sparsecp::fuzz {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

// A size: in [small_min, small_max] most of the time, an edge value otherwise.
inline int64_t pick_size(FuzzedDataProvider& in, int64_t small_max, int64_t small_min = 1) {
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0:
      return in.ConsumeIntegralInRange<int64_t>(-3, 0);
    case 1:
      return in.ConsumeIntegral<int64_t>();  // anything, including 2^63 - 1
    case 2:
      return std::numeric_limits<int64_t>::max() - in.ConsumeIntegralInRange<int64_t>(0, 2);
    case 3:
      return (int64_t{1} << 62) + in.ConsumeIntegralInRange<int64_t>(-2, 2);
    default:
      return in.ConsumeIntegralInRange<int64_t>(small_min, small_max);
  }
}

// A real value: in [low, high] most of the time; NaN, infinity or a negative otherwise.
inline double pick_real(FuzzedDataProvider& in, double low, double high) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return std::numeric_limits<double>::quiet_NaN();
    case 1:
      return std::numeric_limits<double>::infinity();
    case 2:
      return -in.ConsumeFloatingPointInRange<double>(0, 2);
    default:
      return in.ConsumeFloatingPointInRange<double>(low, high);
  }
}

}  // namespace sparsecp::fuzz

#define EXPECT(condition)                                 \
  do {                                                    \
    if (!(condition)) ::sparsecp::fuzz::fail(#condition); \
  } while (false)
