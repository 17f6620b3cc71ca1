// `sparsecp run`: the main job. Under `mpirun -np N`, every rank owns one contiguous
// shard of a packed batch and runs the Lightning Indexer selection once per strategy —
// 'none' (every rank selects its own rows), hyper_parallel's 'hybrid' and sparsecp's 'spill'
// balancing a cost model calibrated on this machine, or 'none' and the --mode list — moving
// qr, merge weights and RoPE to workers and the int32 key ids back over MPI. It checks
// that every strategy's top-k equals 'none' bit for bit on every rank, repeats the
// strategies interleaved until the spread of the slowest rank's selection time is known,
// and reports them side by side.
//
// Steps (each a function below): prepare (inputs, model, cost model) -> agree (every
// rank was given the same settings) -> plan (each strategy's route for this rank) ->
// measure (interleaved repeats) -> verify (bit-identical results) -> report.
#include <cblas.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "calibration.hpp"
#include "command.hpp"
#include "model_flags.hpp"
#include "progress.hpp"
#include "run_job.hpp"
#include "run_model.hpp"
#include "run_report.hpp"
#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/io/output_set.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/cost_model_refit.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/collectives.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "sparsecp/transport/mpi_session.hpp"
#include "strategy_flags.hpp"
#include "timing.hpp"

