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
// the previous model: the start model until the window holds enough variety. No
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
// the same figures as cost_sample of the task list the segments came from.
CostSample segment_cost_sample(std::span<const Segment> segments, int64_t ratio, int64_t topk,
                               double seconds);

class CostModelRefit {
 public:
  // `start` is the model until the first fit; `window` >= 1 steps are kept.
  // Throws InvalidInputError for an invalid start model or window.
  CostModelRefit(CostModel start, int64_t window);

  // Adds one step's samples (each rank's, of every strategy run in the step) and refits
  // over the window. Throws InvalidInputError for an invalid sample (fit_cost_model's
  // checks), leaving the estimator unchanged.
  void add_step(std::span<const CostSample> samples);

  // The model to plan the next step with (unit "ns" once fitted; topk of the start;
  // its note names the start's, so its id differs from any calibrated model's).
  const CostModel& model() const { return model_; }
  // The latest successful fit over the window (unset before the first).
  const std::optional<CostFit>& last_fit() const { return fit_; }
  // True when the latest step's samples admitted no fit and the model was kept.
  bool kept_previous() const { return kept_previous_; }
  int64_t steps() const { return steps_; }
  int64_t window() const { return window_; }
  // Samples in the window now.
  int64_t samples() const;

 private:
  CostModel model_;
  std::string start_note_;  // the start model's note (or id), carried into every refit
  int64_t window_;
  int64_t steps_ = 0;
  bool kept_previous_ = false;
  std::optional<CostFit> fit_;
  std::deque<std::vector<CostSample>> recent_;
};

}  // namespace sparsecp
