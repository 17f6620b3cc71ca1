// Input checks shared by the fused indexer KL loss, its reference and the size queries.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "indexer_kl_internal.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp::kl_detail {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream text;
  text << "[";
  for (size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << "]";
  return text.str();
}

// Element count of a shape; throws unless every extent is non-negative and the byte
// count (8 bytes an element, the widest type involved) fits int64.
int64_t elements(const std::vector<int64_t>& shape, const char* name) {
  int64_t count = 1;
  for (const int64_t extent : shape) {
    SPARSECP_CHECK(extent >= 0, "Indexer KL ", name, " has a negative extent: shape ",
                   shape_text(shape));
    SPARSECP_CHECK(!__builtin_mul_overflow(count, extent, &count) &&
                       count <= std::numeric_limits<int64_t>::max() / 8,
                   "Indexer KL ", name, " shape ", shape_text(shape), " is too large");
  }
  return count;
}

void check_float(const TensorView& view, const char* name, size_t rank, const char* layout) {
  SPARSECP_CHECK(view.shape.size() == rank, "Indexer KL ", name, " must have shape ", layout,
                 ", got ", shape_text(view.shape));
  const int64_t count = elements(view.shape, name);
  SPARSECP_CHECK(view.dtype == DType::kFloat32 || view.dtype == DType::kBFloat16, "Indexer KL ",
                 name, " must be float32 or bfloat16");
  SPARSECP_CHECK(view.data != nullptr || count == 0, "Indexer KL ", name, " has no data for shape ",
                 shape_text(view.shape));
}

void check_span(std::span<float> span, int64_t expected, const char* name,
                const std::vector<int64_t>& shape) {
  SPARSECP_CHECK(static_cast<int64_t>(span.size()) == expected, "Indexer KL ", name,
                 " gradient holds ", span.size(), " floats, expected ", expected, " (shape ",
                 shape_text(shape), ")");
  SPARSECP_CHECK(span.data() != nullptr || expected == 0, "Indexer KL ", name,
                 " gradient has no memory");
}

void check_options(const IndexerKlOptions& options) {
  SPARSECP_CHECK(options.threads >= 0, "Indexer KL thread count must be non-negative, got ",
                 options.threads);
  (void)resolve_kernel_isa(options.isa);  // throws for an ISA (or SPARSECP_ISA) the CPU lacks
  SPARSECP_CHECK(std::isfinite(options.attention_scale) &&
                     std::abs(options.attention_scale) <= std::numeric_limits<float>::max(),
                 "Indexer KL attention_scale must be finite (in float32), got ",
                 options.attention_scale);
  SPARSECP_CHECK(std::isfinite(options.loss_coeff), "Indexer KL loss_coeff must be finite, got ",
                 options.loss_coeff);
  SPARSECP_CHECK(options.main_key_offset >= 0,
                 "Indexer KL main_key_offset must be non-negative, got ", options.main_key_offset);
}

// The indexer's tensors (the seed's validate_indexer_tensors(query, key, weights)).
void check_indexer_tensors(const IndexerKlInputs& in, KlShape& s) {
  check_float(in.index_query, "index_query", 4, "[B, S, H, D]");
  check_float(in.index_key, "index_key", 3, "[B, K, D]");
  check_float(in.merge_weight, "merge_weight", 3, "[B, S, H]");
  s.batch = in.index_query.shape[0];
  s.rows = in.index_query.shape[1];
  s.heads = in.index_query.shape[2];
  s.head_dim = in.index_query.shape[3];
  s.index_keys = in.index_key.shape[1];
  SPARSECP_CHECK(s.heads >= 1 && s.head_dim >= 1,
                 "Indexer KL index_query needs at least one head and one channel, got shape ",
                 shape_text(in.index_query.shape));
  SPARSECP_CHECK(in.index_key.shape[0] == s.batch && in.index_key.shape[2] == s.head_dim,
                 "Indexer KL index_key must have shape [B, K, D] = [", s.batch, ", K, ", s.head_dim,
                 "] (B and D of index_query), got ", shape_text(in.index_key.shape));
  SPARSECP_CHECK(in.merge_weight.shape == std::vector<int64_t>({s.batch, s.rows, s.heads}),
                 "Indexer KL merge_weight must have shape [B, S, H] = [", s.batch, ", ", s.rows,
                 ", ", s.heads, "] (from index_query), got ", shape_text(in.merge_weight.shape));
}

// The seed's fused-KL checks on the selections.
void check_selection_shape(const IndexerKlInputs& in, KlShape& s) {
  const IndexTensorView& ids = in.topk_indices;
  SPARSECP_CHECK(ids.shape.size() == 3 && ids.shape[0] == s.batch && ids.shape[1] == s.rows,
                 "Fused KL indices must have shape [B, Q, TopK] matching Indexer Q: "
                 "topk_indices and index_query must share batch/query dimensions (got "
                 "topk_indices ",
                 shape_text(ids.shape), " and index_query ", shape_text(in.index_query.shape), ")");
  SPARSECP_CHECK(ids.dtype == IndexDType::kInt32 || ids.dtype == IndexDType::kInt64,
                 "Indexer KL topk_indices must be int32 or int64");
  SPARSECP_CHECK(ids.data != nullptr || elements(ids.shape, "topk_indices") == 0,
                 "Indexer KL topk_indices has no data");
  s.topk = ids.shape[2];
}