namespace sparsecp::cli {
namespace {

// A step every rank runs, voted on after a sleeping barrier (steps take uneven time here:
// ranks outnumber cores): transport/collectives.hpp's on_every_rank.
template <typename Step>
void on_every_rank(MpiCommunicator& comm, const char* what, Step&& step) {
  sparsecp::on_every_rank(comm, what, std::forward<Step>(step), [&] { sleeping_barrier(comm); });
}

// ---------------------------------------------------------------------------------------
// Prepare: the batch, the model, the strategies and the cost model spill balances.

// The cost model of this run (identical on every rank): --cost-model FILE, else (unless
// --no-calibrate) a model calibrated for the run's shape on this machine, reused from
// the cache when one exists; rank 0 measures or reads it and sends it to the others.
CostModelChoice choose_cost_model(const RunFlags& flags, const StrategyParams& params,
                                  MpiCommunicator& comm, const Progress& progress) {
  CostModelChoice choice;
  if (params.cost_model) {  // --cost-model FILE, read by StrategyFlags::params
    choice.model = params.cost_model;
    choice.source = "file " + flags.strategy.cost_model;
    return choice;
  }
  if (!flags.calibrate) {
    choice.source = "none (--no-calibrate): spill balances causal pairs";
    return choice;
  }
  CalibrationSettings settings;
  settings.model = flags.model;
  settings.grid.ratio = flags.ratio;
  settings.threads = flags.threads;
  CostModel model;
  int64_t calibration_refused = 0;
  on_every_rank(comm, "calibrating the cost model", [&] {
    if (comm.rank() != 0) return;
    const std::string dir = flags.cache ? cost_model_cache_dir() : "";
    const std::string path = dir.empty() ? "" : dir + "/" + settings.cache_key();
    if (!path.empty() && std::filesystem::exists(path)) {
      try {
        model = load_cost_model(path);
        choice.source = "reused " + path + " (" + model.note + ")";
        progress.say("spill's cost model for this shape and machine: reused from the cache");
        return;
      } catch (const Error&) {
        // An unreadable cache entry is recalibrated and overwritten.
      }
    }
    // A fit over the residual bound (a busy machine) is retried once with more
    // repeats, then refused: spill starts from causal pairs, and says so.
    std::optional<CpuCalibration> fit;
    std::string refused;
    progress.say("calibrating spill's cost model for this shape on this machine (%s) ...",
                 path.empty() ? "not cached: --no-cache" : "cached for the next run");
    for (const int repeats : {settings.grid.repeats, 3 * settings.grid.repeats}) {
      CalibrationSettings attempt = settings;
      attempt.grid.repeats = repeats;
      try {
        fit = calibrate_cpu(attempt, &progress);
        break;
      } catch (const InvalidInputError& error) {
        if (std::string_view(error.what()).find("fit refused") == std::string_view::npos) throw;
        refused = error.what();
        progress.say(
            "the fit was refused (%s)%s", refused.c_str(),
            repeats == settings.grid.repeats ? "; calibrating again with more repeats ..." : "");
      }
    }
    if (!fit) {
      calibration_refused = 1;
      choice.source = "calibration refused twice (" + refused + "): spill starts from causal pairs";
      return;
    }
    model = fit->fit.model;
    char text[96];
    std::snprintf(text, sizeof text, "calibrated now in %.1f s (rms residual %.0f%%)",
                  fit->seconds_taken, 100 * fit->fit.rms_relative_residual);
    choice.source = text;
    progress.say("%s", text);
    if (path.empty()) return;
    try {
      std::filesystem::create_directories(dir);
      OutputSet output;  // whole or absent (io/output_set.hpp)
      output.add_text(path, format_cost_model(model), "cost model cache");
      output.commit();
      choice.source += ", saved to " + path;
    } catch (const std::exception& e) {
      choice.source += std::string(", not cached: ") + e.what();
    }
  });
  const std::vector<int64_t> coefficients =
      broadcast(comm,
                {std::bit_cast<int64_t>(model.a), std::bit_cast<int64_t>(model.b),
                 std::bit_cast<int64_t>(model.c), std::bit_cast<int64_t>(model.d), model.topk,
                 calibration_refused},
                0);
  if (comm.rank() != 0) choice.source = "from rank 0";
  if (coefficients[5] != 0) return choice;  // causal pairs (the source says why)
  // Every term that prices a row, bit for bit: the ranks' plans must agree.
  model.a = std::bit_cast<double>(coefficients[0]);
  model.b = std::bit_cast<double>(coefficients[1]);
  model.c = std::bit_cast<double>(coefficients[2]);
  model.d = std::bit_cast<double>(coefficients[3]);
  model.topk = coefficients[4];
  model.unit = "ns";
  choice.model = model;
  return choice;
}

Job prepare(const RunFlags& flags, MpiCommunicator& comm) {
  Job job;
  job.cp = comm.size();
  on_every_rank(comm, "preparing the inputs", [&] {
    check_repeats(flags.repeats, "--repeats");
    check_repeats(flags.max_repeats, "--max-repeats");
    // --max-repeats alone below the default --repeats lowers the floor (rounds_floor); both
    // given and contradicting each other is an error.
    SPARSECP_CHECK(flags.max_repeats >= flags.repeats || flags.repeats_option == nullptr ||
                       flags.repeats_option->count() == 0,
                   "--max-repeats ", flags.max_repeats, " is below --repeats ", flags.repeats);
    SPARSECP_CHECK(flags.time_budget >= 0, "--time-budget must be non-negative, got ",
                   flags.time_budget);
    SPARSECP_CHECK(flags.threads >= 1 && flags.threads <= 1024,
                   "--threads must be within [1, 1024], got ", flags.threads);
    openblas_set_num_threads(flags.threads);
    job.lengths = flags.batch.load(job.cp);
    const int64_t total = checked_total(job.lengths);
    validate_plan_inputs(job.lengths, job.cp, flags.ratio, Mode::kNone, std::nullopt);
    job.strategies.push_back(&find_strategy("none"));
    for (const Strategy* chosen : flags.strategy.strategies("hybrid,spill")) {
      SPARSECP_CHECK(chosen->name() != "none",
                     "--mode none is the baseline every run already includes; choose other "
                     "strategies (or leave --mode out for none, hybrid and spill)");
      job.strategies.push_back(chosen);
    }
    job.params = flags.strategy.params(flags.ratio, flags.model);
    job.batch = flags.batch;
    job.requested_tokens = total;
    job.model = make_run_model(flags.model, flags.ratio, flags.threads, flags.model_seed,
                               job.lengths, comm.rank(), total / job.cp);
  });
  return job;
}

bool balances_cost_model(const Strategy& s) { return s.name() == "spill" || s.name() == "auto"; }

// spill and auto balance the run's cost model (the other strategies ignore it).
void add_cost_model(const RunFlags& flags, Job& job, MpiCommunicator& comm,
                    const Progress& progress) {
  const bool needs_cost = std::any_of(job.strategies.begin(), job.strategies.end(),
                                      [](const Strategy* s) { return balances_cost_model(*s); });
  if (!needs_cost) return;
  job.cost = choose_cost_model(flags, job.params, comm, progress);
  job.params.cost_model = job.cost.model;
  if (job.cost.model) job.cost.source += " (id " + cost_model_id(*job.cost.model) + ")";
}

// Every setting that shapes the collectives below must agree across ranks: ranks handed
// different inputs (an MPMD launch, a per-rank lengths file) would plan different
// routes, or run different numbers of collectives and hang (agreement.hpp). One check
// covers every strategy, so that ranks with different strategy lists cannot fall out of
// step in the check itself.
void agree(const RunFlags& flags, const Job& job, MpiCommunicator& comm) {
  PlanningFingerprint fingerprint =
      planning_fingerprint(job.lengths, job.cp, flags.ratio, *job.strategies.back(), job.params);
  fingerprint.add("strategies", static_cast<int64_t>(job.strategies.size()));
  for (const Strategy* strategy : job.strategies) {
    const PlanningFingerprint one =
        planning_fingerprint(job.lengths, job.cp, flags.ratio, *strategy, job.params);
    fingerprint.add("strategy " + std::string(strategy->name()),
                    static_cast<int64_t>(one.value() >> 1));
  }
  fingerprint.add("heads", flags.model.heads)
      .add("head_dim", flags.model.head_dim)
      .add("rope_dim", flags.model.rope_dim)
      .add("q_rank", flags.model.q_rank)
      .add("topk", flags.model.topk)
      .add("model_seed", static_cast<int64_t>(flags.model_seed))
      .add("threads", flags.threads)
      .add("repeats", flags.repeats)
      .add("max_repeats", flags.max_repeats)
      .add("adapt", flags.adapt)
      .add("adapt_window", flags.adapt_window)
      .add_real("time_budget", flags.time_budget)
      .add("scalable_batch", flags.batch.default_size() ? 1 : 0)  // size_to_budget may shrink it
      .add("calibrate", flags.calibrate ? 1 : 0)
      .add("overlap", flags.overlap ? 1 : 0)
      .add("concurrent_selections", flags.concurrent_selections);
  check_agreement(comm, fingerprint);
}

// ---------------------------------------------------------------------------------------
// Measure

// Causal (query, key) pairs of a worker's segments (cost.hpp).
int64_t segment_work(std::span<const Segment> segments, int64_t ratio) {
  int64_t work = 0;
  for (const Segment& s : segments) {
    const int64_t end = (s.key_end - s.key_begin) * ratio + s.residual;
    work += range_work(end - (s.q_end - s.q_begin), end, ratio);
  }
  return work;
}

// One balanced selection through the overlapped path, timed. CPU time of the selection
// is the calling thread's (one selection thread) or the process's (several). With
// `concurrent` > 0 the ranks take turns selecting, at most `concurrent` at a time (ranks
// [0, c), then [c, 2c), ...; the others wait asleep): with more ranks than cores, no two
// selections then share a core or its caches while they are timed, as on a cluster where
// each rank has its own device.
RankFigures run_once(const RunModel& model, StrategyRuns& runs, bool first, int64_t concurrent,
                     MpiCommunicator& comm) {
  const clockid_t cpu_clock =
      model.config.threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID;
  RankFigures figures;
  sleeping_barrier(comm);
  comm.reset_stats();
  const double step_start = wall_seconds();
  IndexerInputExchange exchange = launch_indexer_inputs(model.inputs(), runs.route, comm);
  const double launched = wall_seconds();
  // Test hook (tests of failure handling): this rank fails alone, mid-exchange.
  if (const char* fail_rank = std::getenv("SPARSECP_RUN_FAIL_RANK")) {
    SPARSECP_CHECK(std::to_string(comm.rank()) != fail_rank, "injected failure on rank ",
                   comm.rank(), " in the middle of an input exchange (SPARSECP_RUN_FAIL_RANK)");
  }
  double start = wall_seconds();
  const WorkerInputs worker = exchange.wait();
  figures.input_wait = wall_seconds() - start;

  const IndexerRoute& route = *runs.route;
  SelectedKeys selected{
      route.query_count, model.config.topk,
      std::vector<int32_t>(static_cast<size_t>(route.query_count * model.config.topk))};
  const int64_t turn = concurrent > 0 ? concurrent : comm.size();
  for (int64_t first_rank = 0; first_rank < comm.size(); first_rank += turn) {
    if (comm.rank() >= first_rank && comm.rank() < first_rank + turn) {
      const double cpu_start = clock_seconds(cpu_clock);
      start = wall_seconds();
      select_worker_rows(worker.query_residual.view(), worker.weights.view(), worker.cos.view(),
                         worker.sin.view(), *model.projection, model.keys_view(), route.segments,
                         model.config, selected.ids);
      figures.select_wall = wall_seconds() - start;
      figures.select_cpu = clock_seconds(cpu_clock) - cpu_start;
    }
    if (first_rank + turn < comm.size()) sleeping_barrier(comm);  // the next turn
  }

  sleeping_barrier(comm);  // ranks finish selecting at different times; wait asleep
  const double result_launch = wall_seconds();
  PendingRows pending = exchange.launch_result(selected);
  start = wall_seconds();
  SelectedKeys owner = pending.wait();
  const double step_end = wall_seconds();
  figures.result_wait = step_end - start;
  figures.step_wall = step_end - step_start;
  figures.exchange_wall = (launched - step_start) + figures.input_wait + (step_end - result_launch);

  figures.rows = route.query_count;
  figures.work = segment_work(route.segments, model.config.ratio);
  figures.bytes_sent = comm.stats().bytes_sent;
  figures.bytes_received = comm.stats().bytes_received;
  const ExchangeBytes predicted =
      expected_exchange_bytes(route, input_row_bytes(model.inputs()), model.config.topk);
  figures.predicted_sent = predicted.sent();
  figures.predicted_received = predicted.received();
  if (first) {
    runs.result = std::move(owner);
  } else if (!(owner == runs.result)) {
    ++runs.unstable_repeats;
  }
  return figures;
}

// The slowest rank's selection CPU time in each repeat of `runs`.
std::vector<double> slowest_per_repeat(const StrategyRuns& runs) {
  std::vector<double> slowest;
  for (const auto& ranks : runs.repeats) {
    double most = 0;
    for (const RankFigures& f : ranks) most = std::max(most, f.select_cpu);
    slowest.push_back(most);
  }
  return slowest;
}

Comparison compare(const StrategyRuns& a, const StrategyRuns& b) {
  const std::vector<double> ta = slowest_per_repeat(a);
  const std::vector<double> tb = slowest_per_repeat(b);
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(ta.size(), tb.size()); ++i) {
    if (tb[i] > 0) ratios.push_back(ta[i] / tb[i]);
  }
  Comparison c{&a, &b};
  if (ratios.empty()) return c;
  c.ratio = median_interval(ratios);
  // Fewer rounds than a verdict needs claim nothing, however far apart (kRoundsForVerdict).
  c.outside_noise = static_cast<int64_t>(ratios.size()) >= kRoundsForVerdict &&
                    (c.ratio.low > 1 || c.ratio.high < 1);
  return c;
}

// Every pair of strategies (the baseline's and each other's), in strategy order.
std::vector<Comparison> compare_all(const std::vector<StrategyRuns>& all) {
  std::vector<Comparison> pairs;
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) pairs.push_back(compare(all[i], all[j]));
  }
  return pairs;
}

