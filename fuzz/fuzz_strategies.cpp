// libFuzzer target: plan_spill (spill.hpp) and every registered strategy
// (strategy.hpp's all_strategies(): the seed modes, per-doc-zigzag, round-robin, snake,
// lpt-search, spill, auto, and any added later), with the all-rank invariants.
//
// Bytes decode into document lengths, CP size, ratio, SpillOptions (target imbalance,
// fragment bound, a linear cost model) and StrategyParams, from ranges that include
// invalid values (zero, negative, NaN, near 2^62 and 2^63). Only sparsecp::Error may
// escape; any other exception, sanitizer report or broken invariant is a crash. When a
// plan is made, the target checks:
//   * it is a plan for `cp` ranks that assigns every row of every document exactly once
//     (check_plan_covers), each rank's tasks sorted, disjoint and merged; a strategy
//     reports `cp` padding entries;
//   * row caps where the strategy promises one: none, zigzag and round-robin give every
//     rank exactly its local rows; greedy, hybrid, spill and auto stay within the seed's
//     cap worker_row_cap(total, cp) (2 x local, saturating);
//   * spill's own accounting: rows moved = the plan's rows moved = the sum of rows shed
//     and of rows received, and per-rank rows = local - shed + received;
//   * the routes every rank builds from the plan agree with each other row for row
//     (what rank r sends to q is what q expects from r; plan_invariants.hpp).
// Size guards (documented in fuzz/README.md): strategies run on batches of at most 2^16
// tokens (several are O(rows)), routes are built up to 2^12 tokens; plan_spill, which is
// O(documents + cp), also runs on huge batches (the overflow paths).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "plan_invariants.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategy.hpp"

using namespace sparsecp;

