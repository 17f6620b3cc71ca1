// sparsecp: simulate balancing strategies side by side on packed batches.
//
// `simulate_plan` runs one strategy on one batch and measures what a user choosing a
// strategy cares about; `run_sweep` does that for every strategy, CP size and batch of
// a sweep; `summarize` reduces the batches of each (strategy, cp, workload) to medians;
// the writers print the summaries as a table, JSON or CSV (report_svg.hpp draws them).
//
// Definitions (all per batch; "owner" of a row is the rank whose contiguous shard of
// sum(lengths) / cp rows holds it):
//   work[r]         causal (query, key) pairs rank r selects (cost.hpp), real rows only.
//   imbalance       max(work) / mean(work); 1.0 when there is no work.
//   lower_bound     max(mean, largest_unit_work) / mean: no plan that keeps the
//                   strategy's indivisible units whole can do better. The unit is the
//                   strategy's own (Strategy::unit()): a single row for row-granular
//                   strategies (zigzag, per-doc-zigzag, round-robin), a block (greedy,
//                   hybrid, snake), a fragment (lpt-search), the whole shard (none, so
//                   its bound is its own imbalance).
//   row_lower_bound max(mean, costliest single row) / mean: the physical limit for any
//                   row-granular plan.
//   rows_moved      rows selected on a rank other than their owner;
//                   max_rows_moved_per_rank is the most any one owner sends away.
//   bytes_moved     rows_moved * (input bytes + result bytes) of RowBytes: inputs go
//                   owner -> worker, int32 top-k ids come back.
//   rows_moved_bound  the fewest rows any plan must move for every rank to end at or
//                   below the mean work: each owner above the mean sheds its costliest
//                   rows first (min_rows_to_balance). A property of the batch, the same
//                   for every strategy.
//   max_bytes_sent_per_rank  the most bytes one rank puts on the wire in the two
//                   all-to-alls: its moved rows' inputs as owner plus the results of
//                   rows it selects for other owners as worker.
//   fragments[r]    tasks (maximal contiguous document pieces) rank r selects; each is
//                   a separate segment for the selector.
//   rows[r]         query rows rank r selects (memory for its inputs and results).
//   padding_rows    synthetic rows the strategy's layout computes for nothing.
//   plan_ms         milliseconds of Strategy::plan on the caller's clock (0 without one).
// With a node map (params.ranks_per_node = R > 0; node_map.hpp: R consecutive ranks per
// node, R dividing cp; spill then plans topology-aware, the others ignore it):
//   cross_node_rows rows selected on another node than their owner's node (each is sent
//                   there as input and its top-k sent back); cross_node_bytes their wire
//                   bytes (input + result bytes of RowBytes each).
//   cross_node_bound  the fewest rows any plan whose busiest rank is at most spill's
//                   target load T (params.target_imbalance on spill's cost model) must
//                   send across nodes (cross_node_rows_lower_bound), and its bytes. A
//                   property of the batch, the same for every strategy.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sparsecp/planning/row_bytes.hpp"
#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// Milliseconds since any fixed origin. Planning reads no clock: a caller that wants
// plan_ms passes one (the CLI passes std::chrono::steady_clock); unset, plan_ms is 0.
using MillisecondClock = std::function<double()>;

// One strategy on one batch.
struct SimulationResult {
  std::string strategy;
  int64_t cp = 0;
  std::string workload;  // distribution name, or the given batch's name
  int64_t batch = 0;     // the generator seed, or the given batch's position (1-based)
  int64_t total_rows = 0;
  std::vector<int64_t> work, rows, fragments, rows_sent, padding;  // per rank
  int64_t total_work = 0;
  int64_t largest_unit_work = 0;
  double imbalance = 0;
  double lower_bound = 0;
  double row_lower_bound = 0;
  int64_t rows_moved = 0;
  int64_t rows_moved_bound = 0;
  int64_t max_rows_moved_per_rank = 0;
  int64_t bytes_moved = 0;
  int64_t bytes_moved_bound = 0;  // rows_moved_bound * (input + result bytes)
  int64_t max_bytes_sent_per_rank = 0;
  int64_t fragments_max = 0;
  int64_t fragments_total = 0;
  int64_t rows_max = 0;
  int64_t padding_rows = 0;
  double plan_ms = 0;
  std::string note;
  std::string error;  // non-empty when the strategy rejected the batch (its Error text)
  // The node map's figures (above); all 0 without one (ranks_per_node 0).
  int64_t ranks_per_node = 0;
  int64_t cross_node_rows = 0;
  int64_t cross_node_bytes = 0;
  int64_t cross_node_bound = 0;        // set by run_sweep
  int64_t cross_node_bytes_bound = 0;  // set by run_sweep
};

// The fewest rows that must leave their owners so that no rank's causal work exceeds
// the mean: every owner above the mean sheds its costliest rows (the latest positions
// of its documents) until it is at or below the mean. Lengths must be valid (as for
// plan_tasks); 0 when the contiguous plan is already perfectly balanced.
int64_t min_rows_to_balance(std::span<const int64_t> lengths, int64_t cp, int64_t ratio);