// True when every pair of strategies is told apart (the same on every rank: the figures
// are gathered).
bool decided(const std::vector<StrategyRuns>& all) {
  const std::vector<Comparison> pairs = compare_all(all);
  return std::all_of(pairs.begin(), pairs.end(),
                     [](const Comparison& c) { return c.outside_noise; });
}

// ---------------------------------------------------------------------------------------
// Fit the job to the machine

int64_t milliseconds(double seconds) { return static_cast<int64_t>(seconds * 1e3); }

// The rounds the job runs whatever the budget: --repeats (default kRoundsForVerdict, the
// fewest that can tell two strategies apart), at most --max-repeats.
int64_t rounds_floor(const RunFlags& flags) { return std::min(flags.repeats, flags.max_repeats); }

// Rebuilds the batch and its inputs at `tokens` (the generator's batch, same seed and
// distribution; documents shrink with the shard). The same on every rank.
void rebuild_batch(const RunFlags& flags, Job& job, MpiCommunicator& comm, int64_t tokens) {
  on_every_rank(comm, "scaling the batch", [&] {
    job.batch.tokens = tokens;
    job.lengths = job.batch.load(job.cp);
    const int64_t total = checked_total(job.lengths);
    validate_plan_inputs(job.lengths, job.cp, flags.ratio, Mode::kNone, std::nullopt);
    job.model = make_run_model(flags.model, flags.ratio, flags.threads, flags.model_seed,
                               job.lengths, comm.rank(), total / job.cp);
  });
}

