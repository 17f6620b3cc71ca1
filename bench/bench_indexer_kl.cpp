// Fused indexer KL loss (forward + the three gradients) per kernel ISA, dtype and thread
// count at DeepSeek-V4 shapes: index heads 64 x 128, attention heads 64 x 512, TopK 512 of
// 2048 compressed keys. Counter GFLOP/s = the counted FLOPs (indexer_kl_flops) per second.
// The CLI's `sparsecp bench kl` adds the same run's BLAS sgemm rate and the checks.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/indexer_kl.hpp"
#include "sparsecp/planning/workload.hpp"

namespace {

constexpr int64_t kHeads = 64, kDim = 128, kAttHeads = 64, kAttDim = 512, kKeys = 2048, kTopk = 512;

void fused_kl(benchmark::State& state, sparsecp::KernelIsa isa, sparsecp::DType dtype) {
  if (!sparsecp::kernel_isa_supported(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const int64_t rows = state.range(0);
  sparsecp::SplitMix64 random(1);
  const auto tensor = [&](int64_t count, std::vector<float>& f32, std::vector<uint16_t>& b16) {
    f32.resize(static_cast<size_t>(count));
    b16.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) {
      b16[i] = sparsecp::float_to_bf16(static_cast<float>(random.uniform() - 0.5));
      f32[i] = sparsecp::bf16_to_float(b16[i]);
    }
  };
  std::vector<float> q, k, w, qa, ka, sinks(kAttHeads, 0.0f);
  std::vector<uint16_t> q16, k16, w16, qa16, ka16;
  tensor(rows * kHeads * kDim, q, q16);
  tensor(kKeys * kDim, k, k16);
  tensor(rows * kHeads, w, w16);
  tensor(kAttHeads * rows * kAttDim, qa, qa16);
  tensor(kKeys * kAttDim, ka, ka16);
  std::vector<int32_t> ids(static_cast<size_t>(rows * kTopk)), all(kKeys);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kTopk; ++i) {
      std::swap(all[static_cast<size_t>(i)],
                all[static_cast<size_t>(i) + random.next() % static_cast<uint64_t>(kKeys - i)]);
    }
    std::sort(all.begin(), all.begin() + kTopk);
    std::copy_n(all.begin(), kTopk, ids.begin() + r * kTopk);
  }
  const bool bf16 = dtype == sparsecp::DType::kBFloat16;
  const auto view = [&](const std::vector<float>& f, const std::vector<uint16_t>& b,
                        std::vector<int64_t> shape) {
    return sparsecp::TensorView{bf16 ? static_cast<const void*>(b.data()) : f.data(), dtype,
                                std::move(shape)};
  };
  sparsecp::IndexerKlInputs in;
  in.index_query = view(q, q16, {1, rows, kHeads, kDim});
  in.index_key = view(k, k16, {1, kKeys, kDim});
  in.merge_weight = view(w, w16, {1, rows, kHeads});
  in.attention_query = view(qa, qa16, {1, kAttHeads, rows, kAttDim});
  in.compressed_key = view(ka, ka16, {1, kKeys, kAttDim});
  in.sinks = {sinks.data(), sparsecp::DType::kFloat32, {kAttHeads}};
  in.topk_indices = {ids.data(), sparsecp::IndexDType::kInt32, {1, rows, kTopk}};
  sparsecp::IndexerKlOptions options;
  options.attention_scale = 0.044;
  options.isa = isa;
  options.threads = static_cast<int>(state.range(1));
  std::vector<float> dq(q.size()), dk(k.size()), dw(w.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(sparsecp::indexer_kl_loss(in, options, {dq, dk, dw}));
  }
  state.counters["GFLOP/s"] = benchmark::Counter(sparsecp::indexer_kl_flops(in, options) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK_CAPTURE(fused_kl, avx512_fp32, sparsecp::KernelIsa::kAvx512, sparsecp::DType::kFloat32)
    ->Args({128, 1})
    ->Args({128, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(fused_kl, avx512_bf16, sparsecp::KernelIsa::kAvx512, sparsecp::DType::kBFloat16)
    ->Args({128, 1})
    ->Args({128, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(fused_kl, portable_fp32, sparsecp::KernelIsa::kPortable,
                  sparsecp::DType::kFloat32)
    ->Args({16, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
