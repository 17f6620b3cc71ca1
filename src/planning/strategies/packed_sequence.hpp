// Internal to the strategies: the packed sequence as global rows, and the pieces of it
// that strategies move as a whole. Not installed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp::strategies {

// Validates like plan_tasks (positive lengths/ratio/cp, sum divisible by cp, no 64-bit
// overflow) with the seed's texts, and returns the total row count.
inline int64_t validate_batch(std::span<const int64_t> lengths, int64_t cp, int64_t ratio) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  int64_t total = 0;
  for (const int64_t length : lengths) total += length;
  return total;
}

// ceil(a / b) for a >= 0 and b >= 1, without forming a + b - 1 (which overflows for a
// block size or alignment near 2^63).
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Documents in packed order: document d holds global rows [starts[d], starts[d + 1]).
class PackedSequence {
 public:
  explicit PackedSequence(std::span<const int64_t> lengths) : starts_(lengths.size() + 1, 0) {
    for (size_t d = 0; d < lengths.size(); ++d) starts_[d + 1] = starts_[d] + lengths[d];
  }

  int64_t total() const { return starts_.back(); }
  int64_t documents() const { return static_cast<int64_t>(starts_.size()) - 1; }
  int64_t start(int64_t document) const { return starts_[static_cast<size_t>(document)]; }
  int64_t length(int64_t document) const { return start(document + 1) - start(document); }

  // The document holding global row `row` (0 <= row < total()).
  int64_t document_of(int64_t row) const {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), row);
    return static_cast<int64_t>(it - starts_.begin()) - 1;
  }

  // Calls visit(document, start, end) for each document piece of global rows
  // [begin, end), in packed order, in document coordinates.
  template <typename Visit>
  void for_each_piece(int64_t begin, int64_t end, Visit&& visit) const {
    if (begin >= end) return;
    for (int64_t d = document_of(begin); begin < end; ++d) {
      const int64_t piece_end = std::min(end, start(d + 1));
      if (piece_end > begin) visit(d, begin - start(d), piece_end - start(d));
      begin = piece_end;
    }
  }

  // Appends the tasks of global rows [begin, end).
  void append_tasks(int64_t begin, int64_t end, std::vector<Task>& tasks) const {
    for_each_piece(begin, end, [&](int64_t d, int64_t s, int64_t e) {
      tasks.push_back({d, s, e});
    });
  }

  // Causal work of global rows [begin, end).
  int64_t work(int64_t begin, int64_t end, int64_t ratio) const {
    int64_t sum = 0;
    for_each_piece(begin, end,
                   [&](int64_t, int64_t s, int64_t e) { sum += range_work(s, e, ratio); });
    return sum;
  }

  // Documents touched by global rows [begin, end).
  int64_t pieces(int64_t begin, int64_t end) const {
    int64_t count = 0;
    for_each_piece(begin, end, [&](int64_t, int64_t, int64_t) { ++count; });
    return count;
  }

  // The largest causal work of any chunk [k * chunk, (k + 1) * chunk) of the packed
  // sequence (the last one may be shorter).
  int64_t largest_chunk_work(int64_t chunk, int64_t ratio) const {
    int64_t largest = 0;
    for (int64_t begin = 0; begin < total(); begin += chunk) {
      largest = std::max(largest, work(begin, std::min(total(), begin + chunk), ratio));
    }
    return largest;
  }

 private:
  std::vector<int64_t> starts_;
};

// The causal work of the costliest single row of the batch: the last row of the
// longest document sees floor(length / ratio) keys.
inline int64_t largest_row_work(std::span<const int64_t> lengths, int64_t ratio) {
  int64_t longest = 0;
  for (const int64_t length : lengths) longest = std::max(longest, length);
  return longest / ratio;
}

// The causal work of the costliest document-relative block [k * block, (k+1) * block)
// (cut short at the document's end), as the seed's greedy pool cuts documents.
inline int64_t largest_block_work(std::span<const int64_t> lengths, int64_t block, int64_t ratio) {
  int64_t largest = 0;
  for (const int64_t length : lengths) {
    // Work grows along a document, so the last block or the last full one is costliest.
    const int64_t last = (length - 1) / block * block;
    largest = std::max(largest, range_work(last, length, ratio));
    if (last >= block) largest = std::max(largest, range_work(last - block, last, ratio));
  }
  return largest;
}

}  // namespace sparsecp::strategies
