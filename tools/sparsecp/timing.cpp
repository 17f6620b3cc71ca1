#include "timing.hpp"

#include <algorithm>
#include <cmath>

namespace sparsecp::cli {

double clock_seconds(clockid_t clock) {
  timespec time{};
  clock_gettime(clock, &time);
  return static_cast<double>(time.tv_sec) + 1e-9 * static_cast<double>(time.tv_nsec);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

Spread Spread::of(const std::vector<double>& values) {
  if (values.empty()) return {};
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  return {*low, cli::median(values), *high};
}

MedianInterval median_interval(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  // P(B <= i) for B ~ Binomial(n, 1/2), in logs (n is at most a few thousand repeats).
  const double log_half_n = static_cast<double>(n) * std::log(0.5);
  const auto log_pmf = [&](size_t i) {
    return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
           std::lgamma(static_cast<double>(n - i) + 1) + log_half_n;
  };
  // [x_(k), x_(n-k+1)] (1-based) covers the median with probability 1 - 2 P(B <= k - 1):
  // take the largest k for which that is at least 95%.
  size_t k = 1;
  double tail = std::exp(log_pmf(0));
  while (k < n / 2) {
    tail += std::exp(log_pmf(k));  // P(B <= k): what taking k + 1 would give up
    if (2 * tail > 0.05) break;
    ++k;
  }
  return {median(values), values[k - 1], values[n - k]};
}

}  // namespace sparsecp::cli
