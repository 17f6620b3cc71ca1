// libFuzzer target: the planner (plan.hpp) and the Indexer routes (route.hpp).
//
// Bytes decode into document lengths, CP size, ratio, mode, block size and hybrid
// threshold, from ranges that include invalid values (zero, negative, near 2^53 and
// 2^63). Only sparsecp::Error may escape the library; any other exception reaches
// libFuzzer as a crash. When a plan is made, the target checks:
//   * every row of every document is assigned exactly once (check_plan_covers), each
//     rank's tasks are sorted, disjoint and merged;
//   * row caps: none and zigzag give every rank exactly its local row count; greedy and
//     hybrid stay within 2 * local rows per rank;
//   * routes of all ranks agree with each other row for row: the i-th row rank r sends
//     to q is the global row q expects in its i-th receive slot from r, kept rows land
//     where the plan says, and segments describe the worker rows;
//   * indexer_route (including the zigzag fast path) equals make_route of the full
//     plan, and zigzag_rank_tasks equals the plan's tasks.
// Planning allocates O(tasks) and routes O(rows): inputs whose plan or routes would be
// gigantic only run validation (see fuzz/README.md).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "plan_invariants.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/batch_plan.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"

using namespace sparsecp;

namespace {

using sparsecp::fuzz::pick_size;

void check_routes(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                  const PlanOptions& options) {
  const std::vector<IndexerRoute> routes = fuzz::check_routes_agree(plan, lengths, ratio);
  for (int64_t rank = 0; rank < cp; ++rank) {
    EXPECT(indexer_route(lengths, cp, rank, ratio, options) == routes[rank]);
    if (options.mode == Mode::kZigzag) {
      const std::vector<Task> mine = zigzag_rank_tasks(lengths, cp, rank);
      const auto planned = plan.tasks(rank);
      EXPECT(std::equal(mine.begin(), mine.end(), planned.begin(), planned.end()));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t cp =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 9) : pick_size(in, 64);
  const int64_t ratio =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 5) : pick_size(in, 300);
  PlanOptions options;
  options.mode = static_cast<Mode>(in.ConsumeIntegralInRange<int>(0, 3));
  if (in.ConsumeBool()) options.block_size = pick_size(in, 200);
  if (in.ConsumeBool() || (options.mode == Mode::kHybrid && in.ConsumeBool())) {
    options.zigzag_min_length = pick_size(in, 400);
  }
  std::vector<int64_t> lengths(in.ConsumeIntegralInRange<size_t>(0, 24));
  const bool tiny = in.ConsumeBool();
  for (int64_t& length : lengths) {
    length = tiny ? in.ConsumeIntegralInRange<int64_t>(1, 40) : pick_size(in, 700);
  }
  // Make the total divisible by cp often enough to reach the planners.
  if (!lengths.empty() && cp >= 1 && cp <= 64 && in.ConsumeBool()) {
    __int128 total = 0;
    for (const int64_t length : lengths) total += length;
    const int64_t missing = static_cast<int64_t>((cp - total % cp) % cp);
    if (lengths.back() > 0 && lengths.back() <= INT64_MAX - missing) lengths.back() += missing;
  }

  try {
    const std::optional<int64_t> block =
        validate_plan_inputs(lengths, cp, ratio, options.mode, options.block_size);
    validate_hybrid_threshold(options.mode, options.zigzag_min_length);
    // Size guard (documented limit): tasks planned and rows routed.
    __int128 total = 0;
    __int128 tasks = 0;
    for (const int64_t length : lengths) {
      total += length;
      tasks += block ? (length + *block - 1) / *block : 2;
    }
    if (options.mode != Mode::kNone) tasks += static_cast<__int128>(lengths.size()) * 2 * cp;
    if (tasks > (1 << 16)) return 0;
    const TaskPlan plan = plan_tasks(lengths, cp, ratio, options);
    EXPECT(plan.cp() == cp);
    check_plan_covers(plan, lengths);
    const int64_t local = static_cast<int64_t>(total / cp);
    fuzz::check_sorted_disjoint(plan);
    for (int64_t rank = 0; rank < cp; ++rank) {
      if (options.mode == Mode::kNone || options.mode == Mode::kZigzag) {
        EXPECT(plan.rows(rank) == local);
      } else {
        EXPECT(plan.rows(rank) <= worker_row_cap(static_cast<int64_t>(total), cp));
      }
    }
    const PlanStats stats = plan_stats(plan, lengths, ratio);
    EXPECT(stats.imbalance >= 1.0 - 1e-9);
    if (options.mode == Mode::kNone) EXPECT(stats.rows_moved == 0);
    if (total <= (1 << 14)) check_routes(plan, lengths, cp, ratio, options);
  } catch (const Error&) {
    // The library's one error type: a clear rejection.
  }
  return 0;
}
