// `sparsecp spill`: the spill planner on one batch (per-rank table) or on a sweep of
// generated batches, against its lower bounds and the seed's modes.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/simulate.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

struct SpillFlags {
  std::string lengths;
  std::string lengths_file;
  std::string cps = "8";
  std::string distributions = "lognormal";
  std::string seeds = "1";
  int64_t tokens = 1 << 20;
  int64_t scale = 0;
  int64_t ratio = 4;
  double target = 1.001;
  int64_t fragments = 0;
  std::string cost_model;
  int repeats = 5;
  bool json = false;
};

int64_t parse_integer(std::string_view token, std::string_view option) {
  int64_t value = 0;
  const auto [stop, status] = std::from_chars(token.data(), token.data() + token.size(), value);
  SPARSECP_CHECK(!token.empty() && status == std::errc() && stop == token.data() + token.size(),
                 option, ": '", token, "' is not an integer");
  return value;
}

std::vector<std::string> split(std::string_view text, std::string_view option) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    SPARSECP_CHECK(comma > begin, option, ": empty entry in '", text, "'");
    items.emplace_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return items;
}

// "1,2,7" and ranges "1-5".
std::vector<int64_t> parse_integers(std::string_view text, std::string_view option) {
  std::vector<int64_t> values;
  for (const std::string& item : split(text, option)) {
    const size_t dash = item.find('-', 1);
    if (dash == std::string::npos) {
      values.push_back(parse_integer(item, option));
      continue;
    }
    const int64_t first = parse_integer(std::string_view(item).substr(0, dash), option);
    const int64_t last = parse_integer(std::string_view(item).substr(dash + 1), option);
    SPARSECP_CHECK(first <= last && last - first < 100000, option, ": bad range '", item, "'");
    for (int64_t value = first; value <= last; ++value) values.push_back(value);
  }
  return values;
}

// Rows each rank sends away as owner plus rows it selects for other owners.
std::vector<int64_t> rows_sent_received(const TaskPlan& plan, std::span<const int64_t> lengths) {
  const int64_t cp = plan.cp();
  std::vector<int64_t> starts(lengths.size() + 1, 0);
  for (size_t d = 0; d < lengths.size(); ++d) starts[d + 1] = starts[d] + lengths[d];
  const int64_t local = starts.back() / cp;
  std::vector<int64_t> traffic(static_cast<size_t>(cp), 0);
  for (int64_t worker = 0; worker < cp; ++worker) {
    for (const Task& task : plan.tasks(worker)) {
      int64_t begin = starts[static_cast<size_t>(task.document)] + task.start;
      const int64_t end = starts[static_cast<size_t>(task.document)] + task.end;
      while (begin < end) {
        const int64_t owner = begin / local;
        const int64_t stop = std::min(end, (owner + 1) * local);
        if (owner != worker) {
          traffic[static_cast<size_t>(owner)] += stop - begin;
          traffic[static_cast<size_t>(worker)] += stop - begin;
        }
        begin = stop;
      }
    }
  }
  return traffic;
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
  PlanStats stats;  // causal
  std::vector<int64_t> traffic;
  BalanceBound bound;              // causal row bound
  int64_t rows_moved_bound_1 = 0;  // causal, target 1.0 (no rank above the mean)
  double plan_ms = 0;              // median of repeats
  std::vector<ModeFigures> modes;  // zigzag, greedy, hybrid
  const ModeFigures* best_mode() const {
    const ModeFigures* best = nullptr;
    for (const ModeFigures& mode : modes) {
      if (!best || mode.busiest_traffic < best->busiest_traffic) best = &mode;
    }
    return best;
  }
};

