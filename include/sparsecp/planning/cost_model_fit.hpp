// sparsecp: fitting the per-row cost model (cost_model.hpp) to measured times.
//
// One implementation for every caller: `sparsecp calibrate` (timed synthetic points),
// `sparsecp run`'s start-up calibration, Python's `sparsecp.fit_cost_model`, and
// tools/cost_model/fit_run_times.py (a job's own per-rank selection times).
//
// Each sample is one timed call that selected `rows` rows whose priced key widths sum
// to `visible` (the visible-key counts themselves unless the model has a candidate cap or
// a width quantum: then width(vis) = roundup(min(vis, candidates), quantum)), whose
// min(topk, vis) sum to `capped` and whose expected top-k admissions (CostModel::heap)
// sum to `heap`. The time is modelled as
//     seconds = k + a * rows + b * visible + c * capped + d * heap
// with k the per-call constant (threads, buffers) when `per_call_term` is set, else 0.
// The fit is non-negative least squares of the relative residuals
// (predicted - seconds) / seconds, the figure it reports and is refused on: a 7 ms call
// counts as much as a 35 ms one, so the fit predicts small and large calls (ranks) alike
// well instead of fitting the largest times and missing the small ones by tens of percent.
// Solved exactly: weighted least squares on every subset of the columns, keeping the
// non-negative solution with the least squared relative error (at most 31 subsets of a
// 5-column problem). A column that is zero in every sample (heap when no row sees more
// than topk keys, or a caller that leaves it 0) is left out: its coefficient is 0.
// Pure and deterministic.
//
// The candidate cap and the width quantum are settings of the model (what the kernel
// does), not fitted: the caller states them in CostFitOptions, computes `visible` with
// them (cost_sample does), and the fitted model carries them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp {

struct CostSample {
  double rows = 0;
  double visible = 0;  // sum of width(vis) over the rows (vis itself by default)
  double capped = 0;   // sum of min(topk, vis) over the rows
  double seconds = 0;  // measured time of the call (> 0)
  // Sum of CostModel::heap(vis) over the rows (last, so that {rows, visible, capped,
  // seconds} still reads as before; 0: no heap term).
  double heap = 0;
};

// The sums of a task list (one rank's selection) at `ratio` and `topk`, with `seconds`;
// `visible` sums widths under `candidates` (0 = no cap) and `quantum` (1 = exact).
// Exact: closed forms per task, O(tasks).
CostSample cost_sample(std::span<const Task> tasks, int64_t ratio, int64_t topk, double seconds,
                       int64_t candidates = 0, int64_t quantum = 1);

struct CostFitOptions {
  bool per_call_term = false;  // fit k as well (calibrate's points vary rows per call)
  int64_t topk = 512;          // the model's topk (what `capped` was computed with)
  int64_t candidates = 0;      // the model's candidate cap (what `visible` was computed with)
  int64_t quantum = 1;         // the model's width quantum (likewise)
  // Fit d, the top-k admission ("heap") term, too. A kernel that keeps a running top-k
  // over the scored keys (a heap, or sparsecp's CPU kernel's threshold buffer) spends it;
  // torch.topk and GPU radix selects scan every score alike, and a free d column only
  // follows their noise (held-out errors of a torch selector grew from ~4% to ~13% with it).
  bool heap_term = true;
  // > 0: a fit whose rms relative residual exceeds it is refused (InvalidInputError
  // naming both): timings that far from linear (a busy machine, too few repeats) must
  // not be balanced silently. 0: no bound.
  double max_rms_relative_residual = 0;
};

struct CostFit {
  CostModel
      model;  // a, b, c, d in ns per row, unit "ns", topk, candidates, quantum from the options
  double per_call_seconds = 0;    // k (0 without per_call_term)
  std::vector<double> predicted;  // per sample, seconds
  // sqrt(mean(((predicted - measured) / measured)^2)) over the samples.
  double rms_relative_residual = 0;
};

// Throws InvalidInputError naming the first sample with a non-finite or negative sum or
// a time <= 0 (what fit_cost_model checks first).
void validate_cost_samples(std::span<const CostSample> samples);

// Throws InvalidInputError for no samples, a non-finite or negative figure, a time <= 0,
// samples that admit no non-negative fit (degenerate: e.g. every column zero), a
// negative or non-finite residual bound, or a fit over the bound.
CostFit fit_cost_model(std::span<const CostSample> samples, const CostFitOptions& options = {});

}  // namespace sparsecp
