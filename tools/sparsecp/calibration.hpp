// sparsecp CLI: fitting the per-row cost model (planning/cost_model.hpp) to timed
// selection runs on this machine — the procedure behind `sparsecp calibrate`, and the
// quick start-up calibration of `sparsecp run` (with its cache).
//
// Each point times select_worker_rows (projection + scoring + top-k, the worker's whole
// job) on `rows` rows whose visible-key counts centre on one value: one document segment
// of `rows` consecutive rows (vis 0 points: `rows` one-row segments at position 0,
// projection only). The time of a call is modelled as
//     t = k + a * rows + b * sum(vis) + c * sum(min(topk, vis))
// with the sums computed exactly from the segments; every point runs at `rows` and at
// rows / 4 so that the per-call constant k (starting threads, buffers; Wq_b is converted
// once beforehand, as a worker does for a whole step) is told apart from a. k, a, b, c >= 0 are
// fitted by least squares (the best of all non-negative subsets); k is reported but is not part of
// the per-row model. Times are the calling thread's CPU time (one selection thread by default), the
// median of the repeats, which run interleaved (every point once per round). A fit whose rms
// relative residual exceeds max_residual is refused. Inputs: bf16 qr, Wq_b and keys, fp32 weights
// and RoPE.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model_flags.hpp"
#include "sparsecp/planning/cost_model.hpp"

namespace sparsecp::cli {

struct CalibrationSettings {
  ModelFlags model;
  int64_t ratio = 4;
  int64_t rows = 64;  // rows per timed point
  std::vector<int64_t> visible = {0, 64, 256, 448, 512, 640, 1024, 2048, 4096};
  int repeats = 3;
  int threads = 1;
  // The fit is refused (an Error saying so) when its rms relative residual exceeds this
  // (0: no bound): timings of a busy machine must not be balanced silently.
  double max_residual = 0.5;

  // Throws Error naming the first bad setting.
  void validate() const;
  // A file name that identifies the settings and this machine's CPU and kernel ISA, for
  // caching: "cost-model-<hash>.txt".
  std::string cache_key() const;
};

struct CalibrationPoint {
  int64_t target = 0;                        // requested mean visible keys
  double rows = 0, visible = 0, capped = 0;  // rows, sum vis, sum min(topk, vis)
  double seconds = 0;                        // median CPU time
  double predicted = 0;
};

struct Calibration {
  CostModel model;  // a, b, c in ns per row; unit "ns"; note names shape, CPU and date
  double per_call_seconds = 0;
  double rms_relative_residual = 0;
  std::vector<CalibrationPoint> points;
  double seconds_taken = 0;  // wall time of the whole calibration
};

Calibration calibrate(const CalibrationSettings& settings);

// The CPU's model name from /proc/cpuinfo ("unknown CPU" when unreadable).
std::string machine_name();

// Where `sparsecp run` caches calibrated models: $SPARSECP_CACHE_DIR, else
// $XDG_CACHE_HOME/sparsecp, else $HOME/.cache/sparsecp (empty when none is set).
std::string cost_model_cache_dir();

}  // namespace sparsecp::cli
