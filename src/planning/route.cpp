#include "sparsecp/planning/route.hpp"

#include <algorithm>
#include <iterator>
#include <numeric>

#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

// Rows [first, first + count) of some local index space, one contiguous run.
struct RowRange {
  int64_t first;
  int64_t count;
};

std::vector<int64_t> packed_boundaries(std::span<const int64_t> lengths) {
  std::vector<int64_t> boundaries(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), boundaries.begin() + 1);
  return boundaries;
}

// Yields first, first + 1, ...: lets vector::insert write each row index once, without
// the zero fill that resize() would do first (that fill was a third of route building).
struct CountingIterator {
  using iterator_category = std::random_access_iterator_tag;
  using value_type = int64_t;
  using difference_type = std::ptrdiff_t;
  using pointer = const int64_t*;
  using reference = int64_t;

  int64_t value;
  int64_t operator*() const { return value; }
  CountingIterator& operator++() {
    ++value;
    return *this;
  }
  CountingIterator operator++(int) { return {value++}; }
  CountingIterator& operator--() {
    --value;
    return *this;
  }
  CountingIterator operator--(int) { return {value--}; }
  CountingIterator& operator+=(difference_type step) {
    value += step;
    return *this;
  }
  CountingIterator& operator-=(difference_type step) {
    value -= step;
    return *this;
  }
  CountingIterator operator+(difference_type step) const { return {value + step}; }
  CountingIterator operator-(difference_type step) const { return {value - step}; }
  int64_t operator[](difference_type step) const { return value + step; }
  auto operator<=>(const CountingIterator&) const = default;
  difference_type operator-(const CountingIterator& other) const { return value - other.value; }
  bool operator==(const CountingIterator&) const = default;
};

void append_range(std::vector<int64_t>& rows, int64_t first, int64_t count) {
  rows.insert(rows.end(), CountingIterator{first}, CountingIterator{first + count});
}

// Seed `_route_from_ranges` with `_receive_ranges` folded in. A worker's tasks are
// sorted by (document, start), so their packed positions increase and their owners
// never decrease: grouping received rows by owner is the task order itself.
// `sends[peer]` are this owner's local row runs for `peer`, in packed order.
IndexerRoute route_from_ranges(std::span<const Task> tasks, std::span<const int64_t> lengths,
                               std::span<const int64_t> boundaries, int64_t cp, int64_t rank,
                               int64_t ratio, const std::vector<std::vector<RowRange>>& sends) {
  const int64_t local = boundaries.back() / cp;
  IndexerRoute route;
  route.segments = make_segments(tasks, lengths, ratio);
  route.input_splits.assign(static_cast<size_t>(cp), 0);
  route.output_splits.assign(static_cast<size_t>(cp), 0);

  int64_t sent = 0;
  for (int64_t peer = 0; peer < cp; ++peer) {
    if (peer == rank) continue;
    for (const RowRange& range : sends[static_cast<size_t>(peer)]) {
      route.input_splits[static_cast<size_t>(peer)] += range.count;
    }
    sent += route.input_splits[static_cast<size_t>(peer)];
  }
  route.send_rows.reserve(static_cast<size_t>(sent));
  for (int64_t peer = 0; peer < cp; ++peer) {
    if (peer == rank) continue;
    for (const RowRange& range : sends[static_cast<size_t>(peer)]) {
      append_range(route.send_rows, range.first, range.count);
    }
  }

  // Worker side: each task's rows split at owner boundaries.
  int64_t kept = 0;
  int64_t cursor = 0;
  for (const Task& task : tasks) {
    const int64_t begin = boundaries[static_cast<size_t>(task.document)] + task.start;
    const int64_t end = begin + task.length();
    const int64_t mine =
        std::max<int64_t>(0, std::min(end, (rank + 1) * local) - std::max(begin, rank * local));
    kept += mine;
    cursor += task.length();
  }
  route.query_count = cursor;
  route.local_sources.reserve(static_cast<size_t>(kept));
  route.local_targets.reserve(static_cast<size_t>(kept));
  route.receive_rows.reserve(static_cast<size_t>(cursor - kept));
  cursor = 0;
  for (const Task& task : tasks) {
    const int64_t begin = boundaries[static_cast<size_t>(task.document)] + task.start;
    for_each_owner_piece(task, boundaries, local, [&](int64_t owner, int64_t first, int64_t last) {
      const int64_t position = cursor + first - begin;
      if (owner == rank) {
        append_range(route.local_sources, first - owner * local, last - first);
        append_range(route.local_targets, position, last - first);
      } else {
        append_range(route.receive_rows, position, last - first);
        route.output_splits[static_cast<size_t>(owner)] += last - first;
      }
    });
    cursor += task.length();
  }
  return route;
}

