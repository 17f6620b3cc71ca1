// fit_cost_model: recovers known coefficients from noisy synthetic timings, agrees with
// the closed-form sums of cost_sample, and refuses what it cannot fit, naming the value.
#include "sparsecp/planning/cost_model_fit.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using ::testing::HasSubstr;

std::string error_of(const auto& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Samples of segments that start at document position `start` and run `rows` rows.
std::vector<CostSample> synthetic(double k, double a, double b, double c, int64_t topk,
                                  double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(0.0, noise);
  std::vector<CostSample> samples;
  // Positions on both sides of topk * ratio (2048), so that b and c are told apart.
  for (const int64_t rows : {16, 64, 256}) {
    for (const int64_t start : {0, 200, 500, 1000, 1500, 1800, 2500, 3000, 5000, 7000, 9000}) {
      const Task task{0, start, start + rows};
      CostSample s = cost_sample(std::span<const Task>(&task, 1), 4, topk, 0);
      s.seconds = (k + a * s.rows + b * s.visible + c * s.capped) * (1 + jitter(rng));
      samples.push_back(s);
    }
  }
  return samples;
}

TEST(CostModelFit, RecoversKnownCoefficientsFromNoisyTimings) {
  const uint64_t seed =
      testing::test_seed() + 1;  // fixed by default: the fit's tolerance is statistical
  SCOPED_TRACE("seed " + std::to_string(seed));
  // a = 5 us per row, b = 40 ns per key, c = 60 ns per capped key, k = 20 us per call.
  const std::vector<CostSample> samples = synthetic(20e-6, 5e-6, 40e-9, 60e-9, 512, 0.01, seed);
  const CostFit fit = fit_cost_model(samples, {.per_call_term = true, .topk = 512});
  EXPECT_NEAR(fit.model.a, 5000, 500);
  EXPECT_NEAR(fit.model.b, 40, 4);
  EXPECT_NEAR(fit.model.c, 60, 6);
  // k is a few percent of one call here, inside the noise: only its sign is meaningful.
  EXPECT_GE(fit.per_call_seconds, 0);
  EXPECT_EQ(fit.model.unit, "ns");
  EXPECT_EQ(fit.model.topk, 512);
  EXPECT_LT(fit.rms_relative_residual, 0.1);  // least squares weighs the long calls most
  ASSERT_EQ(fit.predicted.size(), samples.size());
}

// A kernel whose top-k admissions cost d each (sparsecp's CPU kernel:
// tens of ns): rows from 0 to 16K visible keys at ratio 4, 1% noise. The fit tells d from
// the per-key b (heap(vis) grows as ln vis, the key term linearly) and recovers all four.
TEST(CostModelFit, RecoversTheHeapTermFromNoisyTimings) {
  const uint64_t seed =
      testing::test_seed() + 2;  // fixed by default: the fit's tolerance is statistical
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(0.0, 0.01);
  const double a = 3e-6, b = 12e-9, c = 70e-9, d = 44e-9;
  std::vector<CostSample> samples;
  for (const int64_t rows : {16, 64}) {
    for (const int64_t vis : {0, 64, 256, 512, 1024, 2048, 4096, 8192, 16384}) {
      const Task task{0, vis * 4, vis * 4 + rows};
      CostSample s = cost_sample(std::span<const Task>(&task, 1), 4, 512, 0);
      s.seconds = (a * s.rows + b * s.visible + c * s.capped + d * s.heap) * (1 + jitter(rng));
      samples.push_back(s);
    }
  }
  const CostFit fit = fit_cost_model(samples, {.topk = 512});
  EXPECT_NEAR(fit.model.a, 3000, 300);
  EXPECT_NEAR(fit.model.b, 12, 1.2);
  EXPECT_NEAR(fit.model.c, 70, 7);
  EXPECT_NEAR(fit.model.d, 44, 6);
  // The three-term model cannot follow those times: its best fit misses by far more,
  // whether d is switched off or the samples carry no heap sums.
  const CostFit three = fit_cost_model(samples, {.topk = 512, .heap_term = false});
  EXPECT_EQ(three.model.d, 0);
  EXPECT_GT(three.rms_relative_residual, 3 * fit.rms_relative_residual);
  for (CostSample& s : samples) s.heap = 0;
  EXPECT_EQ(fit_cost_model(samples, {.topk = 512}).rms_relative_residual,
            three.rms_relative_residual);
}

TEST(CostModelFit, ExactDataWithPerCallTermRecoversIt) {
  const std::vector<CostSample> samples = synthetic(3e-5, 1e-6, 2e-9, 3e-9, 64, 0, 1);
  const CostFit fit = fit_cost_model(samples, {.per_call_term = true, .topk = 64});
  EXPECT_NEAR(fit.per_call_seconds, 3e-5, 1e-12);
  EXPECT_NEAR(fit.model.a, 1000, 1e-3);
  EXPECT_NEAR(fit.model.b, 2, 1e-6);
  EXPECT_NEAR(fit.model.c, 3, 1e-6);
}

TEST(CostModelFit, ExactDataWithoutPerCallTermIsExact) {
  const std::vector<CostSample> samples = synthetic(0, 1e-6, 2e-9, 3e-9, 64, 0, 1);
  const CostFit fit = fit_cost_model(samples, {.per_call_term = false, .topk = 64});
  EXPECT_NEAR(fit.model.a, 1000, 1e-6);
  EXPECT_NEAR(fit.model.b, 2, 1e-9);
  EXPECT_NEAR(fit.model.c, 3, 1e-9);
  EXPECT_EQ(fit.per_call_seconds, 0);
  EXPECT_LT(fit.rms_relative_residual, 1e-9);
}

TEST(CostModelFit, NegativeSlopesAreDroppedNotReturned) {
  // Times that fall with the key count: the unconstrained fit has b < 0; the
  // non-negative one must not.
  std::vector<CostSample> samples;
  for (int i = 1; i <= 8; ++i) {
    samples.push_back({100.0, 1000.0 * i, 100.0, 1e-3 / i});
  }
  const CostFit fit = fit_cost_model(samples);
  EXPECT_GE(fit.model.a, 0);
  EXPECT_GE(fit.model.b, 0);
  EXPECT_GE(fit.model.c, 0);
}

TEST(CostModelFit, CostSampleSumsMatchAPerRowLoop) {
  const std::vector<Task> tasks = {{0, 0, 7}, {1, 5, 1030}, {2, 4093, 4099}};
  const CostSample s = cost_sample(tasks, 4, 512, 1.5);
  double rows = 0, visible = 0, capped = 0;
  for (const Task& task : tasks) {
    for (int64_t p = task.start; p < task.end; ++p) {
      rows += 1;
      visible += static_cast<double>(visible_keys(p, 4));
      capped += static_cast<double>(std::min<int64_t>(512, visible_keys(p, 4)));
    }
  }
  EXPECT_EQ(s.rows, rows);
  EXPECT_EQ(s.visible, visible);
  EXPECT_EQ(s.capped, capped);
  EXPECT_EQ(s.seconds, 1.5);
  // The heap sum, against CostModel::heap row by row (a closed form through ln n!).
  const CostModel model = CostModel::linear(0, 0, 0, 512);
  double heap = 0;
  for (const Task& task : tasks) {
    for (int64_t p = task.start; p < task.end; ++p) heap += model.heap(visible_keys(p, 4));
  }
  EXPECT_GT(heap, 0);  // the first two tasks' rows see at most 257 keys: only the third's count
  EXPECT_NEAR(s.heap, heap, 1e-9 * heap);
}

// The fit minimises the relative residuals it reports: a call 100x smaller counts as much
// as a large one. Two samples of a rows-only model, 2 s for 1 row and 100 s for 100 rows:
// least squares of absolute errors gives a ~ 1.0001 s (the large call wins), of relative
// errors the minimum of (a / 2 - 1)^2 + (a - 1)^2, a = 1.2 s.
TEST(CostModelFit, MinimisesRelativeNotAbsoluteErrors) {
  const std::vector<CostSample> samples = {{1, 0, 0, 2.0}, {100, 0, 0, 100.0}};
  const CostFit fit = fit_cost_model(samples);
  EXPECT_NEAR(fit.model.a, 1.2e9, 1e-3);
  EXPECT_NEAR(fit.rms_relative_residual, std::sqrt((0.4 * 0.4 + 0.2 * 0.2) / 2), 1e-12);
}

// Identical columns (every row sees at most topk keys, so visible == capped) make a
// singular system whatever the times' unit: the fit keeps one of b and c, never an
// arbitrary split from a near-zero pivot, with microsecond times as with seconds.
TEST(CostModelFit, IdenticalColumnsKeepOneTermAtAnyTimeScale) {
  for (const double unit : {1.0, 1e-6}) {
    std::vector<CostSample> samples;
    for (const double rows : {16.0, 64.0}) {
      for (const double vis : {10.0, 100.0, 400.0}) {
        const double visible = rows * vis;
        samples.push_back({rows, visible, visible, unit * (2e-3 * rows + 3e-5 * visible)});
      }
    }
    const CostFit fit = fit_cost_model(samples, {.per_call_term = true});
    EXPECT_EQ(std::min(fit.model.b, fit.model.c), 0.0) << "unit " << unit;
    EXPECT_NEAR((fit.model.b + fit.model.c) / unit, 3e4, 1e-3) << "unit " << unit;
    EXPECT_NEAR(fit.model.a / unit, 2e6, 1e-1) << "unit " << unit;
    EXPECT_LT(fit.rms_relative_residual, 1e-9);
    // One row per call: the per-call and per-row columns are identical too.
    std::vector<CostSample> single;
    for (const double vis : {10.0, 100.0, 400.0, 900.0}) {
      single.push_back({1, vis, std::min(vis, 512.0), unit * (5e-3 + 3e-5 * vis)});
    }
    const CostFit one = fit_cost_model(single, {.per_call_term = true});
    EXPECT_EQ(std::min(one.per_call_seconds, one.model.a), 0.0) << "unit " << unit;
    EXPECT_NEAR(one.per_call_seconds + one.model.a * 1e-9, unit * 5e-3, unit * 1e-9);
  }
}

TEST(CostModelFit, AFitOverTheResidualBoundIsRefused) {
  const uint64_t seed =
      testing::test_seed() + 3;  // fixed by default: the fit's tolerance is statistical
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 1% noise fits well inside a 10% bound...
  const std::vector<CostSample> quiet = synthetic(0, 5e-6, 40e-9, 60e-9, 512, 0.01, seed);
  const CostFit fit = fit_cost_model(quiet, {.topk = 512, .max_rms_relative_residual = 0.1});
  EXPECT_LT(fit.rms_relative_residual, 0.1);
  // ... times of a busy machine (each call slowed by up to 4x at random) do not.
  std::vector<CostSample> busy = quiet;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> slow(1, 4);
  for (CostSample& s : busy) s.seconds *= slow(rng);
  const std::string error =
      error_of([&] { fit_cost_model(busy, {.topk = 512, .max_rms_relative_residual = 0.1}); });
  EXPECT_THAT(error, HasSubstr("cost model fit refused: its rms relative residual "));
  EXPECT_THAT(error, HasSubstr("exceeds the bound of 10%"));
  // Unbounded, the same samples fit (and say how badly).
  EXPECT_GT(fit_cost_model(busy, {.topk = 512}).rms_relative_residual, 0.1);
  EXPECT_THAT(error_of([&] { fit_cost_model(quiet, {.max_rms_relative_residual = -1}); }),
              HasSubstr("residual bound must be finite and non-negative, got -1"));
}

TEST(CostModelFit, RefusesWhatItCannotFitNamingTheValue) {
  EXPECT_THAT(error_of([] { fit_cost_model({}); }), HasSubstr("at least one sample"));
  const std::vector<CostSample> zero_time = {{10, 10, 10, 0}};
  EXPECT_THAT(error_of([&] { fit_cost_model(zero_time); }),
              HasSubstr("cost sample 0 must have a finite, positive time, got 0 s"));
  const std::vector<CostSample> nan_rows = {{NAN, 1, 1, 1}};
  EXPECT_THAT(error_of([&] { fit_cost_model(nan_rows); }), HasSubstr("cost sample 0 must have"));
  const std::vector<CostSample> empty_columns = {{0, 0, 0, 1}, {0, 0, 0, 2}};
  EXPECT_THAT(error_of([&] { fit_cost_model(empty_columns); }), HasSubstr("no non-negative fit"));
}

}  // namespace
}  // namespace sparsecp
