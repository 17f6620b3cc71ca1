// `sparsecp plan`: which rank selects which rows under a strategy, how balanced that is,
// and how far from what no plan can beat.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "strategy_flags.hpp"

namespace sparsecp::cli {
namespace {

struct PlanCommand {
  BatchOptions batch;
  int64_t cp = 8;
  int64_t ratio = 4;
  StrategyFlags strategy;
  ModelFlags model;
  bool json = false;
};

// One strategy's plan on the batch, with its statistics and the two lower bounds.
struct PlanReport {
  const Strategy* strategy = nullptr;
  std::string parameters;
  Plan planned;
  PlanStats stats;
  int64_t busiest_work = 0;
  // The fewest rows any plan whose busiest rank does at most this plan's busiest work
  // must move (lower_bound.hpp, at this plan's imbalance).
  int64_t rows_moved_bound = 0;
  size_t most_tasks = 0;
};

PlanReport report(const Strategy& strategy, std::span<const int64_t> lengths,
                  const PlanCommand& command, const StrategyParams& params) {
  Plan planned = strategy.plan(lengths, command.cp, command.ratio, params);
  PlanReport r{&strategy, strategy.describe(lengths, command.cp, params), planned, planned.stats()};
  for (int64_t rank = 0; rank < command.cp; ++rank) {
    r.busiest_work = std::max(r.busiest_work, r.stats.work[static_cast<size_t>(rank)]);
    r.most_tasks = std::max(r.most_tasks, planned.tasks(rank).size());
  }
  r.rows_moved_bound = planned.rows_moved_bound().total;
  return r;
}

nlohmann::ordered_json report_json(const PlanReport& r, int64_t total_rows, bool tasks) {
  nlohmann::ordered_json out;
  out["mode"] = r.strategy->name();
  out["parameters"] = r.parameters;
  out["imbalance"] = r.stats.imbalance;
  out["total_work"] = r.stats.total_work;
  out["busiest_work"] = r.busiest_work;
  out["rows_moved"] = r.stats.rows_moved;
  out["moved_fraction"] = static_cast<double>(r.stats.rows_moved) /
                          static_cast<double>(std::max<int64_t>(total_rows, 1));
  out["rows_moved_lower_bound"] = r.rows_moved_bound;
  out["largest_unit_work"] = r.planned.largest_unit_work();
  out["max_tasks_per_rank"] = r.most_tasks;
  if (!r.planned.note().empty()) out["note"] = r.planned.note();
  out["ranks"] = nlohmann::ordered_json::array();
  for (int64_t rank = 0; rank < r.planned.tasks().cp(); ++rank) {
    nlohmann::ordered_json entry;
    entry["rank"] = rank;
    entry["rows"] = r.stats.rows[static_cast<size_t>(rank)];
    entry["work"] = r.stats.work[static_cast<size_t>(rank)];
    if (tasks) {
      entry["tasks"] = nlohmann::ordered_json::array();
      for (const Task& task : r.planned.tasks().tasks(rank)) {
        entry["tasks"].push_back({task.document, task.start, task.end});
      }
    }
    out["ranks"].push_back(std::move(entry));
  }
  return out;
}

void print_rank_table(const PlanReport& r) {
  std::printf("%6s %12s %18s %8s %7s\n", "rank", "rows", "work (pairs)", "share", "tasks");
  for (int64_t rank = 0; rank < r.planned.tasks().cp(); ++rank) {
    const auto i = static_cast<size_t>(rank);
    const double share = r.stats.total_work ? 100.0 * static_cast<double>(r.stats.work[i]) /
                                                  static_cast<double>(r.stats.total_work)
                                            : 0.0;
    std::printf("%6lld %12lld %18lld %7.2f%% %7zu\n", static_cast<long long>(rank),
                static_cast<long long>(r.stats.rows[i]), static_cast<long long>(r.stats.work[i]),
                share, r.planned.tasks().tasks(rank).size());
  }
}

void run_plan(const PlanCommand& command) {
  const std::vector<int64_t> lengths = command.batch.load(command.cp);
  const int64_t total_rows = checked_total(lengths);
  validate_plan_inputs(lengths, command.cp, command.ratio, Mode::kNone, std::nullopt);
  const StrategyParams params = command.strategy.params(command.ratio, command.model);
  const BalanceBound bound = balance_bound(lengths, command.cp, command.ratio);

  std::vector<const Strategy*> strategies;
  if (command.strategy.mode.empty()) {
    const auto every = all_strategies();
    strategies.assign(every.begin(), every.end());
  } else {
    strategies.push_back(&command.strategy.strategy(""));
  }
  const bool single = strategies.size() == 1;
  std::vector<PlanReport> reports;
  for (const Strategy* strategy : strategies) {
    reports.push_back(report(*strategy, lengths, command, params));
  }

  if (command.json) {
    nlohmann::ordered_json out;
    out["cp"] = command.cp;
    out["ratio"] = command.ratio;
    out["batch"] = command.batch.describe();
    out["documents"] = lengths.size();
    out["tokens"] = total_rows;
    out["balance_bound"] = bound.bound;
    if (single) {
      nlohmann::ordered_json one = report_json(reports.front(), total_rows, true);
      for (auto& [key, value] : one.items()) out[key] = value;
    } else {
      out["plans"] = nlohmann::ordered_json::array();
      for (const PlanReport& r : reports) out["plans"].push_back(report_json(r, total_rows, true));
    }
    std::cout << out.dump() << "\n";
    return;
  }

  std::printf("sparsecp plan: %s (%zu documents, %lld tokens), cp %lld, ratio %lld\n",
              command.batch.describe().c_str(), lengths.size(), static_cast<long long>(total_rows),
              static_cast<long long>(command.cp), static_cast<long long>(command.ratio));
  const double pct = 100.0 / static_cast<double>(total_rows);
  if (single) {
    const PlanReport& r = reports.front();
    std::printf("mode %s%s%s\n", std::string(r.strategy->name()).c_str(),
                r.parameters.empty() ? "" : ": ", r.parameters.c_str());
    print_rank_table(r);
    std::printf(
        "work imbalance (max/mean causal pairs): %.4f; balance bound (no plan can do better): "
        "%.4f\nrows leaving their owner: %lld (%.2f%%); the fewest any plan this balanced must "
        "move: %lld (%.2f%%)\n",
        r.stats.imbalance, bound.bound, static_cast<long long>(r.stats.rows_moved),
        pct * static_cast<double>(r.stats.rows_moved), static_cast<long long>(r.rows_moved_bound),
        pct * static_cast<double>(r.rows_moved_bound));
    if (!r.planned.note().empty()) std::printf("note: %s\n", r.planned.note().c_str());
    return;
  }
  std::printf("balance bound (the best imbalance any row-granular plan can reach): %.4f\n\n",
              bound.bound);
  std::printf("%-15s %10s %11s %11s %10s  %s\n", "mode", "imbalance", "rows moved", "fewest need",
              "max tasks", "parameters / note");
  for (const PlanReport& r : reports) {
    std::string remark = r.parameters;
    if (!r.planned.note().empty()) remark += (remark.empty() ? "" : "; ") + r.planned.note();
    std::printf("%-15s %10.4f %10.2f%% %10.2f%% %10zu  %s\n",
                std::string(r.strategy->name()).c_str(), r.stats.imbalance,
                pct * static_cast<double>(r.stats.rows_moved),
                pct * static_cast<double>(r.rows_moved_bound), r.most_tasks, remark.c_str());
  }
  std::printf(
      "\nimbalance = the busiest rank's causal (query, key) pairs / the mean; 'none' keeps the "
      "contiguous shards.\nrows moved = rows selected away from their owner; fewest need = the "
      "fewest rows any plan with the same busiest rank must move.\nRun with --mode M for one "
      "strategy's per-rank table; --json adds every rank's task list.\n");
}

const Registration registration("plan", [](CLI::App& app) {
  auto command = std::make_shared<PlanCommand>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Plan which CP rank selects which query rows of a packed batch, and report how balanced\n"
      "the plan is (busiest rank's causal work / mean) and how many rows leave their owner,\n"
      "each beside what no plan can beat. Without --mode, compares every registered strategy.");
  command->batch.add_to(*sub);
  add_cp_and_ratio(*sub, &command->cp, command->ratio);
  command->strategy.add_to(*sub,
                           "Strategy to plan with (any of 'sparsecp simulate --list': none, "
                           "zigzag, greedy, hybrid, spill, auto, ...) [default: compare all]");
  command->model.add_to(*sub, ModelFlags::kTopk);
  sub->add_flag("--json", command->json,
                "Print JSON: {cp, ratio, tokens, balance_bound, mode, parameters, imbalance, "
                "rows_moved, rows_moved_lower_bound, ranks: [{rank, rows, work, tasks: "
                "[[document, start, end], ...]}]}; without --mode, {..., plans: [...]}");
  sub->footer(
      "Examples:\n"
      "  sparsecp plan                                   # built-in lognormal batch, every "
      "strategy\n"
      "  sparsecp plan --lengths 5000,300,2699,1 --cp 4 --mode zigzag\n"
      "  sparsecp plan --lengths 5000,300,2699,1 --cp 4 --mode spill --json\n"
      "  sparsecp batch --dist pareto --tokens 131072 --cp 16 --seed 3 > batch.txt\n"
      "  sparsecp plan --lengths-file batch.txt --cp 16 --mode hybrid --zigzag-min-length 8192\n" +
      lengths_file_help());
  sub->callback([command] { run_plan(*command); });
});

}  // namespace
}  // namespace sparsecp::cli
