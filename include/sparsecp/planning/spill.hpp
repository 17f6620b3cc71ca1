// sparsecp: the `spill` planner — balance by moving the fewest rows.
//
// Every seed mode re-deals most rows: zigzag, greedy and hybrid send 86-98% of all
// rows away from their owners, although an overloaded rank only has to shed its
// excess work, and its heaviest rows are the tails of the documents it holds.
// Spill does exactly that:
//
//   1. Every rank keeps its own contiguous rows (plan.hpp's mode 'none').
//   2. Target load T = max(target_imbalance * mean, costliest single row): the
//      requested balance, or the best any row-granular plan can reach. With an owner
//      load (below), T = max(target * mean, min owner load + costliest row, max owner
//      load), all on the totals.
//   3. Each rank above T sheds its heaviest rows — per-document tails — until its
//      excess L[r] - T is covered: the fewest rows that can carry it
//      (lower_bound.hpp's `heaviest_rows`), so rows moved equal the rows-moved lower
//      bound at T by construction.
//   4. The shed tails, in packed order, fill the ranks below T in rank order, each up
//      to its deficit T - L[r]: a tail moves whole while it fits and is split at a row
//      only where a receiver is full ("next fit"), so a plan has at most one split per
//      receiver. A receiver also stops at the seed's cap of 2 x local rows, and after
//      `max_received_fragments` received pieces when that bound is set.
//   5. What no receiver can take (row slivers left below each receiver's deficit, or
//      the caps) goes, a piece at a time, to the least-loaded rank other than its
//      owner with row room; only then can a rank end above T. `SpillPlan::target_met`
//      says whether every rank ended at most at T.
//
// Guarantees: every row is assigned exactly once; no rank selects more than
// 2 * local rows; the plan is a pure function of the inputs (identical on every
// rank, no communication); rows moved == rows_moved_lower_bound_at(T) (the sum of
// `rows_shed`). Balance is on the given cost model (default: the seed's causal pairs,
// so the seed's imbalance figure applies directly); with a calibrated model
// (cost_model.hpp) spill balances predicted time instead.
//
// Target met: whenever the slack cp * T - total load is at least cp x the costliest
// row (each receiver can stop at most one row short of its deficit, each donor
// overshoots its excess by less than one row), and neither cap binds.
//
// Owner load (SpillOptions::owner_load): per rank, work it does on its own rows
// whatever the plan — the KL loss stays on each row's owner (the seed's design), and
// it costs a_kl + c_kl * min(topk, visible) per owned row (`owner_cost` below). It is
// added to each rank's load before T is chosen and before shedding, so a rank with
// heavy owner-side work selects less: the plan balances selection + owner load. A rank
// whose owner load alone reaches T sheds all its own rows and is no receiver (T is at
// least the largest owner load, so it stays reachable); T is also at least the
// cheapest owner load plus the costliest row (some rank must select that row). Every
// load figure of SpillPlan (mean_load, target_load, load_before, load_after) is the
// total, selection + owner load; SpillPlan::owner_load holds the owner part (a Plan's
// stats(), batch_plan.hpp, price the selection alone: it knows no owner load). rows_moved
// is then the rows-moved bound on those totals (rows_moved_lower_bound_at knows no
// owner load), and the slack rule above holds on the totals; the row cap binds sooner
// (the rows of ranks that shed everything must fit in the others' 2 x local), and then
// target_met says the target was missed. Empty (the default): no
// owner load, bit-identical plans to spill without it.
//
// Cost: O((documents + cp) * log(longest document)) plus building the TaskPlan.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp {

struct SpillOptions {
  // Requested max(load) / mean(load), >= 1. 1.0 asks for the balance bound itself.
  // Default 1.001: on the standard sweep (CP 4-64, lognormal/pareto/mixture, 1M
  // tokens) it moves 1.4% more rows than 1.01 for a 10x tighter balance, and unlike
  // 1.0 it leaves enough slack for the target to be met exactly (docs/RESULTS.md).
  double target_imbalance = 1.001;
  // > 0: a rank receives at most this many pieces from other ranks (extra segments
  // for its selector) while another receiver with room and fewer pieces remains;
  // 0: unbounded. The bound yields only to the two hard rules (coverage, row cap).
  int64_t max_received_fragments = 0;
  // What a row costs (default: causal pairs, the seed's measure).
  CostModel cost;
  // > 0: the node map (node_map.hpp: ranks_per_node consecutive ranks per node) and
  // the topology-aware plan: first each node above ranks_per_node * T exports its
  // heaviest rows (the fewest that carry its excess: the cross-node bound), which fill
  // the ranks below T on nodes below their capacity; then each node balances its own
  // ranks as steps 3-4 do, receivers on the sender's node only; step 5 places the rest
  // anywhere. Rows crossing nodes then equal cross_node_rows_lower_bound_at(T) unless
  // step 5 sends a leftover across; rows moved in all may exceed the flat bound (the
  // extra moves stay inside nodes). 0: no node map, the plan above.
  int64_t ranks_per_node = 0;
  // Per rank: unmovable owner-side load in `cost`'s units (see the header comment; e.g.
  // `owner_cost` of a KL model). Empty: none; otherwise cp finite values >= 0.
  std::vector<double> owner_load;
};

struct SpillPlan {
  TaskPlan plan;
  double target_load = 0;                   // T
  double mean_load = 0;                     // M
  std::vector<double> load_before;          // per rank, contiguous
  std::vector<double> load_after;           // per rank, this plan
  std::vector<int64_t> rows_shed;           // per rank, rows it sends away
  std::vector<int64_t> rows_received;       // per rank, rows it selects for others
  std::vector<int64_t> received_fragments;  // per rank, pieces it received
  int64_t rows_moved = 0;                   // sum of rows_shed
  bool target_met = false;                  // max(load_after) <= T
  bool fragment_bound_met = true;           // no rank above max_received_fragments
  int64_t leftover_pieces = 0;              // pieces placed by step 5
  // With a node map (ranks_per_node > 0): rows selected on another node than their
  // owner's, and the cross-node lower bound at T (node_map.hpp); 0 without one.
  int64_t cross_node_rows = 0;
  int64_t cross_node_bound = 0;
  // Per rank: the owner load included in load_before and load_after (zeros without one);
  // the selection load is load_after - owner_load.
  std::vector<double> owner_load;
};

// Validates like plan_tasks (seed texts), then target_imbalance >= 1,
// max_received_fragments >= 0, the cost model, ranks_per_node (>= 0, dividing cp) and
// owner_load (validate_owner_load).
SpillPlan plan_spill(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                     const SpillOptions& options = {});

// Per rank, the owner-side cost of its contiguous rows (rank r owns global rows
// [r * local, (r + 1) * local)) under `model`: each row costs model.row(visible), so a
// model a + c * min(topk, visible) (b = 0: CostModel::linear(a_kl, 0, c_kl, topk)) prices
// the KL loss of the rows each rank owns. Validates like plan_tasks and the model.
std::vector<double> owner_cost(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                               const CostModel& model);

// Throws Error unless `owner_load` is empty or has `cp` entries, each finite and >= 0
// (the message names the rank and the value).
void validate_owner_load(std::span<const double> owner_load, int64_t cp);

}  // namespace sparsecp