// The job fits itself to the machine and the --time-budget from its first measurement:
// `round` seconds for one round of every strategy (rank 0's wall clock, estimated from
// what was measured: `measured` says what), `elapsed` since the job started, `other`
// seconds of work still to come besides the rounds (the remaining --adapt steps). When the
// rounds the job must run (rounds_floor) and `other` fit the budget left, nothing changes.
// Otherwise the built-in batch (no --lengths, --lengths-file or --tokens) shrinks until they
// do: a round's selection work shrinks at least in proportion to the tokens (documents
// shrink with the shard too), so tokens * (budget left / time needed), less a margin,
// rounded down to 1024 tokens per rank, at least 4096 per rank. A batch the user gave keeps
// its size; the header then says when the verdict comes. The decision is rank 0's,
// broadcast, so every rank takes it. Returns true when the batch changed.
bool size_to_budget(const RunFlags& flags, Job& job, MpiCommunicator& comm, double elapsed,
                    double round, double other, const std::string& measured,
                    const Progress& progress) {
  const std::vector<int64_t> shared =
      broadcast(comm, {milliseconds(elapsed), milliseconds(round), milliseconds(other)}, 0);
  elapsed = static_cast<double>(shared[0]) * 1e-3;
  round = static_cast<double>(shared[1]) * 1e-3;
  other = static_cast<double>(shared[2]) * 1e-3;
  job.round_seconds = round;
  const int64_t rounds = rounds_floor(flags);
  const double left = flags.time_budget - elapsed;
  const double needed = static_cast<double>(rounds) * round + other;
  const long long tokens = static_cast<long long>(job.model.local * job.cp);
  const std::string strategies = std::to_string(job.strategies.size()) + " strategies";
  char text[800];
  if (needed <= left) {
    std::snprintf(text, sizeof text,
                  "sized to this machine: one round of the %s takes about %s here (%s); the %lld "
                  "rounds the job runs at least fit the %s left of the %g s --time-budget, and "
                  "more are added while a pair is within noise and the next round fits",
                  strategies.c_str(), human_seconds(round).c_str(), measured.c_str(),
                  static_cast<long long>(rounds), human_seconds(std::max(left, 0.0)).c_str(),
                  flags.time_budget);
    job.sizing = text;
    progress.say("%s", text);
    return false;
  }
  if (!job.batch.default_size()) {
    std::snprintf(text, sizeof text,
                  "not scaled: one round of the %s takes about %s here (%s), so the %lld rounds "
                  "the job runs at least take about %s, past the %g s --time-budget; the batch "
                  "is the one you gave (%s) and keeps its size (the built-in batch would shrink)",
                  strategies.c_str(), human_seconds(round).c_str(), measured.c_str(),
                  static_cast<long long>(rounds), human_seconds(needed).c_str(), flags.time_budget,
                  job.batch.describe().c_str());
    job.sizing = text;
    progress.say("%s", text);
    return false;
  }
  const int64_t quantum = 1024 * job.cp;
  const int64_t minimum = 4 * quantum;
  const double fraction = left > 0 ? 0.8 * left / needed : 0;
  const int64_t scaled = std::max(
      minimum,
      static_cast<int64_t>(static_cast<double>(tokens) * fraction / static_cast<double>(quantum)) *
          quantum);
  if (scaled >= tokens) {
    std::snprintf(text, sizeof text,
                  "not scaled: one round of the %s takes about %s here (%s), so the %lld rounds "
                  "the job runs at least take about %s, past the %g s --time-budget, but the "
                  "built-in batch is already at its smallest (%lld tokens)",
                  strategies.c_str(), human_seconds(round).c_str(), measured.c_str(),
                  static_cast<long long>(rounds), human_seconds(needed).c_str(), flags.time_budget,
                  tokens);
    job.sizing = text;
    progress.say("%s", text);
    return false;
  }
  std::snprintf(text, sizeof text,
                "scaled to this machine: the built-in batch is %lld tokens instead of %lld, "
                "because one round of the %s took %s at %lld tokens (%s) and the %lld rounds the "
                "job runs at least would not fit the %s left of the %g s --time-budget (--tokens "
                "keeps a size; a longer --time-budget keeps the built-in one)",
                static_cast<long long>(scaled), static_cast<long long>(job.requested_tokens),
                strategies.c_str(), human_seconds(round).c_str(), tokens, measured.c_str(),
                static_cast<long long>(rounds), human_seconds(std::max(left, 0.0)).c_str(),
                flags.time_budget);
  job.sizing = text;
  job.scaled = true;
  progress.say("%s", text);
  rebuild_batch(flags, job, comm, scaled);
  return true;
}

// Every strategy's route for this rank on the job's (possibly rescaled) batch.
void plan_routes(const RunFlags& flags, const Job& job, std::vector<StrategyRuns>& all,
                 MpiCommunicator& comm) {
  on_every_rank(comm, "planning", [&] {
    for (StrategyRuns& runs : all) {
      runs.parameters = runs.strategy->describe(job.lengths, job.cp, job.params);
      runs.route = std::make_shared<const IndexerRoute>(
          runs.strategy->route(job.lengths, job.cp, comm.rank(), flags.ratio, job.params));
      runs.repeats.clear();
      runs.unstable_repeats = 0;
    }
  });
}

// Runs every strategy once per round, interleaved so that a slow spell of the machine
// hits them alike: rounds_floor rounds whatever the budget (the batch was sized so that
// they fit: size_to_budget, after the first round when no --adapt step measured one), then
// more while a pair of strategies is within noise (decided), below --max-repeats, and while
// the next round fits the --time-budget (counted from `started`, the job's start, so
// calibration and --adapt steps count). Fewer than kRoundsForVerdict rounds compare
// nothing (job.too_few_repeats).
std::vector<StrategyRuns> measure(const RunFlags& flags, Job& job, MpiCommunicator& comm,
                                  double started, const Progress& progress) {
  std::vector<StrategyRuns> all;
  for (const Strategy* strategy : job.strategies) {
    StrategyRuns runs;
    runs.strategy = strategy;
    all.push_back(std::move(runs));
  }
  plan_routes(flags, job, all, comm);
  const int64_t floor = rounds_floor(flags);
  for (int64_t round = 0; round < flags.max_repeats;) {
    const double round_start = wall_seconds();
    std::vector<double> slowest;
    for (StrategyRuns& runs : all) {
      const RankFigures mine =
          run_once(job.model, runs, round == 0, flags.concurrent_selections, comm);
      const std::vector<int64_t> every = gather(comm, mine.encode());
      std::vector<RankFigures> ranks;
      double most = 0;
      for (int64_t r = 0; r < job.cp; ++r) {
        ranks.push_back(RankFigures::decode(std::span<const int64_t>(every).subspan(
            static_cast<size_t>(r) * RankFigures::kFields, RankFigures::kFields)));
        most = std::max(most, ranks.back().select_cpu);
      }
      slowest.push_back(most);
      runs.repeats.push_back(std::move(ranks));
    }
    // The stop decision must be the same on every rank: rank 0's clock decides.
    const std::vector<int64_t> clock = broadcast(
        comm, {milliseconds(wall_seconds() - started), milliseconds(wall_seconds() - round_start)},
        0);
    const double elapsed = static_cast<double>(clock[0]) * 1e-3;
    job.round_seconds = static_cast<double>(clock[1]) * 1e-3;
    if (job.sizing.empty()) {  // no --adapt step measured a round: this one does
      if (size_to_budget(flags, job, comm, elapsed, job.round_seconds, 0,
                         "measured by the first round", progress)) {
        plan_routes(flags, job, all, comm);  // the rounds start again on the scaled batch
        round = 0;
        continue;
      }
    }
    ++round;
    if (progress.on()) {
      std::string times;
      for (size_t i = 0; i < all.size(); ++i) {
        times += (i ? ", " : "") + std::string(all[i].strategy->name()) + " " +
                 human_seconds(slowest[i]);
      }
      const double left = round < floor ? static_cast<double>(floor - round) * job.round_seconds
                                        : std::max(0.0, flags.time_budget - elapsed);
      // The first rounds always; later ones at most one line a second (fast jobs).
      const auto say = round <= kRoundsForVerdict ? &Progress::say : &Progress::tick;
      (progress.*say)("round %lld%s: slowest rank's selection %s; the round took %s; %s %s left",
                      static_cast<long long>(round),
                      round <= floor ? (" of " + std::to_string(floor)).c_str() : "", times.c_str(),
                      human_seconds(job.round_seconds).c_str(), round < floor ? "about" : "at most",
                      human_seconds(left).c_str());
    }
    const bool next_fits = elapsed + job.round_seconds <= flags.time_budget;
    char text[200];
    if (round < floor) {
      continue;
    } else if (round >= kRoundsForVerdict && decided(all)) {
      std::snprintf(text, sizeof text, "every pair of strategies told apart");
    } else if (round == flags.max_repeats) {
      std::snprintf(text, sizeof text, "--max-repeats reached");
    } else if (!next_fits) {
      std::snprintf(text, sizeof text,
                    "another round of about %s would not fit the %g s --time-budget",
                    human_seconds(job.round_seconds).c_str(), flags.time_budget);
    } else {
      continue;
    }
    job.stopped = text;
    progress.say("stopped after %lld rounds: %s", static_cast<long long>(round), text);
    break;
  }
  if (static_cast<int64_t>(all.front().repeats.size()) < kRoundsForVerdict) {
    job.too_few_repeats = true;
  }
  return all;
}

