// sparsecp CLI (`run`): the seeded model tensors of the main job.
//
// Every rank owns one contiguous shard of a packed batch: its low-rank query residuals,
// merge weights and RoPE rows, and the tensors every rank holds (Wq_b and the whole
// compressed Index K bank). Values are seeded small integers (qr, Wq_b and keys in a few
// integers, RoPE rotations by multiples of 90 degrees), a function of (seed, global row),
// so every score is exact and a row's top-k cannot depend on where it was computed;
// kernels/select.hpp guarantees the same for real values, the integers only make a
// mismatch impossible to excuse.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model_flags.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/transport/exchange.hpp"

namespace sparsecp::cli {

struct RunModel {
  SelectConfig config;
  int64_t q_rank = 0;
  int64_t local = 0;                     // rows per rank
  int64_t bank = 0;                      // compressed keys of the whole batch
  std::vector<uint16_t> qr;              // [local, q_rank] bf16
  std::vector<float> weights, cos, sin;  // [local, heads], [local, rope_dim / 2] x 2
  std::vector<uint16_t> wq_b;            // [q_rank, heads * head_dim] bf16
  std::vector<uint16_t> keys;            // [bank, head_dim] bf16
  // Wq_b prepared once for every selection of the run (views `wq_b`: RunModel is
  // move-only in spirit; a move keeps the viewed buffer).
  std::optional<ProjectionWeights> projection;

  // The owner inputs of this rank as the exchange takes them.
  IndexerInputs inputs() const;
  MatrixView wq_b_view() const;
  MatrixView keys_view() const;
};

// Builds rank `rank`'s model. Every buffer size is checked for 64-bit overflow and
// against the machine's memory before anything is allocated (an Error naming the
// sizes, never undefined behaviour).
RunModel make_run_model(const ModelFlags& shape, int64_t ratio, int threads, uint64_t seed,
                        std::span<const int64_t> lengths, int64_t rank, int64_t local);

}  // namespace sparsecp::cli
