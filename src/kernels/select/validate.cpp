// Input checks shared by the fast selection path and its reference.
#include <algorithm>
#include <limits>
#include <vector>

#include "select_internal.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp {

void validate_select_config(const SelectConfig& c) {
  SPARSECP_CHECK(c.heads >= 1, "Indexer head count must be positive, got ", c.heads);
  SPARSECP_CHECK(c.head_dim >= 1, "Indexer head_dim must be positive, got ", c.head_dim);
  SPARSECP_CHECK(c.topk >= 1, "Indexer topk must be positive, got ", c.topk);
  SPARSECP_CHECK(c.ratio >= 1, "Indexer compression ratio must be positive, got ", c.ratio);
  SPARSECP_CHECK(c.threads >= 0, "Indexer thread count must be non-negative, got ", c.threads);
  SPARSECP_CHECK(c.threads <= kMaxSelectThreads, "Indexer thread count ", c.threads,
                 " exceeds the supported maximum ", kMaxSelectThreads);
  (void)resolve_kernel_isa(c.isa);  // throws for an ISA (or SPARSECP_ISA) the CPU lacks
  constexpr int64_t kLimit = int64_t{1} << 24;
  SPARSECP_CHECK(c.heads <= kLimit && c.head_dim <= kLimit && c.heads * c.head_dim <= kLimit,
                 "Indexer heads x head_dim ", c.heads, " x ", c.head_dim, " is too large");
  SPARSECP_CHECK(c.topk <= std::numeric_limits<int32_t>::max(), "Indexer topk ", c.topk,
                 " is too large");
}

