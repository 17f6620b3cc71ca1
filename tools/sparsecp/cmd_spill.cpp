// `sparsecp spill`: the spill planner on one batch (per-rank table) or on a sweep of
// generated batches, against its lower bounds and the seed's modes.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/node_map.hpp"
#include "sparsecp/planning/simulate.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategies/spill.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/planning/workload.hpp"
#include "strategy_flags.hpp"
#include "sweep_input.hpp"
#include "timing.hpp"

namespace sparsecp::cli {
namespace {

struct SpillFlags {
  SweepOptions sweep;
  int64_t ratio = 4;
  StrategyFlags strategy;  // --target-imbalance, --max-received-fragments, --cost-model (and the
                           // seed modes' options)
  int64_t repeats = 5;
  bool json = false;
  int64_t ranks_per_node = 0;  // > 0: also the topology-aware plan and cross-node rows
  std::string owner_cost;      // "a,c": owner-side cost per owned row (spill.hpp's owner load)
};

// --owner-cost "a,c" as the model a + c * min(topk, vis) (b = 0, the selection model's topk);
// nothing when not given.
std::optional<CostModel> owner_cost_model(const std::string& text, const CostModel& selection) {
  if (text.empty()) return std::nullopt;
  const std::vector<std::string> items = parse_name_list(text, "--owner-cost");
  SPARSECP_CHECK(items.size() == 2,
                 "--owner-cost takes two numbers a,c (cost per owned row: a + c ",
                 "* min(topk, visible keys)), got '", text, "'");
  double values[2] = {};
  for (size_t i = 0; i < 2; ++i) {
    const std::string& item = items[i];
    const auto [stop, status] = std::from_chars(item.data(), item.data() + item.size(), values[i]);
    SPARSECP_CHECK(status == std::errc() && stop == item.data() + item.size(), "--owner-cost: '",
                   item, "' is not a number");
    SPARSECP_CHECK(std::isfinite(values[i]) && values[i] >= 0, "--owner-cost: ", i == 0 ? "a" : "c",
                   " must be finite and non-negative, got ", item);
  }
  SPARSECP_CHECK(values[0] + values[1] > 0, "--owner-cost: a and c are both 0 (no owner cost); ",
                 "leave the option out instead");
  CostModel model = CostModel::linear(values[0], 0, values[1], selection.topk);
  model.unit = selection.unit;
  return model;
}

// Rows each rank sends away as owner plus rows it selects for other owners.
std::vector<int64_t> rows_sent_received(const TaskPlan& plan, std::span<const int64_t> lengths) {
  RowTraffic traffic = row_traffic(plan, lengths);
  for (size_t r = 0; r < traffic.sent.size(); ++r) traffic.sent[r] += traffic.received[r];
  return traffic.sent;
}

int64_t max_of(const std::vector<int64_t>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

// One seed mode on a batch.
struct ModeFigures {
  std::string name;
  double imbalance = 0;
  int64_t rows_moved = 0;
  int64_t busiest_traffic = 0;  // max over ranks of rows sent + received
};

// Everything the command reports about one batch.
struct BatchReport {
  int64_t cp = 0;
  std::string workload;
  int64_t batch = 0;
  int64_t tokens = 0;
  int64_t documents = 0;
  SpillPlan spill;
  bool owner = false;  // --owner-cost: spill's loads include each rank's owner load
  PlanStats stats;     // causal
  std::vector<int64_t> traffic;
  BalanceBound bound;              // causal row bound
  int64_t rows_moved_bound_1 = 0;  // causal, target 1.0 (no rank above the mean)
  double plan_ms = 0;              // median of repeats
  std::vector<ModeFigures> modes;  // zigzag, greedy, hybrid
  // --ranks-per-node: rows crossing nodes per plan, the topology-aware spill and its
  // causal imbalance.
  std::vector<std::pair<std::string, int64_t>> cross_node;
  std::optional<SpillPlan> topology;
  double topology_imbalance = 0;
  const ModeFigures* best_mode() const {
    const ModeFigures* best = nullptr;
    for (const ModeFigures& mode : modes) {
      if (!best || mode.busiest_traffic < best->busiest_traffic) best = &mode;
    }
    return best;
  }
};

BatchReport report_batch(std::span<const int64_t> lengths, int64_t cp, const SpillFlags& flags,
                         const StrategyParams& params) {
  SpillOptions options = spill_options(params);
  BatchReport report;
  if (const auto owner = owner_cost_model(flags.owner_cost, options.cost)) {
    options.owner_load = owner_cost(lengths, cp, flags.ratio, *owner);
    report.owner = true;
  }
  report.cp = cp;
  for (const int64_t length : lengths) report.tokens += length;
  report.documents = static_cast<int64_t>(lengths.size());
  std::vector<double> times;
  for (int64_t repeat = 0; repeat < flags.repeats; ++repeat) {
    const double begin = wall_seconds();
    report.spill = plan_spill(lengths, cp, flags.ratio, options);
    times.push_back((wall_seconds() - begin) * 1e3);
  }
  report.plan_ms = median(times);
  report.stats = plan_stats(report.spill.plan, lengths, flags.ratio);
  report.traffic = rows_sent_received(report.spill.plan, lengths);
  report.bound = balance_bound(lengths, cp, flags.ratio);
  report.rows_moved_bound_1 = rows_moved_lower_bound(lengths, cp, flags.ratio, 1.0).total;
  for (const char* name : {"zigzag", "greedy", "hybrid"}) {
    std::optional<Plan> planned;
    try {
      planned.emplace(find_strategy(name).plan(lengths, cp, flags.ratio, params));
    } catch (const Error& error) {  // say which part failed: not spill itself
      SPARSECP_FAIL_AS(error.kind(), "spill's comparison with hyper_parallel's mode ", name,
                       " failed: ", error.what());
    }
    const PlanStats& stats = planned->stats();
    report.modes.push_back({name, stats.imbalance, stats.rows_moved,
                            max_of(rows_sent_received(planned->tasks(), lengths))});
    if (flags.ranks_per_node > 0) {
      report.cross_node.emplace_back(
          name, cross_node_rows(planned->tasks(), lengths, flags.ranks_per_node));
    }
  }
  if (flags.ranks_per_node > 0) {
    SpillOptions topology = options;
    topology.ranks_per_node = flags.ranks_per_node;
    report.topology = plan_spill(lengths, cp, flags.ratio, topology);
    report.topology_imbalance = plan_stats(report.topology->plan, lengths, flags.ratio).imbalance;
    report.cross_node.emplace_back(
        "spill", cross_node_rows(report.spill.plan, lengths, flags.ranks_per_node));
    report.cross_node.emplace_back("spill_topology", report.topology->cross_node_rows);
  }
  return report;
}

nlohmann::json batch_json(const BatchReport& r, bool per_rank) {
  nlohmann::json out = {
      {"cp", r.cp},
      {"tokens", r.tokens},
      {"documents", r.documents},
      {"target_load", r.spill.target_load},
      {"mean_load", r.spill.mean_load},
      {"target_met", r.spill.target_met},
      {"fragment_bound_met", r.spill.fragment_bound_met},
      {"imbalance", r.stats.imbalance},
      {"balance_bound", r.bound.bound},
      {"rows_moved", r.stats.rows_moved},
      {"rows_moved_lower_bound", r.spill.rows_moved},
      {"rows_moved_lower_bound_at_mean", r.rows_moved_bound_1},
      {"moved_fraction", static_cast<double>(r.stats.rows_moved) / static_cast<double>(r.tokens)},
      {"busiest_rows_sent_received", max_of(r.traffic)},
      {"fragments_max", 0},
      {"rows_max", max_of(r.stats.rows)},
      {"leftover_pieces", r.spill.leftover_pieces},
      {"plan_ms", r.plan_ms}};
  if (r.topology) {
    nlohmann::json rows = nlohmann::json::object();
    for (const auto& [name, count] : r.cross_node) rows[name] = count;
    out["cross_node"] = {{"bound", r.topology->cross_node_bound},
                         {"rows", rows},
                         {"spill_topology_imbalance", r.topology_imbalance},
                         {"spill_topology_rows_moved", r.topology->rows_moved},
                         {"spill_topology_target_met", r.topology->target_met}};
  }
  if (!r.workload.empty()) {
    out["workload"] = r.workload;
    out["batch"] = r.batch;
  }
  int64_t fragments = 0;
  for (int64_t rank = 0; rank < r.cp; ++rank) {
    fragments = std::max(fragments, static_cast<int64_t>(r.spill.plan.tasks(rank).size()));
  }
  out["fragments_max"] = fragments;
  out["seed_modes"] = nlohmann::json::array();
  for (const ModeFigures& mode : r.modes) {
    out["seed_modes"].push_back({{"strategy", mode.name},
                                 {"imbalance", mode.imbalance},
                                 {"rows_moved", mode.rows_moved},
                                 {"busiest_rows_sent_received", mode.busiest_traffic}});
  }
  if (per_rank) {
    out["ranks"] = nlohmann::json::array();
    for (int64_t rank = 0; rank < r.cp; ++rank) {
      const size_t i = static_cast<size_t>(rank);
      const double owner = r.spill.owner_load[i];
      out["ranks"].push_back({{"rank", rank},
                              {"load_before", r.spill.load_before[i]},
                              {"load_after", r.spill.load_after[i]},
                              {"owner_load", owner},
                              {"selection_load_before", r.spill.load_before[i] - owner},
                              {"selection_load_after", r.spill.load_after[i] - owner},
                              {"work", r.stats.work[i]},
                              {"rows", r.stats.rows[i]},
                              {"rows_shed", r.spill.rows_shed[i]},
                              {"rows_received", r.spill.rows_received[i]},
                              {"received_fragments", r.spill.received_fragments[i]},
                              {"fragments", r.spill.plan.tasks(rank).size()}});
    }
  }
  return out;
}

void print_batch(const BatchReport& r, const SpillFlags& flags, const CostModel& model) {
  const std::string scale =
      model.is_causal() ? "causal pairs" : "the cost model, " + model.unit + " per row";
  std::printf("sparsecp spill: cp %lld, %lld documents, %lld tokens, ratio %lld, target %g on %s\n",
              static_cast<long long>(r.cp), static_cast<long long>(r.documents),
              static_cast<long long>(r.tokens), static_cast<long long>(flags.ratio),
              flags.strategy.given.target_imbalance, scale.c_str());
  if (r.owner) {
    std::printf("  with each rank's owner load (--owner-cost): load = selection + owner\n");
    std::printf("  %4s %14s %14s %14s %14s %9s %9s %9s %6s %6s\n", "rank", "load before",
                "load after", "owner load", "selection", "rows", "shed", "received", "+frag",
                "frags");
  } else {
    std::printf("  %4s %14s %14s %9s %9s %9s %6s %6s\n", "rank", "load before", "load after",
                "rows", "shed", "received", "+frag", "frags");
  }
  for (int64_t rank = 0; rank < r.cp; ++rank) {
    const size_t i = static_cast<size_t>(rank);
    std::printf("  %4lld %14.0f %14.0f", static_cast<long long>(rank), r.spill.load_before[i],
                r.spill.load_after[i]);
    if (r.owner) {
      std::printf(" %14.0f %14.0f", r.spill.owner_load[i],
                  r.spill.load_after[i] - r.spill.owner_load[i]);
    }
    std::printf(" %9lld %9lld %9lld %6lld %6zu\n", static_cast<long long>(r.stats.rows[i]),
                static_cast<long long>(r.spill.rows_shed[i]),
                static_cast<long long>(r.spill.rows_received[i]),
                static_cast<long long>(r.spill.received_fragments[i]),
                r.spill.plan.tasks(rank).size());
  }
  double before = 0;
  double after = 0;
  for (const double load : r.spill.load_before) before = std::max(before, load);
  for (const double load : r.spill.load_after) after = std::max(after, load);
  const std::string measured = r.owner ? scale + " plus the owner load" : scale;
  std::printf("imbalance on %s (what the target refers to): %.4f (contiguous %.3f); target %g %s\n",
              measured.c_str(), after / r.spill.mean_load, before / r.spill.mean_load,
              flags.strategy.given.target_imbalance, r.spill.target_met ? "met" : "NOT met");
  if (!model.is_causal()) {
    std::printf("imbalance in causal pairs (hyper_parallel's measure): %.4f (balance bound %.4f)\n",
                r.stats.imbalance, r.bound.bound);
  } else {
    std::printf("balance bound (the best any row-granular plan can reach): %.4f\n", r.bound.bound);
  }
  std::printf(
      "rows moved: %lld (%.2f%% of all rows) = lower bound at the target %lld; at the mean %lld\n",
      static_cast<long long>(r.stats.rows_moved),
      100.0 * static_cast<double>(r.stats.rows_moved) / static_cast<double>(r.tokens),
      static_cast<long long>(r.spill.rows_moved), static_cast<long long>(r.rows_moved_bound_1));
  std::printf("busiest rank's rows sent + received: spill %lld",
              static_cast<long long>(max_of(r.traffic)));
  for (const ModeFigures& mode : r.modes) {
    std::printf(", %s %lld (imbalance %.3f)", mode.name.c_str(),
                static_cast<long long>(mode.busiest_traffic), mode.imbalance);
  }
  std::printf("\nplanning: %.3f ms (median of %lld)\n", r.plan_ms,
              static_cast<long long>(flags.repeats));
}

void print_sweep(const std::vector<BatchReport>& reports, double target) {
  std::printf("  %-9s %4s %5s %9s %7s %7s %8s %7s %13s %13s %6s %8s\n", "workload", "cp", "batch",
              "imbalance", "bound", "moved%", "LB@t %", "LB@1 %", "busiest s+r", "best mode s+r",
              "ratio", "plan ms");
  int64_t allowed = 0, met = 0;
  double worst_moved_ratio = 0, worst_traffic_ratio = 1e300, slowest = 0;
  for (const BatchReport& r : reports) {
    const ModeFigures* best = r.best_mode();
    const double ratio = max_of(r.traffic) > 0 ? static_cast<double>(best->busiest_traffic) /
                                                     static_cast<double>(max_of(r.traffic))
                                               : 1e300;
    const double pct = 100.0 / static_cast<double>(r.tokens);
    std::printf(
        "  %-9s %4lld %5lld %9.4f %7.4f %7.2f %8.2f %7.2f %13lld %8lld %-4s %6.1fx %8.3f\n",
        r.workload.c_str(), static_cast<long long>(r.cp), static_cast<long long>(r.batch),
        r.stats.imbalance, r.bound.bound, pct * static_cast<double>(r.stats.rows_moved),
        pct * static_cast<double>(r.spill.rows_moved),
        pct * static_cast<double>(r.rows_moved_bound_1), static_cast<long long>(max_of(r.traffic)),
        static_cast<long long>(best->busiest_traffic), best->name.c_str(), ratio, r.plan_ms);
    if (r.bound.bound <= target) {
      ++allowed;
      met += r.stats.imbalance <= target ? 1 : 0;
    }
    if (r.spill.rows_moved > 0) {
      worst_moved_ratio = std::max(worst_moved_ratio, static_cast<double>(r.stats.rows_moved) /
                                                          static_cast<double>(r.spill.rows_moved));
    }
    worst_traffic_ratio = std::min(worst_traffic_ratio, ratio);
    slowest = std::max(slowest, r.plan_ms);
  }
  std::printf(
      "\n%zu batches: imbalance <= %g on %lld of the %lld batches whose balance bound allows it; "
      "rows moved / lower bound at the target <= %.3f; busiest rank's rows sent+received at "
      "least %.1fx below the best hyper_parallel mode's; slowest plan %.3f ms\n",
      reports.size(), target, static_cast<long long>(met), static_cast<long long>(allowed),
      worst_moved_ratio, worst_traffic_ratio, slowest);
}

void run_spill(const SpillFlags& flags) {
  check_repeats(flags.repeats, "--repeats");
  const StrategyParams params = flags.strategy.params(flags.ratio);
  SweepSpec spec = flags.sweep.spec();
  spec.ratio = flags.ratio;
  std::vector<BatchReport> reports;
  for_each_sweep_batch(spec, [&](const SweepBatch& batch) {
    reports.push_back(report_batch(batch.lengths, batch.cp, flags, params));
    reports.back().workload = batch.workload;
    reports.back().batch = batch.batch;
  });
  const SpillOptions options = spill_options(params);
  const bool single = reports.size() == 1;
  if (flags.json) {
    nlohmann::json out;
    out["ratio"] = flags.ratio;
    out["target"] = flags.strategy.given.target_imbalance;
    out["max_received_fragments"] = flags.strategy.given.max_received_fragments;
    const auto owner = owner_cost_model(flags.owner_cost, options.cost);
    out["owner_cost"] =
        owner ? nlohmann::json{{"a", owner->a}, {"c", owner->c}, {"topk", owner->topk}}
              : nlohmann::json(nullptr);
    out["cost_model"] = {{"a", options.cost.a},
                         {"b", options.cost.b},
                         {"c", options.cost.c},
                         {"d", options.cost.d},
                         {"topk", options.cost.topk},
                         {"candidates", options.cost.candidates},
                         {"quantum", options.cost.quantum},
                         {"unit", options.cost.unit}};
    out["batches"] = nlohmann::json::array();
    for (const BatchReport& r : reports) out["batches"].push_back(batch_json(r, single));
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (single) {
    print_batch(reports.front(), flags, options.cost);
  } else {
    std::printf("sparsecp spill: target %g, ratio %lld, %lld tokens per generated batch\n",
                flags.strategy.given.target_imbalance, static_cast<long long>(flags.ratio),
                static_cast<long long>(flags.sweep.tokens));
    std::printf(
        "moved%% = rows spill moves; LB@t = fewest rows any plan must move to reach the "
        "target (spill equals it); LB@1 = ... to bring every rank to the mean; s+r = rows a "
        "rank sends plus receives; best mode = zigzag/greedy/hybrid with the lowest busiest "
        "s+r (their imbalance is 1.000-1.003)\n");
    print_sweep(reports, flags.strategy.given.target_imbalance);
  }
}

const Registration registration("spill", [](CLI::App& app) {
  auto flags = std::make_shared<SpillFlags>();
  CLI::App* sub = app.add_subcommand(
      "spill",
      "Plan with spill: every rank keeps its own rows and each rank above the target load\n"
      "sheds only its heaviest rows (document tails) to ranks below it. With one batch and one\n"
      "CP size, prints the per-rank table (load before/after in the cost model's units, rows,\n"
      "rows shed and received, pieces received, fragments), the causal imbalance against the\n"
      "balance bound, rows moved against the rows-moved lower bound, and the busiest rank's\n"
      "rows sent + received against zigzag, greedy and hybrid. With several CP sizes,\n"
      "distributions, seeds or files, prints one line per batch and a summary: how often the\n"
      "target was met where the balance bound allows it, rows moved against the lower bound, and\n"
      "the busiest rank's traffic against the best of zigzag, greedy and hybrid.");
  flags->sweep.add_to(*sub, "8", "lognormal", "1");
  sub->add_option("--ratio", flags->ratio, "Compression ratio of the indexer (tokens per key)")
      ->capture_default_str();
  flags->strategy.add_to(*sub, "", false);
  sub->add_option("--repeats", flags->repeats,
                  "Plan each batch this many times (at most 10000); the planning time is the "
                  "median")
      ->capture_default_str();
  sub->add_option("--ranks-per-node", flags->ranks_per_node,
                  "Node map (consecutive ranks per node, dividing every --cp): also plan the "
                  "topology-aware spill and report, in --json as cross_node, the rows each plan "
                  "(zigzag, greedy, hybrid, spill, spill_topology) selects on another node than "
                  "their owner's, beside the lower bound; 0: none")
      ->capture_default_str();
  sub->add_option("--owner-cost", flags->owner_cost,
                  "A,C: work each rank does on its own rows whatever the plan, a + c * min(topk, "
                  "visible keys) per owned row, in the cost model's units (causal pairs, or ns "
                  "with --cost-model; topk is the cost model's). E.g. the KL loss, which stays on "
                  "each row's owner: spill then balances selection + owner cost, so the rank with "
                  "the heaviest owner cost selects less. Load columns (and --json's load_before / "
                  "load_after) become totals; --json ranks add owner_load and "
                  "selection_load_before/after. Not given: no owner cost");
  sub->add_flag(
      "--json", flags->json,
      "Print JSON: {ratio, target, cost_model, owner_cost, batches: [{cp, tokens, imbalance, "
      "balance_bound, rows_moved, rows_moved_lower_bound, busiest_rows_sent_received, "
      "seed_modes: [...], plan_ms, ranks: [...] (one batch only)}]}");
  sub->footer(
      "Examples:\n"
      "  sparsecp spill --lengths 5000,300,2699,1 --cp 4\n"
      "  sparsecp spill --cp 8 --dist lognormal --tokens 1048576 --seed 1\n"
      "  sparsecp spill --cp 4,8,16,32,64 --dist lognormal,pareto,mixture --seed 1-5\n"
      "  sparsecp spill --cp 16 --tokens 524288 --target-imbalance 1.0 --cost-model cost_model.txt "
      "--json\n"
      "  sparsecp spill --lengths 5800,600,1400,90,302 --cp 4 --owner-cost 274,2.8   # plus the "
      "KL on the owners (train_indexer_step.py's fit, causal pairs)\n" +
      lengths_file_help());
  sub->callback([flags] { run_spill(*flags); });
});

}  // namespace
}  // namespace sparsecp::cli
