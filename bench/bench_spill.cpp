// Planning time of spill (issue 7 target: <= 1 ms for 1M tokens on 64 ranks), of the
// rows-moved lower bound, and of one rank's route from a spill plan; greedy's plan
// beside it as the yardstick measured in the same run.
//
// Batches: lognormal document lengths with the median a quarter of the local shard
// (sparsecp::generate_batch, seed 1), ratio 4: 1M tokens on 8 and 64 ranks, 512K on 16.
#include <benchmark/benchmark.h>

#include <vector>

#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/workload.hpp"

namespace {

std::vector<int64_t> batch(const benchmark::State& state) {
  return sparsecp::generate_batch({.distribution = "lognormal",
                                   .tokens = state.range(0),
                                   .scale = 0,
                                   .cp = state.range(1),
                                   .seed = 1});
}

void spill_plan(benchmark::State& state) {
  const std::vector<int64_t> lengths = batch(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(sparsecp::plan_spill(lengths, state.range(1), 4));
  }
  state.counters["documents"] = static_cast<double>(lengths.size());
}

void spill_plan_and_route_one_rank(benchmark::State& state) {
  const std::vector<int64_t> lengths = batch(state);
  for (auto _ : state) {
    const sparsecp::SpillPlan spill = sparsecp::plan_spill(lengths, state.range(1), 4);
    benchmark::DoNotOptimize(sparsecp::make_route(spill.plan, lengths, 0, 4));
  }
}

void rows_moved_lower_bound(benchmark::State& state) {
  const std::vector<int64_t> lengths = batch(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(sparsecp::rows_moved_lower_bound(lengths, state.range(1), 4, 1.001));
  }
}

void greedy_plan(benchmark::State& state) {
  const std::vector<int64_t> lengths = batch(state);
  const sparsecp::PlanOptions options{.mode = sparsecp::Mode::kGreedy};
  for (auto _ : state) {
    benchmark::DoNotOptimize(sparsecp::plan_tasks(lengths, state.range(1), 4, options));
  }
}

void apply_cases(benchmark::internal::Benchmark* bench) {
  bench->Args({1 << 20, 8})->Args({1 << 19, 16})->Args({1 << 20, 64})->ArgNames({"tokens", "cp"});
  bench->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(spill_plan)->Apply(apply_cases);
BENCHMARK(spill_plan_and_route_one_rank)->Apply(apply_cases);
BENCHMARK(rows_moved_lower_bound)->Apply(apply_cases);
BENCHMARK(greedy_plan)->Apply(apply_cases);
BENCHMARK_MAIN();
