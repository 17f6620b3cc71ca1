// `sparsecp calibrate`: fit the per-row cost model a + b * vis + c * min(topk, vis)
// (cost_model.hpp) to timed selection runs on this machine, and save it.
//
// Each point times select_worker_rows (projection + scoring + top-k, the worker's whole
// job) on `rows` rows whose visible-key counts centre on one value: one document
// segment of `rows` consecutive rows (vis 0 points: `rows` one-row segments at position
// 0, projection only). The time of a call is modelled as
//     t = k + a * rows + b * sum(vis) + c * sum(min(topk, vis))
// with the sums computed exactly from the segments; every point runs at `rows` and at
// rows / 4 so that the per-call constant k (converting Wq_b, starting threads) is told
// apart from a. k, a, b, c >= 0 are fitted by least squares (the best of all
// non-negative subsets); k is printed but is not part of the per-row model. Times are the calling
// thread's CPU time (one selection thread by default), the median of the repeats.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "problem_size.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

struct CalibrateFlags {
  int64_t heads = 64;
  int64_t head_dim = 128;
  int64_t rope_dim = 64;
  int64_t q_rank = 1536;
  int64_t topk = 512;
  int64_t ratio = 4;
  int64_t rows = 64;
  std::string visible = "0,64,256,448,512,640,1024,2048,4096";
  int repeats = 3;
  int threads = 1;
  std::string out = "cost_model.txt";
  bool json = false;
};

struct Point {
  int64_t target = 0;                        // requested mean visible keys
  double rows = 0, visible = 0, capped = 0;  // regressors: rows, sum vis, sum min(topk, vis)
  // (plus a constant per call: converting Wq_b, thread start-up; fitted, not modelled)
  double seconds = 0;  // median CPU time
  double predicted = 0;
};

double cpu_seconds() {
  timespec time{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time);
  return static_cast<double>(time.tv_sec) + 1e-9 * static_cast<double>(time.tv_nsec);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Least squares over the columns in `use` (a subset of {call, rows, visible, capped});
// coefficients of unused columns are 0. Returns false if the system is singular.
bool solve(const std::vector<Point>& points, std::array<bool, 4> use, std::array<double, 4>& beta) {
  const auto column = [](const Point& p, int j) {
    return j == 0 ? 1.0 : j == 1 ? p.rows : j == 2 ? p.visible : p.capped;
  };
  std::array<double, 4> scale{0, 0, 0, 0};
  for (const Point& p : points) {
    for (int j = 0; j < 4; ++j) scale[j] = std::max(scale[j], std::fabs(column(p, j)));
  }
  std::vector<int> index;
  for (int j = 0; j < 4; ++j) {
    if (use[j] && scale[j] > 0) index.push_back(j);
  }
  beta = {0, 0, 0, 0};
  const size_t n = index.size();
  if (n == 0) return false;
  // Normal equations on scaled columns, Gaussian elimination with partial pivoting.
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0));
  for (const Point& p : points) {
    for (size_t i = 0; i < n; ++i) {
      const double xi = column(p, index[i]) / scale[index[i]];
      for (size_t k = 0; k < n; ++k) m[i][k] += xi * column(p, index[k]) / scale[index[k]];
      m[i][n] += xi * p.seconds;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    size_t pivot = i;
    for (size_t r = i + 1; r < n; ++r) {
      if (std::fabs(m[r][i]) > std::fabs(m[pivot][i])) pivot = r;
    }
    if (std::fabs(m[pivot][i]) < 1e-12) return false;
    std::swap(m[i], m[pivot]);
    for (size_t r = 0; r < n; ++r) {
      if (r == i) continue;
      const double f = m[r][i] / m[i][i];
      for (size_t k = i; k <= n; ++k) m[r][k] -= f * m[i][k];
    }
  }
  for (size_t i = 0; i < n; ++i) beta[index[i]] = m[i][n] / m[i][i] / scale[index[i]];
  return true;
}

double predict(const std::array<double, 4>& beta, const Point& p) {
  return beta[0] + beta[1] * p.rows + beta[2] * p.visible + beta[3] * p.capped;
}