// Seed `_send_ranges`: the runs of this owner's rows inside one worker's sorted tasks.
void append_send_ranges(std::span<const Task> tasks, std::span<const int64_t> boundaries,
                        int64_t first, int64_t last, std::vector<RowRange>& out) {
  // First task whose packed end lies beyond `first` (bisect_right on the end).
  auto it =
      std::upper_bound(tasks.begin(), tasks.end(), first, [&](int64_t value, const Task& task) {
        return value < boundaries[static_cast<size_t>(task.document)] + task.end;
      });
  for (; it != tasks.end(); ++it) {
    const int64_t base = boundaries[static_cast<size_t>(it->document)];
    const int64_t begin = base + it->start;
    if (begin >= last) break;
    const int64_t from = std::max(first, begin);
    const int64_t to = std::min(last, base + it->end);
    out.push_back({from - first, to - from});
  }
}

// Seed `_zigzag_send_ranges` with `_zigzag_intersections`: inverts the zigzag
// placement for this owner's rows without building any other rank's tasks.
std::vector<std::vector<RowRange>> zigzag_send_ranges(std::span<const int64_t> lengths,
                                                      std::span<const int64_t> boundaries,
                                                      int64_t cp, int64_t rank) {
  const int64_t local = boundaries.back() / cp;
  int64_t pooled_total = 0;
  for (const int64_t length : lengths) pooled_total += length % (2 * cp);
  const int64_t capacity = pooled_total / cp;
  const int64_t first = rank * local;
  const int64_t last = first + local;
  std::vector<std::vector<RowRange>> sends(static_cast<size_t>(cp));

  auto document = static_cast<size_t>(
      std::upper_bound(boundaries.begin(), boundaries.end(), first) - boundaries.begin() - 1);
  // Remainder rows pooled before `document`.
  int64_t pooled = 0;
  for (size_t earlier = 0; earlier < document; ++earlier) pooled += lengths[earlier] % (2 * cp);
  for (; document < lengths.size() && boundaries[document] < last; ++document) {
    const int64_t length = lengths[document];
    const int64_t base = boundaries[document];
    const int64_t chunk = length / (2 * cp);
    const int64_t remainder = length % (2 * cp);
    int64_t begin = std::max<int64_t>(0, first - base);
    const int64_t end = std::min(length, last - base);
    // Positive remainders imply positive capacity (total % cp == 0).
    while (begin < std::min(end, remainder)) {
      const int64_t peer = (pooled + begin) / capacity;
      const int64_t stop = std::min({end, remainder, (peer + 1) * capacity - pooled});
      sends[static_cast<size_t>(peer)].push_back({base + begin - first, stop - begin});
      begin = stop;
    }
    while (begin < end) {
      const int64_t slot = (begin - remainder) / chunk;
      const int64_t peer = std::min(slot, 2 * cp - 1 - slot);
      const int64_t stop = std::min(end, remainder + (slot + 1) * chunk);
      sends[static_cast<size_t>(peer)].push_back({base + begin - first, stop - begin});
      begin = stop;
    }
    pooled += remainder;
  }
  return sends;
}

void append_ordered_task(std::vector<Task>& tasks, int64_t document, int64_t start, int64_t end) {
  if (start >= end) return;
  if (!tasks.empty() && tasks.back().document == document && tasks.back().end == start) {
    tasks.back().end = end;
  } else {
    tasks.push_back({document, start, end});
  }
}

void check_rank(int64_t cp, int64_t rank) {
  SPARSECP_CHECK(rank >= 0 && rank < cp, "Indexer balance rank must be inside its CP group");
}

}  // namespace

std::vector<Segment> make_segments(std::span<const Task> tasks, std::span<const int64_t> lengths,
                                   int64_t ratio) {
  SPARSECP_CHECK(ratio >= 1, "Indexer compression ratio must be positive, got ", ratio);
  // Key base of every document up to the last one the tasks name (tasks are sorted).
  std::vector<Segment> segments;
  segments.reserve(tasks.size());
  int64_t key_base = 0;
  size_t based = 0;  // key_base is the first key of document `based`
  int64_t cursor = 0;
  for (const Task& task : tasks) {
    const auto document = static_cast<size_t>(task.document);
    SPARSECP_CHECK(document < lengths.size(), "task names document ", task.document, " of ",
                   lengths.size());
    if (document < based) {  // unsorted input: restart the running sum
      key_base = 0;
      based = 0;
    }
    for (; based < document; ++based) key_base += lengths[based] / ratio;
    segments.push_back(
        {cursor, cursor + task.length(), key_base, key_base + task.end / ratio, task.end % ratio});
    cursor += task.length();
  }
  return segments;
}

