// Plan + route for every rank, as one training step does on all ranks together.
//
// Batches: lognormal document lengths with the median a quarter of the local shard
// (sparsecp::generate_batch, seed 1). Cases from issue 2: 1M tokens on 8 ranks, 4M on
// 32, 1M on 64; modes zigzag (per-rank fast path), greedy and hybrid (plan once, route
// each rank; hybrid threshold = the local row count). Counters: time per rank and per
// local row.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <string_view>
#include <vector>

#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/workload.hpp"

namespace {

void plan_and_route_all_ranks(benchmark::State& state, sparsecp::Mode mode) {
  const int64_t tokens = state.range(0);
  const int64_t cp = state.range(1);
  const int64_t ratio = 4;
  const std::vector<int64_t> lengths = sparsecp::generate_batch(
      {.distribution = "lognormal", .tokens = tokens, .scale = 0, .cp = cp, .seed = 1});
  const int64_t local = tokens / cp;
  sparsecp::PlanOptions options{.mode = mode};
  if (mode == sparsecp::Mode::kHybrid) options.zigzag_min_length = local;
  for (auto _ : state) {
    if (mode == sparsecp::Mode::kZigzag) {
      for (int64_t rank = 0; rank < cp; ++rank) {
        benchmark::DoNotOptimize(sparsecp::indexer_route(lengths, cp, rank, ratio, options));
      }
    } else {
      const sparsecp::TaskPlan plan = sparsecp::plan_tasks(lengths, cp, ratio, options);
      for (int64_t rank = 0; rank < cp; ++rank) {
        benchmark::DoNotOptimize(sparsecp::make_route(plan, lengths, rank, ratio));
      }
    }
  }
  // Rates inverted: seconds per rank and per local row (printed with an 's' suffix).
  const double ranks = static_cast<double>(state.iterations() * cp);
  state.counters["per_rank"] =
      benchmark::Counter(ranks, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["per_local_row"] =
      benchmark::Counter(ranks * static_cast<double>(local),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["documents"] = static_cast<double>(lengths.size());
}

void apply_cases(benchmark::internal::Benchmark* bench) {
  bench->Args({1 << 20, 8})->Args({4 << 20, 32})->Args({1 << 20, 64})->ArgNames({"tokens", "cp"});
  bench->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(plan_and_route_all_ranks, zigzag, sparsecp::Mode::kZigzag)->Apply(apply_cases);
BENCHMARK_CAPTURE(plan_and_route_all_ranks, greedy, sparsecp::Mode::kGreedy)->Apply(apply_cases);
BENCHMARK_CAPTURE(plan_and_route_all_ranks, hybrid, sparsecp::Mode::kHybrid)->Apply(apply_cases);

// Run with --cold_heap to let glibc return freed route memory to the kernel after every
// step (its default), which makes page faults dominate; the default keeps the heap warm
// like a long-running training process (the CLI does the same).
int main(int argc, char** argv) {
  bool cold = false;
  for (int i = 1; i < argc; ++i) cold |= std::string_view(argv[i]) == "--cold_heap";
  if (!cold) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--cold_heap") args.push_back(argv[i]);
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
