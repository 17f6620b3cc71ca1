#include "sparsecp/planning/workload.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "sparsecp/error.hpp"

namespace sparsecp {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

namespace {

double standard_normal(SplitMix64& random) {
  // Box-Muller; 1 - u keeps the logarithm finite.
  const double u = 1.0 - random.uniform();
  const double v = random.uniform();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
}

int64_t draw_length(std::string_view distribution, double scale, SplitMix64& random) {
  double length = scale;
  if (distribution == "fixed") {
    length = scale;
  } else if (distribution == "uniform") {
    length = 1.0 + random.uniform() * (2.0 * scale - 1.0);
  } else if (distribution == "lognormal") {
    length = scale * std::exp(1.0 * standard_normal(random));
  } else if (distribution == "pareto") {
    // Long tail with shape 1.2 above a minimum of scale / 4.
    length = (scale / 4.0) / std::pow(1.0 - random.uniform(), 1.0 / 1.2);
  } else if (distribution == "bimodal") {
    // Many short documents and, rarely, a huge one.
    length = random.uniform() < 0.02 ? scale * 32.0 : scale / 16.0 * (0.5 + random.uniform());
  } else if (distribution == "mixture") {
    // Shaped like public pretraining corpora: most documents are short, most tokens
    // sit in the long ones (80% short lognormal, 20% long lognormal).
    length = random.uniform() < 0.8 ? (scale / 8.0) * std::exp(0.8 * standard_normal(random))
                                    : (scale * 3.0) * std::exp(0.7 * standard_normal(random));
  }
  return std::max<int64_t>(1, std::llround(std::min(length, 0x1.0p52)));
}

}  // namespace

std::vector<std::string_view> workload_distributions() {
  return {"fixed", "uniform", "lognormal", "pareto", "bimodal", "mixture"};
}

std::vector<int64_t> generate_batch(const WorkloadSpec& spec) {
  const auto names = workload_distributions();
  SPARSECP_CHECK(std::find(names.begin(), names.end(), spec.distribution) != names.end(),
                 "unknown workload distribution '", spec.distribution,
                 "' (expected fixed, uniform, lognormal, pareto, bimodal or mixture)");
  SPARSECP_CHECK(spec.tokens > 0, "workload token count must be positive, got ", spec.tokens);
  SPARSECP_CHECK(spec.cp > 0, "workload CP size must be positive, got ", spec.cp);
  SPARSECP_CHECK(spec.scale >= 0, "workload length scale must be non-negative, got ", spec.scale);
  const int64_t local_rows = spec.tokens / spec.cp;  // whole rows per rank
  const double scale = spec.scale > 0 ? static_cast<double>(spec.scale)
                                      : std::max(1.0, static_cast<double>(local_rows) / 4.0);
  SplitMix64 random(spec.seed);
  std::vector<int64_t> lengths;
  int64_t total = 0;
  // Bounds the memory and time a request can take: 2^62 tokens of length 1 would
  // otherwise generate documents until memory runs out.
  constexpr size_t kMaxDocuments = size_t{1} << 24;
  while (total < spec.tokens) {
    SPARSECP_CHECK(lengths.size() < kMaxDocuments, "workload of ", spec.tokens,
                   " tokens at length scale ", scale, " needs more than ", kMaxDocuments,
                   " documents; use a larger --scale or fewer --tokens");
    const int64_t length =
        std::min(draw_length(spec.distribution, scale, random), spec.tokens - total);
    lengths.push_back(length);
    total += length;
  }
  return lengths;
}

}  // namespace sparsecp
