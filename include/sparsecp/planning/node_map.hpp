// sparsecp: ranks on nodes — the rows a plan sends between nodes, and the fewest that
// any plan must send for a target balance.
//
// A CP group spans nodes; bytes between ranks of one node cost little (shared memory,
// NVLink), bytes between nodes cross the network. The node map here is the usual
// launcher layout: `ranks_per_node` consecutive ranks share a node, rank r is on node
// r / ranks_per_node (Open MPI's --map-by slot, torchrun's node ranks), and cp is a
// multiple of ranks_per_node. ranks_per_node == cp is one node; 1, every rank its own.
//
// Cross-node bound. Node n owns the contiguous rows of its ranks, load N[n] (the sum of
// their L[r], lower_bound.hpp). Under a plan whose busiest rank costs at most T, node n
// selects at most ranks_per_node * T, so at least N[n] - ranks_per_node * T of its
// cost is selected on other nodes, and the fewest rows that carry that much are the
// node's heaviest rows (heaviest_rows over all its ranks' pieces). Summed over nodes,
// a lower bound on the rows any such plan sends across nodes. It is at most the flat
// rows-moved bound: a node's excess is at most the sum of its ranks' excesses.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp {

// Checks ranks_per_node >= 1 and that it divides cp; names both values.
void validate_node_map(int64_t cp, int64_t ranks_per_node);

struct CrossNodeBound {
  double target_load = 0;         // T
  std::vector<double> node_load;  // N[n], contiguous layout
  std::vector<int64_t> rows;      // per node: fewest rows that must leave it
  int64_t total = 0;              // sum of rows: the bound
};

// The bound for an explicit target load T. Validates like plan_tasks, the model and
// the node map.
CrossNodeBound cross_node_rows_lower_bound_at(std::span<const int64_t> lengths, int64_t cp,
                                              int64_t ratio, int64_t ranks_per_node,
                                              double target_load, const CostModel& model = {});

// The bound for a target imbalance t >= 1 (T = max(t * M, largest row), as spill).
CrossNodeBound cross_node_rows_lower_bound(std::span<const int64_t> lengths, int64_t cp,
                                           int64_t ratio, int64_t ranks_per_node,
                                           double target_imbalance, const CostModel& model = {});

// Rows `plan` selects on a node other than their owner's (each is sent to that node
// as input and its result sent back). `plan` must cover `lengths` (check_plan_covers).
int64_t cross_node_rows(const TaskPlan& plan, std::span<const int64_t> lengths,
                        int64_t ranks_per_node);

}  // namespace sparsecp
