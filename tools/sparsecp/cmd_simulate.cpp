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
#include "sparsecp/error.hpp"
#include "sparsecp/io/report_svg.hpp"
#include "sparsecp/planning/simulate.hpp"
#include "sparsecp/planning/strategy.hpp"

namespace sparsecp::cli {
namespace {

struct SimulateCommand {
  std::string strategies = "all";
  std::string cps = "4,8,16,32,64";
  std::string distributions = "lognormal,pareto,mixture";
  std::string seeds = "1-5";
  int64_t tokens = 1 << 20;
  int64_t scale = 0;
  int64_t ratio = 4;
  std::string lengths;
  std::string lengths_file;
  std::optional<int64_t> block;
  std::optional<int64_t> zigzag_min_length;
  int64_t snake_block = 128;
  int64_t lpt_align = 128;
  double lpt_row_cap = 1.0;
  int64_t lpt_steps = 64;
  int64_t lpt_fragment_cap = 0;
  std::string lpt_cost = "magi";
  int64_t window = 128;
  int64_t topk = 512;
  int64_t qr_rank = 1536;
  int64_t index_heads = 64;
  int64_t rope_dim = 64;
  bool json = false;
  bool csv = false;
  bool all_batches = false;
  bool list = false;
  std::string svg;
};

int64_t parse_integer(std::string_view token, std::string_view option) {
  int64_t value = 0;
  const auto [stop, status] = std::from_chars(token.data(), token.data() + token.size(), value);
  SPARSECP_CHECK(status == std::errc() && stop == token.data() + token.size(), option, ": '", token,
                 "' is not an integer");
  return value;
}

// "4,8,16", and with ranges allowed also "1-5" or "1-3,7".
std::vector<int64_t> parse_integer_list(std::string_view text, std::string_view option,
                                        bool ranges) {
  std::vector<int64_t> values;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, comma - begin);
    SPARSECP_CHECK(!item.empty(), option, ": empty entry in '", text, "'");
    const size_t dash = ranges ? item.find('-', 1) : std::string_view::npos;
    if (dash == std::string_view::npos) {
      values.push_back(parse_integer(item, option));
    } else {
      const int64_t first = parse_integer(item.substr(0, dash), option);
      const int64_t last = parse_integer(item.substr(dash + 1), option);
      SPARSECP_CHECK(first <= last && last - first < 100000, option, ": bad range '", item, "'");
      for (int64_t value = first; value <= last; ++value) values.push_back(value);
    }
    begin = comma + 1;
  }
  return values;
}

std::vector<std::string> parse_name_list(std::string_view text, std::string_view option) {
  std::vector<std::string> names;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    SPARSECP_CHECK(comma > begin, option, ": empty entry in '", text, "'");
    names.emplace_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return names;
}

// One batch per non-empty line; '#' starts a comment line.
std::vector<std::vector<int64_t>> read_batches_file(const std::string& path) {
  std::ifstream file(path);
  SPARSECP_CHECK(file.good(), "cannot open lengths file '", path, "'");
  std::vector<std::vector<int64_t>> batches;
  std::string line;
  for (int64_t number = 1; std::getline(file, line); ++number) {
    const size_t first = line.find_first_not_of(" \t\r,");
    if (first == std::string::npos || line[first] == '#') continue;
    batches.push_back(parse_lengths(line, path + " line " + std::to_string(number)));
  }
  SPARSECP_CHECK(!batches.empty(), "lengths file '", path, "' holds no batch");
  return batches;
}

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

