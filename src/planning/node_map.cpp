#include "sparsecp/planning/node_map.hpp"

#include <algorithm>
#include <cmath>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/lower_bound.hpp"

namespace sparsecp {

void validate_node_map(int64_t cp, int64_t ranks_per_node) {
  SPARSECP_CHECK(ranks_per_node >= 1, "ranks per node must be at least 1, got ", ranks_per_node);
  SPARSECP_CHECK(cp % ranks_per_node == 0, "ranks per node (", ranks_per_node,
                 ") must divide the CP size (", cp, ")");
}

CrossNodeBound cross_node_rows_lower_bound_at(std::span<const int64_t> lengths, int64_t cp,
                                              int64_t ratio, int64_t ranks_per_node,
                                              double target_load, const CostModel& model) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  validate_cost_model(model);
  validate_node_map(cp, ranks_per_node);
  SPARSECP_CHECK(!std::isnan(target_load), "target load must be a number");
  CrossNodeBound bound;
  bound.target_load = target_load;
  const auto ranks = contiguous_pieces(lengths, cp);
  for (int64_t node = 0; node < cp / ranks_per_node; ++node) {
    std::vector<Task> pieces;
    double load = 0;
    for (int64_t r = node * ranks_per_node; r < (node + 1) * ranks_per_node; ++r) {
      for (const Task& piece : ranks[static_cast<size_t>(r)]) {
        pieces.push_back(piece);
        load += model.range(piece.start, piece.end, ratio);
      }
    }
    const double capacity = static_cast<double>(ranks_per_node) * target_load;
    const Shed shed = heaviest_rows(pieces, ratio, model, load - capacity);
    bound.node_load.push_back(load);
    bound.rows.push_back(shed.rows);
    bound.total += shed.rows;
  }
  return bound;
}

CrossNodeBound cross_node_rows_lower_bound(std::span<const int64_t> lengths, int64_t cp,
                                           int64_t ratio, int64_t ranks_per_node,
                                           double target_imbalance, const CostModel& model) {
  SPARSECP_CHECK(std::isfinite(target_imbalance) && target_imbalance >= 1,
                 "target imbalance must be at least 1, got ", target_imbalance);
  const BalanceBound balance = balance_bound(lengths, cp, ratio, model);
  const double target = std::max(target_imbalance * balance.mean_load, balance.largest_row);
  return cross_node_rows_lower_bound_at(lengths, cp, ratio, ranks_per_node, target, model);
}

int64_t cross_node_rows(const TaskPlan& plan, std::span<const int64_t> lengths,
                        int64_t ranks_per_node) {
  const int64_t cp = plan.cp();
  validate_node_map(cp, ranks_per_node);
  std::vector<int64_t> offsets(lengths.size() + 1, 0);
  for (size_t d = 0; d < lengths.size(); ++d) offsets[d + 1] = offsets[d] + lengths[d];
  const int64_t local = offsets.back() / cp;
  int64_t crossing = 0;
  for (int64_t rank = 0; rank < cp; ++rank) {
    const int64_t node = rank / ranks_per_node;
    for (const Task& task : plan.tasks(rank)) {
      for_each_owner_piece(task, offsets, local, [&](int64_t owner, int64_t first, int64_t last) {
        if (owner / ranks_per_node != node) crossing += last - first;
      });
    }
  }
  return crossing;
}

}  // namespace sparsecp