namespace {

using sparsecp::fuzz::pick_real;
using sparsecp::fuzz::pick_size;

// The promise a strategy makes about per-rank rows.
enum class RowPromise { kNone, kExactlyLocal, kSeedCap };

RowPromise promise_of(std::string_view name) {
  if (name == "none" || name == "zigzag" || name == "round-robin") return RowPromise::kExactlyLocal;
  if (name == "greedy" || name == "hybrid" || name == "spill" || name == "auto") {
    return RowPromise::kSeedCap;
  }
  return RowPromise::kNone;
}

void check_plan(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                RowPromise promise, bool routes) {
  EXPECT(plan.cp() == cp);
  check_plan_covers(plan, lengths);  // throws Error on a gap or overlap: see must_hold
  fuzz::check_sorted_disjoint(plan);
  __int128 total = 0;
  for (const int64_t length : lengths) total += length;
  const int64_t local = static_cast<int64_t>(total / cp);
  const int64_t cap = worker_row_cap(static_cast<int64_t>(total), cp);
  for (int64_t rank = 0; rank < cp; ++rank) {
    if (promise == RowPromise::kExactlyLocal) EXPECT(plan.rows(rank) == local);
    if (promise == RowPromise::kSeedCap) EXPECT(plan.rows(rank) <= cap);
  }
  if (routes) fuzz::check_routes_agree(plan, lengths, ratio);
}

// check_plan_covers reports a broken plan as an Error; a strategy that built one must not
// look like a clean rejection of its inputs.
template <typename Check>
void must_hold(Check&& check) {
  try {
    check();
  } catch (const Error& error) {
    std::fprintf(stderr, "plan check failed: %s\n", error.what());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int64_t cp =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 9) : pick_size(in, 64);
  const int64_t ratio =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(1, 5) : pick_size(in, 300);
  std::vector<int64_t> lengths(in.ConsumeIntegralInRange<size_t>(0, 16));
  const bool tiny = in.ConsumeBool();
  for (int64_t& length : lengths) {
    length = tiny ? in.ConsumeIntegralInRange<int64_t>(1, 60) : pick_size(in, 900);
  }
  // Make the total divisible by cp often enough to reach the planners.
  if (!lengths.empty() && cp >= 1 && cp <= 64 && in.ConsumeBool()) {
    __int128 total = 0;
    for (const int64_t length : lengths) total += length;
    const int64_t missing = static_cast<int64_t>((cp - total % cp) % cp);
    if (lengths.back() > 0 && lengths.back() <= INT64_MAX - missing) lengths.back() += missing;
  }

  SpillOptions spill;
  spill.target_imbalance = in.ConsumeBool() ? 1.001 : pick_real(in, 1.0, 3.0);
  spill.max_received_fragments = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<int64_t>(-1, 6);
  if (in.ConsumeBool()) {
    // Coefficients up to the largest double sometimes (issue 30: 1e308 gave inf/nan loads):
    // a model is either refused or every load it gives is finite.
    const double most = in.ConsumeBool() ? std::numeric_limits<double>::max() : 1e4;
    spill.cost = CostModel::linear(pick_real(in, 0, most), pick_real(in, 0, 100),
                                   pick_real(in, 0, 100), pick_size(in, 600));
    spill.cost.b = in.ConsumeBool() ? spill.cost.b : pick_real(in, 0, most);
    spill.cost.d = pick_real(in, 0, 100);  // the top-k admission term
  }

  StrategyParams params;
  if (in.ConsumeBool()) params.block_size = pick_size(in, 200);
  if (in.ConsumeBool()) params.zigzag_min_length = pick_size(in, 400);
  params.snake_block = in.ConsumeBool() ? 128 : pick_size(in, 64);
  params.lpt_align = in.ConsumeBool() ? 128 : pick_size(in, 64);
  params.lpt_row_cap = in.ConsumeBool() ? 1.0 : pick_real(in, 1.0, 3.0);
  params.lpt_search_steps = in.ConsumeIntegralInRange<int64_t>(-1, 8);
  params.lpt_fragment_cap = in.ConsumeIntegralInRange<int64_t>(-1, 8);
  params.lpt_cost = in.ConsumeBool() ? RowCost::kMagi : RowCost::kCausal;
  params.window = pick_size(in, 256);
  params.topk = pick_size(in, 600);

  __int128 total = 0;
  for (const int64_t length : lengths) total += length;
  const bool small = total <= (1 << 16) && cp >= 1 && cp <= 64;
  const bool routes = total <= (1 << 12);

  // plan_spill: O(documents + cp), so on every input, huge ones included.
  try {
    const SpillPlan planned = plan_spill(lengths, cp, ratio, spill);
    must_hold([&] {
      check_plan(planned.plan, lengths, cp, ratio, RowPromise::kSeedCap, routes && small);
    });
    const PlanStats stats = plan_stats(planned.plan, lengths, ratio);
    int64_t shed = 0;
    int64_t received = 0;
    for (int64_t rank = 0; rank < cp; ++rank) {
      shed += planned.rows_shed[rank];
      received += planned.rows_received[rank];
      EXPECT(planned.plan.rows(rank) == static_cast<int64_t>(total / cp) - planned.rows_shed[rank] +
                                            planned.rows_received[rank]);
    }
    EXPECT(planned.rows_moved == shed && shed == received && stats.rows_moved == shed);
    EXPECT(std::isfinite(planned.target_load) && std::isfinite(planned.mean_load));
    for (int64_t rank = 0; rank < cp; ++rank) {
      EXPECT(std::isfinite(planned.load_before[rank]) && std::isfinite(planned.load_after[rank]));
    }
  } catch (const Error&) {
    // A clear rejection of the inputs or options.
  }

  if (!small) return 0;
  for (const Strategy* strategy : all_strategies()) {
    try {
      const Plan planned = strategy->plan(lengths, cp, ratio, params);
      must_hold([&] {
        check_plan(planned.tasks(), lengths, cp, ratio, promise_of(strategy->name()), routes);
      });
      EXPECT(static_cast<int64_t>(planned.padding_rows().size()) == cp);
      EXPECT(planned.largest_unit_work() >= 0);
    } catch (const Error&) {
      // A clear rejection.
    }
  }
  return 0;
}
