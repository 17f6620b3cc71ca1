#include "sparsecp/planning/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/simulate.hpp"  // median

namespace sparsecp {
namespace {

constexpr int64_t kMaxCalibrationRows = int64_t{1} << 20;
constexpr int64_t kMaxCalibrationVisible = int64_t{1} << 24;
constexpr int kMaxCalibrationRepeats = 10000;

CalibrationPoint make_point(const CalibrationGrid& grid, int64_t target, int64_t rows) {
  const int64_t ratio = grid.ratio;
  CalibrationPoint point;
  point.target = target;
  point.rows = rows;
  std::vector<Task> tasks;
  if (target == 0) {  // rows at position 0 of their own one-token documents
    for (int64_t r = 0; r < rows; ++r) {
      // Position 0 sees floor(1 / ratio) keys: none, except one at ratio 1.
      point.segments.push_back({r, r + 1, 0, 1 / ratio, 1 % ratio});
      tasks.push_back({r, 0, 1});
    }
  } else {
    const int64_t end = std::max(rows, target * ratio + rows / 2);
    point.segments.push_back({0, rows, 0, end / ratio, end % ratio});
    tasks.push_back({0, end - rows, end});
  }
  for (const Segment& s : point.segments) {
    point.keys_needed = std::max(point.keys_needed, s.key_end);
  }
  point.sums = cost_sample(tasks, ratio, grid.topk, 0, grid.candidates, grid.quantum);
  return point;
}

std::string targets_text(const std::vector<int64_t>& targets) {
  std::string text = "[";
  for (const int64_t t : targets) text += (text.size() > 1 ? ", " : "") + std::to_string(t);
  return text + "]";
}

}  // namespace

void CalibrationGrid::validate() const {
  SPARSECP_CHECK(ratio >= 1, "--ratio must be positive, got ", ratio);
  SPARSECP_CHECK(rows >= 1 && rows <= kMaxCalibrationRows, "--rows must be within [1, 2^20], got ",
                 rows);
  SPARSECP_CHECK(repeats >= 1 && repeats <= kMaxCalibrationRepeats, "--repeats must be within [1, ",
                 kMaxCalibrationRepeats, "], got ", repeats);
  SPARSECP_CHECK(std::isfinite(max_residual) && max_residual >= 0,
                 "--max-residual must be finite and non-negative, got ", max_residual);
  SPARSECP_CHECK(topk >= 1, "calibrate: topk must be positive, got ", topk);
  SPARSECP_CHECK(candidates >= 0, "calibrate: the candidate cap must be non-negative, got ",
                 candidates);
  SPARSECP_CHECK(quantum >= 1, "calibrate: the width quantum must be positive, got ", quantum);
  SPARSECP_CHECK(keys >= 0, "calibrate: the selector's key count must be non-negative, got ", keys);
  SPARSECP_CHECK(visible.size() >= 3, "--visible needs at least 3 points, got ", visible.size());
  for (const int64_t v : visible) {
    SPARSECP_CHECK(v >= 0 && v <= kMaxCalibrationVisible, "--visible: ", v,
                   " is outside [0, 2^24] keys");
    // The point's rows sit at document positions up to v * ratio + rows.
    SPARSECP_CHECK(v == 0 || v <= (INT64_MAX - 2 * rows) / ratio, "--visible ", v, " at --ratio ",
                   ratio, " puts rows beyond 64-bit positions");
    // ... and its causal work (work_prefix of its last position, cost.hpp) must fit in
    // 64 bits too: ratio * g * (g - 1) / 2 grows with the ratio for a fixed v.
    if (v > 0) {
      __extension__ using Wide = __int128;
      const int64_t end = v * ratio + rows;
      const Wide groups = end / ratio;
      const Wide work = Wide{ratio} * (groups * (groups - 1) / 2) + groups * (end % ratio + 1);
      SPARSECP_CHECK(work <= INT64_MAX, "calibrate: --visible ", v, " at ratio ", ratio,
                     ": the point's causal work overflows 64 bits");
    }
  }
}

std::vector<CalibrationPoint> calibration_points(const CalibrationGrid& grid) {
  grid.validate();
  std::vector<CalibrationPoint> points;
  std::vector<int64_t> kept;
  for (const int64_t target : grid.visible) {
    std::vector<CalibrationPoint> pair;
    for (const int64_t rows : {grid.rows, std::max<int64_t>(1, grid.rows / 4)}) {
      pair.push_back(make_point(grid, target, rows));
    }
    const bool fits = std::all_of(pair.begin(), pair.end(), [&](const CalibrationPoint& p) {
      return grid.keys == 0 || p.keys_needed <= grid.keys;
    });
    if (!fits) continue;
    if (std::find(kept.begin(), kept.end(), target) == kept.end()) kept.push_back(target);
    points.insert(points.end(), pair.begin(), pair.end());
  }
  std::sort(kept.begin(), kept.end());
  const std::string within =
      grid.keys > 0 ? " within the selector's " + std::to_string(grid.keys) + " keys" : "";
  SPARSECP_CHECK(kept.size() >= 3, "calibrate needs at least 3 different visible-key points",
                 within, ", got ", targets_text(kept), " of ", targets_text(grid.visible));
  return points;
}

Calibration calibrate_cost_model(const CalibrationGrid& grid, const MeasureSelection& measure) {
  std::vector<CalibrationPoint> points = calibration_points(grid);
  (void)measure(points.front());  // warm-up: lazy initialisation is no point's cost
  std::vector<std::vector<double>> times(points.size());
  for (int round = 0; round < grid.repeats; ++round) {
    for (size_t i = 0; i < points.size(); ++i) {
      const double seconds = measure(points[i]);
      SPARSECP_CHECK(std::isfinite(seconds) && seconds > 0, "calibrate: the selector's time of ",
                     seconds, " s for the point of ", points[i].rows, " rows at ", points[i].target,
                     " visible keys is not a positive number of seconds");
      times[i].push_back(seconds);
    }
  }
  std::vector<CostSample> samples;
  for (size_t i = 0; i < points.size(); ++i) {
    points[i].sums.seconds = median(times[i]);
    samples.push_back(points[i].sums);
  }
  const CostFit fit = fit_cost_model(samples, {.per_call_term = true,
                                               .topk = grid.topk,
                                               .candidates = grid.candidates,
                                               .quantum = grid.quantum,
                                               .heap_term = grid.heap_term,
                                               .max_rms_relative_residual = grid.max_residual});
  for (size_t i = 0; i < points.size(); ++i) points[i].predicted = fit.predicted[i];
  return {fit.model, fit.per_call_seconds, fit.rms_relative_residual, std::move(points)};
}

}  // namespace sparsecp
