#include "run_model.hpp"

#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/planning/workload.hpp"

namespace sparsecp::cli {
namespace {

// Small integers from (seed, stream, row, column): identical on every rank.
int64_t small_int(uint64_t seed, uint64_t stream, int64_t row, int64_t column, int64_t span) {
  SplitMix64 random(seed * 0x9E3779B97F4A7C15ULL + stream * 0x632BE59BD9B4E019ULL +
                    static_cast<uint64_t>(row) * 0x85EBCA77C2B2AE63ULL +
                    static_cast<uint64_t>(column));
  return static_cast<int64_t>(random.next() % static_cast<uint64_t>(span));
}

}  // namespace

IndexerInputs RunModel::inputs() const {
  const int64_t half = config.rope_dim / 2;
  return {TensorView::tokens(MatrixView::bf16(qr.data(), local, q_rank)),
          TensorView::tokens(MatrixView::f32(weights.data(), local, config.heads)),
          TensorView::tokens(MatrixView::f32(cos.data(), local, half)),
          TensorView::tokens(MatrixView::f32(sin.data(), local, half))};
}

MatrixView RunModel::wq_b_view() const {
  return MatrixView::bf16(wq_b.data(), q_rank, config.heads * config.head_dim);
}

MatrixView RunModel::keys_view() const {
  return MatrixView::bf16(keys.data(), bank, config.head_dim);
}

RunModel make_run_model(const ModelFlags& shape, int64_t ratio, int threads, uint64_t seed,
                        std::span<const int64_t> lengths, int64_t rank, int64_t local) {
  RunModel model;
  model.config = shape.select_config(ratio, threads);
  model.q_rank = shape.q_rank;
  model.local = local;
  for (const int64_t length : lengths) model.bank += length / ratio;
  const int64_t half = shape.rope_dim / 2;

  // Sizes first, all of them, with the buffers the run allocates later (worker inputs up
  // to twice the owner's rows, the projected Index Q and the top-k ids).
  BufferBudget budget("run");
  const int64_t width = budget.elements({shape.heads, shape.head_dim});
  const int64_t qr_size = budget.add(2, {local, shape.q_rank});
  const int64_t weight_size = budget.add(4, {local, shape.heads});
  const int64_t rope_size = budget.add(4, {local, half});
  budget.add(4, {local, half});
  const int64_t wq_size = budget.add(2, {shape.q_rank, width});
  const int64_t key_size = budget.add(2, {model.bank, shape.head_dim});
  budget.add(2, {2, local, shape.q_rank});  // worker qr
  budget.add(4, {2, local, width});         // worker Index Q
  budget.add(4, {4, local, shape.topk});    // ids, worker and owner
  budget.check_fits_memory();

  model.qr.resize(static_cast<size_t>(qr_size));
  model.weights.resize(static_cast<size_t>(weight_size));
  model.cos.resize(static_cast<size_t>(rope_size));
  model.sin.resize(static_cast<size_t>(rope_size));
  for (int64_t row = 0; row < local; ++row) {
    const int64_t global = rank * local + row;  // inputs are a function of the global row
    for (int64_t c = 0; c < shape.q_rank; ++c) {
      model.qr[static_cast<size_t>(row * shape.q_rank + c)] =
          float_to_bf16(static_cast<float>(small_int(seed, 1, global, c, 5) - 2));
    }
    for (int64_t h = 0; h < shape.heads; ++h) {
      model.weights[static_cast<size_t>(row * shape.heads + h)] =
          static_cast<float>(1 + small_int(seed, 2, global, h, 4));
    }
    for (int64_t i = 0; i < half; ++i) {
      static constexpr float kCos[] = {1, 0, -1, 0};
      static constexpr float kSin[] = {0, 1, 0, -1};
      const int64_t quarter = small_int(seed, 3, global, i, 4);
      model.cos[static_cast<size_t>(row * half + i)] = kCos[quarter];
      model.sin[static_cast<size_t>(row * half + i)] = kSin[quarter];
    }
  }
  model.wq_b.resize(static_cast<size_t>(wq_size));
  for (int64_t r = 0; r < shape.q_rank; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      model.wq_b[static_cast<size_t>(r * width + c)] =
          float_to_bf16(static_cast<float>(small_int(seed, 4, r, c, 3) - 1));
    }
  }
  model.projection.emplace(model.wq_b_view());
  model.keys.resize(static_cast<size_t>(key_size));
  for (int64_t key = 0; key < model.bank; ++key) {
    for (int64_t c = 0; c < shape.head_dim; ++c) {
      model.keys[static_cast<size_t>(key * shape.head_dim + c)] =
          float_to_bf16(static_cast<float>(small_int(seed, 5, key, c, 5) - 2));
    }
  }
  return model;
}

}  // namespace sparsecp::cli
