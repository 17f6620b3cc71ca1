#include "sparsecp/planning/cost_model_fit.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

// k, a, b, c, d (seconds per call, row, key, capped key, top-k admission)
constexpr int kColumns = 5;
using Beta = std::array<double, kColumns>;

double column(const CostSample& s, int j) {
  return j == 0 ? 1.0 : j == 1 ? s.rows : j == 2 ? s.visible : j == 3 ? s.capped : s.heap;
}

double predict(const Beta& beta, const CostSample& s) {
  double sum = 0;
  for (int j = 0; j < kColumns; ++j) sum += beta[j] * column(s, j);
  return sum;
}

// Least squares of the relative residuals (predicted - seconds) / seconds over the columns in
// `use`; coefficients of unused columns are 0.
// Normal equations on scaled columns, Gauss-Jordan with partial pivoting. False when the
// system is singular.
bool solve(std::span<const CostSample> samples, unsigned use, Beta& beta) {
  // Columns scaled by their largest weighted entry, so that the normal equations hold
  // entries of order one whatever the times' unit and the singularity test below means
  // the same for microsecond and second calls.
  Beta scale{};
  for (const CostSample& s : samples) {
    for (int j = 0; j < kColumns; ++j) {
      scale[j] = std::max(scale[j], std::fabs(column(s, j)) / s.seconds);
    }
  }
  std::array<int, kColumns> index{};
  size_t n = 0;
  for (int j = 0; j < kColumns; ++j) {
    if ((use >> j & 1U) != 0 && scale[j] > 0) index[n++] = j;
  }
  beta = {};
  if (n == 0) return false;
  std::array<std::array<double, kColumns + 1>, kColumns> m{};
  for (const CostSample& s : samples) {
    // Each row of the system divided by the sample's time: relative residuals.
    const double weight = 1.0 / s.seconds;
    for (size_t i = 0; i < n; ++i) {
      const double xi = column(s, index[i]) / scale[index[i]] * weight;
      for (size_t k = 0; k < n; ++k) {
        m[i][k] += xi * column(s, index[k]) / scale[index[k]] * weight;
      }
      m[i][n] += xi;  // xi * seconds * weight
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

}  // namespace

CostSample cost_sample(std::span<const Task> tasks, int64_t ratio, int64_t topk, double seconds,
                       int64_t candidates, int64_t quantum) {
  SPARSECP_CHECK(ratio >= 1, "cost sample ratio must be positive, got ", ratio);
  SPARSECP_CHECK(topk >= 1, "cost sample topk must be positive, got ", topk);
  const CostModel rows = CostModel::linear(1, 0, 0, topk);
  CostModel visible = CostModel::linear(0, 1, 0, topk);
  visible.candidates = candidates;
  visible.quantum = quantum;
  validate_cost_model(visible);
  const CostModel capped = CostModel::linear(0, 0, 1, topk);
  CostSample sample;
  sample.seconds = seconds;
  for (const Task& task : tasks) {
    sample.rows += rows.range(task.start, task.end, ratio);
    sample.visible += visible.range(task.start, task.end, ratio);
    sample.capped += capped.range(task.start, task.end, ratio);
    sample.heap += visible.heap_prefix(task.end, ratio) - visible.heap_prefix(task.start, ratio);
  }
  return sample;
}

void validate_cost_samples(std::span<const CostSample> samples) {
  for (size_t i = 0; i < samples.size(); ++i) {
    const CostSample& s = samples[i];
    const bool finite = std::isfinite(s.rows) && std::isfinite(s.visible) &&
                        std::isfinite(s.capped) && std::isfinite(s.heap);
    SPARSECP_CHECK(finite && s.rows >= 0 && s.visible >= 0 && s.capped >= 0 && s.heap >= 0,
                   "cost sample ", i, " must have finite, non-negative sums, got rows ", s.rows,
                   ", visible ", s.visible, ", capped ", s.capped, ", heap ", s.heap);
    // The time on its own: a NaN or infinite time is named, not the (valid) sums.
    SPARSECP_CHECK(std::isfinite(s.seconds) && s.seconds > 0, "cost sample ", i,
                   " must have a finite, positive time, got ", s.seconds, " s");
  }
}

CostFit fit_cost_model(std::span<const CostSample> samples, const CostFitOptions& options) {
  SPARSECP_CHECK(!samples.empty(), "cost model fit needs at least one sample, got none");
  SPARSECP_CHECK(options.topk >= 1, "cost model fit topk must be positive, got ", options.topk);
  const double bound = options.max_rms_relative_residual;
  SPARSECP_CHECK(std::isfinite(bound) && bound >= 0,
                 "cost model fit residual bound must be finite and non-negative, got ", bound);
  validate_cost_samples(samples);
  {
    CostModel terms;  // the settings' errors are the model's
    terms.candidates = options.candidates;
    terms.quantum = options.quantum;
    validate_cost_model(terms);
  }
  Beta best{};
  double best_error = std::numeric_limits<double>::infinity();
  const unsigned step = options.per_call_term ? 1 : 2;  // bit 0: the per-call constant
  for (unsigned mask = step == 1 ? 1 : 2; mask < (1U << kColumns); mask += step) {
    if (!options.heap_term && (mask & (1U << 4)) != 0) continue;
    Beta beta{};
    if (!solve(samples, mask, beta)) continue;
    if (std::any_of(beta.begin(), beta.end(), [](double v) { return v < 0; })) continue;
    double error = 0;
    for (const CostSample& s : samples) {
      const double r = (predict(beta, s) - s.seconds) / s.seconds;
      error += r * r;
    }
    if (error < best_error) {
      best_error = error;
      best = beta;
    }
  }
  SPARSECP_CHECK(std::isfinite(best_error),
                 "cost model fit found no non-negative fit (degenerate samples)");
  CostFit fit;
  fit.model = CostModel::linear(best[1] * 1e9, best[2] * 1e9, best[3] * 1e9, options.topk);
  fit.model.d = best[4] * 1e9;
  fit.model.unit = "ns";
  fit.model.candidates = options.candidates;
  fit.model.quantum = options.quantum;
  if (fit.model.a + fit.model.b + fit.model.c + fit.model.d <= 0) fit.model.b = 1e-9;  // valid
  fit.per_call_seconds = best[0];
  double rms = 0;
  for (const CostSample& s : samples) {
    fit.predicted.push_back(predict(best, s));
    const double r = (fit.predicted.back() - s.seconds) / s.seconds;
    rms += r * r;
  }
  fit.rms_relative_residual = std::sqrt(rms / static_cast<double>(samples.size()));
  SPARSECP_CHECK(bound == 0 || fit.rms_relative_residual <= bound,
                 "cost model fit refused: its rms relative residual ",
                 100 * fit.rms_relative_residual, "% exceeds the bound of ", 100 * bound,
                 "% (the times are far from the model's a + b * vis + c * min(topk, vis) + d * "
                 "heap(vis): a busy machine or too few repeats; repeat the timing on a quieter "
                 "machine or raise the bound)");
  return fit;
}

}  // namespace sparsecp