// The non-negative fit with the least squared error over all column subsets.
std::array<double, 4> fit(std::vector<Point>& points) {
  std::array<double, 4> best{0, 0, 0, 0};
  double best_error = INFINITY;
  for (int mask = 1; mask < 16; ++mask) {
    std::array<double, 4> beta{};
    if (!solve(points, {bool(mask & 1), bool(mask & 2), bool(mask & 4), bool(mask & 8)}, beta)) {
      continue;
    }
    if (beta[0] < 0 || beta[1] < 0 || beta[2] < 0 || beta[3] < 0) continue;
    double error = 0;
    for (const Point& p : points) {
      const double r = predict(beta, p) - p.seconds;
      error += r * r;
    }
    if (error < best_error) {
      best_error = error;
      best = beta;
    }
  }
  SPARSECP_CHECK(std::isfinite(best_error), "calibrate: no non-negative fit (degenerate points)");
  for (Point& p : points) p.predicted = predict(best, p);
  return best;
}

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

void run_calibrate(const CalibrateFlags& flags) {
  SelectConfig config;
  config.heads = flags.heads;
  config.head_dim = flags.head_dim;
  config.rope_dim = flags.rope_dim;
  config.topk = flags.topk;
  config.ratio = flags.ratio;
  config.threads = flags.threads;
  validate_select_config(config);
  SPARSECP_CHECK(flags.q_rank >= 1, "--q-rank must be positive, got ", flags.q_rank);
  SPARSECP_CHECK(flags.rows >= 1, "--rows must be positive, got ", flags.rows);
  SPARSECP_CHECK(flags.repeats >= 1, "--repeats must be at least 1, got ", flags.repeats);
  SPARSECP_CHECK(flags.repeats <= kMaxRepeat, "--repeats must be at most ", kMaxRepeat, ", got ",
                 flags.repeats);
  SPARSECP_CHECK(flags.rope_dim >= 0 && flags.rope_dim % 2 == 0 && flags.rope_dim <= flags.head_dim,
                 "--rope-dim must be even and within [0, head_dim], got ", flags.rope_dim);
  std::vector<int64_t> targets;
  {
    std::string_view text = flags.visible;
    while (!text.empty()) {
      const size_t comma = std::min(text.find(','), text.size());
      const std::string_view item = text.substr(0, comma);
      int64_t value = 0;
      const auto [stop, status] = std::from_chars(item.data(), item.data() + item.size(), value);
      SPARSECP_CHECK(
          !item.empty() && status == std::errc() && stop == item.data() + item.size() && value >= 0,
          "--visible: '", item, "' is not a non-negative integer");
      targets.push_back(value);
      text = comma < text.size() ? text.substr(comma + 1) : std::string_view{};
    }
    SPARSECP_CHECK(targets.size() >= 3, "--visible needs at least 3 points, got ", targets.size());
  }
  // Sizes first (problem_size.hpp): every buffer below, and the causal work of the
  // largest point, before anything is allocated.
  ProblemSize size("calibrate",
                   "--rows, --heads, --head-dim, --q-rank, --topk, --ratio, --visible");
  const int64_t width = size.product({flags.heads, flags.head_dim});
  const int64_t half = flags.rope_dim / 2;
  // The bank covers the largest point's last row.
  int64_t bank = 1;
  for (const int64_t v : targets) {
    bank = std::max(bank, size.sum(size.product({v, flags.ratio}), flags.rows) / flags.ratio + 1);
  }
  size.add_buffer({flags.rows, flags.q_rank}, 2);  // qr
  size.add_buffer({flags.q_rank, width}, 2);       // Wq_b
  size.add_buffer({bank, flags.head_dim}, 2);      // keys
  size.add_buffer({flags.rows, flags.heads}, 4);   // weights
  size.add_buffer({flags.rows, half, 2}, 4);       // cos, sin
  size.add_buffer({flags.rows, flags.topk}, 4);    // selected ids
  size.add_buffer({flags.rows, width}, 4);         // projected Index Q
  size.check_memory();
  for (const int64_t v : targets) {
    // W(end) = ratio * g * (g - 1) / 2 + g * (t + 1), (g, t) = divmod(end, ratio): the
    // largest causal work of the point (cost.hpp), which must fit in 64 bits.
    const int64_t end = v * flags.ratio + flags.rows;  // checked above
    const int64_t g = end / flags.ratio;
    int64_t pairs = 0;  // g * (g - 1) / 2, halving the even factor first
    int64_t work = 0;
    int64_t tail = 0;
    SPARSECP_CHECK(!(g % 2 == 0 ? __builtin_mul_overflow(g / 2, g - 1, &pairs)
                                : __builtin_mul_overflow(g, (g - 1) / 2, &pairs)) &&
                       !__builtin_mul_overflow(flags.ratio, pairs, &work) &&
                       !__builtin_mul_overflow(g, end % flags.ratio + 1, &tail) &&
                       !__builtin_add_overflow(work, tail, &work),
                   "calibrate: --visible ", v, " at ratio ", flags.ratio,
                   ": the point's causal work overflows 64 bits");
  }
  openblas_set_num_threads(std::max(flags.threads, 1));

  SplitMix64 random(20261130);
  const auto value = [&](int span) {
    return static_cast<float>(static_cast<int>(random.next() % static_cast<uint64_t>(span)) -
                              span / 2) /
           static_cast<float>(span);
  };
  std::vector<uint16_t> qr(static_cast<size_t>(flags.rows * flags.q_rank));
  std::vector<uint16_t> wq_b(static_cast<size_t>(flags.q_rank * width));
  std::vector<uint16_t> keys(static_cast<size_t>(bank * flags.head_dim));
  std::vector<float> weights(static_cast<size_t>(flags.rows * flags.heads));
  std::vector<float> cos(static_cast<size_t>(flags.rows * half)), sin(cos.size());
  for (auto& x : qr) x = float_to_bf16(value(17));
  for (auto& x : wq_b) x = float_to_bf16(value(17) * 0.05f);
  for (auto& x : keys) x = float_to_bf16(value(17));
  for (auto& x : weights) x = 0.1f + std::fabs(value(17));
  for (size_t i = 0; i < cos.size(); ++i) {
    const float angle = static_cast<float>(i) * 0.37f;
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
  std::vector<int32_t> out(static_cast<size_t>(flags.rows * flags.topk));
  CostModel capped_only;  // sum of min(topk, vis) via the model's prefix
  capped_only.a = 0;
  capped_only.b = 0;
  capped_only.c = 1;
  capped_only.topk = flags.topk;

  std::vector<Point> points;
  for (const int64_t target : targets) {
    for (const int64_t rows : {flags.rows, std::max<int64_t>(1, flags.rows / 4)}) {
      std::vector<Segment> segments;
      Point point;
      point.target = target;
      point.rows = static_cast<double>(rows);
      if (target == 0) {  // projection only: every row at position 0 of its own document
        for (int64_t r = 0; r < rows; ++r) segments.push_back({r, r + 1, 0, 0, 1 % flags.ratio});
        if (flags.ratio == 1) {  // position 0 sees one key at ratio 1; use it
          for (Segment& s : segments) {
            s.key_end = 1;
            s.residual = 0;
          }
          point.visible = point.capped = static_cast<double>(rows);
        }
      } else {
        const int64_t end = std::max(rows, target * flags.ratio + rows / 2);
        segments.push_back({0, rows, 0, end / flags.ratio, end % flags.ratio});
        point.visible = static_cast<double>(range_work(end - rows, end, flags.ratio));
        point.capped = capped_only.range(end - rows, end, flags.ratio);
      }
      std::vector<double> times;
      for (int repeat = 0; repeat < flags.repeats; ++repeat) {
        const double start = cpu_seconds();
        select_worker_rows(MatrixView::bf16(qr.data(), rows, flags.q_rank),
                           MatrixView::f32(weights.data(), rows, flags.heads),
                           MatrixView::f32(cos.data(), rows, half),
                           MatrixView::f32(sin.data(), rows, half),
                           MatrixView::bf16(wq_b.data(), flags.q_rank, width),
                           MatrixView::bf16(keys.data(), bank, flags.head_dim), segments, config,
                           std::span<int32_t>(out).first(static_cast<size_t>(rows * flags.topk)));
        times.push_back(cpu_seconds() - start);
      }
      point.seconds = median(times);
      points.push_back(point);
    }
  }
  const std::array<double, 4> beta = fit(points);

  CostModel model;
  model.a = beta[1] * 1e9;
  model.b = beta[2] * 1e9;
  model.c = beta[3] * 1e9;
  model.topk = flags.topk;
  model.unit = "ns";
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  model.note = "heads " + std::to_string(flags.heads) + " head_dim " +
               std::to_string(flags.head_dim) + " q_rank " + std::to_string(flags.q_rank) +
               " ratio " + std::to_string(flags.ratio) + " isa " +
               kernel_isa_name(best_kernel_isa()) + " threads " + std::to_string(flags.threads) +
               ", " + machine_name() + ", " + date;
  if (model.a + model.b + model.c <= 0) model.b = 1e-9;  // keep the model valid
  if (flags.out != "-") save_cost_model(flags.out, model);

  double rms = 0;
  for (const Point& p : points) {
    const double r = (p.predicted - p.seconds) / p.seconds;
    rms += r * r;
  }
  rms = std::sqrt(rms / static_cast<double>(points.size()));
  if (flags.json) {
    nlohmann::json out_json;
    out_json["a_ns"] = model.a;
    out_json["b_ns"] = model.b;
    out_json["c_ns"] = model.c;
    out_json["topk"] = model.topk;
    out_json["note"] = model.note;
    out_json["file"] = flags.out;
    out_json["per_call_ns"] = beta[0] * 1e9;
    out_json["rms_relative_residual"] = rms;
    out_json["points"] = nlohmann::json::array();
    for (const Point& p : points) {
      out_json["points"].push_back({{"visible", p.target},
                                    {"rows", p.rows},
                                    {"sum_visible", p.visible},
                                    {"sum_min_topk_visible", p.capped},
                                    {"seconds", p.seconds},
                                    {"predicted_seconds", p.predicted}});
    }
    std::printf("%s\n", out_json.dump(2).c_str());
    return;
  }
  std::printf("sparsecp calibrate: %s\n", model.note.c_str());
  std::printf("  %8s %6s %12s %12s %12s %12s %9s\n", "mean vis", "rows", "sum vis", "sum min(k,v)",
              "measured ms", "model ms", "residual");
  for (const Point& p : points) {
    std::printf("  %8.0f %6.0f %12.0f %12.0f %12.3f %12.3f %8.1f%%\n", p.visible / p.rows, p.rows,
                p.visible, p.capped, p.seconds * 1e3, p.predicted * 1e3,
                100 * (p.predicted - p.seconds) / p.seconds);
  }
  std::printf(
      "fit (ns per row): a = %.4g (fixed), b = %.4g per visible key, c = %.4g per min(topk, "
      "vis); plus %.3g ms per call (not part of the per-row model); rms relative residual "
      "%.1f%%\n",
      model.a, model.b, model.c, beta[0] * 1e3, 100 * rms);
  if (flags.out != "-") std::printf("saved to %s\n", flags.out.c_str());
}

const Registration registration("calibrate", [](CLI::App& app) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "Time the worker's selection (Index-Q projection, scoring, top-k) on this machine at a\n"
      "few visible-key counts, fit the per-row cost a + b*vis + c*min(topk, vis) in\n"
      "nanoseconds by non-negative least squares, print the fit with each point's residual,\n"
      "and save the model for `sparsecp spill --cost-model` and the auto strategy\n"
      "(format: include/sparsecp/planning/cost_model.hpp). Times are the selecting thread's CPU "
      "time,\n"
      "median of --repeats; bf16 qr, Wq_b and keys, fp32 weights and RoPE.");
  sub->add_option("--heads", flags->heads, "Index heads")->capture_default_str();
  sub->add_option("--head-dim", flags->head_dim, "Index head dimension")->capture_default_str();
  sub->add_option("--rope-dim", flags->rope_dim, "Rotated trailing channels per head (even)")
      ->capture_default_str();
  sub->add_option("--q-rank", flags->q_rank, "Low-rank query residual width (q_lora_rank)")
      ->capture_default_str();
  sub->add_option("--topk", flags->topk, "Selected keys per row")->capture_default_str();
  sub->add_option("--ratio", flags->ratio, "Key compression ratio (tokens per key)")
      ->capture_default_str();
  sub->add_option("--rows", flags->rows, "Rows per timed point")->capture_default_str();
  sub->add_option("--visible", flags->visible,
                  "Mean visible keys per row at each point, comma-separated (>= 3 points; 0 = "
                  "projection only); points below and above --topk separate b from c")
      ->capture_default_str();
  sub->add_option("--repeats", flags->repeats, "Timed runs per point (median)")
      ->capture_default_str();
  sub->add_option("--threads", flags->threads, "Selection threads (OpenMP and OpenBLAS)")
      ->capture_default_str();
  sub->add_option("--out", flags->out, "File to save the model to ('-': do not save)")
      ->capture_default_str();
  sub->add_flag("--json", flags->json,
                "Print JSON: {a_ns, b_ns, c_ns, topk, note, file, rms_relative_residual, "
                "points: [{visible, rows, sum_visible, sum_min_topk_visible, seconds, "
                "predicted_seconds}]}");
  sub->footer(
      "Examples:\n"
      "  sparsecp calibrate\n"
      "  sparsecp calibrate --heads 32 --q-rank 1024 --out v41_cost_model.txt\n"
      "  sparsecp spill --cp 8 --cost-model cost_model.txt");
  sub->callback([flags] { run_calibrate(*flags); });
});

}  // namespace
}  // namespace sparsecp::cli
