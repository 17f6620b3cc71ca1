#include "sparsecp/planning/strategy.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/spill.hpp"

namespace sparsecp {

// One factory per strategy file (src/planning/strategies/<stem>.cpp). Adding a
// strategy: its file, its line here and in kStrategyFactories, and its source in
// src/CMakeLists.txt.
std::vector<std::unique_ptr<const Strategy>> make_seed_modes_strategies();
std::vector<std::unique_ptr<const Strategy>> make_per_doc_zigzag_strategies();
std::vector<std::unique_ptr<const Strategy>> make_round_robin_strategies();
std::vector<std::unique_ptr<const Strategy>> make_snake_strategies();
std::vector<std::unique_ptr<const Strategy>> make_lpt_search_strategies();
std::vector<std::unique_ptr<const Strategy>> make_wlb_strategies();
std::vector<std::unique_ptr<const Strategy>> make_spill_strategies();
std::vector<std::unique_ptr<const Strategy>> make_auto_strategies();

namespace {

struct Registry {
  std::vector<std::unique_ptr<const Strategy>> owned;
  std::vector<const Strategy*> listing;

  Registry() {
    const auto adopt = [this](std::vector<std::unique_ptr<const Strategy>> made) {
      for (auto& strategy : made) owned.push_back(std::move(strategy));
    };
    for (const auto factory :
         {make_seed_modes_strategies, make_per_doc_zigzag_strategies, make_round_robin_strategies,
          make_snake_strategies, make_lpt_search_strategies, make_wlb_strategies,
          make_spill_strategies, make_auto_strategies}) {
      adopt(factory());
    }
    for (const auto& strategy : owned) listing.push_back(strategy.get());
    std::sort(listing.begin(), listing.end(), [](const Strategy* a, const Strategy* b) {
      if (a->listing_order() != b->listing_order()) return a->listing_order() < b->listing_order();
      return a->name() < b->name();
    });
  }
};

const Registry& registry() {
  static const Registry instance;
  return instance;
}

std::string known_names() {
  std::ostringstream names;
  const char* separator = "";
  for (const Strategy* strategy : all_strategies()) {
    names << separator << strategy->name();
    separator = ", ";
  }
  return names.str();
}

}  // namespace

std::string_view row_cost_name(RowCost cost) { return cost == RowCost::kMagi ? "magi" : "causal"; }

RowCost parse_row_cost(std::string_view name) {
  if (name == "magi") return RowCost::kMagi;
  if (name == "causal") return RowCost::kCausal;
  SPARSECP_FAIL("unknown row cost '", name, "' (expected magi or causal)");
}

void check_seed_options_used(Mode mode, const StrategyParams& params) {
  resolve_block_size(mode, params.block_size);  // the seed's texts for a misplaced block
  SPARSECP_CHECK(mode == Mode::kHybrid || !params.zigzag_min_length,
                 "indexer_zigzag_min_length requires indexer_load_balance='hybrid'");
}

PlanOptions resolve_seed_options(Mode mode, std::span<const int64_t> lengths, int64_t cp,
                                 const StrategyParams& params) {
  const int64_t local = local_rows(lengths, cp);  // the seed's texts for a bad batch
  PlanOptions options{.mode = mode};
  if (mode == Mode::kGreedy || mode == Mode::kHybrid) {
    options.block_size = params.block_size.value_or(std::min(kDefaultBlockSize, local));
  }
  if (mode == Mode::kHybrid) options.zigzag_min_length = params.zigzag_min_length.value_or(local);
  return options;
}

void validate_strategy_params(const StrategyParams& params) {
  SPARSECP_CHECK(!params.block_size || *params.block_size >= 1,
                 "indexer_balance_block_size must be a positive integer, got ", *params.block_size);
  SPARSECP_CHECK(!params.zigzag_min_length || *params.zigzag_min_length >= 1,
                 "indexer_zigzag_min_length must be a positive integer, got ",
                 *params.zigzag_min_length);
  SPARSECP_CHECK(std::isfinite(params.target_imbalance) && params.target_imbalance >= 1,
                 "spill target imbalance must be at least 1, got ", params.target_imbalance);
  SPARSECP_CHECK(params.max_received_fragments >= 0,
                 "spill fragment bound must be non-negative (0 = unbounded), got ",
                 params.max_received_fragments);
  SPARSECP_CHECK(params.ranks_per_node >= 0,
                 "spill ranks per node must be non-negative (0 = no node map), got ",
                 params.ranks_per_node);
  if (params.cost_model) validate_cost_model(*params.cost_model);
  SPARSECP_CHECK(std::isfinite(params.bandwidth_gbps) && params.bandwidth_gbps > 0,
                 "exchange bandwidth must be positive, got ", params.bandwidth_gbps, " GB/s");
  SPARSECP_CHECK(!params.wlb_split_length || *params.wlb_split_length >= 1,
                 "wlb split length must be positive, got ", *params.wlb_split_length);
  SPARSECP_CHECK(params.snake_block >= 1, "snake block size must be positive, got ",
                 params.snake_block);
  SPARSECP_CHECK(params.lpt_align >= 1, "lpt-search fragment alignment must be positive, got ",
                 params.lpt_align);
  SPARSECP_CHECK(std::isfinite(params.lpt_row_cap) && params.lpt_row_cap >= 1,
                 "lpt-search row cap must be a finite factor >= 1 of the local rows, got ",
                 params.lpt_row_cap);
  SPARSECP_CHECK(params.lpt_search_steps >= 0, "lpt-search step bound must be >= 0, got ",
                 params.lpt_search_steps);
  SPARSECP_CHECK(params.lpt_fragment_cap >= 0, "lpt-search fragment cap must be >= 0, got ",
                 params.lpt_fragment_cap);
  SPARSECP_CHECK(params.window >= 1, "attention window must be positive, got ", params.window);
  SPARSECP_CHECK(params.topk >= 1, "top-k must be positive, got ", params.topk);
  // The values here; their count (one per rank) where the batch is known (plan_spill).
  validate_owner_load(params.owner_load, static_cast<int64_t>(params.owner_load.size()));
}

IndexerRoute Strategy::route(std::span<const int64_t> lengths, int64_t cp, int64_t rank,
                             int64_t ratio, const StrategyParams& params) const {
  SPARSECP_CHECK(rank >= 0 && rank < cp, "Indexer balance rank must be inside its CP group");
  return plan(lengths, cp, ratio, params).route(rank);
}

std::string Strategy::describe(std::span<const int64_t>, int64_t, const StrategyParams&) const {
  return "";
}

std::string describe_cost_model(const std::optional<CostModel>& model, std::string_view fallback) {
  if (!model) return std::string(fallback);
  std::ostringstream text;
  text << "cost model a=" << model->a << " b=" << model->b << " c=" << model->c;
  if (model->d != 0) text << " d=" << model->d;
  text << " " << model->unit << "/row";
  return text.str();
}

std::span<const Strategy* const> all_strategies() { return registry().listing; }

const Strategy& find_strategy(std::string_view name) {
  for (const Strategy* strategy : all_strategies()) {
    if (strategy->name() == name) return *strategy;
  }
  SPARSECP_FAIL("unknown strategy '", name, "' (known: ", known_names(), ")");
}

std::vector<const Strategy*> parse_strategy_list(std::string_view list) {
  if (list == "all") {
    const auto every = all_strategies();
    return {every.begin(), every.end()};
  }
  std::vector<const Strategy*> chosen;
  size_t begin = 0;
  while (true) {
    const size_t comma = list.find(',', begin);
    const std::string_view item = list.substr(
        begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    SPARSECP_CHECK(!item.empty(), "empty strategy name in '", list, "' (known: ", known_names(),
                   ")");
    const Strategy* strategy = &find_strategy(item);
    if (std::find(chosen.begin(), chosen.end(), strategy) == chosen.end()) {
      chosen.push_back(strategy);
    }
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return chosen;
}

Plan Strategy::plan(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const {
  Assignment decided = assign(lengths, cp, ratio, params);
  return Plan(std::move(decided.plan), {lengths.begin(), lengths.end()}, cp, ratio,
              std::string(name()),
              PlanLayout{std::move(decided.padding_rows), decided.largest_unit_work,
                         std::move(decided.note)},
              params.cost_model.value_or(CostModel{}), params.row_bytes);
}

Strategy::Assignment Strategy::assignment_of(const Plan& plan) {
  return {plan.tasks(), plan.padding_rows(), plan.largest_unit_work(), plan.note()};
}

}  // namespace sparsecp
