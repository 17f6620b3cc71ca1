// Test helper for multi-rank selection tests: one rank's share of a small random
// packed batch with small-integer model tensors (exact scores, many ties), and what
// selecting its own rows locally gives. Shared by exchange_select_test and
// spill_mpi_test.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/exchange.hpp"

namespace sparsecp::testing {

inline float small(SplitMix64& random, int span) {
  return static_cast<float>(static_cast<int>(random.next() % static_cast<uint64_t>(span)) -
                            span / 2);
}

struct Case {
  SelectConfig config;
  int64_t q_rank = 6;
  int64_t local = 0;
  std::vector<int64_t> lengths;
  std::vector<float> qr, weights, cos, sin, wq_b, keys;
  int64_t bank = 0;

  Case(int64_t cp, int64_t rank, uint64_t seed) {
    SplitMix64 random(seed);
    config.heads = 2 + static_cast<int64_t>(random.next() % 2);
    config.head_dim = 8;
    config.rope_dim = 4;
    config.topk = 1 + static_cast<int64_t>(random.next() % 7);
    config.ratio = (random.next() % 2) ? 4 : 1;
    config.threads = 1;
    local = 1 + static_cast<int64_t>(random.next() % 41);
    WorkloadSpec spec;
    spec.distribution = seed % 3 == 0 ? "pareto" : "lognormal";
    spec.tokens = local * cp;
    spec.cp = cp;
    spec.seed = seed;
    lengths = generate_batch(spec);
    for (const int64_t length : lengths) bank += length / config.ratio;
    const int64_t width = config.heads * config.head_dim;
    for (int64_t i = 0; i < q_rank * width; ++i) wq_b.push_back(small(random, 3));
    for (int64_t i = 0; i < bank * config.head_dim; ++i) keys.push_back(small(random, 5));
    // Owner inputs: a function of the global row, so ranks need not share them.
    for (int64_t row = 0; row < local; ++row) {
      SplitMix64 rows(seed * 1000003 + static_cast<uint64_t>(rank * local + row));
      for (int64_t c = 0; c < q_rank; ++c) qr.push_back(small(rows, 5));
      for (int64_t h = 0; h < config.heads; ++h) weights.push_back(1.0f + small(rows, 3) + 1.0f);
      for (int64_t i = 0; i < config.rope_dim / 2; ++i) {
        const int quarter = static_cast<int>(rows.next() % 4);
        cos.push_back(quarter == 0 ? 1.0f : quarter == 2 ? -1.0f : 0.0f);
        sin.push_back(quarter == 1 ? 1.0f : quarter == 3 ? -1.0f : 0.0f);
      }
    }
  }

  IndexerInputs inputs() const {
    const int64_t half = config.rope_dim / 2;
    return {TensorView::tokens(MatrixView::f32(qr.data(), local, q_rank)),
            TensorView::tokens(MatrixView::f32(weights.data(), local, config.heads)),
            TensorView::tokens(MatrixView::f32(cos.data(), local, half)),
            TensorView::tokens(MatrixView::f32(sin.data(), local, half))};
  }

  MatrixView wq_b_view() const {
    return MatrixView::f32(wq_b.data(), q_rank, config.heads * config.head_dim);
  }
  MatrixView keys_view() const { return MatrixView::f32(keys.data(), bank, config.head_dim); }

  SelectedKeys select(const WorkerInputs& worker, std::span<const Segment> segments) const {
    SelectedKeys out{
        worker.query_residual.rows, config.topk,
        std::vector<int32_t>(static_cast<size_t>(worker.query_residual.rows * config.topk))};
    select_worker_rows(worker.query_residual.view(), worker.weights.view(), worker.cos.view(),
                       worker.sin.view(), wq_b_view(), keys_view(), segments, config, out.ids);
    return out;
  }

  // The rank's own rows selected here, in owner order, without any communication:
  // the 'none' route's segments over the local rows.
  SelectedKeys local_selection(int64_t cp, int64_t rank) const {
    const IndexerRoute route =
        indexer_route(lengths, cp, rank, config.ratio, {Mode::kNone, std::nullopt, std::nullopt});
    const int64_t half = config.rope_dim / 2;
    WorkerInputs worker{RowMatrix(DType::kFloat32, route.query_count, q_rank),
                        RowMatrix(DType::kFloat32, route.query_count, config.heads),
                        RowMatrix(DType::kFloat32, route.query_count, half),
                        RowMatrix(DType::kFloat32, route.query_count, half)};
    const auto place = [](RowMatrix& into, const std::vector<float>& from, int64_t target,
                          int64_t source) {
      auto* out = reinterpret_cast<float*>(into.bytes.data()) + target * into.cols;
      for (int64_t c = 0; c < into.cols; ++c) out[c] = from[source * into.cols + c];
    };
    for (size_t k = 0; k < route.local_sources.size(); ++k) {
      place(worker.query_residual, qr, route.local_targets[k], route.local_sources[k]);
      place(worker.weights, weights, route.local_targets[k], route.local_sources[k]);
      place(worker.cos, cos, route.local_targets[k], route.local_sources[k]);
      place(worker.sin, sin, route.local_targets[k], route.local_sources[k]);
    }
    const SelectedKeys selected = select(worker, route.segments);
    SelectedKeys owner{local, config.topk,
                       std::vector<int32_t>(static_cast<size_t>(local * config.topk), -2)};
    for (size_t k = 0; k < route.local_sources.size(); ++k) {
      for (int64_t j = 0; j < config.topk; ++j) {
        owner.ids[route.local_sources[k] * config.topk + j] =
            selected.ids[route.local_targets[k] * config.topk + j];
      }
    }
    return owner;
  }
};

}  // namespace sparsecp::testing
