// Fused Lightning Indexer scoring + top-k per kernel ISA and dtype, on one document's
// tail rows (DeepSeek-V4 indexer: 64 heads x 128, topk 512, ratio 4). Counter
// GFLOP/s = 2 * heads * head_dim per visible (row, key) pair. The CLI's
// `sparsecp bench select` adds the BLAS and baseline comparisons in the same run.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"

namespace {

void fused_select(benchmark::State& state, sparsecp::KernelIsa isa, sparsecp::DType dtype) {
  if (!sparsecp::kernel_isa_supported(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const int64_t doc = state.range(0), rows = state.range(1);
  sparsecp::SelectConfig config;  // V4 defaults
  config.isa = isa;
  const int64_t width = config.heads * config.head_dim, bank = doc / config.ratio;
  sparsecp::SplitMix64 random(1);
  std::vector<float> q(static_cast<size_t>(rows * width)),
      w(static_cast<size_t>(rows * config.heads)), k(static_cast<size_t>(bank * config.head_dim));
  for (auto* v : {&q, &w, &k}) {
    for (float& x : *v) x = static_cast<float>(random.uniform() - 0.5);
  }
  std::vector<uint16_t> q16(q.size()), k16(k.size());
  for (size_t i = 0; i < q.size(); ++i) q16[i] = sparsecp::float_to_bf16(q[i]);
  for (size_t i = 0; i < k.size(); ++i) k16[i] = sparsecp::float_to_bf16(k[i]);
  const bool bf16 = dtype == sparsecp::DType::kBFloat16;
  const sparsecp::MatrixView qv = bf16 ? sparsecp::MatrixView::bf16(q16.data(), rows, width)
                                       : sparsecp::MatrixView::f32(q.data(), rows, width);
  const sparsecp::MatrixView kv =
      bf16 ? sparsecp::MatrixView::bf16(k16.data(), bank, config.head_dim)
           : sparsecp::MatrixView::f32(k.data(), bank, config.head_dim);
  const std::vector<sparsecp::Segment> segments{{0, rows, 0, bank, doc % config.ratio}};
  std::vector<int32_t> out(static_cast<size_t>(rows * config.topk));
  for (auto _ : state) {
    sparsecp::select_topk(qv, sparsecp::MatrixView::f32(w.data(), rows, config.heads), kv, segments,
                          config, out);
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = sparsecp::select_score_flops(segments, config);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK_CAPTURE(fused_select, avx512_bf16, sparsecp::KernelIsa::kAvx512,
                  sparsecp::DType::kBFloat16)
    ->Args({4096, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(fused_select, avx512_fp32, sparsecp::KernelIsa::kAvx512,
                  sparsecp::DType::kFloat32)
    ->Args({4096, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(fused_select, avx2_fp32, sparsecp::KernelIsa::kAvx2, sparsecp::DType::kFloat32)
    ->Args({4096, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(fused_select, portable_fp32, sparsecp::KernelIsa::kPortable,
                  sparsecp::DType::kFloat32)
    ->Args({1024, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
