#include "sparsecp/planning/dispatch.hpp"

#include <algorithm>
#include <numeric>

#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

// Routes and owner offsets hold O(size) entries: bound the CP group a hostile input can
// request (the planner's limit, plan.cpp), so a tiny local length over a huge sequence
// is an Error rather than a gigantic allocation.
constexpr int64_t kMaxRanks = int64_t{1} << 20;

void check_rank_count(int64_t size) {
  SPARSECP_CHECK(size <= kMaxRanks, "sequence dispatch over ", size,
                 " CP ranks exceeds the supported maximum ", kMaxRanks);
}

// True when boundaries are 0 = b[0] < b[1] < ... < b[n] (n >= 1).
bool increasing_from_zero(std::span<const int64_t> boundaries) {
  if (boundaries.size() < 2 || boundaries.front() != 0) return false;
  for (size_t i = 1; i < boundaries.size(); ++i) {
    if (boundaries[i] <= boundaries[i - 1]) return false;
  }
  return true;
}

// True when boundaries span exactly local_length * size (and that product fits).
bool spans_sequence(std::span<const int64_t> boundaries, int64_t local_length, int64_t size) {
  int64_t total = 0;
  if (__builtin_mul_overflow(local_length, size, &total)) return false;
  return increasing_from_zero(boundaries) && boundaries.back() == total;
}

// Start of the document holding raw token `token` (seed:
// boundaries[bisect_right(boundaries, token) - 1]), as an index into boundaries.
size_t document_of(std::span<const int64_t> boundaries, int64_t token) {
  const auto it = std::upper_bound(boundaries.begin(), boundaries.end(), token);
  return static_cast<size_t>(it - boundaries.begin()) - 1;
}

}  // namespace

int64_t SequenceDispatchRoute::sent_rows() const {
  return std::accumulate(send_splits.begin(), send_splits.end(), int64_t{0});
}

SequenceDispatchRoute dispatch_route_from_intervals(std::span<const int64_t> interval_starts,
                                                    std::span<const int64_t> owner_offsets,
                                                    int64_t rank) {
  const auto size = static_cast<int64_t>(interval_starts.size());
  SPARSECP_CHECK(size >= 1, "sequence dispatch needs at least one rank, got ", size);
  SPARSECP_CHECK(static_cast<int64_t>(owner_offsets.size()) == size + 1,
                 "sequence dispatch owner offsets need ", size + 1, " entries, got ",
                 owner_offsets.size());
  SPARSECP_CHECK(0 <= rank && rank < size, "sequence dispatch rank ", rank,
                 " is outside its CP group of size ", size);
  SPARSECP_CHECK(owner_offsets[0] == 0, "sequence dispatch owner offsets must start at 0, got ",
                 owner_offsets[0]);
  for (int64_t q = 0; q < size; ++q) {
    SPARSECP_CHECK(owner_offsets[q + 1] >= owner_offsets[q],
                   "sequence dispatch owner offsets must not decrease, got ", owner_offsets[q],
                   " then ", owner_offsets[q + 1], " at rank ", q);
    SPARSECP_CHECK(0 <= interval_starts[q] && interval_starts[q] <= owner_offsets[q],
                   "sequence dispatch interval of rank ", q, " starts at ", interval_starts[q],
                   ", outside [0, ", owner_offsets[q], "]");
  }

  SequenceDispatchRoute route;
  route.size = size;
  route.rank = rank;
  route.global_start = interval_starts[rank];
  route.global_end = owner_offsets[rank + 1];
  route.local_start = owner_offsets[rank];
  route.local_length = owner_offsets[rank + 1] - owner_offsets[rank];
  route.send_begin.assign(size, 0);
  route.send_splits.assign(size, 0);
  route.receive_splits.assign(size, 0);
  // Consumers are higher ranks only: a lower rank's interval ends at or before our rows.
  for (int64_t q = rank + 1; q < size; ++q) {
    const int64_t first = std::max(interval_starts[q], route.local_start);
    if (first < route.global_end) {
      route.send_begin[q] = first - route.local_start;
      route.send_splits[q] = route.global_end - first;
    }
  }
  for (int64_t p = 0; p < rank; ++p) {
    const int64_t first = std::max(route.global_start, owner_offsets[p]);
    route.receive_splits[p] = std::max<int64_t>(0, owner_offsets[p + 1] - first);
  }
  for (int64_t q = 0; q < size && !route.exchange_needed; ++q) {
    route.exchange_needed = interval_starts[q] < owner_offsets[q];
  }
  route.boundaries.assign(owner_offsets.begin(), owner_offsets.end());
  route.interval_starts.assign(interval_starts.begin(), interval_starts.end());
  return route;
}

