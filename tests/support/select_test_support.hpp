// Test helper for the selection component: seeded inputs, segments and a worker case.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"
#include "support/random_batch.hpp"

namespace sparsecp::testing {

inline int64_t pick(SplitMix64& random, int64_t bound) {
  return bound <= 0 ? 0 : static_cast<int64_t>(random.next() % static_cast<uint64_t>(bound));
}

// A matrix stored as fp32 and as bf16 (the bf16 copy rounds the fp32 values).
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> f32;
  std::vector<uint16_t> b16;

  MatrixView view(DType dtype) const {
    return dtype == DType::kFloat32 ? MatrixView::f32(f32.data(), rows, cols)
                                    : MatrixView::bf16(b16.data(), rows, cols);
  }
};

// Small integers in [-bound, bound] (exact in fp32 and bf16), or reals in [-1, 1).
inline Matrix random_matrix(SplitMix64& random, int64_t rows, int64_t cols, int64_t bound,
                            bool integers = true) {
  Matrix m{rows, cols, {}, {}};
  m.f32.resize(static_cast<size_t>(rows * cols));
  for (float& v : m.f32) {
    v = integers ? static_cast<float>(pick(random, 2 * bound + 1) - bound)
                 : static_cast<float>(2.0 * random.uniform() - 1.0);
  }
  for (const float v : m.f32) m.b16.push_back(float_to_bf16(v));
  if (!integers) {  // make the fp32 copy bf16-exact so both dtypes score the same values
    for (size_t i = 0; i < m.f32.size(); ++i) m.f32[i] = bf16_to_float(m.b16[i]);
  }
  return m;
}

// A worker's segments: tail tasks [start, end) of random documents, packed in order,
// with a few rows left uncovered between segments when `gaps`.
struct WorkerCase {
  std::vector<Segment> segments;
  int64_t rows = 0;
  int64_t bank = 0;
};

inline WorkerCase random_worker(SplitMix64& random, int64_t ratio, int64_t documents,
                                int64_t max_length, int64_t max_rows, bool gaps) {
  WorkerCase c;
  std::vector<int64_t> lengths;
  for (int64_t d = 0; d < documents; ++d) {
    const int64_t kind = pick(random, 4);
    lengths.push_back(kind == 0 ? 1 + pick(random, ratio + 1) : 1 + pick(random, max_length));
  }
  std::vector<int64_t> key_bases{0};
  for (const int64_t length : lengths) key_bases.push_back(key_bases.back() + length / ratio);
  c.bank = key_bases.back() + pick(random, 3);  // a few keys no segment uses
  for (int64_t d = 0; d < documents; ++d) {
    if (gaps && pick(random, 3) == 0) c.rows += 1 + pick(random, 3);
    const int64_t end = 1 + pick(random, lengths[static_cast<size_t>(d)]);
    const int64_t rows = 1 + pick(random, std::min(end, max_rows));
    const int64_t base = key_bases[static_cast<size_t>(d)];
    c.segments.push_back({c.rows, c.rows + rows, base, base + end / ratio, end % ratio});
    c.rows += rows;
  }
  return c;
}

}  // namespace sparsecp::testing
