// sparsecp: RowBytes — what one moved query row costs on the wire.
//
// A balanced selection moves each moved row's inputs owner -> worker (low-rank query
// residual, merge weights, RoPE cos/sin) and its top-k key ids worker -> owner. The
// planners that price communication (auto) and the reports that count bytes
// (simulate) size rows with this.
#pragma once

#include <cstdint>
#include <limits>

namespace sparsecp {

// Bytes per moved row, with DeepSeek-V4-like defaults: bf16 low-rank query residual of
// rank 1536, 64 fp32 merge weights, fp32 RoPE cos and sin of 32 each; int32 top-k 512
// key ids come back.
struct RowBytes {
  int64_t qr_rank = 1536;
  int64_t qr_bytes = 2;
  int64_t index_heads = 64;
  int64_t weight_bytes = 4;
  int64_t rope_pairs = 32;
  int64_t rope_bytes = 4;
  int64_t topk = 512;
  int64_t index_bytes = 4;

  // Owner -> worker bytes of one row (3584 with the defaults).
  int64_t input_bytes() const {
    return qr_rank * qr_bytes + index_heads * weight_bytes + 2 * rope_pairs * rope_bytes;
  }
  // Worker -> owner bytes of one row (2048 with the defaults).
  int64_t result_bytes() const { return topk * index_bytes; }

  // Wire bytes of a rank (or a plan) that sends `inputs_sent` rows' inputs and
  // `results_sent` rows' results. Figures for reports: they saturate at INT64_MAX
  // rather than wrap, which only batches of more than ~10^15 moved rows reach.
  int64_t wire_bytes(int64_t inputs_sent, int64_t results_sent) const {
    return saturating_add(saturating_mul(inputs_sent, input_bytes()),
                          saturating_mul(results_sent, result_bytes()));
  }

 private:
  // Both operands are non-negative counts here.
  static int64_t saturating_mul(int64_t a, int64_t b) {
    int64_t value = 0;
    return __builtin_mul_overflow(a, b, &value) ? std::numeric_limits<int64_t>::max() : value;
  }
  static int64_t saturating_add(int64_t a, int64_t b) {
    int64_t value = 0;
    return __builtin_add_overflow(a, b, &value) ? std::numeric_limits<int64_t>::max() : value;
  }
};

}  // namespace sparsecp
