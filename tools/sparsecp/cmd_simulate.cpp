// `sparsecp simulate`: every balancing strategy side by side on packed batches.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "command.hpp"
#include "model_flags.hpp"
#include "progress.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/output_set.hpp"
#include "sparsecp/io/report_svg.hpp"
#include "sparsecp/io/simulate_report.hpp"
#include "sparsecp/planning/simulate.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "strategy_flags.hpp"
#include "sweep_input.hpp"
#include "timing.hpp"

namespace sparsecp::cli {
namespace {

struct SimulateCommand {
  std::string strategies = "all";
  SweepOptions sweep;
  int64_t ratio = 4;
  StrategyFlags strategy;
  ModelFlags model;  // sizes the moved rows (bytes) and lpt-search's top-k
  bool json = false;
  bool csv = false;
  bool all_batches = false;
  bool list = false;
  std::string svg;
  int64_t ranks_per_node = 0;  // > 0: the node map (spill plans with it; cross-node figures)
};

void print_strategies() {
  for (const Strategy* strategy : all_strategies()) {
    std::printf("%-16s %s\n%16s source: %s; unit: %s\n", std::string(strategy->name()).c_str(),
                std::string(strategy->summary()).c_str(), "",
                std::string(strategy->source()).c_str(), std::string(strategy->unit()).c_str());
  }
}

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void operator()(int64_t done, int64_t total) const {
    if (!enabled_ || total <= 0) return;
    const int width = 40;
    const int filled = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r[%s%s] %lld/%lld batches", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
};

// The SVG chart: bars for the first batch planned (smallest CP listed first in the sweep
// order) beside the medians of every batch.
void write_svg(const std::string& path, const SweepSpec& spec,
               const std::vector<SimulationResult>& results) {
  std::vector<SimulationResult> first;
  for (const auto& result : results) {
    if (!first.empty() &&
        (result.cp != first.front().cp || result.workload != first.front().workload ||
         result.batch != first.front().batch)) {
      break;
    }
    first.push_back(result);
  }
  const std::vector<SummaryRow> medians = summarize(results);
  std::ostringstream title;
  title << "sparsecp simulate: " << spec.strategies.size() << " strategies, ratio " << spec.ratio
        << ", "
        << (spec.file_batches.empty()
                ? std::to_string(spec.tokens) + " tokens per batch"
                : std::to_string(spec.file_batches.size()) + " given batch(es)");
  OutputSet output;  // whole or absent (io/output_set.hpp)
  output.add_text(path, render_simulation_svg(first, medians, title.str()), "--svg");
  output.commit();
  std::fprintf(stderr, "wrote %s\n", path.c_str());
}

// The text report: what was swept, the settings, the legend and the table.
void print_text(const SweepSpec& spec, const std::vector<SummaryRow>& rows) {
  const StrategyParams& params = spec.params;
  std::printf("sparsecp simulate: %zu strategies x %lld batches, ratio %lld",
              spec.strategies.size(), static_cast<long long>(sweep_batches(spec)),
              static_cast<long long>(spec.ratio));
  if (spec.file_batches.empty()) {
    std::printf(", %lld tokens per batch, document scale %s\n", static_cast<long long>(spec.tokens),
                spec.doc_scale > 0 ? std::to_string(spec.doc_scale).c_str()
                                   : "a quarter of the local shard");
  } else {
    std::printf(", %zu given batch(es)\n", spec.file_batches.size());
  }
  std::printf("greedy/hybrid block: %s; hybrid threshold: %s\n",
              params.block_size ? std::to_string(*params.block_size).c_str()
                                : "min(2048, the rows per rank)",
              params.zigzag_min_length
                  ? (std::to_string(*params.zigzag_min_length) + " tokens").c_str()
                  : "the rows per rank");
  std::printf("spill: %s\n", find_strategy("spill").describe({}, 1, params).c_str());
  std::printf(
      "imbalance = busiest rank's causal work / mean; bound = the best any plan keeping the\n"
      "strategy's units whole can reach; moved%% = rows selected away from their owner;\n"
      "need%% = the fewest rows any plan must move so no rank exceeds the mean work;\n"
      "MiB moved = inputs out + top-k ids back (%lld + %lld bytes per row).\n\n",
      static_cast<long long>(spec.params.row_bytes.input_bytes()),
      static_cast<long long>(spec.params.row_bytes.result_bytes()));
  if (params.ranks_per_node > 0) {
    std::printf(
        "Node map: %lld consecutive ranks per node (spill plans with it). x-node%% = rows\n"
        "selected on another node than their owner's; bound%% = the fewest any plan whose\n"
        "busiest rank is within spill's target must send across nodes; MiB x-node = the\n"
        "cross-node rows' inputs out + top-k ids back.\n\n",
        static_cast<long long>(params.ranks_per_node));
  }
  std::ostringstream table;
  write_table(table, rows);
  std::fputs(table.str().c_str(), stdout);
}

void run_simulate(const SimulateCommand& command) {
  if (command.list) {
    print_strategies();
    return;
  }
  SPARSECP_CHECK(!(command.json && command.csv), "--json and --csv exclude each other");
  SweepSpec spec = command.sweep.spec();
  spec.strategies = parse_strategy_list(command.strategies);
  spec.ratio = command.ratio;
  command.model.validate();
  spec.params = command.strategy.params(command.ratio, command.model);
  spec.params.ranks_per_node = command.ranks_per_node;
  spec.clock = [] { return wall_seconds() * 1e3; };

  // A bar on a terminal only, never with --json or --csv (progress.hpp).
  const ProgressBar progress(progress_wanted() && !command.json && !command.csv);
  const std::vector<SimulationResult> results =
      run_sweep(spec, [&](int64_t done, int64_t total) { progress(done, total); });
  // Some strategies may reject a batch (reported in their rows); if every one rejected
  // every batch, nothing was simulated and that is the user's error.
  const auto planned = std::find_if(results.begin(), results.end(),
                                    [](const SimulationResult& r) { return r.error.empty(); });
  SPARSECP_CHECK(results.empty() || planned != results.end(),
                 "nothing could be simulated: ", results.front().error);
  const std::vector<SummaryRow> rows =
      command.all_batches ? per_batch_rows(results) : summarize(results);
  if (!command.svg.empty()) write_svg(command.svg, spec, results);
  if (command.json) {
    write_json(std::cout, rows);
  } else if (command.csv) {
    write_csv(std::cout, rows);
  } else {
    print_text(spec, rows);
  }
}

const Registration registration("simulate", [](CLI::App& app) {
  auto command = std::make_shared<SimulateCommand>();
  CLI::App* sub = app.add_subcommand(
      "simulate",
      "Run every balancing strategy side by side on packed batches and report balance, rows and\n"
      "bytes moved, fragments, memory, padding and planning time (medians over batches).");
  std::string names;
  for (const Strategy* strategy : all_strategies()) {
    names += (names.empty() ? "" : ", ") + std::string(strategy->name());
  }
  sub->add_option("--strategies", command->strategies,
                  "'all' or a comma-separated list of: " + names + " (see --list)")
      ->capture_default_str();
  sub->add_flag("--list", command->list, "List the strategies with their sources and exit");
  command->sweep.add_to(*sub, "4,8,16,32,64", "lognormal,pareto,mixture", "1-5");
  sub->add_option("--ratio", command->ratio, "Compression ratio of the indexer (tokens per key)")
      ->capture_default_str();
  command->strategy.add_to(*sub, "", false);
  sub->add_option("--ranks-per-node", command->ranks_per_node,
                  "Node map: this many consecutive ranks per node (dividing every --cp). spill "
                  "plans with it (topology-aware), and every strategy's rows and bytes crossing "
                  "nodes are reported beside the lower bound (--json: cross_node_rows, "
                  "cross_node_bytes, cross_node_bound, ...); 0: none")
      ->capture_default_str();
  command->model.add_to(
      *sub, ModelFlags::kHeads | ModelFlags::kRopeDim | ModelFlags::kQRank | ModelFlags::kTopk);
  auto* json = sub->add_flag("--json", command->json,
                             "Print {\"results\":[{strategy, cp, workload, imbalance, lower_bound, "
                             "rows_moved, max_rows_moved_per_rank, bytes_moved, fragments_max, "
                             "rows_max, padding_rows, plan_ms, ...}]}");
  auto* csv = sub->add_flag("--csv", command->csv, "Print the same fields as CSV");
  json->excludes(csv);
  sub->add_flag("--all-batches", command->all_batches,
                "Report every batch instead of medians per (strategy, cp, workload)");
  sub->add_option("--svg", command->svg,
                  "Also write charts to this SVG file: per-rank work bars (first batch), "
                  "imbalance and bytes moved versus CP size");
  sub->footer(
      "A progress bar goes to stderr when it is a terminal.\n"
      "Examples:\n"
      "  sparsecp simulate                                  # the standard sweep, as a table\n"
      "  sparsecp simulate --cp 8 --dist bimodal --seed 1-3 --strategies zigzag,lpt-search\n"
      "  sparsecp simulate --lengths 5000,300,2699,1 --cp 4 --all-batches\n"
      "  sparsecp simulate --lengths-file a.txt --lengths-file b.txt --cp 16,32 --json > r.json\n"
      "  sparsecp simulate --svg chart.svg --csv > results.csv\n"
      "  sparsecp simulate --cp 16,32 --ranks-per-node 8 --strategies zigzag,hybrid,spill\n"
      "Moved rows are sized with --heads, --q-rank, --rope-dim and --topk (bf16 qr, fp32 "
      "weights and RoPE, int32 ids).\n" +
      lengths_file_help());
  sub->callback([command] { run_simulate(*command); });
});

}  // namespace
}  // namespace sparsecp::cli
