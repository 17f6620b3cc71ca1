// sparsecp strategies: spill — owners keep their rows and shed only their excess.
//
// Source: sparsecp's own planner (include/sparsecp/planning/spill.hpp, issue 7). Every rank
// keeps its contiguous rows; a rank above the target load sheds its heaviest rows
// (document tails) to the ranks below it, splitting a tail only where a receiver is
// full. Rows moved equal the rows-moved lower bound (lower_bound.hpp) at the target.
//
// As a registered strategy it reads StrategyParams' target_imbalance (default 1.001),
// max_received_fragments (default unbounded), cost_model (default: the causal pair
// count, the scale simulate reports), ranks_per_node (default 0: no node map; > 0:
// the topology-aware plan of spill.hpp) and owner_load (default none). Unit: one row.
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategy "spill".
std::vector<std::unique_ptr<const Strategy>> make_spill_strategies();

// The SpillOptions a strategy run uses under `params`.
SpillOptions spill_options(const StrategyParams& params);

// plan_spill as a strategy's assignment (largest unit: the costliest row; a note when
// the target or the fragment bound was not met).
Strategy::Assignment spill_strategy_assignment(std::span<const int64_t> lengths, int64_t cp,
                                               int64_t ratio, const SpillOptions& options);

}  // namespace sparsecp