// The teacher's tensors and the compact bank's view of index_key.
void check_teacher_tensors(const IndexerKlInputs& in, KlShape& s, bool any_topk) {
  check_float(in.compressed_key, "compressed_key", 3, "[B, K, Dm]");
  check_float(in.attention_query, "attention_query", 4, "[B, Hm, S, Dm]");
  check_float(in.sinks, "sinks", 1, "[Hm]");
  s.keys = in.compressed_key.shape[1];
  s.att_dim = in.compressed_key.shape[2];
  if (any_topk) {
    SPARSECP_CHECK(s.keys >= 1 && s.topk >= 1 && s.topk <= 512,
                   "Fused KL takes 1 <= TopK <= 512 ids per row over K >= 1 keys; got K=", s.keys,
                   ", TopK=", s.topk);
  } else {
    SPARSECP_CHECK(s.keys >= 1 && std::min<int64_t>(512, s.keys) <= s.topk && s.topk <= 512,
                   "Fused KL requires ordinary TopK512 selections, allowing padding for a compact "
                   "bank; got K=",
                   s.keys, ", TopK=", s.topk);
  }
  SPARSECP_CHECK(in.compressed_key.shape[0] == s.batch && s.att_dim >= 1,
                 "Indexer KL compressed_key must have shape [B, K, Dm] with B = ", s.batch,
                 " and Dm >= 1, got ", shape_text(in.compressed_key.shape));
  s.att_heads = in.attention_query.shape[1];
  SPARSECP_CHECK(
      in.attention_query.shape[0] == s.batch && s.att_heads >= 1 &&
          in.attention_query.shape[2] == s.rows && in.attention_query.shape[3] == s.att_dim,
      "Indexer KL attention_query must have shape [B, Hm, S, Dm] = [", s.batch, ", Hm, ", s.rows,
      ", ", s.att_dim, "] (head-major; B, S of index_query, Dm of compressed_key, Hm >= 1), got ",
      shape_text(in.attention_query.shape));
  SPARSECP_CHECK(in.sinks.shape[0] == s.att_heads, "Indexer KL sinks must have shape [Hm] = [",
                 s.att_heads, "] (one logit per attention head), got ", shape_text(in.sinks.shape));
  SPARSECP_CHECK(s.offset <= s.index_keys && s.keys <= s.index_keys - s.offset,
                 "Indexer KL index_key has ", s.index_keys, " rows, fewer than main_key_offset ",
                 s.offset, " + the compact bank's K = ", s.keys,
                 " (compressed_key rows) that its view needs");
  constexpr int64_t kWidthLimit = int64_t{1} << 30;
  SPARSECP_CHECK(s.heads <= kWidthLimit / s.head_dim && s.att_heads <= kWidthLimit / s.att_dim,
                 "Indexer KL heads x head_dim (", s.heads, " x ", s.head_dim, ", ", s.att_heads,
                 " x ", s.att_dim, ") is too large");
}

void check_gradients(const IndexerKlInputs& in, const IndexerKlGradients& gradients) {
  check_span(gradients.index_query, elements(in.index_query.shape, "index_query"), "index_query",
             in.index_query.shape);
  check_span(gradients.index_key, elements(in.index_key.shape, "index_key"), "index_key",
             in.index_key.shape);
  check_span(gradients.merge_weight, elements(in.merge_weight.shape, "merge_weight"),
             "merge_weight", in.merge_weight.shape);
}

// Every id is -1 (padding) or a key of the compact bank.
void check_id_range(const IndexTensorView& ids, const KlShape& s) {
  const int64_t id_count = elements(ids.shape, "topk_indices");
  const int64_t low = s.offset, high = s.offset + s.keys;
  for (int64_t i = 0; i < id_count; ++i) {
    const int64_t id = ids.at(i);
    if (id == -1 || (id >= low && id < high)) continue;
    const int64_t slot = i % s.topk, row = i / s.topk % s.rows, b = i / s.topk / s.rows;
    if (s.offset == 0) {
      SPARSECP_FAIL("Indexer KL topk id ", id, " at [", b, ", ", row, ", ", slot,
                    "] is outside the bank's keys [0, ", high, ") (use -1 for padding)");
    }
    SPARSECP_FAIL("Indexer KL topk id ", id, " at [", b, ", ", row, ", ", slot,
                  "] is outside the compact bank's keys [main_key_offset, main_key_offset + K) "
                  "= [",
                  low, ", ", high, ") (use -1 for padding)");
  }
}

}  // namespace

KlShape validate_indexer_kl(const IndexerKlInputs& in, const IndexerKlOptions& options,
                            const IndexerKlGradients* gradients, bool check_ids) {
  check_options(options);
  KlShape s;
  s.offset = options.main_key_offset;
  check_indexer_tensors(in, s);
  check_selection_shape(in, s);
  check_teacher_tensors(in, s, options.any_topk);
  if (gradients) check_gradients(in, *gradients);
  if (check_ids && options.loss_coeff != 0.0) check_id_range(in.topk_indices, s);
  return s;
}

}  // namespace sparsecp::kl_detail
