// sparsecp CLI: the timing and summary helpers every measuring command shares (run,
// calibrate, bench select, route --all-ranks, spill), so that "median" and "spread"
// mean the same thing in every report.
#pragma once

#include <time.h>

#include <vector>

namespace sparsecp::cli {

// Seconds on `clock` (CLOCK_MONOTONIC for wall time, CLOCK_THREAD_CPUTIME_ID for the
// calling thread's CPU time, CLOCK_PROCESS_CPUTIME_ID for the process's).
double clock_seconds(clockid_t clock);
inline double wall_seconds() { return clock_seconds(CLOCK_MONOTONIC); }
inline double thread_cpu_seconds() { return clock_seconds(CLOCK_THREAD_CPUTIME_ID); }

// The median (mean of the two middle values for an even count; 0 when empty).
double median(std::vector<double> values);

// Minimum, median and maximum of repeated measurements: what a report shows instead of
// one number, so a reader can tell a difference from noise.
struct Spread {
  double min = 0;
  double median = 0;
  double max = 0;
  static Spread of(const std::vector<double>& values);
  // True when every value of `this` lies below every value of `other`.
  bool below(const Spread& other) const { return max < other.min; }
};

// The median of `values` with a distribution-free confidence interval of at least 95%
// (order statistics x_(k) and x_(n-k+1), the largest k whose binomial tail allows it;
// the whole range for fewer than 6 values). Unlike min..max it narrows as values are
// added, so that repeating a measurement can settle a comparison.
struct MedianInterval {
  double median = 0;
  double low = 0;
  double high = 0;
};
MedianInterval median_interval(std::vector<double> values);

}  // namespace sparsecp::cli
