// sparsecp CLI (`run`): the main job's shared types: its flags, what it prepared (Job),
// what each rank measured per repeat (RankFigures, StrategyRuns) and the summaries the
// report prints (Summary, Comparison, OverlapFigures). cmd_run.cpp measures them;
// run_report.cpp prints them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "model_flags.hpp"
#include "run_model.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "strategy_flags.hpp"
#include "timing.hpp"

namespace sparsecp::cli {

// The fewest rounds whose per-round ratios can tell two strategies apart: the interval
// median_interval gives over 6 values (their min..max) holds the median with probability
// 1 - 2/64 = 97%; over 5, only 94%, over 3, 75%. A comparison of fewer rounds claims
// nothing ("too few repeats to compare").
inline constexpr int64_t kRoundsForVerdict = 6;

struct RunFlags {
  BatchOptions batch;
  int64_t ratio = 4;
  StrategyFlags strategy;
  ModelFlags model{.heads = 16, .head_dim = 128, .rope_dim = 64, .q_rank = 256, .topk = 512};
  uint64_t model_seed = 7;
  int threads = 1;
  int64_t repeats = kRoundsForVerdict;
  int64_t max_repeats = 60;
  double time_budget = 120;  // the whole job, calibration included (size_to_budget)
  int64_t adapt = 1;         // steps refitting the cost model from the job's own times
  int64_t adapt_window = 4;  // steps the refit keeps
  bool calibrate = true;
  bool cache = true;  // reuse and save calibrated models (cost_model_cache_dir)
  bool overlap = false;
  int64_t concurrent_selections = 0;  // ranks selecting at a time (0: all; run_once)
  bool json = false;
  bool check_agreement = true;
  std::string svg;  // --svg FILE: per-rank selection time and work of every strategy
  const CLI::Option* repeats_option = nullptr;  // whether --repeats was given
};

struct CostModelChoice {
  std::optional<CostModel> model;  // unset: causal pairs
  std::string source;              // "file X", "calibrated now in 3.2 s", "cache X", ...
};

// One step of --adapt: what the strategy balancing the cost model measured when it
// planned with `planned_with`, and the model refitted from the step's times.
struct AdaptStep {
  CostModel planned_with;
  std::string strategy;         // the strategy whose balance the step reports (spill, auto)
  double time_imbalance = 1;    // its slowest rank's selection CPU time / the mean
  double slowest_seconds = 0;   // its slowest rank's selection CPU time
  CostModel refitted;           // the model of the next step
  bool kept_previous = false;   // the step changed nothing: no fit yet, or the fit was refused
  double refused_residual = 0;  // > 0: the fit's rms residual, over the bound, was refused
  double rms_residual = 0;      // of the refit over the window
  int64_t window_samples = 0;
};

struct Job {
  double load_average = 0;       // the machine's 1-minute load average at start (rank 0)
  int64_t cores = 0;             // online CPUs (rank 0)
  std::string stopped;           // why the repeats stopped (measure)
  bool too_few_repeats = false;  // fewer than kRoundsForVerdict rounds: nothing is compared
  BatchOptions batch;            // the batch's options, --tokens as run (size_to_budget)
  // How the job fitted itself to the machine and the --time-budget (size_to_budget): the
  // first measured round's time, and what was scaled and why. Empty before it decides.
  std::string sizing;
  bool scaled = false;           // the built-in batch was shrunk
  int64_t requested_tokens = 0;  // the batch's tokens before any scaling
  double round_seconds = 0;      // one round of every strategy, wall (latest measured)
  std::vector<int64_t> lengths;
  int64_t cp = 0;
  RunModel model;
  std::vector<const Strategy*> strategies;  // strategies[0] is 'none', the baseline
  StrategyParams params;
  CostModelChoice cost;
  std::vector<AdaptStep> adapt;  // --adapt's steps, in order (empty without them)
};

// What one rank measured in one run of one strategy.
struct RankFigures {
  int64_t rows = 0;
  int64_t work = 0;
  double select_cpu = 0;
  double select_wall = 0;
  double input_wait = 0;
  double result_wait = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t predicted_sent = 0;
  int64_t predicted_received = 0;
  // The step on this rank, wall: from launching the input exchange to holding its own
  // rows' top-k (exchanges, selection and waiting for the other ranks), and the two
  // exchanges alone (each launch plus its wait).
  double step_wall = 0;
  double exchange_wall = 0;

