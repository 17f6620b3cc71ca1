#include "sparsecp/planning/strategies/spill.hpp"

#include <cstdio>
#include <sstream>

#include "packed_sequence.hpp"

namespace sparsecp {

Strategy::Assignment spill_strategy_assignment(std::span<const int64_t> lengths, int64_t cp,
                                               int64_t ratio, const SpillOptions& options) {
  SpillPlan spill = plan_spill(lengths, cp, ratio, options);
  Strategy::Assignment result;
  result.plan = std::move(spill.plan);
  result.padding_rows.assign(static_cast<size_t>(cp), 0);
  result.largest_unit_work = strategies::largest_row_work(lengths, ratio);
  if (!spill.target_met) {
    double most = 0;
    for (const double load : spill.load_after) most = std::max(most, load);
    char text[128];
    std::snprintf(text, sizeof text, "target %.4g not met: %.4g",
                  spill.target_load / spill.mean_load, most / spill.mean_load);
    result.note = text;
  }
  if (!spill.fragment_bound_met) {
    result.note += result.note.empty() ? "" : "; ";
    result.note += "fragment bound exceeded";
  }
  return result;
}

SpillOptions spill_options(const StrategyParams& params) {
  SpillOptions options;
  options.target_imbalance = params.target_imbalance;
  options.max_received_fragments = params.max_received_fragments;
  if (params.cost_model) options.cost = *params.cost_model;
  options.ranks_per_node = params.ranks_per_node;
  options.owner_load = params.owner_load;
  return options;
}

namespace {

class Spill final : public Strategy {
 public:
  std::string_view name() const override { return "spill"; }
  std::string_view source() const override {
    return "sparsecp plan_spill (include/sparsecp/planning/spill.hpp)";
  }
  std::string_view summary() const override {
    return "owners keep their rows; overloaded ranks shed their heaviest tails to ranks "
           "below the target (default 1.001 x mean)";
  }
  std::string_view unit() const override { return "row"; }
  int listing_order() const override { return 50; }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    validate_strategy_params(params);
    return spill_strategy_assignment(lengths, cp, ratio, spill_options(params));
  }

  std::string describe(std::span<const int64_t>, int64_t,
                       const StrategyParams& params) const override {
    std::ostringstream text;
    text << "target imbalance " << params.target_imbalance << " on "
         << describe_cost_model(params.cost_model, "causal pairs");
    if (params.max_received_fragments > 0) {
      text << ", at most " << params.max_received_fragments << " received pieces per rank";
    }
    if (params.ranks_per_node > 0) {
      text << ", node map of " << params.ranks_per_node << " ranks per node";
    }
    if (!params.owner_load.empty()) text << ", plus each rank's owner load";
    return text.str();
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_spill_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<Spill>());
  return made;
}

}  // namespace sparsecp