// --adapt K: K steps before the measured repeats. Each step runs 'none' and every
// strategy that balances the cost model once, all-gathers each rank's sums and selection
// CPU time (cost_sample's five figures per strategy: one small all-gather), refits the
// model over the last --adapt-window steps (planning/cost_model_refit.hpp) and replans
// with it from the next step. 'none' runs in the first step only: its route never
// changes, and its samples (ranks of very different costs) stay in the window; the
// measured repeats run with the final model.
//
// The first step is the job's first measurement: from its wall time the job sizes itself
// to the machine (size_to_budget) before the next step.
//
// Test hook (tests of the refit, whose outcome must not depend on the machine's load):
// SPARSECP_RUN_ADAPT_NS="a,b,c,d[,spread]" replaces each rank's measured selection CPU time
// in the --adapt steps by a*rows + b*visible + c*capped + d*heap nanoseconds of the rank's
// own sums (segment_cost_sample's), times (1 + spread * rank). Spread 0 (the default) gives
// times the refit recovers exactly, so every step's fit is accepted; a large spread gives
// times no per-row model explains, so every fit is refused and the previous model kept.
// The selections still run (and are verified); the measured repeats are untouched.
struct InjectedAdaptTimes {
  CostModel model;
  double spread = 0;
};

std::optional<InjectedAdaptTimes> injected_adapt_times() {
  const char* text = std::getenv("SPARSECP_RUN_ADAPT_NS");
  if (text == nullptr) return std::nullopt;
  std::vector<double> values;
  const std::string all = text;
  size_t begin = 0;
  while (begin <= all.size()) {
    const size_t end = std::min(all.find(',', begin), all.size());
    const std::string field = all.substr(begin, end - begin);
    char* stop = nullptr;
    const double value = std::strtod(field.c_str(), &stop);
    SPARSECP_CHECK(
        !field.empty() && stop == field.c_str() + field.size() && std::isfinite(value) &&
            value >= 0,
        "SPARSECP_RUN_ADAPT_NS must be 4 or 5 finite non-negative numbers a,b,c,d[,spread]; "
        "got '",
        all, "'");
    values.push_back(value);
    begin = end + 1;
  }
  SPARSECP_CHECK(
      values.size() == 4 || values.size() == 5,
      "SPARSECP_RUN_ADAPT_NS must be 4 or 5 finite non-negative numbers a,b,c,d[,spread]; "
      "got '",
      all, "'");
  InjectedAdaptTimes injected;
  injected.model.a = values[0];
  injected.model.b = values[1];
  injected.model.c = values[2];
  injected.model.d = values[3];
  if (values.size() == 5) injected.spread = values[4];
  return injected;
}