// Plans `lengths` with `strategy` and measures the plan. A strategy's Error becomes
// `error` (the other figures stay 0) so that one rejected batch does not end a sweep;
// invalid batches (which every strategy rejects) are still reported that way, and so is
// a node map (params.ranks_per_node > 0) that does not divide cp. Bytes are counted
// with params.row_bytes.
SimulationResult simulate_plan(const Strategy& strategy, std::span<const int64_t> lengths,
                               int64_t cp, int64_t ratio, const StrategyParams& params,
                               const MillisecondClock& clock = {});

// What to sweep. Generated batches use WorkloadSpec{distribution, tokens, doc_scale,
// cp, seed} (workload.hpp), so with doc_scale 0 document lengths scale with the shard
// (a quarter of it, the generator's default); `file_batches` are used as given for
// every CP size and must divide by each.
struct SweepSpec {
  std::vector<const Strategy*> strategies;
  std::vector<int64_t> cps = {4, 8, 16, 32, 64};
  std::vector<std::string> distributions = {"lognormal", "pareto", "mixture"};
  std::vector<uint64_t> seeds = {1, 2, 3, 4, 5};
  int64_t tokens = 1 << 20;
  int64_t doc_scale = 0;
  std::vector<std::vector<int64_t>> file_batches;  // when non-empty, replaces generators
  std::vector<std::string> file_batch_names;       // their workload names [default "file"]
  int64_t ratio = 4;
  StrategyParams params;   // unset defaults resolve per batch (resolve_seed_options)
  MillisecondClock clock;  // times Strategy::plan for plan_ms (unset: plan_ms 0)
};

// Batches a sweep will plan: |cps| * (|distributions| * |seeds| or |file_batches|).
int64_t sweep_batches(const SweepSpec& spec);

// One batch of a sweep: the CP size, the workload (distribution or file batch name), the
// batch id (the seed, or the file batch's 1-based position) and its lengths.
struct SweepBatch {
  int64_t cp = 0;
  std::string workload;
  int64_t batch = 0;
  std::span<const int64_t> lengths;
};

// Calls visit(batch) for every batch of the sweep in (cp, workload, batch) order,
// generating each when needed (the strategies are not used). Throws Error before the
// first visit when the spec is unusable (no or non-positive CP size, an unknown
// distribution, tokens or a file batch that a CP size does not divide, ...).
void for_each_sweep_batch(const SweepSpec& spec,
                          const std::function<void(const SweepBatch&)>& visit);

// Runs every strategy on every batch, in (cp, workload, batch, strategy) order.
// Throws Error before planning anything when the spec is unusable (no strategy, a
// non-positive or non-dividing CP size, an unknown distribution, a negative
// params.ranks_per_node or one that does not divide every CP size, ...). `progress`
// (optional) is called after each batch with (done, total).
std::vector<SimulationResult> run_sweep(const SweepSpec& spec,
                                        const std::function<void(int64_t, int64_t)>& progress = {});

// Medians over the batches of one (strategy, cp, workload), in first-seen order.
// Failed batches are counted in `failures` and left out of the medians.
struct SummaryRow {
  std::string strategy;
  int64_t cp = 0;
  std::string workload;
  std::optional<int64_t> batch;  // set when the row is one batch, not a median
  int64_t batches = 0;
  int64_t failures = 0;
  double imbalance = 0;
  double lower_bound = 0;
  double row_lower_bound = 0;
  double rows_moved = 0;
  double moved_fraction = 0;  // rows_moved / total rows
  double rows_moved_bound = 0;
  double moved_bound_fraction = 0;  // rows_moved_bound / total rows ("need%" in tables)
  double max_rows_moved_per_rank = 0;
  double bytes_moved = 0;
  double bytes_moved_bound = 0;
  double max_bytes_sent_per_rank = 0;
  double fragments_max = 0;
  double rows_max = 0;
  double padding_rows = 0;
  double plan_ms = 0;
  std::string note;  // the first note or error seen
  // With a node map (ranks_per_node > 0), medians like the rest; 0 without one.
  int64_t ranks_per_node = 0;
  double cross_node_rows = 0;
  double cross_node_fraction = 0;  // cross_node_rows / total rows
  double cross_node_bytes = 0;
  double cross_node_bound = 0;
  double cross_node_bound_fraction = 0;  // cross_node_bound / total rows
  double cross_node_bytes_bound = 0;
};

std::vector<SummaryRow> summarize(std::span<const SimulationResult> results);

// Each result as its own row (batch set), for --all-batches reports.
std::vector<SummaryRow> per_batch_rows(std::span<const SimulationResult> results);

// Median of `values` (mean of the middle two for an even count); NaN when empty.
double median(std::vector<double> values);

// The reports of these rows (JSON, CSV, a table): io/simulate_report.hpp.

}  // namespace sparsecp
