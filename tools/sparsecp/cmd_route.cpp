// `sparsecp route`: one rank's IndexerRoute, or every rank's (for timing).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "strategy_flags.hpp"
#include "timing.hpp"

namespace sparsecp::cli {
namespace {

struct RouteCommand {
  BatchOptions batch;
  int64_t cp = 8;
  int64_t ratio = 4;
  StrategyFlags strategy;
  ModelFlags model;
  std::optional<int64_t> rank;
  bool all_ranks = false;
  bool full = false;
  int64_t repeat = 1;
  bool json = false;
};

nlohmann::ordered_json route_json(const IndexerRoute& route) {
  nlohmann::ordered_json out;
  out["segments"] = nlohmann::ordered_json::array();
  for (const Segment& s : route.segments) {
    out["segments"].push_back({s.q_begin, s.q_end, s.key_begin, s.key_end, s.residual});
  }
  out["input_splits"] = route.input_splits;
  out["output_splits"] = route.output_splits;
  out["send_rows"] = route.send_rows;
  out["receive_rows"] = route.receive_rows;
  out["local_sources"] = route.local_sources;
  out["local_targets"] = route.local_targets;
  out["query_count"] = route.query_count;
  return out;
}

// The strategy's whole plan beside the two lower bounds, as `plan` prints them: the best
// imbalance any plan can reach, and the fewest rows any plan as balanced must move.
struct PlanBounds {
  double imbalance = 1;
  double balance_bound = 1;
  int64_t rows_moved = 0;
  int64_t rows_moved_bound = 0;
};

PlanBounds plan_bounds(std::span<const int64_t> lengths, const RouteCommand& command,
                       const Strategy& strategy, const StrategyParams& params) {
  const Plan planned = strategy.plan(lengths, command.cp, command.ratio, params);
  return {planned.stats().imbalance, planned.balance_bound().bound, planned.stats().rows_moved,
          planned.rows_moved_bound().total};
}

void add_bounds(nlohmann::ordered_json& out, const PlanBounds& b) {
  out["imbalance"] = b.imbalance;
  out["balance_bound"] = b.balance_bound;
  out["rows_moved"] = b.rows_moved;
  out["rows_moved_lower_bound"] = b.rows_moved_bound;
}

void print_bounds(const PlanBounds& b, int64_t tokens) {
  const double pct = 100.0 / static_cast<double>(std::max<int64_t>(tokens, 1));
  std::printf(
      "the whole plan: work imbalance %.4f (balance bound, no plan can do better: %.4f); rows "
      "leaving their owner %lld (%.2f%%), the fewest any plan this balanced must move %lld "
      "(%.2f%%)\n",
      b.imbalance, b.balance_bound, static_cast<long long>(b.rows_moved),
      pct * static_cast<double>(b.rows_moved), static_cast<long long>(b.rows_moved_bound),
      pct * static_cast<double>(b.rows_moved_bound));
}

int64_t sum(const std::vector<int64_t>& values) {
  int64_t total = 0;
  for (const int64_t value : values) total += value;
  return total;
}

// Every rank's route the way a training step computes them: each rank calls
// Strategy::route for itself, which for zigzag builds only that rank's tasks (the seed's
// fast path); every other strategy plans the whole batch, which a training step does once
// per batch and shares (the seed caches it with lru_cache), so here it is planned once
// and routed per rank. Each route is handed to `visit` and then dropped, as each rank
// keeps only its own.
template <typename Visit>
void for_each_route(std::span<const int64_t> lengths, const RouteCommand& command,
                    const Strategy& strategy, const StrategyParams& params, Visit&& visit) {
  if (strategy.name() == "zigzag") {
    for (int64_t rank = 0; rank < command.cp; ++rank) {
      visit(strategy.route(lengths, command.cp, rank, command.ratio, params));
    }
    return;
  }
  const Plan planned = strategy.plan(lengths, command.cp, command.ratio, params);
  for (int64_t rank = 0; rank < command.cp; ++rank) {
    visit(planned.route(rank));
  }
}

void run_all_ranks(const RouteCommand& command, std::span<const int64_t> lengths,
                   const Strategy& strategy, const StrategyParams& params) {
  check_repeats(command.repeat, "--repeats");
  std::vector<double> seconds;
  int64_t moved = 0;
  for (int64_t i = 0; i < command.repeat; ++i) {
    moved = 0;
    const double start = wall_seconds();
    for_each_route(lengths, command, strategy, params,
                   [&](const IndexerRoute& route) { moved += sum(route.input_splits); });
    seconds.push_back(wall_seconds() - start);
  }
  const Spread spread = Spread::of(seconds);
  const int64_t local = checked_total(lengths) / command.cp;
  const PlanBounds bounds = plan_bounds(lengths, command, strategy, params);
  const double per_rank = spread.median / static_cast<double>(command.cp);
  if (command.json) {
    nlohmann::ordered_json out;
    out["cp"] = command.cp;
    out["ratio"] = command.ratio;
    out["mode"] = strategy.name();
    out["parameters"] = strategy.describe(lengths, command.cp, params);
    out["repeats"] = command.repeat;
    out["local_rows"] = local;
    out["seconds_per_rank"] = per_rank;
    out["seconds_all_ranks"] = spread.median;
    out["seconds_min_all_ranks"] = spread.min;
    out["seconds_max_all_ranks"] = spread.max;
    out["ns_per_local_row"] = per_rank * 1e9 / static_cast<double>(local);
    out["rows_moved"] = moved;
    add_bounds(out, bounds);
    if (command.full) {
      out["routes"] = nlohmann::ordered_json::array();
      for_each_route(lengths, command, strategy, params, [&](const IndexerRoute& route) {
        out["routes"].push_back(route_json(route));
      });
    }
    std::cout << out.dump() << "\n";
    return;
  }
  std::printf(
      "%s: %lld ranks, %lld local rows each: %.3f us per rank (median of %lld; all ranks "
      "%.3f-%.3f ms), %.2f ns per local row, %lld rows moved\n",
      std::string(strategy.name()).c_str(), static_cast<long long>(command.cp),
      static_cast<long long>(local), per_rank * 1e6, static_cast<long long>(command.repeat),
      spread.min * 1e3, spread.max * 1e3, per_rank * 1e9 / static_cast<double>(local),
      static_cast<long long>(moved));
  print_bounds(bounds, local * command.cp);
}

void print_route(const IndexerRoute& route, int64_t rank) {
  std::printf(
      "rank %lld selects %lld rows in %zu segments; keeps %zu of its own rows, sends %lld, "
      "receives %lld\n",
      static_cast<long long>(rank), static_cast<long long>(route.query_count),
      route.segments.size(), route.local_sources.size(),
      static_cast<long long>(sum(route.input_splits)),
      static_cast<long long>(sum(route.output_splits)));
  std::printf("%6s %12s %12s\n", "peer", "sends", "receives");
  for (size_t peer = 0; peer < route.input_splits.size(); ++peer) {
    std::printf("%6zu %12lld %12lld\n", peer, static_cast<long long>(route.input_splits[peer]),
                static_cast<long long>(route.output_splits[peer]));
  }
  std::printf("segments (q_begin, q_end, key_begin, key_end, residual):\n");
  const size_t shown = std::min<size_t>(route.segments.size(), 20);
  for (size_t i = 0; i < shown; ++i) {
    const Segment& s = route.segments[i];
    std::printf("  (%lld, %lld, %lld, %lld, %lld)\n", static_cast<long long>(s.q_begin),
                static_cast<long long>(s.q_end), static_cast<long long>(s.key_begin),
                static_cast<long long>(s.key_end), static_cast<long long>(s.residual));
  }
  if (shown < route.segments.size()) {
    std::printf("  ... %zu more (use --json for all fields)\n", route.segments.size() - shown);
  }
}

void run_route(const RouteCommand& command) {
  SPARSECP_CHECK(command.rank.has_value() != command.all_ranks,
                 "route needs exactly one of --rank R and --all-ranks");
  SPARSECP_CHECK(command.all_ranks || command.repeat == 1, "--repeats requires --all-ranks");
  // The seed's order (indexer_route): the rank before anything else, then the batch, then
  // the options (the seed's texts for each).
  SPARSECP_CHECK(!command.rank || (*command.rank >= 0 && *command.rank < command.cp),
                 "Indexer balance rank must be inside its CP group");
  const std::vector<int64_t> lengths = command.batch.load(command.cp);
  checked_total(lengths);
  validate_plan_inputs(lengths, command.cp, command.ratio, Mode::kNone, std::nullopt);
  const Strategy& strategy = command.strategy.strategy("zigzag");
  const StrategyParams params = command.strategy.params(command.ratio, command.model);
  if (command.all_ranks) {
    run_all_ranks(command, lengths, strategy, params);
    return;
  }
  const IndexerRoute route =
      strategy.route(lengths, command.cp, *command.rank, command.ratio, params);
  const PlanBounds bounds = plan_bounds(lengths, command, strategy, params);
  if (command.json) {
    nlohmann::ordered_json out = route_json(route);  // the seed's fields first
    add_bounds(out, bounds);
    std::cout << out.dump() << "\n";
  } else {
    const std::string parameters = strategy.describe(lengths, command.cp, params);
    std::printf("mode %s%s%s\n", std::string(strategy.name()).c_str(),
                parameters.empty() ? "" : ": ", parameters.c_str());
    print_route(route, *command.rank);
    print_bounds(bounds, checked_total(lengths));
  }
}

const Registration registration("route", [](CLI::App& app) {
  auto command = std::make_shared<RouteCommand>();
  CLI::App* sub = app.add_subcommand(
      "route",
      "Build a rank's IndexerRoute: which local rows it sends to each peer, where received rows\n"
      "land, and the segments its selector sees (field names as in hyper_parallel\n"
      "indexer_balance's IndexerRoute), beside the whole plan's imbalance and rows moved and\n"
      "their two lower bounds (as in 'sparsecp plan').");
  command->batch.add_to(*sub);
  add_cp_and_ratio(*sub, &command->cp, command->ratio);
  command->strategy.add_to(*sub,
                           "Strategy (any of 'sparsecp simulate --list'; none/zigzag/greedy/hybrid "
                           "give hyper_parallel's exact IndexerRoute) [default: zigzag]");
  command->model.add_to(*sub, ModelFlags::kTopk);
  sub->add_option("--rank", command->rank, "The rank whose route to build (0 <= R < --cp)");
  sub->add_flag("--all-ranks", command->all_ranks,
                "Build every rank's route, as a training step does, and report the time per rank");
  sub->add_option(names("--repeats", {"--repeat"}), command->repeat,
                  "With --all-ranks: repeat N times in this process (at most 10000) and report the "
                  "median")
      ->capture_default_str();
  sub->add_flag("--full", command->full, "With --all-ranks --json: include every rank's route");
  sub->add_flag(
      "--json", command->json,
      "Print JSON. With --rank: the route's fields segments, input_splits, output_splits, "
      "send_rows, receive_rows, local_sources, local_targets, query_count. With "
      "--all-ranks: timing (seconds_per_rank, ns_per_local_row, ...). Both then add the whole "
      "plan's imbalance, balance_bound, rows_moved and rows_moved_lower_bound");
  sub->footer(
      "Examples:\n"
      "  sparsecp route --lengths 5000,300,2699,1 --cp 4 --mode zigzag --rank 1 --json\n"
      "  sparsecp route --lengths 5000,300,2699,1 --cp 4 --mode spill --rank 3 --json\n"
      "  sparsecp route --tokens 1048576 --cp 8 --mode greedy --all-ranks --repeats 20\n"
      "  sparsecp batch --tokens 1048576 --cp 64 > batch.txt\n"
      "  sparsecp route --lengths-file batch.txt --cp 64 --mode spill --all-ranks\n" +
      lengths_file_help());
  sub->callback([command] { run_route(*command); });
});

}  // namespace
}  // namespace sparsecp::cli
