#include "sparsecp/planning/cost_model_refit.hpp"

#include <cmath>
#include <utility>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/plan.hpp"

namespace sparsecp {

CostSample segment_cost_sample(std::span<const Segment> segments, int64_t ratio, int64_t topk,
                               double seconds, int64_t candidates, int64_t quantum) {
  SPARSECP_CHECK(ratio >= 1, "cost sample ratio must be positive, got ", ratio);
  std::vector<Task> tasks;
  tasks.reserve(segments.size());
  for (const Segment& s : segments) {
    const int64_t end = (s.key_end - s.key_begin) * ratio + s.residual;
    tasks.push_back(Task{0, end - (s.q_end - s.q_begin), end});
  }
  return cost_sample(tasks, ratio, topk, seconds, candidates, quantum);
}

CostModelRefit::CostModelRefit(CostModel start, int64_t window, double max_rms_relative_residual,
                               std::optional<bool> heap_term)
    : model_(std::move(start)),
      window_(window),
      max_residual_(max_rms_relative_residual),
      heap_term_(heap_term.value_or(model_.d > 0)) {
  validate_cost_model(model_);
  start_note_ = model_.note.empty() ? cost_model_id(model_) : model_.note;
  SPARSECP_CHECK(window >= 1, "the refit window must hold at least one step, got ", window);
  SPARSECP_CHECK(std::isfinite(max_rms_relative_residual) && max_rms_relative_residual > 0,
                 "the refit's residual bound must be finite and positive, got ",
                 max_rms_relative_residual);
}

int64_t CostModelRefit::samples() const {
  int64_t n = 0;
  for (const auto& step : recent_) n += static_cast<int64_t>(step.size());
  return n;
}

void CostModelRefit::add_step(std::span<const CostSample> samples) {
  validate_cost_samples(samples);  // an invalid sample must not enter the window
  recent_.emplace_back(samples.begin(), samples.end());
  while (static_cast<int64_t>(recent_.size()) > window_) recent_.pop_front();
  ++steps_;
  std::vector<CostSample> all;
  for (const auto& step : recent_) all.insert(all.end(), step.begin(), step.end());
  CostFitOptions options;
  options.topk = model_.topk;
  options.candidates = model_.candidates;
  options.quantum = model_.quantum;
  options.heap_term = heap_term_;
  kept_previous_ = true;
  refused_residual_ = 0;
  if (all.size() < 3) return;  // fewer samples than a, b, c
  try {
    CostFit fit = fit_cost_model(all, options);
    if (fit.rms_relative_residual > max_residual_) {
      // Keep planning with the model the job has; the caller reports the refusal.
      refused_residual_ = fit.rms_relative_residual;
      return;
    }
    // The start's note names the shape and device (it enters the model's id).
    fit.model.note = "refitted from a job's own times; started from " + start_note_;
    model_ = fit.model;
    fit_ = std::move(fit);
    kept_previous_ = false;
  } catch (const InvalidInputError&) {
    // Degenerate window (every sample alike): keep the model the job plans with.
  }
}

}  // namespace sparsecp