void adapt(const RunFlags& flags, Job& job, MpiCommunicator& comm, double started,
           const Progress& progress) {
  std::vector<const Strategy*> stepping = {job.strategies.front()};
  for (const Strategy* s : job.strategies) {
    if (balances_cost_model(*s)) stepping.push_back(s);
  }
  if (flags.adapt == 0 || stepping.size() == 1) return;
  const std::optional<InjectedAdaptTimes> injected = injected_adapt_times();
  // sparsecp's kernel keeps a running top-k: the refit learns d even from a start without it.
  CostModelRefit refit(job.params.cost_model.value_or(CostModel{}), flags.adapt_window,
                       kDefaultRefitResidualBound, /*heap_term=*/true);
  const CostModel& start = refit.model();
  const int64_t topk = start.topk, candidates = start.candidates, quantum = start.quantum;
  for (int64_t step = 0; step < flags.adapt; ++step) {
    if (step == 1) stepping.erase(stepping.begin());  // 'none' once (see above)
    std::vector<StrategyRuns> runs(stepping.size());
    on_every_rank(comm, "planning an --adapt step", [&] {
      for (size_t i = 0; i < stepping.size(); ++i) {
        runs[i].strategy = stepping[i];
        runs[i].route = std::make_shared<const IndexerRoute>(
            stepping[i]->route(job.lengths, job.cp, comm.rank(), flags.ratio, job.params));
      }
    });
    std::vector<int64_t> mine;
    double step_seconds = 0, without_none = 0;
    for (StrategyRuns& r : runs) {
      const double run_start = wall_seconds();
      const RankFigures figures = run_once(job.model, r, true, flags.concurrent_selections, comm);
      step_seconds += wall_seconds() - run_start;
      if (r.strategy != job.strategies.front()) without_none += wall_seconds() - run_start;
      const CostSample s =
          segment_cost_sample(r.route->segments, flags.ratio, topk, 0, candidates, quantum);
      double select_ns = figures.select_cpu * 1e9;
      if (injected) {  // the test hook above
        const CostModel& m = injected->model;
        select_ns = (m.a * s.rows + m.b * s.visible + m.c * s.capped + m.d * s.heap) *
                    (1 + injected->spread * static_cast<double>(comm.rank()));
      }
      // The heap sum is a real number; whole replacements are precision enough.
      mine.insert(mine.end(), {static_cast<int64_t>(s.rows), static_cast<int64_t>(s.visible),
                               static_cast<int64_t>(s.capped), std::llround(s.heap),
                               static_cast<int64_t>(select_ns)});
    }
    constexpr size_t kFigures = 5;                          // rows, visible, capped, heap, ns
    const std::vector<int64_t> every = gather(comm, mine);  // [rank][strategy][kFigures]
    std::vector<CostSample> samples;
    AdaptStep record;
    record.planned_with = job.params.cost_model.value_or(CostModel{});
    record.strategy = std::string(stepping.back()->name());
    double most = 0, total = 0;
    for (int64_t rank = 0; rank < job.cp; ++rank) {
      for (size_t i = 0; i < stepping.size(); ++i) {
        const size_t at = (static_cast<size_t>(rank) * stepping.size() + i) * kFigures;
        const double seconds = static_cast<double>(every[at + 4]) * 1e-9;
        // A rank with no rows to select (its time is only the call) tells nothing.
        if (every[at] > 0 && seconds > 0) {
          samples.push_back({.rows = static_cast<double>(every[at]),
                             .visible = static_cast<double>(every[at + 1]),
                             .capped = static_cast<double>(every[at + 2]),
                             .seconds = seconds,
                             .heap = static_cast<double>(every[at + 3])});
        }
        if (i + 1 == stepping.size()) {
          most = std::max(most, seconds);
          total += seconds;
        }
      }
    }
    refit.add_step(samples);
    record.slowest_seconds = most;
    if (total > 0) record.time_imbalance = most * static_cast<double>(job.cp) / total;
    record.refitted = refit.model();
    record.kept_previous = refit.kept_previous();
    record.refused_residual = refit.refused_residual();
    record.rms_residual = refit.last_fit() ? refit.last_fit()->rms_relative_residual : 0;
    record.window_samples = refit.samples();
    job.adapt.push_back(record);
    job.params.cost_model = refit.model();
    progress.say("--adapt step %lld of %lld: %s's time imbalance %.3f (slowest rank %s); %s",
                 static_cast<long long>(step + 1), static_cast<long long>(flags.adapt),
                 record.strategy.c_str(), record.time_imbalance,
                 human_seconds(record.slowest_seconds).c_str(),
                 record.kept_previous ? "model kept" : "model refitted");
    if (step == 0 && job.sizing.empty()) {
      // A round runs every strategy; this step ran some of them (none and spill/auto).
      const double round = step_seconds * static_cast<double>(job.strategies.size()) /
                           static_cast<double>(stepping.size());
      const std::string measured = "estimated from the first --adapt step, which ran " +
                                   std::to_string(stepping.size()) + " of them in " +
                                   human_seconds(step_seconds);
      size_to_budget(flags, job, comm, wall_seconds() - started, round,
                     static_cast<double>(flags.adapt - 1) * without_none, measured, progress);
    }
  }
  job.cost.source += "; refitted from this job's own times over " + std::to_string(flags.adapt) +
                     " --adapt step(s)";
}

OverlapFigures measure_overlap(const RunModel& model, const StrategyRuns& runs, int64_t repeats,
                               MpiCommunicator& comm) {
  const int64_t width = model.config.heads * model.config.head_dim;
  const int64_t half = model.config.rope_dim / 2;
  constexpr int64_t kBlock = 512;
  std::vector<float> q(static_cast<size_t>(std::min(kBlock, model.local) * width));
  const auto owner_projection = [&](IndexerInputExchange* poll) {
    for (int64_t begin = 0; begin < model.local; begin += kBlock) {
      const int64_t rows = std::min(kBlock, model.local - begin);
      project_index_query(
          MatrixView::bf16(model.qr.data() + begin * model.q_rank, rows, model.q_rank),
          *model.projection, MatrixView::f32(model.cos.data() + begin * half, rows, half),
          MatrixView::f32(model.sin.data() + begin * half, rows, half), model.config,
          std::span<float>(q).first(static_cast<size_t>(rows * width)));
      if (poll != nullptr) poll->test();
    }
  };
  std::vector<double> alone, work, after, polled;
  for (int64_t repeat = 0; repeat < repeats; ++repeat) {
    sleeping_barrier(comm);
    double start = wall_seconds();
    launch_indexer_inputs(model.inputs(), runs.route, comm).wait();
    alone.push_back(wall_seconds() - start);
    for (const bool poll : {false, true}) {
      sleeping_barrier(comm);
      IndexerInputExchange exchange = launch_indexer_inputs(model.inputs(), runs.route, comm);
      start = wall_seconds();
      owner_projection(poll ? &exchange : nullptr);
      if (!poll) work.push_back(wall_seconds() - start);
      start = wall_seconds();
      exchange.wait();
      (poll ? polled : after).push_back(wall_seconds() - start);
    }
  }
  return {median(alone), median(work), median(after), median(polled)};
}

// ---------------------------------------------------------------------------------------
// Verify and summarise