  static constexpr size_t kFields = 12;
  std::vector<int64_t> encode() const {
    const auto ns = [](double s) { return static_cast<int64_t>(s * 1e9); };
    return {rows,           work,
            ns(select_cpu), ns(select_wall),
            ns(input_wait), ns(result_wait),
            bytes_sent,     bytes_received,
            predicted_sent, predicted_received,
            ns(step_wall),  ns(exchange_wall)};
  }
  static RankFigures decode(std::span<const int64_t> v) {
    const auto s = [](int64_t ns) { return static_cast<double>(ns) * 1e-9; };
    return {v[0], v[1], s(v[2]), s(v[3]), s(v[4]),  s(v[5]),
            v[6], v[7], v[8],    v[9],    s(v[10]), s(v[11])};
  }
  bool bytes_match() const {
    return bytes_sent == predicted_sent && bytes_received == predicted_received;
  }
};

// One strategy's runs: this rank's result and every rank's figures per repeat.
struct StrategyRuns {
  const Strategy* strategy = nullptr;
  std::string parameters;
  std::shared_ptr<const IndexerRoute> route;      // this rank's
  SelectedKeys result;                            // this rank's own rows, from the first run
  int64_t unstable_repeats = 0;                   // runs whose result differed from the first
  std::vector<std::vector<RankFigures>> repeats;  // [repeat][rank]
};

// How much faster `b` is than `a`: per round (the strategies of one round run back to
// back, so a slow spell of the machine hits both), a's slowest-rank time over b's; the
// median of those ratios and its 95% interval (median_interval). Outside noise when the
// interval excludes 1: then more repeats would not change which is faster.
struct Comparison {
  const StrategyRuns* a = nullptr;
  const StrategyRuns* b = nullptr;
  MedianInterval ratio{1, 1, 1};
  bool outside_noise = false;
};

// How much of the input exchange the owner's own work hides (--overlap): the exchange
// alone (launch then wait at once) against launch, the owner's Index-Q projection of its
// own rows (the seed overlaps exactly this), then wait; with `poll`, the owner calls
// test() between row blocks so that MPI can progress the transfer. Medians per rank.
struct OverlapFigures {
  double alone = 0;        // launch + wait, nothing in between
  double work = 0;         // the owner's projection (wall)
  double wait_after = 0;   // wait() after the projection, no polling
  double wait_polled = 0;  // wait() after the projection, test() between blocks
};

// One strategy's summary, the same on every rank.
struct Summary {
  const StrategyRuns* runs = nullptr;
  std::vector<RankFigures> ranks;  // per rank: medians of the times over the repeats
  Spread slowest;                  // the slowest rank's selection CPU time per repeat
  Spread step_wall;                // the slowest rank's step wall time per repeat
  Spread exchange_wall;            // the slowest rank's exchange time per repeat
  double work_imbalance = 1;
  double time_imbalance = 1;  // of the per-rank median selection CPU times
  int64_t busiest_sent = 0;
  int64_t busiest_received = 0;
  int64_t total_sent = 0;
  bool bytes_match = true;
  int64_t mismatched_rows = 0;  // rows whose top-k differs from 'none', all ranks
  int64_t unstable_repeats = 0;
  // Speedup of the slowest rank over 'none': the median per-round ratio and its 95%
  // interval (compare); significant when the interval excludes 1.
  double speedup = 1, speedup_low = 1, speedup_high = 1;
  bool significant = false;
  std::optional<OverlapFigures> overlap;  // the rank with the slowest exchange alone
  int64_t overlap_rank = 0;
};

}  // namespace sparsecp::cli
