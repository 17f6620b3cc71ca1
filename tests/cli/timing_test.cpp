// The run report's statistics (tools/sparsecp/timing.hpp): the median's distribution-free
// confidence interval, against the exact binomial coverage computed here by brute force.
#include "timing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace {

using sparsecp::cli::median_interval;

// Coverage of [x_(k), x_(n-k+1)]: 1 - 2 P(B <= k - 1), B ~ Binomial(n, 1/2).
double coverage(size_t n, size_t k) {
  double below = 0;
  for (size_t i = 0; i < k; ++i) {
    below += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) +
                      static_cast<double>(n) * std::log(0.5));
  }
  return 1 - 2 * below;
}

TEST(MedianInterval, IsTheNarrowestOrderStatisticIntervalOfAtLeast95Percent) {
  for (size_t n = 1; n <= 200; ++n) {
    std::vector<double> values(n);
    std::iota(values.rbegin(), values.rend(), 1.0);  // n, ..., 1: unsorted on purpose
    const auto interval = median_interval(values);
    const auto k = static_cast<size_t>(interval.low);  // values are 1..n: x_(k) == k
    ASSERT_GE(k, 1u) << n;
    EXPECT_EQ(interval.high, static_cast<double>(n - k + 1)) << n;
    EXPECT_DOUBLE_EQ(interval.median, (n + 1) / 2.0) << n;
    if (n >= 6) {
      EXPECT_GE(coverage(n, k), 0.95) << "n " << n << " k " << k;
    }
    if (k + 1 <= n / 2) {
      EXPECT_LT(coverage(n, k + 1), 0.95) << "n " << n << ": k " << k << " is not the largest";
    }
  }
}

TEST(MedianInterval, NarrowsWithMoreRepeatsAndHandlesTheEmptyCase) {
  EXPECT_EQ(median_interval({}).median, 0);
  EXPECT_EQ(median_interval({2.5}).low, 2.5);
  // Ratios alternating 0.9 and 1.1 around a run of 1.05: min..max always holds 1, but the
  // interval of the median leaves it out once there are enough repeats.
  std::vector<double> ratios;
  for (int i = 0; i < 40; ++i) ratios.push_back(i % 8 == 0 ? (i % 16 ? 0.9 : 1.3) : 1.05);
  const auto interval = median_interval(ratios);
  EXPECT_GT(interval.low, 1.0);
  EXPECT_LE(interval.low, interval.high);
  EXPECT_LT(*std::min_element(ratios.begin(), ratios.end()), 1.0);  // min..max holds 1
}

}  // namespace
