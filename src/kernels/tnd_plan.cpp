// csa_tnd_plan: keep the rows of each segment that see a key, packed in order.
#include "sparsecp/kernels/tnd_plan.hpp"

#include <limits>

#include "sparsecp/error.hpp"

namespace sparsecp {

TndPlan::TndPlan(std::vector<TndSequence> sequences, int64_t ratio)
    : sequences_(std::move(sequences)), ratio_(ratio) {
  for (const TndSequence& sequence : sequences_) {
    packed_rows_ += sequence.row_end - sequence.row_begin;
  }
}

std::vector<int64_t> TndPlan::query_offsets() const {
  std::vector<int64_t> offsets{0};
  for (const TndSequence& s : sequences_)
    offsets.push_back(s.packed_begin + s.row_end - s.row_begin);
  return offsets;
}

std::vector<int64_t> TndPlan::key_offsets() const {
  std::vector<int64_t> offsets{0};
  for (const TndSequence& s : sequences_)
    offsets.push_back(offsets.back() + s.key_end - s.key_begin);
  return offsets;
}

std::vector<int64_t> TndPlan::packed_row_ids() const {
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(packed_rows_));
  for (const TndSequence& s : sequences_) {
    for (int64_t row = s.row_begin; row < s.row_end; ++row) rows.push_back(row);
  }
  return rows;
}

bool TndPlan::covers_queries(int64_t rows) const {
  int64_t next = 0;
  for (const TndSequence& s : sequences_) {
    if (s.row_begin != next) return false;
    next = s.row_end;
  }
  return next == rows;
}

void TndPlan::restore(std::span<const int32_t> packed, std::span<int32_t> result,
                      int64_t width) const {
  SPARSECP_CHECK(width >= 0, "TND restore width must be non-negative, got ", width);
  SPARSECP_CHECK(static_cast<int64_t>(packed.size()) == packed_rows_ * width,
                 "TND restore expects ", packed_rows_, " packed rows of width ", width, ", got ",
                 packed.size(), " values");
  for (const TndSequence& s : sequences_) {
    SPARSECP_CHECK(s.row_end * width <= static_cast<int64_t>(result.size()),
                   "TND restore result holds ", result.size(), " values, too few for row ",
                   s.row_end - 1, " of width ", width);
    const int64_t count = (s.row_end - s.row_begin) * width;
    for (int64_t i = 0; i < count; ++i) {
      result[static_cast<size_t>(s.row_begin * width + i)] =
          packed[static_cast<size_t>(s.packed_begin * width + i)];
    }
  }
}

std::optional<TndPlan> csa_tnd_plan(std::span<const Segment> segments, int64_t ratio) {
  SPARSECP_CHECK(ratio >= 1, "Indexer compression ratio must be positive, got ", ratio);
  constexpr int64_t kLimit = std::numeric_limits<int64_t>::max() / 4;
  std::vector<TndSequence> sequences;
  int64_t packed = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    SPARSECP_CHECK(s.q_begin >= 0 && s.q_begin <= s.q_end && s.key_begin >= 0 &&
                       s.key_begin <= s.key_end && s.q_end < kLimit && s.key_end < kLimit,
                   "Indexer segment ", i, " (", s.q_begin, ", ", s.q_end, ", ", s.key_begin, ", ",
                   s.key_end, ", ", s.residual,
                   ") needs 0 <= q_begin <= q_end and 0 <= key_begin <= key_end");
    SPARSECP_CHECK(s.residual >= 0 && s.residual < ratio, "Indexer segment ", i, " residual ",
                   s.residual, " is outside [0, ratio ", ratio, ")");
    SPARSECP_CHECK((s.key_end - s.key_begin) <= kLimit / ratio, "Indexer segment ", i,
                   " key count ", s.key_end - s.key_begin, " is too large");
    const int64_t end = (s.key_end - s.key_begin) * ratio + s.residual;
    const int64_t rows = s.q_end - s.q_begin;
    SPARSECP_CHECK(rows <= end, "Indexer segment ", i, " holds ", rows,
                   " rows but its document ends at position ", end);
    const int64_t first = end - rows;  // document position of row q_begin
    // Rows at positions p < ratio - 1 see no key; skip them.
    const int64_t skip = first >= ratio - 1 ? 0 : std::min(rows, ratio - 1 - first);
    if (skip == rows) continue;
    sequences.push_back(
        TndSequence{s.q_begin + skip, s.q_end, packed, first + skip, s.key_begin, s.key_end});
    packed += rows - skip;
  }
  if (sequences.empty()) return std::nullopt;
  return TndPlan(std::move(sequences), ratio);
}

}  // namespace sparsecp
