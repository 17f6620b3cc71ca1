// sparsecp strategies: auto — per batch, the plan with the lowest predicted step time.
//
// Source: sparsecp (issue 7). For each candidate — the seed modes none, zigzag,
// greedy and hybrid with the given StrategyParams, and spill at several target
// imbalances — auto predicts one balanced selection step as
//
//     inputs phase  + compute               + results phase
//     max_r max(rows out_r, rows in_r) x input bytes / bandwidth
//                   + max_r sum of cost(row) over the rows rank r selects
//                                           + max_r max(...) x result bytes / bandwidth
//
// (the two all-to-alls cannot finish before their busiest rank; selection cannot
// finish before the slowest rank) and returns the candidate with the lowest sum,
// ties to the earlier candidate; but when the contiguous split ('none') already meets
// StrategyParams::target_imbalance on the cost model, it returns 'none' and moves
// nothing. `AutoChoice::reason` says why, with the runner-up.
//
// The cost model is in nanoseconds per row (cost_model.hpp). Default: a nominal
// DeepSeek-V4 indexer (64 heads x 128, q_rank 1536) on an accelerator doing 400
// dense TFLOP/s: a = 2 * 1536 * 8192 / 4e5 ns (projection), b = 2 * 64 * 128 / 4e5 ns
// per visible key, c = 0; bandwidth 50 GB/s per rank and direction. For this
// machine's figures run `sparsecp calibrate` and pass the model. The registered
// strategy "auto" takes its cost model (StrategyParams::cost_model, default the nominal
// one above), bandwidth and row bytes from the caller's StrategyParams; its seed
// candidates use the params' block size and threshold, its spill candidates the cost
// model. Note that auto balances *predicted time*, not causal pairs: its plan's causal
// work imbalance can be well above 1 when the model charges a fixed per-row cost.
// Unit: the chosen candidate's.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/simulate.hpp"
#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The nominal accelerator model described above.
CostModel nominal_accelerator_cost_model();

struct AutoOptions;
// The AutoOptions the registered strategy uses under `params` (see above).
AutoOptions auto_options(const StrategyParams& params);

struct AutoOptions {
  CostModel cost = nominal_accelerator_cost_model();  // ns per row
  double bandwidth_gbps = 50;                         // GB/s = bytes per ns, per rank
  RowBytes row_bytes;                                 // bytes of a moved row
  std::vector<double> spill_targets = {1.0, 1.001, 1.01, 1.02, 1.05, 1.1};
  StrategyParams params;  // for the seed modes (defaults resolved by resolve_seed_options)
  // params.owner_load, when set (ns per rank, spill.hpp's owner load): added to every
  // candidate's per-rank compute (and so to its imbalance), and given to the spill
  // candidates, which balance selection + owner load. The seed modes' plans ignore it.
  // params.ranks_per_node > 0 (it must divide cp): the spill candidates are the
  // topology-aware plans of spill.hpp (the prediction does not price node links apart).
};

// One candidate's prediction (times in nanoseconds).
struct AutoCandidate {
  std::string name;  // e.g. "hybrid", "spill(1.01)"
  double compute_ns = 0;
  double inputs_ns = 0;
  double results_ns = 0;
  double step_ns = 0;
  int64_t rows_moved = 0;
  double imbalance = 0;  // of the cost model's load (plus the owner load, when set)
  std::string error;     // non-empty when the candidate rejected the batch
};

struct AutoChoice {
  Strategy::Assignment plan;  // the winner's
  size_t chosen = 0;          // index into candidates
  std::vector<AutoCandidate> candidates;
  std::string reason;
};

// Plans every candidate and picks the fastest predicted. Validates like plan_tasks,
// then the cost model, bandwidth > 0 and spill targets >= 1.
AutoChoice choose_plan(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                       const AutoOptions& options = {});

// Predicted step time of any plan under `options` (the same formula).
AutoCandidate predict_step(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t ratio,
                           const AutoOptions& options);

// The strategy "auto".
std::vector<std::unique_ptr<const Strategy>> make_auto_strategies();

}  // namespace sparsecp
