// sparsecp: the causal work model of the Lightning Indexer.
//
// A query at document position p (0-based) sees floor((p + 1) / ratio) compressed
// keys of its own document: only blocks whose last raw token is at or before p are
// complete. Its indexer work (projection aside) is proportional to that count, so the
// work of the first n rows of a document is
//
//     W(n) = ratio * g * (g - 1) / 2 + g * (t + 1),   (g, t) = divmod(n, ratio)
//
// and a task covering document rows [start, end) costs W(end) - W(start).
// Seed names: W is `_work_prefix`, task cost is `_task_work`.
//
// All quantities are 64-bit: a 10M-token batch at ratio 1 holds ~5e13 pairs.
// Callers that accept untrusted lengths validate them first (see plan.hpp), which
// guarantees that no intermediate here overflows.
#pragma once

#include <cstdint>

namespace sparsecp {

// Visible compressed keys of the row at document position `position` (0-based).
constexpr int64_t visible_keys(int64_t position, int64_t ratio) { return (position + 1) / ratio; }

// W(n): causal (query, key) pairs of the first `rows` rows of a document.
// Seed: `_work_prefix(length, ratio)`.
constexpr int64_t work_prefix(int64_t rows, int64_t ratio) {
  const int64_t groups = rows / ratio;
  const int64_t tail = rows % ratio;
  // groups * (groups - 1) is even, so halving before multiplying by ratio is exact
  // and keeps the intermediate below the final value's magnitude.
  return ratio * (groups * (groups - 1) / 2) + groups * (tail + 1);
}

// Causal pairs of the document rows [start, end). Seed: `_task_work`.
constexpr int64_t range_work(int64_t start, int64_t end, int64_t ratio) {
  return work_prefix(end, ratio) - work_prefix(start, ratio);
}

}  // namespace sparsecp
