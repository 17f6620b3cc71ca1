// libFuzzer target: the KV routes of main attention (dispatch.hpp,
// compression_plan.hpp).
//
// Bytes decode into document lengths (or raw, possibly invalid, boundaries), CP size,
// window and ratio. Only sparsecp::Error may escape. When routes are built for every
// rank, the target checks them against a brute-force model of the whole sequence:
//   * every rank computes the same `exchange_needed`;
//   * rank q's block is [global_start, end of its own rows) with global_start as the
//     documentation defines it (SWA: max(document start, q * local - window + 1);
//     prefix: the compressed offset of the document holding q's first token);
//   * what r sends to q is what q expects from r, and the rows received from lower
//     ranks, concatenated in rank order, are exactly the block rows before q's own;
//   * sent ranges lie inside the sender's physical rows; nobody sends to itself or
//     to a lower rank;
//   * document_compression_plan: nullopt exactly when compression_aligned; otherwise
//     its runs cover the rank's owned blocks in order, every block's raw rows lie in
//     the gathered halo block and inside the block's document, at the right place.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "fuzz_input.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/compression_plan.hpp"
#include "sparsecp/planning/dispatch.hpp"

using namespace sparsecp;

namespace {

using sparsecp::fuzz::fail;
using sparsecp::fuzz::pick_size;

// Checks the routes of all ranks against each other; `owners` are the physical
// offsets (size + 1 entries) and `starts[q]` the expected first block row of q.
void check_routes(const std::vector<SequenceDispatchRoute>& routes,
                  const std::vector<int64_t>& owners, const std::vector<int64_t>& starts) {
  const auto size = static_cast<int64_t>(routes.size());
  for (int64_t q = 0; q < size; ++q) {
    const SequenceDispatchRoute& route = routes[q];
    EXPECT(route.size == size && route.rank == q);
    EXPECT(route.exchange_needed == routes[0].exchange_needed);
    EXPECT(route.local_start == owners[q] && route.local_length == owners[q + 1] - owners[q]);
    EXPECT(route.global_end == owners[q + 1]);
    EXPECT(route.global_start == starts[q]);
    EXPECT(route.send_splits[q] == 0 && route.receive_splits[q] == 0);
    int64_t cursor = route.global_start;  // next global row expected in the block
    for (int64_t r = 0; r < size; ++r) {
      const SequenceDispatchRoute& sender = routes[r];
      EXPECT(sender.send_splits[q] == route.receive_splits[r]);
      const int64_t rows = route.receive_splits[r];
      EXPECT(rows >= 0);
      if (rows == 0) continue;
      EXPECT(r < q);
      EXPECT(sender.send_begin[q] >= 0 && sender.send_begin[q] + rows <= sender.local_length);
      EXPECT(owners[r] + sender.send_begin[q] == cursor);
      cursor += rows;
    }
    EXPECT(cursor == route.local_start);
    EXPECT(route.received_rows() == route.local_start - route.global_start);
  }
  bool needed = false;
  for (int64_t q = 0; q < size; ++q) needed = needed || starts[q] < owners[q];
  EXPECT(routes[0].exchange_needed == needed);
}

// Index of the document holding raw token `token`.
size_t document_of(const std::vector<int64_t>& boundaries, int64_t token) {
  size_t d = 0;
  while (boundaries[d + 1] <= token) ++d;
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size_bytes) {
  FuzzedDataProvider in(data, size_bytes);
  const int64_t size =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 9) : pick_size(in, 40, 1);
  const int64_t window = pick_size(in, 200, 1);
  const int64_t ratio =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 6) : pick_size(in, 300, 0);
  const int64_t rank_choice = in.ConsumeIntegral<int64_t>();
  const bool raw_boundaries = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  std::vector<int64_t> boundaries;
  int64_t local = 0;
  try {
    if (raw_boundaries) {
      boundaries.resize(in.ConsumeIntegralInRange<size_t>(0, 12));
      for (int64_t& b : boundaries) b = pick_size(in, 500, 0);
      local = pick_size(in, 100, 1);
    } else {
      std::vector<int64_t> lengths(in.ConsumeIntegralInRange<size_t>(1, 20));
      for (int64_t& length : lengths) length = pick_size(in, 120, 1);
      boundaries = document_boundaries(lengths);
      // Pad the last document so that the total divides by the CP size.
      if (size >= 1 && size <= 40 && boundaries.back() % size) {
        const int64_t missing = size - boundaries.back() % size;
        if (boundaries.back() <= INT64_MAX - missing) boundaries.back() += missing;
      }
      local = size >= 1 ? boundaries.back() / size : 1;
    }
  } catch (const Error&) {
    return 0;
  }

  // One rank of arbitrary inputs: errors only through Error.
  try {
    sliding_window_route(boundaries, local, size, rank_choice, window);
  } catch (const Error&) {
  }
  try {
    document_prefix_route(boundaries, local, size, rank_choice, ratio);
  } catch (const Error&) {
  }
  try {
    document_compression_plan(boundaries, ratio, local, size, rank_choice);
  } catch (const Error&) {
  }
  try {
    compressed_document_offsets(boundaries, ratio);
    compressed_owner_offsets(boundaries, ratio, local);
  } catch (const Error&) {
  }

  // Every rank of a valid, small sequence: cross-rank model checks.
  if (size < 1 || size > 40 || local < 1 || local > 20000 || boundaries.size() < 2 ||
      boundaries.back() > 20000 || boundaries.back() != local * size) {
    return 0;
  }
  for (size_t i = 1; i < boundaries.size(); ++i) {
    if (boundaries[i] <= boundaries[i - 1] || boundaries[0] != 0) return 0;
  }
  std::vector<int64_t> raw_owners(static_cast<size_t>(size) + 1);
  for (int64_t q = 0; q <= size; ++q) raw_owners[q] = q * local;

  // Sliding window.
  try {
    std::vector<SequenceDispatchRoute> routes;
    std::vector<int64_t> starts;
    for (int64_t q = 0; q < size; ++q) {
      routes.push_back(sliding_window_route(boundaries, local, size, q, window));
      const int64_t first = q * local;
      starts.push_back(std::max(boundaries[document_of(boundaries, first)], first - window + 1));
    }
    check_routes(routes, raw_owners, starts);
  } catch (const Error&) {
    EXPECT(window < 1);  // valid boundaries: only a bad window may be rejected
  }

  // Compressed prefixes and the compression plan.
  if (ratio < 1) return 0;
  std::vector<int64_t> keys;
  std::vector<int64_t> owners;
  try {
    keys = compressed_document_offsets(boundaries, ratio);
    owners = compressed_owner_offsets(boundaries, ratio, local);
  } catch (const Error&) {
    fail("compressed offsets rejected a valid sequence");
  }
  EXPECT(keys.size() == boundaries.size() && owners.size() == static_cast<size_t>(size) + 1);
  EXPECT(owners.back() == keys.back());
  if (ratio <= 2) {
    try {
      std::vector<SequenceDispatchRoute> routes;
      std::vector<int64_t> starts;
      for (int64_t q = 0; q < size; ++q) {
        routes.push_back(document_prefix_route(boundaries, local, size, q, ratio));
        starts.push_back(keys[document_of(boundaries, q * local)]);
      }
      check_routes(routes, owners, starts);
    } catch (const Error&) {
      fail("document_prefix_route rejected a valid sequence");
    }
  }
  const bool aligned = compression_aligned(boundaries, ratio, local);
  std::vector<SequenceDispatchRoute> halos;
  std::vector<int64_t> halo_starts;
  for (int64_t q = 0; q < size; ++q) {
    std::optional<DocumentCompressionPlan> plan;
    try {
      plan = document_compression_plan(boundaries, ratio, local, size, q);
    } catch (const Error&) {
      fail("document_compression_plan rejected a valid sequence");
    }
    EXPECT(plan.has_value() == !aligned);
    if (!plan) continue;
    EXPECT(plan->ratio == ratio);
    EXPECT(plan->key_begin == owners[q] && plan->key_end == owners[q + 1]);
    EXPECT(plan->halo.global_end == (q + 1) * local && plan->halo.local_start == q * local);
    int64_t key = plan->key_begin;
    for (const CompressedRun& run : plan->runs) {
      EXPECT(run.count > 0 && run.key_begin == key);
      EXPECT(run.document >= 0 && static_cast<size_t>(run.document) + 1 < boundaries.size());
      for (int64_t i = 0; i < run.count; ++i) {
        const int64_t block = run.key_begin + i - keys[run.document];  // block within document
        const int64_t raw = boundaries[run.document] + block * ratio;  // its first raw token
        EXPECT(block >= 0 && raw + ratio <= boundaries[run.document + 1]);
        EXPECT(plan->halo.global_start + run.raw_begin + i * ratio == raw);
        EXPECT(run.raw_begin + (i + 1) * ratio <= plan->halo.block_rows());
      }
      key += run.count;
    }
    EXPECT(key == plan->key_end);
    // The halo starts at the first owned block's first raw token, or at the rank's own
    // first token when that is earlier or it owns no block.
    int64_t start = q * local;
    if (owners[q + 1] > owners[q]) {
      size_t d = 0;
      while (keys[d + 1] <= owners[q]) ++d;
      start = std::min(start, boundaries[d] + (owners[q] - keys[d]) * ratio);
    }
    halos.push_back(plan->halo);
    halo_starts.push_back(start);
  }
  if (!aligned) check_routes(halos, raw_owners, halo_starts);
  return 0;
}
