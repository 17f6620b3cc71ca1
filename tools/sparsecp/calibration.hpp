// sparsecp CLI: calibrating the per-row cost model (planning/cost_model.hpp) on sparsecp's
// own CPU selection kernel — `sparsecp calibrate`, and the quick start-up calibration of
// `sparsecp run` (with its cache).
//
// The procedure (points, a warm-up call, interleaved repeats, medians, the non-negative fit
// with its per-call term and residual bound) is the library's calibrate_cost_model
// (planning/calibration.hpp), the one sparsecp.torch.calibrate runs on a user's selector.
// What this file adds is the selector and its clock: select_worker_rows (projection +
// scoring + top-k, the worker's whole job) on random bf16 qr, Wq_b and keys and fp32
// weights and RoPE, timed as the calling thread's CPU time (one selection thread by
// default). Wq_b is converted once beforehand, as a worker does for a whole step.
#pragma once

#include <string>

#include "model_flags.hpp"
#include "progress.hpp"
#include "sparsecp/planning/calibration.hpp"

namespace sparsecp::cli {

struct CalibrationSettings {
  ModelFlags model;
  // ratio, rows, visible, repeats, max_residual; topk is the model's (calibrate_cpu sets it).
  CalibrationGrid grid;
  int threads = 1;

  // Throws Error naming the first bad setting.
  void validate() const;
  // A file name that identifies the settings and this machine's CPU and kernel ISA, for
  // caching: "cost-model-<hash>.txt".
  std::string cache_key() const;
};

struct CpuCalibration {
  Calibration fit;           // model.note names shape, ISA, threads, CPU and date
  double seconds_taken = 0;  // wall time of the whole calibration
};

// `progress` (may be null) says which point is being timed, at most once a second.
CpuCalibration calibrate_cpu(const CalibrationSettings& settings,
                             const Progress* progress = nullptr);

// The CPU's model name from /proc/cpuinfo ("unknown CPU" when unreadable).
std::string machine_name();

// Where `sparsecp run` caches calibrated models: $SPARSECP_CACHE_DIR, else
// $XDG_CACHE_HOME/sparsecp, else $HOME/.cache/sparsecp (empty when none is set, or when
// SPARSECP_CACHE_DIR is "off": no cache).
std::string cost_model_cache_dir();

}  // namespace sparsecp::cli
