#include "sparsecp/planning/strategies/auto.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include "packed_sequence.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/node_map.hpp"
#include "sparsecp/planning/strategies/spill.hpp"

namespace sparsecp {

CostModel nominal_accelerator_cost_model() {
  constexpr double kFlopsPerNs = 4e5;  // 400 TFLOP/s
  CostModel model;
  model.a = 2.0 * 1536 * 64 * 128 / kFlopsPerNs;
  model.b = 2.0 * 64 * 128 / kFlopsPerNs;
  model.c = 0;
  model.topk = 512;
  model.unit = "ns";
  model.note = "nominal: 64 heads x 128, q_rank 1536, 400 TFLOP/s";
  return model;
}

AutoCandidate predict_step(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t ratio,
                           const AutoOptions& options) {
  const PlanStats stats = plan_stats(plan, lengths, ratio, options.cost, options.row_bytes);
  const std::vector<double>& owner = options.params.owner_load;
  validate_owner_load(owner, plan.cp());
  AutoCandidate candidate;
  candidate.rows_moved = stats.rows_moved;
  int64_t busiest_rows = 0;
  double total = 0;
  for (size_t r = 0; r < stats.cost.size(); ++r) {
    busiest_rows = std::max({busiest_rows, stats.rows_sent[r], stats.rows_received[r]});
    const double load = stats.cost[r] + (owner.empty() ? 0.0 : owner[r]);
    candidate.compute_ns = std::max(candidate.compute_ns, load);
    total += load;
  }
  const double rows = static_cast<double>(busiest_rows);
  candidate.inputs_ns =
      rows * static_cast<double>(options.row_bytes.input_bytes()) / options.bandwidth_gbps;
  candidate.results_ns =
      rows * static_cast<double>(options.row_bytes.result_bytes()) / options.bandwidth_gbps;
  candidate.step_ns = candidate.inputs_ns + candidate.compute_ns + candidate.results_ns;
  candidate.imbalance = stats.cost_imbalance;
  if (!owner.empty() && total > 0) {
    candidate.imbalance = candidate.compute_ns * static_cast<double>(stats.cost.size()) / total;
  }
  return candidate;
}

namespace {

std::string describe(const AutoCandidate& c) {
  char text[160];
  std::snprintf(text, sizeof text, "%s %.3g ms (compute %.3g + exchange %.3g)", c.name.c_str(),
                c.step_ns * 1e-6, c.compute_ns * 1e-6, (c.inputs_ns + c.results_ns) * 1e-6);
  return text;
}

}  // namespace

AutoChoice choose_plan(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                       const AutoOptions& options) {
  strategies::validate_batch(lengths, cp, ratio);
  validate_cost_model(options.cost);
  SPARSECP_CHECK(std::isfinite(options.bandwidth_gbps) && options.bandwidth_gbps > 0,
                 "auto bandwidth must be positive, got ", options.bandwidth_gbps, " GB/s");
  for (const double target : options.spill_targets) {
    SPARSECP_CHECK(std::isfinite(target) && target >= 1,
                   "auto spill targets must be at least 1, got ", target);
  }
  validate_strategy_params(options.params);
  validate_owner_load(options.params.owner_load, cp);
  // A node map that cannot apply must fail here, not reject every spill candidate quietly.
  if (options.params.ranks_per_node > 0) validate_node_map(cp, options.params.ranks_per_node);
  const StrategyParams& params = options.params;

  AutoChoice choice;
  std::vector<Strategy::Assignment> plans;
  const auto consider = [&](std::string name, const auto& make) {
    AutoCandidate candidate;
    Strategy::Assignment planned;
    try {
      planned = make();
      candidate = predict_step(planned.plan, lengths, ratio, options);
    } catch (const Error& error) {
      candidate.error = error.what();
    }
    candidate.name = std::move(name);
    choice.candidates.push_back(std::move(candidate));
    plans.push_back(std::move(planned));
  };
  for (const char* name : {"none", "zigzag", "greedy", "hybrid"}) {
    const Strategy& strategy = find_strategy(name);
    consider(name,
             [&] { return Strategy::assignment_of(strategy.plan(lengths, cp, ratio, params)); });
  }
  for (const double target : options.spill_targets) {
    char name[32];
    std::snprintf(name, sizeof name, "spill(%g)", target);
    SpillOptions spill;
    spill.target_imbalance = target;
    spill.cost = options.cost;
    spill.owner_load = params.owner_load;
    spill.ranks_per_node = params.ranks_per_node;  // topology-aware candidates with a node map
    consider(name, [&] { return spill_strategy_assignment(lengths, cp, ratio, spill); });
  }
  bool found = false;
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const AutoCandidate& c = choice.candidates[i];
    if (!c.error.empty()) continue;
    if (!found || c.step_ns < choice.candidates[choice.chosen].step_ns) choice.chosen = i;
    found = true;
  }
  SPARSECP_CHECK(found,
                 "auto: every candidate rejected the batch: ", choice.candidates.front().error);
  // The contiguous split ('none', candidate 0) already meets the target: nothing moves,
  // however little a balanced plan would shave off the modelled compute.
  const AutoCandidate& contiguous = choice.candidates.front();
  const bool none_meets_target =
      contiguous.error.empty() && contiguous.imbalance <= params.target_imbalance;
  if (none_meets_target) choice.chosen = 0;
  // The runner-up: the fastest other candidate.
  std::optional<size_t> second;
  for (size_t i = 0; i < choice.candidates.size(); ++i) {
    const AutoCandidate& c = choice.candidates[i];
    if (i == choice.chosen || !c.error.empty()) continue;
    if (!second || c.step_ns < choice.candidates[*second].step_ns) second = i;
  }
  choice.reason = "chose " + describe(choice.candidates[choice.chosen]);
  if (none_meets_target) {
    char text[160];
    std::snprintf(text, sizeof text,
                  ": the contiguous split already meets the target imbalance %g (%.6g), nothing "
                  "moves",
                  params.target_imbalance, contiguous.imbalance);
    choice.reason += text;
  }
  if (second) choice.reason += "; next " + describe(choice.candidates[*second]);
  choice.plan = std::move(plans[choice.chosen]);
  return choice;
}

AutoOptions auto_options(const StrategyParams& params) {
  AutoOptions options;
  if (params.cost_model) options.cost = *params.cost_model;
  options.bandwidth_gbps = params.bandwidth_gbps;
  options.row_bytes = params.row_bytes;
  options.params = params;
  return options;
}

namespace {

class Auto final : public Strategy {
 public:
  std::string_view name() const override { return "auto"; }
  std::string_view source() const override {
    return "sparsecp choose_plan (include/sparsecp/planning/strategies/auto.hpp)";
  }
  std::string_view summary() const override {
    return "per batch, the hyper_parallel mode or spill target with the lowest predicted "
           "step time";
  }
  std::string_view unit() const override { return "that of the chosen plan"; }

  std::string describe(std::span<const int64_t>, int64_t,
                       const StrategyParams& params) const override {
    std::ostringstream text;
    text << "predicts step time on "
         << describe_cost_model(params.cost_model, "a nominal accelerator model") << " at "
         << params.bandwidth_gbps << " GB/s (balances time, not causal pairs)";
    return text.str();
  }
  int listing_order() const override { return 51; }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    AutoChoice choice = choose_plan(lengths, cp, ratio, auto_options(params));
    Assignment result = std::move(choice.plan);
    result.note = choice.reason;
    return result;
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_auto_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<Auto>());
  return made;
}

}  // namespace sparsecp
