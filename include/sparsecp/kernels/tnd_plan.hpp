// sparsecp: TndPlan — the packed (TND) layout of the query rows that see a key.
//
// Seed `csa_tnd_plan(segments, ratio)` ("Packed Lightning Indexer"). Within a segment
// (route.hpp) the row at document position p sees floor((p + 1) / ratio) keys, so the
// rows that see nothing are a prefix of the segment: the first positions p < ratio - 1.
// The plan keeps, per segment, only the rows that see at least one key, packed back to
// back in segment order (T = total kept rows). A packed segment is a TND "sequence"
// in the FlashAttention varlen sense: `query_offsets` / `key_offsets` are its
// cumulative query / key counts, and its causal mask is bottom-right aligned (its
// last row sees all of its keys [key_begin, key_end)).
//
// `csa_tnd_plan` returns std::nullopt when no row sees a key (the seed returns None and
// the result is all -1). `covers_queries(n)` is true when the packed rows are exactly
// rows 0..n-1 in order, so the packed result already is the answer; otherwise
// `restore` scatters packed rows back to their original row positions (rows the plan
// dropped keep whatever the destination held: the caller fills it with -1 first).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sparsecp/segment.hpp"

namespace sparsecp {

// One packed sequence: original rows [row_begin, row_end) of a segment (all see a
// key), packed at [packed_begin, packed_begin + row_end - row_begin). The first row
// sits at document position `first_position`; bank keys are [key_begin, key_end).
struct TndSequence {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t packed_begin = 0;
  int64_t first_position = 0;
  int64_t key_begin = 0;
  int64_t key_end = 0;

  friend constexpr bool operator==(const TndSequence&, const TndSequence&) = default;
};

class TndPlan {
 public:
  explicit TndPlan(std::vector<TndSequence> sequences, int64_t ratio);

  const std::vector<TndSequence>& sequences() const { return sequences_; }
  int64_t ratio() const { return ratio_; }
  // Total packed rows (T).
  int64_t packed_rows() const { return packed_rows_; }
  // Cumulative packed query counts (size sequences + 1), the TND kernels'
  // actual_seq_lengths_query with a leading 0.
  std::vector<int64_t> query_offsets() const;
  // Cumulative key counts (size sequences + 1).
  std::vector<int64_t> key_offsets() const;
  // Original row of every packed row.
  std::vector<int64_t> packed_row_ids() const;

  // Keys the packed row `packed` sees; its document position is first_position + j.
  static int64_t visible_keys(int64_t position, int64_t ratio) { return (position + 1) / ratio; }

  // Seed `plan.covers_queries(n)`: the packed rows are rows 0..n-1 in order.
  bool covers_queries(int64_t rows) const;

  // Seed `plan.restore(indices, result)`: copies packed row i (width `width`) of
  // `packed` to its original row of `result` ([rows, width]). Throws Error on sizes.
  void restore(std::span<const int32_t> packed, std::span<int32_t> result, int64_t width) const;

 private:
  std::vector<TndSequence> sequences_;
  int64_t ratio_;
  int64_t packed_rows_ = 0;
};

// Seed `csa_tnd_plan(segments, ratio)`. Validates each segment (non-negative ranges,
// q_begin <= q_end, key_begin <= key_end, 0 <= residual < ratio, and no more rows than
// the document has positions) and throws Error naming the bad one; ratio >= 1.
// Segments keep their order; only rows that see a key are kept.
std::optional<TndPlan> csa_tnd_plan(std::span<const Segment> segments, int64_t ratio);

}  // namespace sparsecp
