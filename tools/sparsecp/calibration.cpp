#include "calibration.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>

#include "batch_input.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/cost_model_fit.hpp"
#include "sparsecp/planning/workload.hpp"
#include "timing.hpp"

namespace sparsecp::cli {
namespace {

using Point = CalibrationPoint;

}  // namespace

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
  SPARSECP_CHECK(ratio >= 1, "--ratio must be positive, got ", ratio);
  SPARSECP_CHECK(rows >= 1 && rows <= (int64_t{1} << 20), "--rows must be within [1, 2^20], got ",
                 rows);
  check_repeats(repeats, "--repeats");
  SPARSECP_CHECK(std::isfinite(max_residual) && max_residual >= 0,
                 "--max-residual must be finite and non-negative, got ", max_residual);
  SPARSECP_CHECK(threads >= 0, "--threads must be non-negative, got ", threads);
  SPARSECP_CHECK(visible.size() >= 3, "--visible needs at least 3 points, got ", visible.size());
  for (const int64_t v : visible) {
    SPARSECP_CHECK(v >= 0 && v <= (int64_t{1} << 24), "--visible: ", v,
                   " is outside [0, 2^24] keys");
    // The point's rows sit at document positions up to v * ratio + rows.
    SPARSECP_CHECK(v == 0 || v <= (INT64_MAX - 2 * rows) / ratio, "--visible ", v, " at --ratio ",
                   ratio, " puts rows beyond 64-bit positions");
    // ... and the point's causal work (work_prefix of its last position, cost.hpp) must
    // fit in 64 bits too: ratio * g * (g - 1) / 2 grows with the ratio for a fixed v.
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

std::string CalibrationSettings::cache_key() const {
  std::ostringstream text;
  text << model.heads << ' ' << model.head_dim << ' ' << model.rope_dim << ' ' << model.q_rank
       << ' ' << model.topk << ' ' << ratio << ' ' << rows << ' ' << repeats << ' ' << threads
       << ' ' << kernel_isa_name(best_kernel_isa()) << ' ' << machine_name();
  for (const int64_t v : visible) text << ' ' << v;
  char name[64];
  std::snprintf(name, sizeof name, "cost-model-%016zx.txt", std::hash<std::string>{}(text.str()));
  return name;
}

std::string cost_model_cache_dir() {
  if (const char* dir = std::getenv("SPARSECP_CACHE_DIR"); dir && *dir) return dir;
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
  int64_t bank = 1;  // compressed keys: the largest point's last row sees all of them
  int64_t width = 0;
  std::vector<uint16_t> qr, wq_b, keys;
  std::vector<float> weights, cos, sin;
  std::vector<int32_t> out;
};

CalibrationInputs make_inputs(const CalibrationSettings& settings) {
  const ModelFlags& m = settings.model;
  CalibrationInputs in;
  for (const int64_t v : settings.visible) {
    in.bank = std::max(in.bank, (v * settings.ratio + settings.rows) / settings.ratio + 1);
  }
  BufferBudget budget("calibrate");
  in.width = budget.elements({m.heads, m.head_dim});
  budget.add(2, {settings.rows, m.q_rank});
  budget.add(2, {m.q_rank, in.width});
  budget.add(2, {in.bank, m.head_dim});
  budget.add(4, {settings.rows, m.heads});
  budget.add(4, {settings.rows, m.rope_dim});
  budget.add(4, {settings.rows, m.topk});
  budget.add(4, {settings.rows, in.width});
  budget.check_fits_memory();
  SplitMix64 random(20261130);
  const auto value = [&](int span) {
    return static_cast<float>(static_cast<int>(random.next() % static_cast<uint64_t>(span)) -
                              span / 2) /
           static_cast<float>(span);
  };
  const auto half = static_cast<size_t>(m.rope_dim / 2);
  in.qr.resize(static_cast<size_t>(settings.rows * m.q_rank));
  in.wq_b.resize(static_cast<size_t>(m.q_rank * in.width));
  in.keys.resize(static_cast<size_t>(in.bank * m.head_dim));
  in.weights.resize(static_cast<size_t>(settings.rows * m.heads));
  in.cos.resize(static_cast<size_t>(settings.rows) * half);
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
  in.out.resize(static_cast<size_t>(settings.rows * m.topk));
  return in;
}

// The segments of one point and its exact sums (rows, sum vis, sum min(topk, vis)).
std::vector<Segment> point_segments(int64_t target, int64_t rows,
                                    const CalibrationSettings& settings, Point& point) {
  const int64_t ratio = settings.ratio;
  std::vector<Segment> segments;
  point.target = target;
  point.rows = static_cast<double>(rows);
  if (target == 0) {  // projection only: every row at position 0 of its own document
    for (int64_t r = 0; r < rows; ++r) segments.push_back({r, r + 1, 0, 0, 1 % ratio});
    if (ratio == 1) {  // position 0 sees one key at ratio 1; use it
      for (Segment& s : segments) {
        s.key_end = 1;
        s.residual = 0;
      }
      point.visible = point.capped = static_cast<double>(rows);
    }
    return segments;
  }
  const int64_t end = std::max(rows, target * ratio + rows / 2);
  segments.push_back({0, rows, 0, end / ratio, end % ratio});
  const Task task{0, end - rows, end};
  const CostSample sums =
      cost_sample(std::span<const Task>(&task, 1), ratio, settings.model.topk, 0);
  point.visible = sums.visible;
  point.capped = sums.capped;
  return segments;
}

// The CPU time of one selection of `rows` rows of `segments`.
double time_point(const CalibrationSettings& settings, CalibrationInputs& in,
                  const ProjectionWeights& projection, const SelectConfig& config,
                  std::span<const Segment> segments, int64_t rows) {
  const ModelFlags& m = settings.model;
  const int64_t half = m.rope_dim / 2;
  const double start = thread_cpu_seconds();
  select_worker_rows(MatrixView::bf16(in.qr.data(), rows, m.q_rank),
                     MatrixView::f32(in.weights.data(), rows, m.heads),
                     MatrixView::f32(in.cos.data(), rows, half),
                     MatrixView::f32(in.sin.data(), rows, half), projection,
                     MatrixView::bf16(in.keys.data(), in.bank, m.head_dim), segments, config,
                     std::span<int32_t>(in.out).first(static_cast<size_t>(rows * m.topk)));
  return thread_cpu_seconds() - start;
}

// "heads 64 head_dim 128 q_rank 1536 ratio 4 isa avx512 threads 1, <CPU>, <date>".
std::string model_note(const CalibrationSettings& settings) {
  const ModelFlags& m = settings.model;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return "heads " + std::to_string(m.heads) + " head_dim " + std::to_string(m.head_dim) +
         " q_rank " + std::to_string(m.q_rank) + " ratio " + std::to_string(settings.ratio) +
         " isa " + kernel_isa_name(best_kernel_isa()) + " threads " +
         std::to_string(settings.threads) + ", " + machine_name() + ", " + date;
}

}  // namespace

Calibration calibrate(const CalibrationSettings& settings) {
  settings.validate();
  const double started = wall_seconds();
  const ModelFlags& m = settings.model;
  const SelectConfig config = m.select_config(settings.ratio, settings.threads);
  openblas_set_num_threads(std::max(settings.threads, 1));
  CalibrationInputs in = make_inputs(settings);
  // Wq_b is converted once, as a worker does for all its calls of a step.
  const ProjectionWeights projection(MatrixView::bf16(in.wq_b.data(), m.q_rank, in.width));
  // Repeats interleaved (every point once per round), so that a slow spell of a busy
  // machine hits every point alike instead of one point's repeats; the median per point.
  std::vector<Point> points;
  std::vector<std::vector<Segment>> point_rows;
  std::vector<int64_t> point_row_counts;
  for (const int64_t target : settings.visible) {
    for (const int64_t rows : {settings.rows, std::max<int64_t>(1, settings.rows / 4)}) {
      Point point;
      point_rows.push_back(point_segments(target, rows, settings, point));
      point_row_counts.push_back(rows);
      points.push_back(point);
    }
  }
  std::vector<std::vector<double>> times(points.size());
  for (int repeat = 0; repeat < settings.repeats; ++repeat) {
    for (size_t i = 0; i < points.size(); ++i) {
      times[i].push_back(
          time_point(settings, in, projection, config, point_rows[i], point_row_counts[i]));
    }
  }
  for (size_t i = 0; i < points.size(); ++i) points[i].seconds = median(times[i]);
  std::vector<CostSample> samples;
  for (const Point& p : points) samples.push_back({p.rows, p.visible, p.capped, p.seconds});
  const CostFit fit = fit_cost_model(
      samples,
      {.per_call_term = true, .topk = m.topk, .max_rms_relative_residual = settings.max_residual});
  for (size_t i = 0; i < points.size(); ++i) points[i].predicted = fit.predicted[i];

  Calibration result;
  result.model = fit.model;
  result.model.note = model_note(settings);
  result.per_call_seconds = fit.per_call_seconds;
  result.rms_relative_residual = fit.rms_relative_residual;
  result.points = std::move(points);
  result.seconds_taken = wall_seconds() - started;
  return result;
}

}  // namespace sparsecp::cli
