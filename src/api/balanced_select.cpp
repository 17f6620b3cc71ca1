#include "sparsecp/balanced_select.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

namespace sparsecp {

namespace {

std::vector<std::string> registry_names() {
  std::vector<std::string> names;
  for (const Strategy* strategy : all_strategies()) names.emplace_back(strategy->name());
  return names;
}

int64_t registry_index(const Strategy& strategy) {
  const auto strategies = all_strategies();
  return std::find(strategies.begin(), strategies.end(), &strategy) - strategies.begin();
}

RouteRequest seed_request(std::span<const int64_t> lengths, int64_t ratio,
                          const PlanOptions& options, Communicator& comm, bool synchronous) {
  return {lengths,
          [lengths, ratio, options, &comm] {
            return indexer_route(lengths, comm.size(), comm.rank(), ratio, options);
          },
          planning_fingerprint(lengths, comm.size(), ratio, options), synchronous};
}

RouteRequest strategy_request(std::span<const int64_t> lengths, int64_t ratio,
                              const Strategy& strategy, const StrategyParams& params,
                              Communicator& comm, bool synchronous) {
  return {lengths,
          [lengths, ratio, &strategy, &params, &comm] {
            return strategy.route(lengths, comm.size(), comm.rank(), ratio, params);
          },
          planning_fingerprint(lengths, comm.size(), ratio, strategy, params), synchronous};
}

}  // namespace

PlanningFingerprint planning_fingerprint(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio, const PlanOptions& options) {
  PlanningFingerprint fingerprint(lengths, cp, ratio);
  fingerprint.set_strategy(registry_index(find_strategy(mode_name(options.mode))),
                           registry_names());
  fingerprint.set_seed_options(options.block_size, options.zigzag_min_length);
  return fingerprint;
}

PlanningFingerprint planning_fingerprint(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio, const Strategy& strategy,
                                         const StrategyParams& params) {
  PlanningFingerprint fingerprint(lengths, cp, ratio);
  fingerprint.set_strategy(registry_index(strategy), registry_names());
  fingerprint.set_seed_options(params.block_size, params.zigzag_min_length);
  // Settings that seed options never carry, so that the two vocabularies never agree by
  // accident (a strategy fingerprint always has these).
  fingerprint.add_real("target_imbalance", params.target_imbalance);
  fingerprint.add("max_received_fragments", params.max_received_fragments);
  fingerprint.add("ranks_per_node", params.ranks_per_node);
  const CostModel cost = params.cost_model.value_or(CostModel{});
  fingerprint.add("cost_model", params.cost_model ? 1 : 0);
  fingerprint.add_real("cost a", cost.a).add_real("cost b", cost.b).add_real("cost c", cost.c);
  fingerprint.add_real("cost d", cost.d);
  fingerprint.add("cost topk", cost.topk);
  fingerprint.add_real("bandwidth_gbps", params.bandwidth_gbps);
  fingerprint.add("row input bytes", params.row_bytes.input_bytes());
  fingerprint.add("row result bytes", params.row_bytes.result_bytes());
  fingerprint.add("wlb_split_length", params.wlb_split_length.value_or(-1));
  fingerprint.add("snake_block", params.snake_block);
  fingerprint.add("lpt_align", params.lpt_align);
  fingerprint.add_real("lpt_row_cap", params.lpt_row_cap);
  fingerprint.add("lpt_search_steps", params.lpt_search_steps);
  fingerprint.add("lpt_fragment_cap", params.lpt_fragment_cap);
  fingerprint.add("lpt_cost", static_cast<int64_t>(params.lpt_cost));
  fingerprint.add("window", params.window);
  fingerprint.add("topk", params.topk);
  if (!params.owner_load.empty()) {  // only when set: fingerprints without one stay as they were
    uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a over the values' bits, in rank order
    for (const double load : params.owner_load) {
      const uint64_t bits = std::bit_cast<uint64_t>(load);
      for (int i = 0; i < 8; ++i) hash = (hash ^ ((bits >> (8 * i)) & 0xff)) * 0x100000001b3ULL;
    }
    fingerprint.add("owner_load ranks", static_cast<int64_t>(params.owner_load.size()));
    fingerprint.add("owner_load hash", static_cast<int64_t>(hash));
  }
  return fingerprint;
}

IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs,
                                           std::span<const int64_t> lengths, int64_t ratio,
                                           const PlanOptions& options, Communicator& comm) {
  return launch_indexer_inputs(inputs, seed_request(lengths, ratio, options, comm, false), comm);
}

IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs,
                                           std::span<const int64_t> lengths, int64_t ratio,
                                           const Strategy& strategy, const StrategyParams& params,
                                           Communicator& comm) {
  return launch_indexer_inputs(
      inputs, strategy_request(lengths, ratio, strategy, params, comm, false), comm);
}

SelectedKeys balanced_select(const IndexerInputs& inputs, const Selector& selector,
                             std::span<const int64_t> lengths, int64_t ratio,
                             const PlanOptions& options, Communicator& comm) {
  return select_and_return(
      launch_indexer_inputs(inputs, seed_request(lengths, ratio, options, comm, true), comm),
      selector, comm);
}

SelectedKeys balanced_select(const IndexerInputs& inputs, const Selector& selector,
                             std::span<const int64_t> lengths, int64_t ratio,
                             const Strategy& strategy, const StrategyParams& params,
                             Communicator& comm) {
  return select_and_return(
      launch_indexer_inputs(inputs, strategy_request(lengths, ratio, strategy, params, comm, true),
                            comm),
      selector, comm);
}

}  // namespace sparsecp
