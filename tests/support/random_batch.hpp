// Test helper: seeded random packed batches with awkward shapes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "sparsecp/planning/workload.hpp"

namespace sparsecp::testing {

// Seed for randomized tests: SPARSECP_TEST_SEED from the environment, else a fixed
// default; printed so any failure can be replayed.
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* text = std::getenv("SPARSECP_TEST_SEED");
    const uint64_t value = text ? std::strtoull(text, nullptr, 10) : 20261130;
    std::printf("randomized tests: SPARSECP_TEST_SEED=%llu\n",
                static_cast<unsigned long long>(value));
    return value;
  }();
  return seed;
}

// A random batch for `cp` ranks: 1..max_documents documents, lengths mixing 1-token,
// short, around-2*cp and long documents; the last is padded so cp divides the total.
inline std::vector<int64_t> random_batch(SplitMix64& random, int64_t cp, int64_t max_documents,
                                         int64_t max_length) {
  const auto pick = [&](int64_t bound) {
    return static_cast<int64_t>(random.next() % static_cast<uint64_t>(bound));
  };
  const int64_t documents = 1 + pick(max_documents);
  std::vector<int64_t> lengths;
  for (int64_t d = 0; d < documents; ++d) {
    switch (pick(4)) {
      case 0:
        lengths.push_back(1 + pick(3));
        break;
      case 1:
        lengths.push_back(2 * cp - 1 + pick(3));
        break;
      case 2:
        lengths.push_back(1 + pick(max_length / 8 + 1));
        break;
      default:
        lengths.push_back(1 + pick(max_length));
    }
  }
  int64_t total = 0;
  for (const int64_t length : lengths) total += length;
  if (total % cp) lengths.back() += cp - total % cp;
  return lengths;
}

}  // namespace sparsecp::testing
