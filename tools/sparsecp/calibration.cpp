#include "calibration.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <span>
#include <sstream>

#include "batch_input.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"
#include "timing.hpp"

namespace sparsecp::cli {

std::string machine_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

void CalibrationSettings::validate() const {
  model.validate();
  grid.validate();
  SPARSECP_CHECK(threads >= 0, "--threads must be non-negative, got ", threads);
}

std::string CalibrationSettings::cache_key() const {
  std::ostringstream text;
  // "procedure 3": the library's procedure with its warm-up call, the relative-residual
  // fit and the top-k admission term d (2026-12-02); models cached by earlier ones are not reused.
  text << "procedure 3 " << model.heads << ' ' << model.head_dim << ' ' << model.rope_dim << ' '
       << model.q_rank << ' ' << model.topk << ' ' << grid.ratio << ' ' << grid.rows << ' '
       << grid.repeats << ' ' << threads << ' ' << kernel_isa_name(best_kernel_isa()) << ' '
       << machine_name();
  for (const int64_t v : grid.visible) text << ' ' << v;
  char name[64];
  std::snprintf(name, sizeof name, "cost-model-%016zx.txt", std::hash<std::string>{}(text.str()));
  return name;
}

std::string cost_model_cache_dir() {
  if (const char* dir = std::getenv("SPARSECP_CACHE_DIR"); dir && *dir) {
    return std::string(dir) == "off" ? "" : dir;  // "off": no cache (as sparsecp.models reads it)
  }
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir && *dir) {
    return std::string(dir) + "/sparsecp";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return std::string(home) + "/.cache/sparsecp";
  }
  return "";
}

namespace {

// Random bf16 inputs of the largest point, made once: every point uses a prefix of them.
struct CalibrationInputs {
  int64_t bank = 1;  // compressed keys: as many as the largest point's rows see
  int64_t width = 0;
  std::vector<uint16_t> qr, wq_b, keys;
  std::vector<float> weights, cos, sin;
  std::vector<int32_t> out;
};

CalibrationInputs make_inputs(const CalibrationSettings& settings,
                              std::span<const CalibrationPoint> points) {
  const ModelFlags& m = settings.model;
  const int64_t rows = settings.grid.rows;
  CalibrationInputs in;
  for (const CalibrationPoint& p : points) in.bank = std::max(in.bank, p.keys_needed);
  BufferBudget budget("calibrate");
  in.width = budget.elements({m.heads, m.head_dim});
  budget.add(2, {rows, m.q_rank});
  budget.add(2, {m.q_rank, in.width});
  budget.add(2, {in.bank, m.head_dim});
  budget.add(4, {rows, m.heads});
  budget.add(4, {rows, m.rope_dim});
  budget.add(4, {rows, m.topk});
  budget.add(4, {rows, in.width});
  budget.check_fits_memory();
  SplitMix64 random(20261130);
  const auto value = [&](int span) {
    return static_cast<float>(static_cast<int>(random.next() % static_cast<uint64_t>(span)) -
                              span / 2) /
           static_cast<float>(span);
  };
  const auto half = static_cast<size_t>(m.rope_dim / 2);
  in.qr.resize(static_cast<size_t>(rows * m.q_rank));
  in.wq_b.resize(static_cast<size_t>(m.q_rank * in.width));
  in.keys.resize(static_cast<size_t>(in.bank * m.head_dim));
  in.weights.resize(static_cast<size_t>(rows * m.heads));
  in.cos.resize(static_cast<size_t>(rows) * half);
  in.sin.resize(in.cos.size());
  for (auto& x : in.qr) x = float_to_bf16(value(17));
  for (auto& x : in.wq_b) x = float_to_bf16(value(17) * 0.05f);
  for (auto& x : in.keys) x = float_to_bf16(value(17));
  for (auto& x : in.weights) x = 0.1f + std::fabs(value(17));
  for (size_t i = 0; i < in.cos.size(); ++i) {
    const float angle = static_cast<float>(i) * 0.37f;
    in.cos[i] = std::cos(angle);
    in.sin[i] = std::sin(angle);
  }
  in.out.resize(static_cast<size_t>(rows * m.topk));
  return in;
}

// "heads 64 head_dim 128 q_rank 1536 ratio 4 isa avx512 threads 1, <CPU>, <date>".
std::string model_note(const CalibrationSettings& settings) {
  const ModelFlags& m = settings.model;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return "heads " + std::to_string(m.heads) + " head_dim " + std::to_string(m.head_dim) +
         " q_rank " + std::to_string(m.q_rank) + " ratio " + std::to_string(settings.grid.ratio) +
         " isa " + kernel_isa_name(best_kernel_isa()) + " threads " +
         std::to_string(settings.threads) + ", " + machine_name() + ", " + date;
}

}  // namespace

CpuCalibration calibrate_cpu(const CalibrationSettings& settings, const Progress* progress) {
  CalibrationSettings checked = settings;
  checked.grid.topk = settings.model.topk;
  checked.grid.heap_term = true;  // sparsecp's kernel keeps a running top-k per row
  checked.validate();
  const double started = wall_seconds();
  const ModelFlags& m = checked.model;
  const SelectConfig config = m.select_config(checked.grid.ratio, checked.threads);
  openblas_set_num_threads(std::max(checked.threads, 1));
  const std::vector<CalibrationPoint> grid_points = calibration_points(checked.grid);
  CalibrationInputs in = make_inputs(checked, grid_points);
  const ProjectionWeights projection(MatrixView::bf16(in.wq_b.data(), m.q_rank, in.width));
  const int64_t half = m.rope_dim / 2;
  // One warm-up call, then every point --repeats times (calibrate_cost_model).
  const int64_t calls = static_cast<int64_t>(grid_points.size()) * checked.grid.repeats + 1;
  int64_t call = 0;
  const auto measure = [&](const CalibrationPoint& point) {
    ++call;
    if (progress != nullptr) {
      progress->tick(
          "timing the selection: call %lld of about %lld (%lld rows, about %lld "
          "visible keys each)",
          static_cast<long long>(call), static_cast<long long>(calls),
          static_cast<long long>(point.rows), static_cast<long long>(point.target));
    }
    const int64_t rows = point.rows;
    const double start = thread_cpu_seconds();
    select_worker_rows(
        MatrixView::bf16(in.qr.data(), rows, m.q_rank),
        MatrixView::f32(in.weights.data(), rows, m.heads),
        MatrixView::f32(in.cos.data(), rows, half), MatrixView::f32(in.sin.data(), rows, half),
        projection, MatrixView::bf16(in.keys.data(), in.bank, m.head_dim), point.segments, config,
        std::span<int32_t>(in.out).first(static_cast<size_t>(rows * m.topk)));
    return thread_cpu_seconds() - start;
  };
  CpuCalibration result{calibrate_cost_model(checked.grid, measure), 0};
  result.fit.model.note = model_note(checked);
  result.seconds_taken = wall_seconds() - started;
  return result;
}

}  // namespace sparsecp::cli