SequenceDispatchRoute sliding_window_route(std::span<const int64_t> boundaries,
                                           int64_t local_length, int64_t size, int64_t rank,
                                           int64_t window) {
  SPARSECP_CHECK(local_length > 0 && size > 0 && 0 <= rank && rank < size && window > 0,
                 "SWA dispatch requires positive dimensions and a valid CP rank");
  SPARSECP_CHECK(spans_sequence(boundaries, local_length, size),
                 "SWA document boundaries must span the full contiguous CP sequence");
  check_rank_count(size);
  std::vector<int64_t> starts(size);
  std::vector<int64_t> owners(size + 1);
  for (int64_t q = 0; q < size; ++q) {
    const int64_t first = q * local_length;
    // first - window + 1 cannot overflow: first >= 0 and window <= INT64_MAX.
    starts[q] = std::max(boundaries[document_of(boundaries, first)], first - window + 1);
    owners[q] = first;
  }
  owners[size] = size * local_length;
  SequenceDispatchRoute route = dispatch_route_from_intervals(starts, owners, rank);
  route.kind = DispatchRouteKind::kSlidingWindow;
  route.boundaries.assign(boundaries.begin(), boundaries.end());
  route.interval_starts.clear();
  route.raw_local_length = local_length;
  route.window = window;
  return route;
}

std::vector<int64_t> compressed_document_offsets(std::span<const int64_t> boundaries,
                                                 int64_t ratio) {
  SPARSECP_CHECK(ratio >= 1, "compressed document offsets need a positive ratio, got ", ratio);
  SPARSECP_CHECK(increasing_from_zero(boundaries),
                 "compressed document offsets need strictly increasing document boundaries "
                 "starting at 0");
  std::vector<int64_t> keys(boundaries.size(), 0);
  for (size_t d = 1; d < boundaries.size(); ++d) {
    keys[d] = keys[d - 1] + (boundaries[d] - boundaries[d - 1]) / ratio;
  }
  return keys;
}

std::vector<int64_t> compressed_owner_offsets(std::span<const int64_t> boundaries, int64_t ratio,
                                              int64_t local_length) {
  SPARSECP_CHECK(local_length > 0, "compressed owner offsets need a positive local length, got ",
                 local_length);
  const std::vector<int64_t> keys = compressed_document_offsets(boundaries, ratio);
  const int64_t total = boundaries.back();
  SPARSECP_CHECK(total % local_length == 0, "compressed owner offsets: sequence length ", total,
                 " is not a multiple of the local length ", local_length);
  const int64_t size = total / local_length;
  check_rank_count(size);
  std::vector<int64_t> owners(size + 1);
  for (int64_t r = 0; r <= size; ++r) {
    const int64_t first = r * local_length;
    const size_t d = document_of(boundaries, first);
    // Blocks of document d whose last token is before `first`; at the end of the
    // sequence d is the final boundary and this adds 0.
    owners[r] = keys[d] + (first - boundaries[d]) / ratio;
  }
  return owners;
}

SequenceDispatchRoute document_prefix_route(std::span<const int64_t> boundaries,
                                            int64_t local_length, int64_t size, int64_t rank,
                                            int64_t ratio) {
  SPARSECP_CHECK(
      (ratio == 1 || ratio == 2) && local_length > 0 && size > 0 && 0 <= rank && rank < size,
      "Main KV dispatch requires a supported ratio and equal positive raw CP shards");
  SPARSECP_CHECK(spans_sequence(boundaries, local_length, size),
                 "Main KV document boundaries must span the complete contiguous CP sequence");
  check_rank_count(size);
  const std::vector<int64_t> keys = compressed_document_offsets(boundaries, ratio);
  const std::vector<int64_t> owners = compressed_owner_offsets(boundaries, ratio, local_length);
  std::vector<int64_t> starts(size);
  for (int64_t q = 0; q < size; ++q) {
    starts[q] = keys[document_of(boundaries, q * local_length)];
  }
  SequenceDispatchRoute route = dispatch_route_from_intervals(starts, owners, rank);
  route.kind = DispatchRouteKind::kDocumentPrefix;
  route.boundaries.assign(boundaries.begin(), boundaries.end());
  route.interval_starts.clear();
  route.raw_local_length = local_length;
  route.ratio = ratio;
  return route;
}

std::vector<int64_t> document_boundaries(std::span<const int64_t> lengths) {
  std::vector<int64_t> boundaries(lengths.size() + 1, 0);
  for (size_t d = 0; d < lengths.size(); ++d) {
    SPARSECP_CHECK(lengths[d] > 0, "document length ", d, " must be positive, got ", lengths[d]);
    SPARSECP_CHECK(!__builtin_add_overflow(boundaries[d], lengths[d], &boundaries[d + 1]),
                   "document lengths overflow a 64-bit token count at document ", d);
  }
  return boundaries;
}

}  // namespace sparsecp
