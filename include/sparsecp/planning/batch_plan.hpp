// sparsecp: Plan — one strategy's plan of one batch, the one result type of planning.
//
// Every strategy (strategy.hpp: hyper_parallel's modes, the peers, spill, auto) returns a
// Plan. It holds what was decided and what it was decided for:
//   * the per-rank task lists (TaskPlan, plan.hpp): which rank selects which rows;
//   * the batch: document lengths, CP size, ratio, and the strategy's name;
//   * what the strategy knows about its own layout: padding rows per rank, the causal
//     work of its largest indivisible unit, a remark;
// and, computed on first use and then kept (a Plan is immutable; copies share them):
//   * `stats()`: per-rank rows, causal work and modelled cost, fragments, rows and
//     bytes each rank sends and receives, rows moved and the imbalance;
//   * `balance_bound()` and `rows_moved_bound()`: the two lower bounds of lower_bound.hpp
//     (the best imbalance any row-granular plan reaches, and the fewest rows any plan
//     whose busiest rank is no busier than this one's must move);
//   * `route(rank)`: that rank's IndexerRoute (route.hpp), for transport.
//
// Vocabulary: "work" is causal (query, key) pairs (cost.hpp), the seed's measure;
// "cost" is the cost model's figure (cost_model.hpp, nanoseconds for a calibrated model,
// causal pairs for the default one).
//
// Pure: no communication, no clock, no files; identical on every rank for equal inputs.
// Lazy figures are computed under a once-flag, so a Plan may be shared between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/row_bytes.hpp"

namespace sparsecp {

// What a strategy knows about its own layout, beside the task lists.
struct PlanLayout {
  // Per rank: synthetic padding rows the layout adds and computes for nothing
  // (per-doc-zigzag pads every document to a multiple of 2 * cp). Empty means zeros.
  std::vector<int64_t> padding_rows;
  // Causal work of the largest unit the strategy never splits (a block, a fragment, a
  // shard, or a single row for row-granular strategies). No plan at this granularity
  // can have a busiest rank below max(mean work, this).
  int64_t largest_unit_work = 0;
  // Human-readable remark, e.g. "fragment cap exceeded: contiguous fallback".
  std::string note;
};

// The figures of a plan (Plan::stats). "Owner" of a row: the rank whose contiguous
// shard of sum(lengths) / cp rows holds it.
struct PlanStats {
  std::vector<int64_t> rows;           // per rank: query rows it selects
  std::vector<int64_t> work;           // per rank: causal pairs it selects
  std::vector<double> cost;            // per rank: the cost model's load
  std::vector<int64_t> fragments;      // per rank: tasks (segments for its selector)
  std::vector<int64_t> rows_sent;      // per rank: own rows another rank selects
  std::vector<int64_t> rows_received;  // per rank: rows it selects for other owners
  int64_t total_work = 0;
  double imbalance = 1.0;       // max(work) / mean(work); 1.0 when total work is 0
  double cost_imbalance = 1.0;  // max(cost) / mean(cost); 1.0 when total cost is 0
  int64_t rows_moved = 0;       // sum of rows_sent
  int64_t max_rows_moved_per_rank = 0;
  // rows_moved * (input + result bytes of the plan's RowBytes), saturating at INT64_MAX
  // (RowBytes::wire_bytes), as is max_bytes_sent_per_rank.
  int64_t bytes_moved = 0;
  // The most bytes one rank puts on the wire in the two all-to-alls: its moved rows'
  // inputs as owner plus the results of rows it selects for other owners as worker.
  int64_t max_bytes_sent_per_rank = 0;
};

// The figures of per-rank task lists on `lengths` (Plan::stats computes these once).
PlanStats plan_stats(const TaskPlan& tasks, std::span<const int64_t> lengths, int64_t ratio,
                     const CostModel& cost = {}, const RowBytes& row_bytes = {});

class Plan {
 public:
  // `tasks` must cover every row of `lengths` exactly once (check_plan_covers) and have
  // `cp` ranks; `cost` prices rows for stats().cost and the bounds, `row_bytes` sizes
  // the moved rows for the byte figures.
  Plan(TaskPlan tasks, std::vector<int64_t> lengths, int64_t cp, int64_t ratio,
       std::string strategy, PlanLayout layout = {}, CostModel cost = {}, RowBytes row_bytes = {});

  std::string_view strategy() const;
  int64_t cp() const;
  int64_t ratio() const;
  std::span<const int64_t> lengths() const;
  const TaskPlan& tasks() const;
  std::span<const Task> tasks(int64_t rank) const { return tasks().tasks(rank); }
  // Always cp() entries.
  const std::vector<int64_t>& padding_rows() const;
  int64_t largest_unit_work() const;
  const std::string& note() const;
  const CostModel& cost_model() const;
  const RowBytes& row_bytes() const;

  // Computed on first use (see the header comment).
  const PlanStats& stats() const;
  // max(mean, costliest single row) / mean on the causal-pair measure.
  const BalanceBound& balance_bound() const;
  // The fewest rows any plan whose busiest rank does at most this plan's busiest
  // rank's causal work must move (rows_moved_lower_bound_at).
  const RowsMovedBound& rows_moved_bound() const;
  // max(mean work, largest unit work) / mean work: no plan that keeps this strategy's
  // units whole does better; 1 without work.
  double unit_bound() const;

  // Rank `rank`'s route (make_route over these tasks). Throws Error outside [0, cp).
  IndexerRoute route(int64_t rank) const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

// Rows each rank sends away as owner (`sent`) and selects for other owners (`received`),
// from per-rank task lists: every task split at the owners' shard boundaries. The one
// owner-split walk every figure of moved rows rests on.
struct RowTraffic {
  std::vector<int64_t> sent;
  std::vector<int64_t> received;
  int64_t moved = 0;
};
RowTraffic row_traffic(const TaskPlan& tasks, std::span<const int64_t> lengths);

}  // namespace sparsecp