Summary summarise(const StrategyRuns& runs, const StrategyRuns& baseline, MpiCommunicator& comm) {
  Summary s;
  s.runs = &runs;
  const int64_t cp = comm.size();
  for (int64_t r = 0; r < cp; ++r) {
    RankFigures f = runs.repeats.front()[static_cast<size_t>(r)];
    std::vector<double> cpu, wall, input, result;
    for (const auto& repeat : runs.repeats) {
      const RankFigures& x = repeat[static_cast<size_t>(r)];
      cpu.push_back(x.select_cpu);
      wall.push_back(x.select_wall);
      input.push_back(x.input_wait);
      result.push_back(x.result_wait);
      s.bytes_match = s.bytes_match && x.bytes_match();
    }
    f.select_cpu = median(cpu);
    f.select_wall = median(wall);
    f.input_wait = median(input);
    f.result_wait = median(result);
    s.ranks.push_back(f);
  }
  int64_t total_work = 0, most_work = 0;
  double total_time = 0, most_time = 0;
  for (const RankFigures& f : s.ranks) {
    total_work += f.work;
    most_work = std::max(most_work, f.work);
    total_time += f.select_cpu;
    most_time = std::max(most_time, f.select_cpu);
    s.busiest_sent = std::max(s.busiest_sent, f.bytes_sent);
    s.busiest_received = std::max(s.busiest_received, f.bytes_received);
    s.total_sent += f.bytes_sent;
  }
  const auto n = static_cast<double>(cp);
  if (total_work > 0)
    s.work_imbalance = static_cast<double>(most_work) * n / static_cast<double>(total_work);
  if (total_time > 0) s.time_imbalance = most_time * n / total_time;
  s.slowest = Spread::of(slowest_per_repeat(runs));
  std::vector<double> step, exchange;
  for (const auto& repeat : runs.repeats) {
    double most_step = 0, most_exchange = 0;
    for (const RankFigures& x : repeat) {
      most_step = std::max(most_step, x.step_wall);
      most_exchange = std::max(most_exchange, x.exchange_wall);
    }
    step.push_back(most_step);
    exchange.push_back(most_exchange);
  }
  s.step_wall = Spread::of(step);
  s.exchange_wall = Spread::of(exchange);
  if (&runs != &baseline) {
    const Comparison c = compare(baseline, runs);
    s.speedup = c.ratio.median;
    s.speedup_low = c.ratio.low;
    s.speedup_high = c.ratio.high;
    s.significant = c.outside_noise;
  }

  // Bit-identical top-k on every rank: compare row by row, count mismatches.
  const SelectedKeys& mine = runs.result;
  const SelectedKeys& reference = baseline.result;
  int64_t mismatched = 0;
  if (mine.rows != reference.rows || mine.topk != reference.topk) {
    mismatched = reference.rows;
  } else {
    for (int64_t row = 0; row < mine.rows; ++row) {
      const auto a = mine.row(row);
      const auto b = reference.row(row);
      mismatched += std::equal(a.begin(), a.end(), b.begin(), b.end()) ? 0 : 1;
    }
  }
  std::vector<int64_t> totals = {mismatched, runs.unstable_repeats};
  comm.all_reduce(totals, ReduceOp::kSum);
  s.mismatched_rows = totals[0];
  s.unstable_repeats = totals[1];
  return s;
}

void attach_overlap(Summary& s, const OverlapFigures& mine, MpiCommunicator& comm) {
  const auto ns = [](double x) { return static_cast<int64_t>(x * 1e9); };
  const std::vector<int64_t> every =
      gather(comm, {ns(mine.alone), ns(mine.work), ns(mine.wait_after), ns(mine.wait_polled)});
  int64_t rank = 0;
  for (int64_t r = 1; r < comm.size(); ++r) {
    if (every[static_cast<size_t>(r * 4)] > every[static_cast<size_t>(rank * 4)]) rank = r;
  }
  const auto at = [&](int i) {
    return static_cast<double>(every[static_cast<size_t>(rank * 4 + i)]) * 1e-9;
  };
  s.overlap = OverlapFigures{at(0), at(1), at(2), at(3)};
  s.overlap_rank = rank;
}

// ---------------------------------------------------------------------------------------

void run_ranks(const RunFlags& flags) {
  const double started = wall_seconds();  // the --time-budget counts the whole job
  MpiCommunicator comm(MPI_COMM_WORLD);
  // Progress on rank 0's terminal only (progress.hpp); the report is rank 0's too.
  const Progress progress =
      comm.rank() == 0 ? Progress("sparsecp run", flags.json) : Progress::off();
  progress.say("%lld ranks; preparing the batch and the model",
               static_cast<long long>(comm.size()));
  // The machine's load before the job adds its own (the report warns when it is high).
  double load = 0;
  const int64_t cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (getloadavg(&load, 1) != 1) load = 0;
  Job job = prepare(flags, comm);
  job.load_average = load;
  job.cores = cores;
  if (flags.check_agreement) agree(flags, job, comm);
  add_cost_model(flags, job, comm, progress);
  adapt(flags, job, comm, started, progress);
  std::vector<StrategyRuns> runs = measure(flags, job, comm, started, progress);
  std::vector<Comparison> pairs = compare_all(runs);
  if (job.too_few_repeats) {
    for (Comparison& c : pairs) c.outside_noise = false;
  }
  std::vector<Summary> summaries;
  for (const StrategyRuns& r : runs) summaries.push_back(summarise(r, runs.front(), comm));
  if (job.too_few_repeats) {
    for (Summary& s : summaries) s.significant = false;
  }
  if (flags.overlap) {
    progress.say("measuring the overlap of the input exchange (--overlap)");
    for (size_t s = 1; s < runs.size(); ++s) {
      attach_overlap(summaries[s], measure_overlap(job.model, runs[s], flags.repeats, comm), comm);
    }
  }
  sleeping_barrier(comm);
  if (comm.rank() == 0) {
    if (flags.json) {
      print_json(flags, job, summaries, pairs);
    } else {
      print_text(flags, job, summaries, pairs);
    }
    std::fflush(stdout);
    if (!flags.svg.empty()) write_svg(flags, job, summaries);
  }
  if (!verified(summaries)) throw ExitStatus{1};
}

void run_job(const RunFlags& flags) {
  const MpiSession session;
  try {
    run_ranks(flags);
  } catch (const ExitStatus&) {
    throw;
  } catch (const std::exception& error) {
    session.leave_on_error(error.what());
    throw;
  }
}

