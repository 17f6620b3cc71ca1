// sparsecp: seeded generators of packed batches (document lengths).
//
// Every generator is deterministic for a given spec on every platform: it uses its
// own SplitMix64 stream and closed-form transforms, never <random>'s distributions
// (whose output differs between standard libraries). Lengths are drawn until the
// batch holds `tokens` tokens; the last document is cut so the sum is exactly
// `tokens`. Every length is at least 1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecp {

struct WorkloadSpec {
  // "fixed", "uniform", "lognormal", "pareto", "bimodal" or "mixture".
  std::string distribution = "lognormal";
  int64_t tokens = 1 << 20;
  // Scale of a document length: the fixed length, the uniform mean, the lognormal
  // median, the Pareto minimum, ... Zero picks a scale from `tokens` and `cp`:
  // a quarter of the local shard.
  int64_t scale = 0;
  int64_t cp = 8;
  uint64_t seed = 1;
};

// Names accepted by WorkloadSpec::distribution.
std::vector<std::string_view> workload_distributions();

// Draws one packed batch. Throws Error for an unknown distribution or a
// non-positive token count.
std::vector<int64_t> generate_batch(const WorkloadSpec& spec);

// A deterministic 64-bit generator (SplitMix64), also for tests.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t state_;
};

}  // namespace sparsecp
