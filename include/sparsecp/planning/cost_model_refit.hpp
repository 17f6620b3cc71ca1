// sparsecp: refitting the cost model from a job's own per-rank selection times.
//
// A calibrated model (cost_model.hpp) is fitted on synthetic points, often under other
// load than the job's; what the job itself measures, each rank's selection time for its
// own task list, is the figure the planners must balance. CostModelRefit keeps the
// samples of the last `window` steps (each rank's sums, cost_sample, with its measured
// seconds: one small all-gather per step) and refits the model over them with the
// library fit (cost_model_fit.hpp), so spill and auto replan with it from the next step.
//
// A window whose samples admit no non-negative fit (fewer than three, every sum zero) keeps
// the previous model: the start model until the window holds enough variety. So does a
// fit whose rms relative residual exceeds the estimator's bound (refused(): the times are
// too far from the model's form to balance, e.g. a machine whose load changed mid-step).
// The start model's candidate cap and width quantum carry into every refit: samples must
// be summed with them (segment_cost_sample's `candidates` and `quantum`). No
// per-call constant is fitted: a rank's selection is one call of hundreds of
// milliseconds, and a constant every rank pays alike cannot be balanced away, while a
// fit free to explain the times by it alone would leave no model. Pure and
// deterministic: no clock, no files.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/cost_model_fit.hpp"
#include "sparsecp/segment.hpp"

namespace sparsecp {

// The sums of a worker's segments (segment.hpp) at `ratio` and `topk`, with `seconds`:
// the same figures as cost_sample of the task list the segments came from (widths under
// `candidates` and `quantum`, as there).
CostSample segment_cost_sample(std::span<const Segment> segments, int64_t ratio, int64_t topk,
                               double seconds, int64_t candidates = 0, int64_t quantum = 1);

// The default bound on a refit's rms relative residual. A job's own per-rank times fit
// the model to 2-6% even on a loaded 2-core machine (docs/RESULTS.md); a fit 5x worse
// than that explains the step's times by something else.
inline constexpr double kDefaultRefitResidualBound = 0.25;

class CostModelRefit {
 public:
  // `start` is the model until the first fit; `window` >= 1 steps are kept; a fit whose
  // rms relative residual exceeds `max_rms_relative_residual` (> 0) is refused; the refit
  // fits the top-k heap term d when `heap_term` says so (default: when the start has one,
  // d > 0). Throws InvalidInputError for an invalid start model, window or bound.
  CostModelRefit(CostModel start, int64_t window,
                 double max_rms_relative_residual = kDefaultRefitResidualBound,
                 std::optional<bool> heap_term = std::nullopt);

  // Adds one step's samples (each rank's, of every strategy run in the step) and refits
  // over the window. Throws InvalidInputError for an invalid sample (fit_cost_model's
  // checks), leaving the estimator unchanged.
  void add_step(std::span<const CostSample> samples);

  // The model to plan the next step with (unit "ns" once fitted; topk of the start;
  // its note names the start's, so its id differs from any calibrated model's).
  const CostModel& model() const { return model_; }
  // The latest successful fit over the window (unset before the first).
  const std::optional<CostFit>& last_fit() const { return fit_; }
  // True when the latest step changed nothing: its window admitted no fit, or the fit
  // was refused.
  bool kept_previous() const { return kept_previous_; }
  // True when the latest step's fit was refused for its residual (then kept_previous()).
  bool refused() const { return refused_residual_ > 0; }
  // The refused fit's rms relative residual (0 unless refused()).
  double refused_residual() const { return refused_residual_; }
  double max_rms_relative_residual() const { return max_residual_; }
  bool heap_term() const { return heap_term_; }
  int64_t steps() const { return steps_; }
  int64_t window() const { return window_; }
  // Samples in the window now.
  int64_t samples() const;

 private:
  CostModel model_;
  std::string start_note_;  // the start model's note (or id), carried into every refit
  int64_t window_;
  double max_residual_;
  bool heap_term_;
  int64_t steps_ = 0;
  bool kept_previous_ = false;
  double refused_residual_ = 0;
  std::optional<CostFit> fit_;
  std::deque<std::vector<CostSample>> recent_;
};

}  // namespace sparsecp
