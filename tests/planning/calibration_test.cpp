// calibrate_cost_model: the points' sums equal a row-by-row count over their segments;
// points beyond the selector's bank are left out; the procedure times every point
// `repeats` times interleaved after one warm-up call, takes medians, recovers a known
// cost from noisy times, refuses a fit over its bound and a time that is not a positive
// number, and passes the selector's own errors through unchanged.
#include "sparsecp/planning/calibration.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "sparsecp/error.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using ::testing::HasSubstr;

// Rows, sum of widths and sum min(topk, vis) of `segments`, one row at a time.
CostSample count_rows(const std::vector<Segment>& segments, const CalibrationGrid& grid) {
  CostSample sums;
  for (const Segment& s : segments) {
    const int64_t end = (s.key_end - s.key_begin) * grid.ratio + s.residual;
    for (int64_t p = end - (s.q_end - s.q_begin); p < end; ++p) {
      const int64_t vis = (p + 1) / grid.ratio;
      int64_t width = grid.candidates > 0 ? std::min(vis, grid.candidates) : vis;
      width = (width + grid.quantum - 1) / grid.quantum * grid.quantum;
      sums.rows += 1;
      sums.visible += static_cast<double>(width);
      sums.capped += static_cast<double>(std::min(grid.topk, vis));
    }
  }
  return sums;
}

TEST(CalibrationPoints, SumsEqualARowByRowCountAndTargetsCentre) {
  for (const int64_t ratio : {1, 2, 4, 128}) {
    for (const int64_t rows : {1, 7, 64}) {
      CalibrationGrid grid;
      grid.ratio = ratio;
      grid.rows = rows;
      grid.visible = {0, 3, 64, 600};
      grid.topk = 32;
      grid.candidates = ratio == 2 ? 100 : 0;
      grid.quantum = ratio == 2 ? 16 : 1;
      const std::vector<CalibrationPoint> points = calibration_points(grid);
      ASSERT_EQ(points.size(), 8u) << "ratio " << ratio << " rows " << rows;
      for (size_t i = 0; i < points.size(); ++i) {
        const CalibrationPoint& p = points[i];
        EXPECT_EQ(p.target, grid.visible[i / 2]);
        EXPECT_EQ(p.rows, i % 2 == 0 ? rows : std::max<int64_t>(1, rows / 4));
        const CostSample counted = count_rows(p.segments, grid);
        EXPECT_EQ(p.sums.rows, counted.rows);
        EXPECT_EQ(p.sums.visible, counted.visible) << "ratio " << ratio << " target " << p.target;
        EXPECT_EQ(p.sums.capped, counted.capped);
        EXPECT_EQ(p.segments.back().q_end, p.rows);  // rows [0, rows) of the caller's inputs
        int64_t keys = 0;
        for (const Segment& s : p.segments) keys = std::max(keys, s.key_end);
        EXPECT_EQ(p.keys_needed, keys);
        if (p.target == 0) {  // no key, except position 0's one key at ratio 1
          EXPECT_EQ(p.sums.visible, ratio == 1 ? static_cast<double>(p.rows) : 0.0);
        } else if (rows == 64 && grid.candidates == 0 && p.target * ratio >= rows / 2) {
          EXPECT_NEAR(p.sums.visible / p.sums.rows, static_cast<double>(p.target), 1.0);
        }
      }
    }
  }
}

TEST(CalibrationPoints, TargetsBeyondTheBankAreLeftOutAndTooFewRefused) {
  CalibrationGrid grid;
  grid.rows = 16;
  grid.visible = {0, 16, 64, 4096};
  grid.keys = 100;
  const std::vector<CalibrationPoint> points = calibration_points(grid);
  ASSERT_EQ(points.size(), 6u);
  for (const CalibrationPoint& p : points) EXPECT_LE(p.keys_needed, 100);
  grid.visible = {0, 4096, 8192};
  try {
    calibration_points(grid);
    FAIL() << "expected an error";
  } catch (const InvalidInputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("at least 3 different visible-key points within the "
                                    "selector's 100 keys, got [0] of [0, 4096, 8192]"));
  }
}

