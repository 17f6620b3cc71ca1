// sparsecp: calibrating the per-row cost model (cost_model.hpp) on any selector — the one
// procedure behind `sparsecp calibrate`, the start-up calibration of `sparsecp run`
// (sparsecp's own CPU kernel, kernels/select_calibration.hpp) and Python's
// `sparsecp.torch.calibrate` (the user's own selector on its own device).
//
// A calibration times one selector call per point over synthetic segments and fits
//     seconds = k + a * rows + b * sum(width(vis)) + c * sum(min(topk, vis))
// with fit_cost_model (cost_model_fit.hpp; k is the per-call constant, reported but not part
// of the per-row model). The points are pure integer data (calibration_points); the timing
// is injected as a callback, so this file reads no clock and the caller chooses it: thread
// CPU time for sparsecp's kernel, CUDA events on a GPU, a model in tests.
//
// Procedure (`calibrate_cost_model`):
//   1. one warm-up call on the first point, not timed into any point (lazy initialisation
//      of the selector, first-touch pages);
//   2. `repeats` rounds, each timing every point once in order (interleaved, so a slow
//      spell of a busy machine hits every point alike instead of one point's repeats);
//   3. per point the median of its times;
//   4. the non-negative least-squares fit with the per-call term, refused (InvalidInputError
//      "cost model fit refused: ...") when its rms relative residual exceeds max_residual.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/cost_model_fit.hpp"
#include "sparsecp/segment.hpp"

namespace sparsecp {

// What to time. Every visible-key target runs at `rows` rows and at max(1, rows / 4), so
// that the per-call constant k is told apart from the per-row a.
struct CalibrationGrid {
  int64_t ratio = 4;  // the layer's compression ratio (tokens per key)
  int64_t rows = 64;  // rows of the larger call of each target
  // Mean visible keys per row of each target; 0 = rows that see no key (projection only).
  // Targets below and above topk separate b from c; targets up to 16K keys (a 64K-token
  // document at ratio 4) separate the key term b from the heap term d (ln vis).
  std::vector<int64_t> visible = {0, 64, 256, 448, 512, 640, 1024, 2048, 4096, 8192, 16384};
  int64_t topk = 512;         // ids per row (the model's topk)
  int64_t candidates = 0;     // the selector's candidate cap (0: none); carried by the model
  int64_t quantum = 1;        // the selector's width quantum (1: exact); carried by the model
  int64_t keys = 0;           // > 0: the selector's bank holds this many keys; targets whose
                              // segments reach further are left out
  bool heap_term = false;     // fit the top-k admission term d (CostFitOptions::heap_term):
                              // for selectors that keep a running top-k (sparsecp's CPU kernel)
  int repeats = 3;            // timed calls per point (median)
  double max_residual = 0.5;  // refuse a fit above this rms relative residual; 0: no bound

  // Throws InvalidInputError naming the first bad setting (the CLI's option names:
  // --ratio, --rows, --visible, --repeats, --max-residual).
  void validate() const;
};

// One timed shape. `segments` address rows [0, rows) of the caller's inputs and bank keys
// [0, keys_needed); `sums` are their exact sums (cost_sample's, with the grid's topk,
// candidate cap and quantum) and, after calibrate_cost_model, the median time in seconds.
struct CalibrationPoint {
  int64_t target = 0;  // requested mean visible keys per row
  int64_t rows = 0;
  int64_t keys_needed = 0;
  std::vector<Segment> segments;
  CostSample sums;
  double predicted = 0;  // the fitted model's seconds for this point (k included)
};

// The points of a grid, target by target, each at rows then rows / 4 (pure). A target t > 0
// is one segment of `rows` consecutive rows of one document, centred on t visible keys (its
// last row sits at position max(rows, t * ratio + rows / 2) - 1). Target 0 is `rows`
// one-row documents at position 0, which see no key (at ratio 1 position 0 sees one key, so
// there each row sees exactly one). Targets that need more than grid.keys keys are left
// out; fewer than 3 targets left is an InvalidInputError naming the bank's size.
std::vector<CalibrationPoint> calibration_points(const CalibrationGrid& grid);

struct Calibration {
  CostModel model;  // a, b, c in ns per row (unit "ns"); topk, candidates, quantum from the grid
  double per_call_seconds = 0;  // k
  double rms_relative_residual = 0;
  std::vector<CalibrationPoint> points;  // sums.seconds: median measured; predicted: fitted
};

// Seconds of one selector call on `point.segments` (rows [0, point.rows) of the caller's
// inputs), measured by the caller's clock; must be > 0 and finite.
using MeasureSelection = std::function<double(const CalibrationPoint& point)>;

// The procedure above. Throws grid.validate()'s and calibration_points' errors before the
// first call, whatever `measure` throws (unchanged), InvalidInputError naming a point whose
// time is not a positive finite number, and the fit's errors (a refused fit among them).
Calibration calibrate_cost_model(const CalibrationGrid& grid, const MeasureSelection& measure);

}  // namespace sparsecp
