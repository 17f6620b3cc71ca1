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

Calibration calibrate(const CalibrationSettings& settings) {
  settings.validate();
  const double started = wall_seconds();
  const ModelFlags& m = settings.model;
  const SelectConfig config = m.select_config(settings.ratio, settings.threads);
  openblas_set_num_threads(std::max(settings.threads, 1));
  // The bank covers the largest point's last row.
  int64_t bank = 1;
  for (const int64_t v : settings.visible) {
    bank = std::max(bank, (v * settings.ratio + settings.rows) / settings.ratio + 1);
  }
  BufferBudget budget("calibrate");
  const int64_t width = budget.elements({m.heads, m.head_dim});
  budget.add(2, {settings.rows, m.q_rank});
  budget.add(2, {m.q_rank, width});
  budget.add(2, {bank, m.head_dim});
  budget.add(4, {settings.rows, m.heads});
  budget.add(4, {settings.rows, m.rope_dim});
  budget.add(4, {settings.rows, m.topk});
  budget.add(4, {settings.rows, width});
  budget.check_fits_memory();
  const int64_t half = m.rope_dim / 2;
  SplitMix64 random(20261130);
  const auto value = [&](int span) {
    return static_cast<float>(static_cast<int>(random.next() % static_cast<uint64_t>(span)) -
                              span / 2) /
           static_cast<float>(span);
  };
  std::vector<uint16_t> qr(static_cast<size_t>(settings.rows * m.q_rank));
  std::vector<uint16_t> wq_b(static_cast<size_t>(m.q_rank * width));
  std::vector<uint16_t> keys(static_cast<size_t>(bank * m.head_dim));
  std::vector<float> weights(static_cast<size_t>(settings.rows * m.heads));
  std::vector<float> cos(static_cast<size_t>(settings.rows * half)), sin(cos.size());
  for (auto& x : qr) x = float_to_bf16(value(17));
  for (auto& x : wq_b) x = float_to_bf16(value(17) * 0.05f);
  for (auto& x : keys) x = float_to_bf16(value(17));
  for (auto& x : weights) x = 0.1f + std::fabs(value(17));
  for (size_t i = 0; i < cos.size(); ++i) {
    const float angle = static_cast<float>(i) * 0.37f;
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
  std::vector<int32_t> out(static_cast<size_t>(settings.rows * m.topk));
  CostModel capped_only;  // sum of min(topk, vis) via the model's prefix
  capped_only.a = 0;
  capped_only.b = 0;
  capped_only.c = 1;
  capped_only.topk = m.topk;

  // Wq_b is converted once, as a worker does for all its calls of a step.
  const ProjectionWeights projection(MatrixView::bf16(wq_b.data(), m.q_rank, width));
  std::vector<Point> points;
  for (const int64_t target : settings.visible) {
    for (const int64_t rows : {settings.rows, std::max<int64_t>(1, settings.rows / 4)}) {
      std::vector<Segment> segments;
      Point point;
      point.target = target;
      point.rows = static_cast<double>(rows);
      if (target == 0) {  // projection only: every row at position 0 of its own document
        for (int64_t r = 0; r < rows; ++r) segments.push_back({r, r + 1, 0, 0, 1 % settings.ratio});
        if (settings.ratio == 1) {  // position 0 sees one key at ratio 1; use it
          for (Segment& s : segments) {
            s.key_end = 1;
            s.residual = 0;
          }
          point.visible = point.capped = static_cast<double>(rows);
        }
      } else {
        const int64_t end = std::max(rows, target * settings.ratio + rows / 2);
        segments.push_back({0, rows, 0, end / settings.ratio, end % settings.ratio});
        point.visible = static_cast<double>(range_work(end - rows, end, settings.ratio));
        point.capped = capped_only.range(end - rows, end, settings.ratio);
      }
      std::vector<double> times;
      for (int repeat = 0; repeat < settings.repeats; ++repeat) {
        const double start = thread_cpu_seconds();
        select_worker_rows(MatrixView::bf16(qr.data(), rows, m.q_rank),
                           MatrixView::f32(weights.data(), rows, m.heads),
                           MatrixView::f32(cos.data(), rows, half),
                           MatrixView::f32(sin.data(), rows, half), projection,
                           MatrixView::bf16(keys.data(), bank, m.head_dim), segments, config,
                           std::span<int32_t>(out).first(static_cast<size_t>(rows * m.topk)));
        times.push_back(thread_cpu_seconds() - start);
      }
      point.seconds = median(times);
      points.push_back(point);
    }
  }
  std::vector<CostSample> samples;
  for (const Point& p : points) samples.push_back({p.rows, p.visible, p.capped, p.seconds});
  const CostFit fit = fit_cost_model(samples, {.per_call_term = true, .topk = m.topk});
  for (size_t i = 0; i < points.size(); ++i) points[i].predicted = fit.predicted[i];

  CostModel model = fit.model;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  model.note = "heads " + std::to_string(m.heads) + " head_dim " + std::to_string(m.head_dim) +
               " q_rank " + std::to_string(m.q_rank) + " ratio " + std::to_string(settings.ratio) +
               " isa " + kernel_isa_name(best_kernel_isa()) + " threads " +
               std::to_string(settings.threads) + ", " + machine_name() + ", " + date;
  Calibration result;
  result.model = model;
  result.per_call_seconds = fit.per_call_seconds;
  result.rms_relative_residual = fit.rms_relative_residual;
  result.points = std::move(points);
  result.seconds_taken = wall_seconds() - started;
  return result;
}

}  // namespace sparsecp::cli
