// `sparsecp plan`: which rank selects which rows, and how balanced that is.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "plan_options.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp::cli {
namespace {

struct PlanCommand {
  PlanFlags flags;
  bool json = false;
};

nlohmann::ordered_json plan_json(const TaskPlan& plan, const PlanStats& stats,
                                 const PlanFlags& flags, const PlanOptions& options) {
  nlohmann::ordered_json out;
  out["cp"] = flags.cp;
  out["ratio"] = flags.ratio;
  out["mode"] = mode_name(options.mode);
  out["block_size"] = resolve_block_size(options.mode, options.block_size).value_or(0);
  out["zigzag_min_length"] = options.zigzag_min_length.value_or(0);
  out["ranks"] = nlohmann::ordered_json::array();
  for (int64_t rank = 0; rank < plan.cp(); ++rank) {
    nlohmann::ordered_json entry;
    entry["rank"] = rank;
    entry["tasks"] = nlohmann::ordered_json::array();
    for (const Task& task : plan.tasks(rank)) {
      entry["tasks"].push_back({task.document, task.start, task.end});
    }
    entry["rows"] = stats.rows[static_cast<size_t>(rank)];
    entry["work"] = stats.work[static_cast<size_t>(rank)];
    out["ranks"].push_back(std::move(entry));
  }
  out["imbalance"] = stats.imbalance;
  out["total_work"] = stats.total_work;
  out["rows_moved"] = stats.rows_moved;
  return out;
}

void print_plan_table(const TaskPlan& plan, const PlanStats& stats, int64_t total_rows) {
  std::printf("%6s %12s %16s %8s %7s\n", "rank", "rows", "work", "share", "tasks");
  for (int64_t rank = 0; rank < plan.cp(); ++rank) {
    const auto r = static_cast<size_t>(rank);
    const double share = stats.total_work ? 100.0 * static_cast<double>(stats.work[r]) /
                                                static_cast<double>(stats.total_work)
                                          : 0.0;
    std::printf("%6lld %12lld %16lld %7.2f%% %7zu\n", static_cast<long long>(rank),
                static_cast<long long>(stats.rows[r]), static_cast<long long>(stats.work[r]), share,
                plan.tasks(rank).size());
  }
  std::printf(
      "work imbalance (max/mean): %.4f   rows leaving their owner: %lld of %lld (%.1f%%)\n",
      stats.imbalance, static_cast<long long>(stats.rows_moved), static_cast<long long>(total_rows),
      total_rows ? 100.0 * static_cast<double>(stats.rows_moved) / static_cast<double>(total_rows)
                 : 0.0);
}

void run_plan(const PlanCommand& command) {
  const PlanFlags& flags = command.flags;
  const std::vector<int64_t> lengths = flags.batch.load(flags.cp);
  int64_t total_rows = 0;
  for (const int64_t length : lengths) {
    // Before the planner's own validation: the sum must not overflow first.
    SPARSECP_CHECK(!__builtin_add_overflow(total_rows, length, &total_rows),
                   "Indexer balance document lengths sum beyond 64 bits (document of ", length,
                   " tokens)");
  }

  if (!flags.mode.empty()) {
    const PlanOptions options = flags.options(parse_mode(flags.mode));
    const TaskPlan plan = plan_tasks(lengths, flags.cp, flags.ratio, options);
    const PlanStats stats = plan_stats(plan, lengths, flags.ratio);
    if (command.json) {
      std::cout << plan_json(plan, stats, flags, options).dump() << "\n";
      return;
    }
    std::printf("sparsecp plan: %s (%zu documents, %lld tokens), cp %lld, ratio %lld, mode %s\n",
                flags.batch.describe().c_str(), lengths.size(), static_cast<long long>(total_rows),
                static_cast<long long>(flags.cp), static_cast<long long>(flags.ratio),
                flags.mode.c_str());
    print_plan_table(plan, stats, total_rows);
    return;
  }

  // No --mode: compare the baseline with the three seed modes on the same batch.
  validate_plan_inputs(lengths, flags.cp, flags.ratio, Mode::kNone, std::nullopt);
  const int64_t local = total_rows / flags.cp;
  const int64_t threshold = flags.zigzag_min_length.value_or(local);
  nlohmann::ordered_json plans = nlohmann::ordered_json::array();
  if (!command.json) {
    std::printf("sparsecp plan: %s (%zu documents, %lld tokens), cp %lld, ratio %lld\n",
                flags.batch.describe().c_str(), lengths.size(), static_cast<long long>(total_rows),
                static_cast<long long>(flags.cp), static_cast<long long>(flags.ratio));
    std::printf("hybrid threshold: %lld tokens%s\n\n", static_cast<long long>(threshold),
                flags.zigzag_min_length ? "" : " (the local row count; set --zigzag-min-length)");
    std::printf("%-8s %10s %16s %16s %12s %8s %10s\n", "mode", "imbalance", "max work", "mean work",
                "rows moved", "moved", "max tasks");
  }
  for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
    PlanOptions options;
    options.mode = mode;
    if (mode == Mode::kGreedy || mode == Mode::kHybrid) options.block_size = flags.block_size;
    if (mode == Mode::kHybrid) options.zigzag_min_length = threshold;
    const TaskPlan plan = plan_tasks(lengths, flags.cp, flags.ratio, options);
    const PlanStats stats = plan_stats(plan, lengths, flags.ratio);
    if (command.json) {
      plans.push_back(plan_json(plan, stats, flags, options));
      continue;
    }
    int64_t most = 0;
    size_t most_tasks = 0;
    for (int64_t rank = 0; rank < plan.cp(); ++rank) {
      most = std::max(most, stats.work[static_cast<size_t>(rank)]);
      most_tasks = std::max(most_tasks, plan.tasks(rank).size());
    }
    std::printf("%-8s %10.4f %16lld %16.0f %12lld %7.1f%% %10zu\n",
                std::string(mode_name(mode)).c_str(), stats.imbalance, static_cast<long long>(most),
                static_cast<double>(stats.total_work) / static_cast<double>(flags.cp),
                static_cast<long long>(stats.rows_moved),
                100.0 * static_cast<double>(stats.rows_moved) / static_cast<double>(total_rows),
                most_tasks);
  }
  if (command.json) {
    nlohmann::ordered_json out;
    out["cp"] = flags.cp;
    out["ratio"] = flags.ratio;
    out["plans"] = std::move(plans);
    std::cout << out.dump() << "\n";
  } else {
    std::printf(
        "\nimbalance = slowest rank's causal (query, key) pairs / the mean; 'none' is the "
        "contiguous baseline.\nRun with --mode M for the per-rank table of one mode.\n");
  }
}

const Registration registration("plan", [](CLI::App& app) {
  auto command = std::make_shared<PlanCommand>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Plan which CP rank selects which query rows of a packed batch, and report the balance.\n"
      "Without --mode, compares 'none' (no balancing) with zigzag, greedy and hybrid.");
  command->flags.add_to(*sub,
                        "none | zigzag | greedy | hybrid (default: compare all four). See "
                        "include/sparsecp/planning/plan.hpp for what each does");
  sub->add_flag("--json", command->json,
                "Print JSON: {cp, ratio, mode, ranks:[{rank, tasks:[[document,start,end]], rows, "
                "work}], imbalance, ...}; without --mode, {cp, ratio, plans:[...]}");
  sub->footer(
      "Examples:\n"
      "  sparsecp plan                                   # built-in lognormal batch, all modes\n"
      "  sparsecp plan --lengths 5000,300,2699,1 --cp 4 --mode zigzag\n"
      "  sparsecp plan --lengths-file batch.txt --cp 16 --mode hybrid --zigzag-min-length 8192 "
      "--json");
  sub->callback([command] { run_plan(*command); });
});

}  // namespace
}  // namespace sparsecp::cli