IndexerRoute make_route(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t rank,
                        int64_t ratio) {
  const int64_t cp = plan.cp();
  check_rank(cp, rank);
  const std::vector<int64_t> boundaries = packed_boundaries(lengths);
  SPARSECP_CHECK(boundaries.back() > 0 && boundaries.back() % cp == 0,
                 "Indexer balance needs positive document lengths/ratio and an equal contiguous CP "
                 "partition");
  const int64_t local = boundaries.back() / cp;
  // Plans from outside the planners (TaskPlan::from_ranks) must name real rows.
  for (int64_t peer = 0; peer < cp; ++peer) {
    for (const Task& task : plan.tasks(peer)) {
      SPARSECP_CHECK(task.document >= 0 && task.document < static_cast<int64_t>(lengths.size()) &&
                         task.start >= 0 && task.end <= lengths[static_cast<size_t>(task.document)],
                     "plan task (", task.document, ", ", task.start, ", ", task.end, ") of rank ",
                     peer, " lies outside the batch's documents");
    }
  }
  std::vector<std::vector<RowRange>> sends(static_cast<size_t>(cp));
  for (int64_t peer = 0; peer < cp; ++peer) {
    if (peer != rank) {
      append_send_ranges(plan.tasks(peer), boundaries, rank * local, (rank + 1) * local,
                         sends[static_cast<size_t>(peer)]);
    }
  }
  return route_from_ranges(plan.tasks(rank), lengths, boundaries, cp, rank, ratio, sends);
}

std::vector<Task> zigzag_rank_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t rank) {
  int64_t pooled_total = 0;
  for (const int64_t length : lengths) pooled_total += length % (2 * cp);
  const int64_t capacity = pooled_total / cp;
  const int64_t first = rank * capacity;
  const int64_t last = first + capacity;
  std::vector<Task> tasks;
  int64_t pooled = 0;
  for (size_t document = 0; document < lengths.size(); ++document) {
    const auto doc = static_cast<int64_t>(document);
    const int64_t chunk = lengths[document] / (2 * cp);
    const int64_t remainder = lengths[document] % (2 * cp);
    append_ordered_task(tasks, doc, std::max<int64_t>(0, first - pooled),
                        std::min(remainder, last - pooled));
    pooled += remainder;
    if (chunk) {
      for (const int64_t slot : {rank, 2 * cp - 1 - rank}) {
        const int64_t start = remainder + slot * chunk;
        append_ordered_task(tasks, doc, start, start + chunk);
      }
    }
  }
  return tasks;
}

IndexerRoute indexer_route(std::span<const int64_t> lengths, int64_t cp, int64_t rank,
                           int64_t ratio, const PlanOptions& options) {
  check_rank(cp, rank);
  if (options.mode == Mode::kZigzag) {
    validate_plan_inputs(lengths, cp, ratio, options.mode, options.block_size);
    validate_hybrid_threshold(options.mode, options.zigzag_min_length);
    const std::vector<int64_t> boundaries = packed_boundaries(lengths);
    const std::vector<Task> tasks = zigzag_rank_tasks(lengths, cp, rank);
    return route_from_ranges(tasks, lengths, boundaries, cp, rank, ratio,
                             zigzag_send_ranges(lengths, boundaries, cp, rank));
  }
  return make_route(plan_tasks(lengths, cp, ratio, options), lengths, rank, ratio);
}

ExchangeBytes expected_exchange_bytes(const IndexerRoute& route, int64_t input_row_bytes,
                                      int64_t topk) {
  const auto product = [](int64_t a, int64_t b) {
    int64_t value = 0;
    SPARSECP_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &value),
                   "Indexer exchange bytes of ", a, " x ", b, " overflows 64 bits");
    return value;
  };
  const int64_t sent = static_cast<int64_t>(route.send_rows.size());
  const int64_t received = static_cast<int64_t>(route.receive_rows.size());
  const int64_t result_row = product(topk, static_cast<int64_t>(sizeof(int32_t)));
  return {product(sent, input_row_bytes), product(received, input_row_bytes),
          product(received, result_row), product(sent, result_row)};
}

}  // namespace sparsecp
