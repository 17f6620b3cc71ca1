// Plain-loop reference of the worker-side selection: the executable specification
// the fast path is tested against. Kept deliberately simple; speed does not matter.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "select_internal.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"

namespace sparsecp {

using select_detail::element;

void project_index_query_reference(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                                   const SelectConfig& config, std::span<float> q_out,
                                   WeightLayout layout) {
  const int64_t width =
      select_detail::validate_projection(qr, wq_b, cos, sin, config, q_out, layout);
  const bool bf16 = qr.dtype == DType::kBFloat16;
  const int64_t rank = qr.cols;
  for (int64_t t = 0; t < qr.rows; ++t) {
    float* row = q_out.data() + t * width;
    for (int64_t c = 0; c < width; ++c) {
      float sum = 0.0f;
      for (int64_t r = 0; r < rank; ++r) {
        const float w = layout == WeightLayout::kInOut ? element(wq_b, r, c) : element(wq_b, c, r);
        sum += element(qr, t, r) * w;
      }
      row[c] = bf16 ? round_to_bf16(sum) : sum;
    }
    // RoPE, interleaved pairs on the trailing rope_dim channels of every head.
    const int64_t first = config.head_dim - config.rope_dim;
    for (int64_t h = 0; h < config.heads; ++h) {
      float* head = row + h * config.head_dim;
      for (int64_t i = 0; i < config.rope_dim / 2; ++i) {
        const float c = element(cos, t, i);
        const float s = element(sin, t, i);
        const float x0 = head[first + 2 * i];
        const float x1 = head[first + 2 * i + 1];
        const float y0 = x0 * c - x1 * s;
        const float y1 = x1 * c + x0 * s;
        head[first + 2 * i] = bf16 ? round_to_bf16(y0) : y0;
        head[first + 2 * i + 1] = bf16 ? round_to_bf16(y1) : y1;
      }
    }
  }
}

void select_topk_reference(MatrixView q, MatrixView weights, MatrixView keys,
                           std::span<const Segment> segments, const SelectConfig& config,
                           std::span<int32_t> out) {
  const auto plan = select_detail::validate_select(q, weights, keys, segments, config, out);
  std::fill(out.begin(), out.end(), -1);
  if (!plan) return;
  const bool bf16 = keys.dtype == DType::kBFloat16;
  const int64_t dim = config.head_dim;
  std::vector<float> query(static_cast<size_t>(config.heads * dim));
  std::vector<uint64_t> candidates;
  for (const TndSequence& sequence : plan->sequences()) {
    for (int64_t t = sequence.row_begin; t < sequence.row_end; ++t) {
      const int64_t position = sequence.first_position + (t - sequence.row_begin);
      const int64_t visible = TndPlan::visible_keys(position, config.ratio);
      for (int64_t c = 0; c < config.heads * dim; ++c) {
        const float value = element(q, t, c);
        query[static_cast<size_t>(c)] = bf16 ? round_to_bf16(value) : value;
      }
      candidates.clear();
      for (int64_t s = sequence.key_begin; s < sequence.key_begin + visible; ++s) {
        float score = 0.0f;
        for (int64_t h = 0; h < config.heads; ++h) {
          float dot = 0.0f;
          for (int64_t d = 0; d < dim; ++d) {
            dot += query[static_cast<size_t>(h * dim + d)] * element(keys, s, d);
          }
          score += element(weights, t, h) * (dot < 0.0f ? 0.0f : dot);
        }
        candidates.push_back(select_detail::candidate(score, s));
      }
      std::sort(candidates.begin(), candidates.end(), std::greater<>());
      const int64_t kept = std::min<int64_t>(config.topk, visible);
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < kept; ++i) {
        ids.push_back(select_detail::candidate_key(candidates[static_cast<size_t>(i)]));
      }
      std::sort(ids.begin(), ids.end());
      std::copy(ids.begin(), ids.end(), out.begin() + t * config.topk);
    }
  }
}

void select_worker_rows_reference(MatrixView qr, MatrixView weights, MatrixView cos, MatrixView sin,
                                  MatrixView wq_b, MatrixView keys,
                                  std::span<const Segment> segments, const SelectConfig& config,
                                  std::span<int32_t> out, WeightLayout layout) {
  validate_select_config(config);
  SPARSECP_CHECK(qr.rows >= 0 && qr.rows <= INT64_MAX / 4 / (config.heads * config.head_dim),
                 "Indexer query residual rows ", qr.rows, " out of range");
  std::vector<float> q(static_cast<size_t>(qr.rows * config.heads * config.head_dim));
  project_index_query_reference(qr, wq_b, cos, sin, config, q, layout);
  select_topk_reference(MatrixView::f32(q.data(), qr.rows, config.heads * config.head_dim), weights,
                        keys, segments, config, out);
}

}  // namespace sparsecp
