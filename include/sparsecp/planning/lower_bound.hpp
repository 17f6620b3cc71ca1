// sparsecp: what no plan can beat — the balance bound and the fewest rows that must
// move — and the heaviest-rows construction both rest on.
//
// Rank r owns the contiguous global rows [r * local, (r + 1) * local), local =
// sum(lengths) / cp, as document pieces (plan.hpp's Task). Under a per-row cost model
// (cost_model.hpp; the default is the seed's causal pair count) its contiguous load is
// L[r], and the mean load is M = sum(L) / cp.
//
// Balance bound. A plan that splits documents anywhere (row granularity) cannot make
// its busiest rank cheaper than max(M, the costliest single row); as an imbalance,
// max(M, largest row) / M. (simulate.hpp calls this `row_lower_bound`.)
//
// Rows-moved bound. To bring every rank's load to at most a target load T, each rank
// with L[r] > T must hand at least L[r] - T of its cost to other ranks, and the fewest
// rows that carry that much are its heaviest rows. Summed over the overloaded ranks,
// that is a lower bound on the rows any plan with max load <= T moves away from their
// owners (rows kept by their owner never move; a rank below T need not send anything).
// For a target imbalance t the target load is T = max(t * M, largest row): below the
// balance bound no plan exists, so the bound is taken at the best reachable level.
//
// The heaviest rows of a rank are document tails: the cost never decreases along a
// document, so the rows with at least a given number of visible keys form a suffix of
// each piece. `heaviest_rows` finds the fewest such rows by a binary search on that
// threshold, O(pieces * log(longest document)); ties at the threshold go first to
// pieces that already shed rows (so they extend a tail instead of starting a new
// fragment), then in packed order. The `_reference` functions sort every row's cost
// instead and are the specification the fast ones are tested against.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp {

// The document pieces of every rank's contiguous shard, in packed order. Inputs must
// be valid (validate_plan_inputs).
std::vector<std::vector<Task>> contiguous_pieces(std::span<const int64_t> lengths, int64_t cp);

struct BalanceBound {
  double mean_load = 0;    // M
  double largest_row = 0;  // the costliest single row of the batch
  double bound = 1;        // max(M, largest_row) / M; 1 when there is no load
};

// Validates like plan_tasks (seed texts) and the model; see the header comment.
BalanceBound balance_bound(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                           const CostModel& model = {});

// The fewest heaviest rows of one rank whose cost reaches `excess`.
struct Shed {
  // Per piece: the piece keeps document rows [start, cut) and sheds [cut, end).
  std::vector<int64_t> cut;
  int64_t rows = 0;  // rows shed
  double cost = 0;   // their cost (>= excess unless the pieces hold less in total)
};

// Sheds nothing when excess <= 0 and everything when the pieces cost less than
// `excess`. `pieces` are one rank's document pieces (any order, disjoint).
Shed heaviest_rows(std::span<const Task> pieces, int64_t ratio, const CostModel& model,
                   double excess);

struct RowsMovedBound {
  double target_load = 0;     // T
  double mean_load = 0;       // M
  std::vector<double> load;   // L[r], contiguous layout
  std::vector<int64_t> rows;  // per rank: fewest rows that must leave it
  int64_t total = 0;          // sum of rows: the bound
  int64_t max_per_rank = 0;   // max of rows
};

// The bound for a target imbalance t >= 1 (T = max(t * M, largest row)).
RowsMovedBound rows_moved_lower_bound(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                                      double target_imbalance, const CostModel& model = {});

// The bound for an explicit target load T (e.g. the busiest rank's load of a plan at
// hand: any plan whose busiest rank costs at most T moves at least this many rows).
RowsMovedBound rows_moved_lower_bound_at(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio, double target_load,
                                         const CostModel& model = {});

// Plain sorts over every row; same results.
BalanceBound balance_bound_reference(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                                     const CostModel& model = {});
RowsMovedBound rows_moved_lower_bound_reference(std::span<const int64_t> lengths, int64_t cp,
                                                int64_t ratio, double target_load,
                                                const CostModel& model = {});

}  // namespace sparsecp