const Registration registration("run", [](CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  flags->batch.tokens = 1 << 16;
  CLI::App* sub = app.add_subcommand(
      "run",
      "The main job, under mpirun: every rank owns one contiguous shard of a packed batch and\n"
      "runs the Lightning Indexer top-k selection once per strategy: 'none' (every rank selects\n"
      "its own rows), hyper_parallel's 'hybrid' and sparsecp's 'spill' balancing a cost model\n"
      "calibrated for this shape on this machine (cached), or 'none' and the --mode list. Inputs\n"
      "(qr, merge weights, RoPE) move to workers and the int32 key ids back over MPI. Checks\n"
      "every strategy's top-k equals none's bit for bit on every rank, repeats the strategies\n"
      "interleaved until the spread of the slowest rank's time is known, and reports per rank\n"
      "(rows, causal work, selection CPU time, bytes checked against the route) and side by\n"
      "side (slowest rank's time min/median/max and speedup with its range, work and time\n"
      "imbalance, bytes). Exit status 1 when results differ. Model tensors are seeded small\n"
      "integers (exact scores); the Index K bank is the same on every rank.");
  flags->batch.add_to(*sub);
  add_cp_and_ratio(*sub, nullptr, flags->ratio);
  flags->strategy.add_to(*sub,
                         "Strategies to compare with none, comma-separated and run interleaved: "
                         "any of 'sparsecp simulate --list' (zigzag, greedy, hybrid, spill, auto, "
                         "snake, ...), e.g. zigzag,hybrid,spill; the strategy options below apply "
                         "to every listed strategy that takes them, and a seed mode refuses one "
                         "it does not (--block-size with zigzag) [default: hybrid,spill]");
  flags->model.add_to(*sub);
  sub->add_option("--model-seed", flags->model_seed, "Seed of the model tensors")
      ->check(unsigned_64_bit())
      ->capture_default_str();
  sub->add_option("--threads", flags->threads,
                  "Selection threads per rank (OpenMP and OpenBLAS); CPU time is the thread's "
                  "when 1, the process's otherwise")
      ->capture_default_str();
  flags->repeats_option =
      sub->add_option(
             "--repeats", flags->repeats,
             "Interleaved rounds of every strategy at least, whatever the --time-budget "
             "(results must repeat exactly); fewer than 6 compare nothing: 6 is the fewest "
             "whose min..max of per-round ratios is a 95% interval of their median")
          ->capture_default_str();
  sub->add_option("--max-repeats", flags->max_repeats,
                  "Rounds at most: more are added while any two strategies are within noise of "
                  "each other (the 95% interval of their per-round time ratio holds 1) and the "
                  "next round fits the --time-budget")
      ->capture_default_str();
  sub->add_option("--time-budget", flags->time_budget,
                  "Seconds the whole job aims to take, calibration and --adapt steps included. "
                  "From its first measured round the job sizes itself: no round is added past "
                  "the budget, and when the --repeats rounds would not fit, the built-in batch "
                  "(no --lengths, --lengths-file or --tokens) shrinks until they do; the header "
                  "says what was scaled and why. A batch you gave keeps its size")
      ->capture_default_str();
  sub->add_option("--adapt", flags->adapt,
                  "Steps before the measured repeats that refit spill's/auto's cost model from "
                  "this job's own per-rank selection times (each step runs spill/auto once, the "
                  "first also none, refits over a sliding window and replans from the next "
                  "step); 0 keeps the calibrated model")
      ->check(CLI::Range(int64_t{0}, int64_t{100}))
      ->capture_default_str();
  sub->add_option("--concurrent-selections", flags->concurrent_selections,
                  "Ranks that select at the same time, taking turns (0: all at once). With "
                  "more ranks than cores, the number of cores times each rank's selection "
                  "without another rank sharing its core; step and exchange times then "
                  "include the turns")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  sub->add_option("--adapt-window", flags->adapt_window,
                  "Steps whose times the --adapt refit keeps (a sliding window)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}))
      ->capture_default_str();
  sub->add_flag("!--no-calibrate", flags->calibrate,
                "spill/auto without a --cost-model balance causal pairs instead of a model "
                "calibrated at start-up (or read from the cache: $SPARSECP_CACHE_DIR, "
                "$XDG_CACHE_HOME/sparsecp or ~/.cache/sparsecp)");
  sub->add_flag("!--no-cache", flags->cache,
                "Calibrate at start-up even when the cache holds a model for this shape, and "
                "save nothing (the cache folder: $SPARSECP_CACHE_DIR, else "
                "$XDG_CACHE_HOME/sparsecp, else ~/.cache/sparsecp; SPARSECP_CACHE_DIR=off "
                "does the same for every run)");
  sub->add_option("--svg", flags->svg,
                  "Also write an SVG chart: every strategy's per-rank selection CPU time "
                  "(median over the rounds) and causal work, as bars in units of the mean");
  sub->add_flag("--overlap", flags->overlap,
                "Also measure how much of the input exchange the owner's own Q projection hides");
  sub->add_flag("!--no-agreement-check", flags->check_agreement,
                "Skip the check (on by default) that every rank was given the same document "
                "lengths, strategies, parameters, model sizes and repeat settings; without it, "
                "ranks given different inputs can hang or mix up rows");
  sub->add_flag(
      "--json", flags->json,
      "Print JSON (rank 0): {verified, cp, tokens, model, cost_model (when spill or "
      "auto runs: a_ns, b_ns, c_ns, d_ns, id, source), adapt (with --adapt steps: [{step, "
      "strategy, planned_with, time_imbalance, slowest_select_cpu_s, refitted, "
      "kept_previous, refused_rms_relative_residual, rms_relative_residual, "
      "window_samples}]), sizing: {text, scaled, requested_tokens, round_s, time_budget_s}, "
      "too_few_repeats, "
      "repeats, "
      "strategies: [{mode, parameters, ranks: [{rank, rows, work, select_cpu_s, "
      "bytes_sent, bytes_received, predicted_bytes_sent, ...}], work_imbalance, "
      "time_imbalance, slowest_select_cpu_s: {min, median, max}, "
      "step_wall_s: {min, median, max}, exchange_s: {min, median, max}, "
      "speedup_slowest_rank: {median, low, high, outside_noise}, bytes..., "
      "bytes_match_route, mismatched_rows}], comparisons: [{a, b, a_over_b: {median, "
      "low, high}, outside_noise}], load_average, cores, concurrent_selections, repeats_stopped}");
  sub->footer(
      "Examples (as root, mpirun needs --allow-run-as-root; with more ranks than cores, "
      "--oversubscribe):\n"
      "  mpirun --allow-run-as-root --oversubscribe -np 4 sparsecp run\n"
      "  mpirun --allow-run-as-root --oversubscribe -np 4 sparsecp run --mode greedy --dist "
      "pareto --tokens 131072 --seed 3\n"
      "  sparsecp batch --tokens 65536 --cp 8 > batch.txt\n"
      "  mpirun --allow-run-as-root --oversubscribe -np 8 sparsecp run --lengths-file batch.txt "
      "--mode spill --cost-model cost_model.txt --json\n" +
      lengths_file_help());
  sub->callback([flags] { run_job(*flags); });
});

}  // namespace
}  // namespace sparsecp::cli
