#include "sparsecp/planning/strategy.hpp"

#include <algorithm>
#include <sstream>

#include "sparsecp/error.hpp"

namespace sparsecp {

// One factory per strategy file (src/planning/strategies/<stem>.cpp). Adding a
// strategy: its file, its line here and in kStrategyFactories, and its source in
// src/CMakeLists.txt.
std::vector<std::unique_ptr<const Strategy>> make_seed_modes_strategies();
std::vector<std::unique_ptr<const Strategy>> make_per_doc_zigzag_strategies();
std::vector<std::unique_ptr<const Strategy>> make_round_robin_strategies();
std::vector<std::unique_ptr<const Strategy>> make_snake_strategies();
std::vector<std::unique_ptr<const Strategy>> make_lpt_search_strategies();
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
          make_snake_strategies, make_lpt_search_strategies, make_spill_strategies,
          make_auto_strategies}) {
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

}  // namespace sparsecp