BatchReport report_batch(std::vector<int64_t> lengths, int64_t cp, const SpillFlags& flags,
                         const SpillOptions& options) {
  BatchReport report;
  report.cp = cp;
  for (const int64_t length : lengths) report.tokens += length;
  report.documents = static_cast<int64_t>(lengths.size());
  std::vector<double> times;
  for (int repeat = 0; repeat < std::max(flags.repeats, 1); ++repeat) {
    const auto begin = std::chrono::steady_clock::now();
    report.spill = plan_spill(lengths, cp, flags.ratio, options);
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
            .count());
  }
  report.plan_ms = median(times);
  report.stats = plan_stats(report.spill.plan, lengths, flags.ratio);
  report.traffic = rows_sent_received(report.spill.plan, lengths);
  report.bound = balance_bound(lengths, cp, flags.ratio);
  report.rows_moved_bound_1 = rows_moved_lower_bound(lengths, cp, flags.ratio, 1.0).total;
  StrategyParams params;
  params.block_size = std::clamp<int64_t>(params.block_size, 1, report.tokens / cp);
  for (const char* name : {"zigzag", "greedy", "hybrid"}) {
    StrategyPlan planned;
    try {
      planned = find_strategy(name).plan(lengths, cp, flags.ratio, params);
    } catch (const Error& error) {  // say which part failed: not spill itself
      SPARSECP_FAIL_AS(error.kind(), "spill's comparison with the seed mode ", name,
                       " failed: ", error.what());
    }
    const PlanStats stats = plan_stats(planned.plan, lengths, flags.ratio);
    report.modes.push_back({name, stats.imbalance, stats.rows_moved,
                            max_of(rows_sent_received(planned.plan, lengths))});
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
      out["ranks"].push_back({{"rank", rank},
                              {"load_before", r.spill.load_before[i]},
                              {"load_after", r.spill.load_after[i]},
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
  std::printf("sparsecp spill: cp %lld, %lld documents, %lld tokens, ratio %lld, target %g on %s\n",
              static_cast<long long>(r.cp), static_cast<long long>(r.documents),
              static_cast<long long>(r.tokens), static_cast<long long>(flags.ratio), flags.target,
              model.is_causal() ? "causal pairs" : ("the cost model (" + model.unit + ")").c_str());
  std::printf("  %4s %14s %14s %9s %9s %9s %6s %6s\n", "rank", "load before", "load after", "rows",
              "shed", "received", "+frag", "frags");
  for (int64_t rank = 0; rank < r.cp; ++rank) {
    const size_t i = static_cast<size_t>(rank);
    std::printf(
        "  %4lld %14.0f %14.0f %9lld %9lld %9lld %6lld %6zu\n", static_cast<long long>(rank),
        r.spill.load_before[i], r.spill.load_after[i], static_cast<long long>(r.stats.rows[i]),
        static_cast<long long>(r.spill.rows_shed[i]),
        static_cast<long long>(r.spill.rows_received[i]),
        static_cast<long long>(r.spill.received_fragments[i]), r.spill.plan.tasks(rank).size());
  }
  double before = 0;
  for (const double load : r.spill.load_before) before = std::max(before, load);
  std::printf("imbalance (causal work): %.4f (contiguous %.3f, balance bound %.4f); target %s\n",
              r.stats.imbalance, before / r.spill.mean_load, r.bound.bound,
              r.spill.target_met ? "met" : "NOT met");
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
  std::printf("\nplanning: %.3f ms (median of %d)\n", r.plan_ms, std::max(flags.repeats, 1));
}

void print_sweep(const std::vector<BatchReport>& reports, double target) {
  std::printf("  %-9s %4s %5s %9s %7s %7s %8s %7s %13s %13s %6s %8s\n", "workload", "cp", "batch",
              "imbalance", "bound", "moved%", "LB@t %", "LB@1 %", "busiest s+r", "best seed s+r",
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
      "least %.1fx below the best seed mode's; slowest plan %.3f ms\n",
      reports.size(), target, static_cast<long long>(met), static_cast<long long>(allowed),
      worst_moved_ratio, worst_traffic_ratio, slowest);
}

void run_spill(const SpillFlags& flags) {
  SpillOptions options;
  options.target_imbalance = flags.target;
  options.max_received_fragments = flags.fragments;
  if (!flags.cost_model.empty()) options.cost = load_cost_model(flags.cost_model);
  SPARSECP_CHECK(flags.repeats >= 1, "--repeats must be at least 1, got ", flags.repeats);
  const std::vector<int64_t> cps = parse_integers(flags.cps, "--cp");
  std::vector<BatchReport> reports;
  const bool given = !flags.lengths.empty() || !flags.lengths_file.empty();
  if (given) {
    const std::vector<int64_t> lengths = !flags.lengths.empty()
                                             ? parse_lengths(flags.lengths, "--lengths")
                                             : read_lengths_file(flags.lengths_file);
    for (const int64_t cp : cps) {
      reports.push_back(report_batch(lengths, cp, flags, options));
      reports.back().workload = "given";
    }
  } else {
    const auto distributions = split(flags.distributions, "--dist");
    const auto seeds = parse_integers(flags.seeds, "--seeds");
    for (const int64_t cp : cps) {
      SPARSECP_CHECK(cp >= 1, "--cp: CP size must be positive, got ", cp);
      for (const std::string& distribution : distributions) {
        for (const int64_t seed : seeds) {
          SPARSECP_CHECK(seed >= 0, "--seeds: seed must be non-negative, got ", seed);
          std::vector<int64_t> lengths =
              generate_batch(WorkloadSpec{.distribution = distribution,
                                          .tokens = flags.tokens,
                                          .scale = flags.scale,
                                          .cp = cp,
                                          .seed = static_cast<uint64_t>(seed)});
          reports.push_back(report_batch(std::move(lengths), cp, flags, options));
          reports.back().workload = distribution;
          reports.back().batch = seed;
        }
      }
    }
  }
  const bool single = reports.size() == 1;
  if (flags.json) {
    nlohmann::json out;
    out["ratio"] = flags.ratio;
    out["target"] = flags.target;
    out["max_received_fragments"] = flags.fragments;
    out["cost_model"] = {{"a", options.cost.a},
                         {"b", options.cost.b},
                         {"c", options.cost.c},
                         {"topk", options.cost.topk},
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
                flags.target, static_cast<long long>(flags.ratio),
                static_cast<long long>(flags.tokens));
    std::printf(
        "moved%% = rows spill moves; LB@t = fewest rows any plan must move to reach the "
        "target (spill equals it); LB@1 = ... to bring every rank to the mean; s+r = rows a "
        "rank sends plus receives; best seed = zigzag/greedy/hybrid with the lowest busiest "
        "s+r (their imbalance is 1.000-1.003)\n");
    print_sweep(reports, flags.target);
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
      "distributions or seeds, prints one line per batch and a summary of the issue-7 targets.");
  auto* lengths = sub->add_option("--lengths", flags->lengths,
                                  "Document lengths in packed order, e.g. 5000,300,2699,1");
  auto* file = sub->add_option("--lengths-file", flags->lengths_file,
                               "File with document lengths (commas or whitespace)");
  lengths->excludes(file);
  sub->add_option("--cp", flags->cps, "CP sizes (ranks), comma-separated")->capture_default_str();
  sub->add_option("--dist", flags->distributions,
                  "Generated workloads, comma-separated: fixed, uniform, lognormal, pareto, "
                  "bimodal, mixture (ignored with --lengths/--lengths-file)")
      ->capture_default_str();
  sub->add_option("--seeds", flags->seeds, "Generator seeds: a list '1,2' and/or ranges '1-5'")
      ->capture_default_str();
  sub->add_option("--tokens", flags->tokens, "Tokens per generated batch (divisible by each CP)")
      ->capture_default_str();
  sub->add_option("--scale", flags->scale,
                  "Typical document length in tokens; 0 = a quarter of the local shard")
      ->capture_default_str();
  sub->add_option("--ratio", flags->ratio, "Compression ratio of the indexer (tokens per key)")
      ->capture_default_str();
  sub->add_option("--target", flags->target,
                  "Target imbalance, max load / mean load (>= 1); ranks above it shed rows")
      ->capture_default_str();
  sub->add_option("--fragments", flags->fragments,
                  "Most pieces one rank receives from others (0 = unbounded)")
      ->capture_default_str();
  sub->add_option("--cost-model", flags->cost_model,
                  "Balance this cost model (a file from `sparsecp calibrate`) instead of causal "
                  "pairs [default: causal pairs, the seed's measure]");
  sub->add_option("--repeats", flags->repeats,
                  "Plan each batch this many times; the planning time is the median")
      ->capture_default_str();
  sub->add_flag("--json", flags->json,
                "Print JSON: {ratio, target, cost_model, batches: [{cp, tokens, imbalance, "
                "balance_bound, rows_moved, rows_moved_lower_bound, busiest_rows_sent_received, "
                "seed_modes: [...], plan_ms, ranks: [...] (one batch only)}]}");
  sub->footer(
      "Examples:\n"
      "  sparsecp spill --lengths 5000,300,2699,1 --cp 4\n"
      "  sparsecp spill --cp 8 --dist lognormal --tokens 1048576 --seeds 1\n"
      "  sparsecp spill --cp 4,8,16,32,64 --dist lognormal,pareto,mixture --seeds 1-5\n"
      "  sparsecp spill --cp 16 --tokens 524288 --target 1.0 --cost-model cost_model.txt --json");
  sub->callback([flags] { run_spill(*flags); });
});

}  // namespace
}  // namespace sparsecp::cli