void run_simulate(const SimulateCommand& command) {
  if (command.list) {
    print_strategies();
    return;
  }
  SPARSECP_CHECK(!(command.json && command.csv), "--json and --csv exclude each other");
  SweepSpec spec;
  spec.strategies = parse_strategy_list(command.strategies);
  spec.cps = parse_integer_list(command.cps, "--cp", false);
  spec.ratio = command.ratio;
  spec.tokens = command.tokens;
  spec.doc_scale = command.scale;
  if (!command.lengths.empty()) {
    spec.file_batches.push_back(parse_lengths(command.lengths, "--lengths"));
  } else if (!command.lengths_file.empty()) {
    spec.file_batches = read_batches_file(command.lengths_file);
  } else {
    spec.distributions = parse_name_list(command.distributions, "--dist");
    spec.seeds.clear();
    for (const int64_t seed : parse_integer_list(command.seeds, "--seeds", true)) {
      SPARSECP_CHECK(seed >= 0, "--seeds: seed must be non-negative, got ", seed);
      spec.seeds.push_back(static_cast<uint64_t>(seed));
    }
  }
  SPARSECP_CHECK(command.rope_dim >= 0 && command.rope_dim % 2 == 0,
                 "--rope-dim must be even and non-negative, got ", command.rope_dim);
  SPARSECP_CHECK(command.qr_rank >= 0 && command.index_heads >= 0 && command.topk >= 1,
                 "--qr-rank and --index-heads must be non-negative and --topk positive");
  SPARSECP_CHECK(command.snake_block >= 1, "--snake-block must be positive, got ",
                 command.snake_block);
  SPARSECP_CHECK(command.lpt_align >= 1, "--lpt-align must be positive, got ", command.lpt_align);
  SPARSECP_CHECK(command.lpt_steps >= 0, "--lpt-steps must be non-negative, got ",
                 command.lpt_steps);
  SPARSECP_CHECK(!spec.file_batches.empty() || !spec.seeds.empty(), "--seeds names no seed");
  StrategyParams& params = spec.params;
  params.block_size = command.block;
  params.zigzag_min_length = command.zigzag_min_length;
  params.snake_block = command.snake_block;
  params.lpt_align = command.lpt_align;
  params.lpt_row_cap = command.lpt_row_cap;
  params.lpt_search_steps = command.lpt_steps;
  params.lpt_fragment_cap = command.lpt_fragment_cap;
  params.lpt_cost = parse_row_cost(command.lpt_cost);
  params.window = command.window;
  params.topk = command.topk;
  spec.params.row_bytes.qr_rank = command.qr_rank;
  spec.params.row_bytes.index_heads = command.index_heads;
  spec.params.row_bytes.rope_pairs = command.rope_dim / 2;
  spec.params.row_bytes.topk = command.topk;

  const ProgressBar progress(isatty(STDERR_FILENO) == 1);
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

  if (!command.svg.empty()) {
    // Bars for the first batch planned (smallest CP listed first in the sweep order).
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
                  : "batches from " + (command.lengths.empty() ? command.lengths_file
                                                               : std::string("--lengths")));
    std::ofstream file(command.svg, std::ios::binary);
    SPARSECP_CHECK(file.good(), "cannot write SVG file '", command.svg, "'");
    file << render_simulation_svg(first, medians, title.str());
    SPARSECP_CHECK(file.good(), "failed writing SVG file '", command.svg, "'");
    std::fprintf(stderr, "wrote %s\n", command.svg.c_str());
  }

  if (command.json) {
    write_json(std::cout, rows);
    return;
  }
  if (command.csv) {
    write_csv(std::cout, rows);
    return;
  }
  std::printf("sparsecp simulate: %zu strategies x %lld batches, ratio %lld",
              spec.strategies.size(), static_cast<long long>(sweep_batches(spec)),
              static_cast<long long>(spec.ratio));
  if (spec.file_batches.empty()) {
    std::printf(", %lld tokens per batch, document scale %s\n", static_cast<long long>(spec.tokens),
                spec.doc_scale > 0 ? std::to_string(spec.doc_scale).c_str()
                                   : "a quarter of the local shard");
  } else {
    std::printf(", %zu batch(es) from %s\n", spec.file_batches.size(),
                command.lengths.empty() ? command.lengths_file.c_str() : "--lengths");
  }
  if (params.zigzag_min_length) {
    std::printf("hybrid threshold: %lld tokens\n",
                static_cast<long long>(*params.zigzag_min_length));
  } else {
    std::printf("hybrid threshold: the local row count (set --zigzag-min-length)\n");
  }
  std::printf(
      "imbalance = busiest rank's causal work / mean; bound = the best any plan keeping the\n"
      "strategy's units whole can reach; moved%% = rows selected away from their owner;\n"
      "need%% = the fewest rows any plan must move so no rank exceeds the mean work;\n"
      "MiB moved = inputs out + top-k ids back (%lld + %lld bytes per row).\n\n",
      static_cast<long long>(spec.params.row_bytes.input_bytes()),
      static_cast<long long>(spec.params.row_bytes.result_bytes()));
  std::ostringstream table;
  write_table(table, rows);
  std::fputs(table.str().c_str(), stdout);
}