TEST(CalibrationGrid, NamesTheBadSetting) {
  const auto error_of = [](CalibrationGrid grid) {
    try {
      grid.validate();
    } catch (const InvalidInputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CalibrationGrid grid;
  grid.ratio = 0;
  EXPECT_THAT(error_of(grid), HasSubstr("--ratio must be positive, got 0"));
  grid = {};
  grid.rows = 0;
  EXPECT_THAT(error_of(grid), HasSubstr("--rows must be within [1, 2^20], got 0"));
  grid = {};
  grid.repeats = 0;
  EXPECT_THAT(error_of(grid), HasSubstr("--repeats must be within [1, 10000], got 0"));
  grid = {};
  grid.max_residual = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of(grid), HasSubstr("--max-residual must be finite and non-negative"));
  grid = {};
  grid.visible = {0, 64};
  EXPECT_THAT(error_of(grid), HasSubstr("--visible needs at least 3 points, got 2"));
  grid = {};
  grid.visible = {0, 64, -1};
  EXPECT_THAT(error_of(grid), HasSubstr("--visible: -1 is outside [0, 2^24] keys"));
  grid = {};
  grid.quantum = 0;
  EXPECT_THAT(error_of(grid), HasSubstr("width quantum must be positive, got 0"));
  EXPECT_EQ(error_of(CalibrationGrid{}), "no error");
}

// A selector whose time is k + a*rows + b*widths + c*capped, with relative noise.
struct ModelSelector {
  double k, a, b, c, noise;
  std::mt19937_64 rng;
  std::vector<const CalibrationPoint*> calls;

  double operator()(const CalibrationPoint& point) {
    calls.push_back(&point);
    std::uniform_real_distribution<double> jitter(-noise, noise);
    const CostSample& s = point.sums;
    return (k + a * s.rows + b * s.visible + c * s.capped) * (1 + jitter(rng));
  }
};

TEST(CalibrateCostModel, RecoversAKnownCostFromNoisyInterleavedTimes) {
  const uint64_t seed =
      testing::test_seed() + 1;  // fixed by default: the fit's tolerance is statistical
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  CalibrationGrid grid;
  grid.topk = 64;
  grid.repeats = 5;
  grid.visible = {0, 16, 48, 256, 1024};
  ModelSelector selector{2e-5, 3e-6, 40e-9, 70e-9, 0.005, std::mt19937_64(seed), {}};
  const Calibration fit =
      calibrate_cost_model(grid, [&](const CalibrationPoint& p) { return selector(p); });
  EXPECT_EQ(fit.model.unit, "ns");
  EXPECT_EQ(fit.model.topk, 64);
  EXPECT_NEAR(fit.model.a, 3000, 0.05 * 3000);
  EXPECT_NEAR(fit.model.b, 40, 0.05 * 40);
  EXPECT_NEAR(fit.model.c, 70, 0.1 * 70);
  EXPECT_NEAR(fit.per_call_seconds, 2e-5, 0.2 * 2e-5);
  EXPECT_LT(fit.rms_relative_residual, 0.02);
  // One warm-up call on the first point, then every point once per round, in order.
  ASSERT_EQ(fit.points.size(), 10u);
  ASSERT_EQ(selector.calls.size(), 1 + 10u * 5);
  for (size_t i = 1; i < selector.calls.size(); ++i) {
    EXPECT_EQ(selector.calls[i]->target, fit.points[(i - 1) % 10].target);
    EXPECT_EQ(selector.calls[i]->rows, fit.points[(i - 1) % 10].rows);
  }
  for (const CalibrationPoint& p : fit.points) {
    EXPECT_GT(p.sums.seconds, 0);
    EXPECT_NEAR(p.predicted, p.sums.seconds, 0.02 * p.sums.seconds);
  }
}

TEST(CalibrateCostModel, TheMedianIgnoresOneSlowSpell) {
  CalibrationGrid grid;
  grid.repeats = 3;
  grid.visible = {0, 64, 512, 2048};
  int call = 0;
  const Calibration fit = calibrate_cost_model(grid, [&](const CalibrationPoint& p) {
    const double seconds = 1e-6 * p.sums.rows + 1e-8 * p.sums.visible;
    return ++call == 10 ? 100 * seconds : seconds;  // one call 100x slow (call 1 warms up)
  });
  EXPECT_LT(fit.rms_relative_residual, 1e-9);
  EXPECT_NEAR(fit.model.a, 1000, 1e-6);
  EXPECT_NEAR(fit.model.b, 10, 1e-9);
}

TEST(CalibrateCostModel, RefusesAFitOverItsBoundAndTimesThatAreNotPositive) {
  CalibrationGrid grid;
  grid.max_residual = 0.2;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> busy(1e-4, 1e-2);  // times unrelated to the work
  EXPECT_THAT(
      [&] { calibrate_cost_model(grid, [&](const CalibrationPoint&) { return busy(rng); }); },
      ::testing::ThrowsMessage<InvalidInputError>(
          HasSubstr("cost model fit refused: its rms relative residual")));
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_THAT([&] { calibrate_cost_model(grid, [&](const CalibrationPoint&) { return bad; }); },
                ::testing::ThrowsMessage<InvalidInputError>(
                    HasSubstr("is not a positive number of seconds")))
        << bad;
  }
}

TEST(CalibrateCostModel, PassesTheSelectorsErrorsThroughAndChecksTheGridFirst) {
  CalibrationGrid grid;
  int calls = 0;
  EXPECT_THAT(
      [&] {
        calibrate_cost_model(grid, [&](const CalibrationPoint&) -> double {
          ++calls;
          throw std::runtime_error("device lost");
        });
      },
      ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("device lost")));
  EXPECT_EQ(calls, 1);
  grid.rows = 0;
  calls = 0;
  EXPECT_THROW(calibrate_cost_model(grid,
                                    [&](const CalibrationPoint&) {
                                      ++calls;
                                      return 1.0;
                                    }),
               InvalidInputError);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace sparsecp
