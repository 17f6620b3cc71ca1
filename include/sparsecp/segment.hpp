// sparsecp: Segment — one contiguous piece of one document in a worker's query order.
//
// Shared vocabulary (like error.hpp and tensor.hpp), so that neither layer depends on
// the other: planning's routes produce segments, the kernels' selector consumes them.
// Seed: the 5-tuples of `IndexerRoute.segments`,
// `(q_begin, q_end, key_begin, key_end, residual)`.
//
// Rows [q_begin, q_end) of the worker's order hold document rows
// [end - (q_end - q_begin), end) where end = (key_end - key_begin) * ratio + residual.
// `key_begin` is the document's first key in the compressed Index K bank (documents
// own floor(length / ratio) keys each, in packed order); the row at document
// position p sees bank keys [key_begin, key_begin + floor((p + 1) / ratio)).
#pragma once

#include <cstdint>

namespace sparsecp {

struct Segment {
  int64_t q_begin = 0;
  int64_t q_end = 0;
  int64_t key_begin = 0;
  int64_t key_end = 0;
  int64_t residual = 0;

  friend constexpr bool operator==(const Segment&, const Segment&) = default;
};

}  // namespace sparsecp