const Registration registration("simulate", [](CLI::App& app) {
  auto command = std::make_shared<SimulateCommand>();
  CLI::App* sub = app.add_subcommand(
      "simulate",
      "Run every balancing strategy side by side on packed batches and report balance, rows and\n"
      "bytes moved, fragments, memory, padding and planning time (medians over batches).");
  sub->add_option("--strategies", command->strategies,
                  "'all' or a comma-separated list of: none, zigzag, greedy, hybrid, "
                  "per-doc-zigzag, round-robin, snake, lpt-search (see --list)")
      ->capture_default_str();
  sub->add_flag("--list", command->list, "List the strategies with their sources and exit");
  sub->add_option("--cp", command->cps, "CP sizes, comma-separated")->capture_default_str();
  sub->add_option("--dist", command->distributions,
                  "Generated workloads, comma-separated: fixed, uniform, lognormal, pareto, "
                  "bimodal, mixture")
      ->capture_default_str();
  sub->add_option("--seeds", command->seeds,
                  "Generator seeds per workload: a list '1,2,3' and/or ranges '1-5'")
      ->capture_default_str();
  sub->add_option("--tokens", command->tokens,
                  "Tokens per generated batch (must be divisible by every CP size)")
      ->capture_default_str();
  sub->add_option("--scale", command->scale,
                  "Typical document length in tokens (lognormal median, Pareto minimum x4, ...); "
                  "0 = a quarter of the local shard at each CP size")
      ->capture_default_str();
  auto* lengths = sub->add_option("--lengths", command->lengths,
                                  "One batch given inline: document lengths in packed order, "
                                  "e.g. 5000,300,2699,1 (replaces the generators)");
  auto* file = sub->add_option("--lengths-file", command->lengths_file,
                               "File with one batch per line (lengths separated by commas or "
                               "spaces; '#' lines skipped); replaces the generators");
  lengths->excludes(file);
  sub->add_option("--ratio", command->ratio, "Compression ratio of the indexer (tokens per key)")
      ->capture_default_str();
  sub->add_option("--block", command->block,
                  "greedy/hybrid: rows per pooled block (clamped to the local rows)")
      ->capture_default_str();
  sub->add_option("--zigzag-min-length", command->zigzag_min_length,
                  "hybrid: documents of at least this many tokens keep zigzag chunks "
                  "[default: the local row count tokens/cp]");
  sub->add_option("--snake-block", command->snake_block, "snake: rows per packed block")
      ->capture_default_str();
  sub->add_option("--lpt-align", command->lpt_align, "lpt-search: rows per aligned fragment")
      ->capture_default_str();
  sub->add_option("--lpt-row-cap", command->lpt_row_cap,
                  "lpt-search: per-rank row cap as a multiple (>= 1) of the local rows")
      ->capture_default_str();
  sub->add_option("--lpt-steps", command->lpt_steps,
                  "lpt-search: most improving local-search steps after LPT")
      ->capture_default_str();
  sub->add_option("--lpt-fragment-cap", command->lpt_fragment_cap,
                  "lpt-search: fall back to contiguous when a rank has more fragments than this "
                  "(MagiAttention uses 64); 0 = no cap")
      ->capture_default_str();
  sub->add_option("--lpt-cost", command->lpt_cost,
                  "lpt-search internal row cost: magi (min(p+1,window)+min(topk,vis)+vis+0.25) "
                  "or causal (vis); reports always use causal work")
      ->capture_default_str();
  sub->add_option("--window", command->window, "Sliding window in tokens (magi row cost)")
      ->capture_default_str();
  sub->add_option("--topk", command->topk,
                  "Top-k keys per row (magi row cost; int32 ids returned per moved row)")
      ->capture_default_str();
  sub->add_option("--qr-rank", command->qr_rank, "Row-size model: bf16 query residual width")
      ->capture_default_str();
  sub->add_option("--index-heads", command->index_heads,
                  "Row-size model: fp32 merge weights per row (index heads)")
      ->capture_default_str();
  sub->add_option("--rope-dim", command->rope_dim,
                  "Row-size model: RoPE dims (fp32 cos and sin of rope-dim/2 each)")
      ->capture_default_str();
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
      "  sparsecp simulate --cp 8 --dist bimodal --seeds 1-3 --strategies zigzag,lpt-search\n"
      "  sparsecp simulate --lengths 5000,300,2699,1 --cp 4 --all-batches\n"
      "  sparsecp simulate --lengths-file batches.txt --cp 16,32 --json > results.json\n"
      "  sparsecp simulate --svg chart.svg --csv > results.csv");
  sub->callback([command] { run_simulate(*command); });
});

}  // namespace
}  // namespace sparsecp::cli
