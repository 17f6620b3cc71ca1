#include "sparsecp/planning/compression_plan.hpp"

#include <algorithm>

#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

bool spans_sequence(std::span<const int64_t> boundaries, int64_t local_length, int64_t size) {
  int64_t total = 0;
  if (__builtin_mul_overflow(local_length, size, &total)) return false;
  if (boundaries.size() < 2 || boundaries.front() != 0 || boundaries.back() != total) return false;
  for (size_t i = 1; i < boundaries.size(); ++i) {
    if (boundaries[i] <= boundaries[i - 1]) return false;
  }
  return true;
}

// Document holding compressed row `key` (keys are document offsets, non-decreasing).
size_t document_of_key(const std::vector<int64_t>& keys, int64_t key) {
  return static_cast<size_t>(std::upper_bound(keys.begin(), keys.end(), key) - keys.begin()) - 1;
}

}  // namespace

bool compression_aligned(std::span<const int64_t> boundaries, int64_t ratio, int64_t local_length) {
  if (ratio <= 1) return true;
  if (local_length % ratio != 0) return false;
  return std::all_of(boundaries.begin(), boundaries.end(),
                     [ratio](int64_t boundary) { return boundary % ratio == 0; });
}

std::optional<DocumentCompressionPlan> document_compression_plan(
    std::span<const int64_t> boundaries, int64_t ratio, int64_t local_length, int64_t size,
    int64_t rank) {
  SPARSECP_CHECK(ratio >= 0 && local_length > 0 && size > 0 && 0 <= rank && rank < size,
                 "Document compression requires a non-negative ratio, positive dimensions and a "
                 "valid CP rank");
  SPARSECP_CHECK(spans_sequence(boundaries, local_length, size),
                 "Document compression boundaries must span the full contiguous CP sequence");
  if (compression_aligned(boundaries, ratio, local_length)) return std::nullopt;

  const std::vector<int64_t> keys = compressed_document_offsets(boundaries, ratio);
  const std::vector<int64_t> owners = compressed_owner_offsets(boundaries, ratio, local_length);
  // Raw token where compressed row `key` begins.
  const auto block_start = [&](int64_t key) {
    const size_t d = document_of_key(keys, key);
    return boundaries[d] + (key - keys[d]) * ratio;
  };
  std::vector<int64_t> starts(size);
  std::vector<int64_t> raw_owners(size + 1);
  for (int64_t q = 0; q < size; ++q) {
    raw_owners[q] = q * local_length;
    starts[q] = raw_owners[q];
    if (owners[q] < owners[q + 1]) starts[q] = std::min(starts[q], block_start(owners[q]));
  }
  raw_owners[size] = size * local_length;

  DocumentCompressionPlan plan;
  plan.ratio = ratio;
  plan.halo = dispatch_route_from_intervals(starts, raw_owners, rank);
  plan.key_begin = owners[rank];
  plan.key_end = owners[rank + 1];
  for (int64_t key = plan.key_begin; key < plan.key_end;) {
    const size_t d = document_of_key(keys, key);
    const int64_t end = std::min(keys[d + 1], plan.key_end);
    plan.runs.push_back({static_cast<int64_t>(d),
                         boundaries[d] + (key - keys[d]) * ratio - plan.halo.global_start, key,
                         end - key});
    key = end;
  }
  return plan;
}

}  // namespace sparsecp