namespace select_detail {
namespace {

void check_view(MatrixView view, const char* name) {
  SPARSECP_CHECK(view.rows >= 0 && view.cols >= 0, "Indexer ", name, " has a negative shape [",
                 view.rows, ", ", view.cols, "]");
  SPARSECP_CHECK(view.cols == 0 || view.rows <= std::numeric_limits<int64_t>::max() / 4 / view.cols,
                 "Indexer ", name, " shape [", view.rows, ", ", view.cols, "] is too large");
  SPARSECP_CHECK(view.data != nullptr || view.rows * view.cols == 0, "Indexer ", name,
                 " has no data for shape [", view.rows, ", ", view.cols, "]");
  SPARSECP_CHECK(view.dtype == DType::kFloat32 || view.dtype == DType::kBFloat16, "Indexer ", name,
                 " has an unknown dtype");
}

}  // namespace

std::optional<TndPlan> validate_select(MatrixView q, MatrixView weights, MatrixView keys,
                                       std::span<const Segment> segments,
                                       const SelectConfig& config, std::span<int32_t> out) {
  validate_select_config(config);
  check_view(q, "query");
  check_view(weights, "weights");
  check_view(keys, "keys");
  const int64_t width = config.heads * config.head_dim;
  SPARSECP_CHECK(q.cols == width, "Indexer query width ", q.cols,
                 " does not match heads x head_dim ", config.heads, " x ", config.head_dim);
  SPARSECP_CHECK(weights.rows == q.rows && weights.cols == config.heads,
                 "Indexer merge weights must have shape [", q.rows, ", ", config.heads, "], got [",
                 weights.rows, ", ", weights.cols, "]");
  SPARSECP_CHECK(keys.cols == config.head_dim, "Indexer keys have head_dim ", keys.cols,
                 " but the query has head_dim ", config.head_dim);
  SPARSECP_CHECK(keys.rows < std::numeric_limits<int32_t>::max(), "Indexer key bank of ", keys.rows,
                 " keys does not fit int32 ids");
  SPARSECP_CHECK(static_cast<int64_t>(out.size()) / config.topk == q.rows &&
                     static_cast<int64_t>(out.size()) % config.topk == 0,
                 "Indexer output holds ", out.size(), " ids, expected rows x topk = ", q.rows,
                 " x ", config.topk);
  auto plan = csa_tnd_plan(segments, config.ratio);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    SPARSECP_CHECK(s.q_end <= q.rows, "Indexer segment ", i, " rows [", s.q_begin, ", ", s.q_end,
                   ") exceed the ", q.rows, " query rows");
    SPARSECP_CHECK(s.key_end <= keys.rows, "Indexer segment ", i, " keys [", s.key_begin, ", ",
                   s.key_end, ") exceed the bank of ", keys.rows, " keys");
    if (s.q_end > s.q_begin) ranges.emplace_back(s.q_begin, s.q_end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    SPARSECP_CHECK(ranges[i - 1].second <= ranges[i].first, "Indexer segments overlap: rows [",
                   ranges[i - 1].first, ", ", ranges[i - 1].second, ") and [", ranges[i].first,
                   ", ", ranges[i].second, ")");
  }
  return plan;
}

int64_t validate_projection(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                            const SelectConfig& config, std::span<float> q_out,
                            WeightLayout layout) {
  const int64_t width = validate_projection_inputs(qr, wq_b, cos, sin, config, layout);
  SPARSECP_CHECK(static_cast<int64_t>(q_out.size()) == qr.rows * width,
                 "Indexer query output holds ", q_out.size(),
                 " values, expected rows x width = ", qr.rows, " x ", width);
  return width;
}

int64_t validate_projection_inputs(MatrixView qr, MatrixView wq_b, MatrixView cos, MatrixView sin,
                                   const SelectConfig& config, WeightLayout layout) {
  validate_select_config(config);
  SPARSECP_CHECK(
      config.rope_dim >= 0 && config.rope_dim % 2 == 0 && config.rope_dim <= config.head_dim,
      "Indexer rope_dim ", config.rope_dim, " must be even and within [0, head_dim ",
      config.head_dim, "]");
  check_view(qr, "query residual");
  check_view(wq_b, "wq_b");
  check_view(cos, "cos");
  check_view(sin, "sin");
  SPARSECP_CHECK(qr.dtype == wq_b.dtype, "Indexer query residual dtype ", dtype_name(qr.dtype),
                 " does not match wq_b dtype ", dtype_name(wq_b.dtype));
  SPARSECP_CHECK(layout == WeightLayout::kInOut || layout == WeightLayout::kOutIn,
                 "Indexer wq_b has an unknown layout");
  const int64_t rank = layout == WeightLayout::kInOut ? wq_b.rows : wq_b.cols;
  const int64_t width = layout == WeightLayout::kInOut ? wq_b.cols : wq_b.rows;
  SPARSECP_CHECK(rank == qr.cols, "Indexer wq_b input dimension ", rank,
                 " does not match the query residual rank ", qr.cols);
  SPARSECP_CHECK(width % config.head_dim == 0, "Indexer query width ", width,
                 " is not divisible by head_dim ", config.head_dim);
  SPARSECP_CHECK(width / config.head_dim == config.heads, "Indexer query width ", width, " gives ",
                 width / config.head_dim, " heads of head_dim ", config.head_dim, ", expected ",
                 config.heads);
  const int64_t pairs = config.rope_dim / 2;
  SPARSECP_CHECK(
      cos.rows == qr.rows && cos.cols == pairs && sin.rows == qr.rows && sin.cols == pairs,
      "Indexer cos/sin must have shape [", qr.rows, ", ", pairs, "] (rope_dim ", config.rope_dim,
      " / 2), got [", cos.rows, ", ", cos.cols, "] and [", sin.rows, ", ", sin.cols, "]");
  return width;
}

}  // namespace select_detail
SelectConfig make_select_config(int64_t heads, int64_t head_dim, int64_t rope_dim, int64_t topk,
                                int64_t ratio, int threads, KernelIsa isa) {
  const SelectConfig config{.heads = heads,
                            .head_dim = head_dim,
                            .rope_dim = rope_dim,
                            .topk = topk,
                            .ratio = ratio,
                            .threads = threads,
                            .isa = isa};
  validate_select_config(config);
  return config;
}

}  // namespace sparsecp
