// The plain reference of the sparse attention kernel (sparse_attention.hpp): loops over rows,
// heads and columns in float64, written to be checked by eye.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/sparse_attention.hpp"

namespace sparsecp {

namespace {

double element(const void* data, AttentionDType dtype, int64_t i) {
  switch (dtype) {
    case AttentionDType::kFloat32:
      return static_cast<const float*>(data)[i];
    case AttentionDType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case AttentionDType::kFloat64:
      return static_cast<const double*>(data)[i];
  }
  return 0.0;
}

double sink_of(const SparseAttentionInputs& in, int64_t h) {
  return in.dtype == AttentionDType::kFloat64 ? static_cast<const double*>(in.sinks)[h]
                                              : static_cast<const float*>(in.sinks)[h];
}

// Logits of row r, head h over its columns (-inf where no key), the largest, and the full
// log-denominator (keys and sink) and the keys-only one.
struct RowSoftmax {
  std::vector<double> logits;
  double lse_keys = 0.0;
  double lse_full = 0.0;
};

RowSoftmax row_softmax(const SparseAttentionInputs& in, int64_t r, int64_t h) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  RowSoftmax s;
  s.logits.assign(static_cast<std::size_t>(in.columns), -kInf);
  double top = -kInf;
  for (int64_t c = 0; c < in.columns; ++c) {
    const int32_t id = in.indices[r * in.columns + c];
    if (id < 0) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < in.qk_dim; ++d) {
      dot += element(in.q, in.dtype, (r * in.heads + h) * in.qk_dim + d) *
             element(in.kv, in.dtype, id * in.qk_dim + d);
    }
    s.logits[static_cast<std::size_t>(c)] = dot * in.scale;
    top = std::max(top, dot * in.scale);
  }
  const double sink = in.sinks != nullptr ? sink_of(in, h) : -kInf;
  double shift = std::max(top, sink);
  if (!std::isfinite(shift)) shift = 0.0;
  double keys = 0.0;
  for (int64_t c = 0; c < in.columns; ++c)
    keys += std::exp(s.logits[static_cast<std::size_t>(c)] - shift);
  const double total = keys + (in.sinks != nullptr ? std::exp(sink - shift) : 0.0);
  s.lse_keys = keys > 0.0 ? shift + std::log(keys) : -kInf;
  s.lse_full = total > 0.0 ? shift + std::log(total) : -kInf;
  return s;
}

double probability(const RowSoftmax& s, int64_t c) {
  const double l = s.logits[static_cast<std::size_t>(c)];
  return std::isfinite(s.lse_full) && l > -std::numeric_limits<double>::infinity()
             ? std::exp(l - s.lse_full)
             : 0.0;
}

}  // namespace

void sparse_attention_reference(const SparseAttentionInputs& in, double* out, double* lse) {
  validate_sparse_attention(in, SparseAttentionConfig{});
  for (int64_t r = 0; r < in.rows; ++r) {
    for (int64_t h = 0; h < in.heads; ++h) {
      const RowSoftmax s = row_softmax(in, r, h);
      lse[r * in.heads + h] = s.lse_keys;
      double* o = out + (r * in.heads + h) * in.value_dim;
      for (int64_t v = 0; v < in.value_dim; ++v) o[v] = 0.0;
      for (int64_t c = 0; c < in.columns; ++c) {
        const int32_t id = in.indices[r * in.columns + c];
        if (id < 0) continue;
        const double p = probability(s, c);
        for (int64_t v = 0; v < in.value_dim; ++v)
          o[v] += p * element(in.kv, in.dtype, id * in.qk_dim + v);
      }
    }
  }
}

void sparse_attention_reference_backward(const SparseAttentionInputs& in, const void* grad_out,
                                         double* grad_q, double* grad_kv, double* grad_sinks) {
  validate_sparse_attention(in, SparseAttentionConfig{});
  for (int64_t i = 0; i < in.rows * in.heads * in.qk_dim; ++i) grad_q[i] = 0.0;
  for (int64_t i = 0; i < in.keys * in.qk_dim; ++i) grad_kv[i] = 0.0;
  if (grad_sinks != nullptr) {
    for (int64_t h = 0; h < in.heads; ++h) grad_sinks[h] = 0.0;
  }
  std::vector<double> out(static_cast<std::size_t>(in.value_dim));
  for (int64_t r = 0; r < in.rows; ++r) {
    for (int64_t h = 0; h < in.heads; ++h) {
      const RowSoftmax s = row_softmax(in, r, h);
      const int64_t head = r * in.heads + h;
      // out and delta = d out . out
      std::fill(out.begin(), out.end(), 0.0);
      for (int64_t c = 0; c < in.columns; ++c) {
        const int32_t id = in.indices[r * in.columns + c];
        if (id < 0) continue;
        for (int64_t v = 0; v < in.value_dim; ++v) {
          out[static_cast<std::size_t>(v)] +=
              probability(s, c) * element(in.kv, in.dtype, id * in.qk_dim + v);
        }
      }
      double delta = 0.0;
      for (int64_t v = 0; v < in.value_dim; ++v) {
        delta +=
            element(grad_out, in.dtype, head * in.value_dim + v) * out[static_cast<std::size_t>(v)];
      }
      for (int64_t c = 0; c < in.columns; ++c) {
        const int32_t id = in.indices[r * in.columns + c];
        if (id < 0) continue;
        const double p = probability(s, c);
        double dp = 0.0;  // d out . v
        for (int64_t v = 0; v < in.value_dim; ++v) {
          const double dout = element(grad_out, in.dtype, head * in.value_dim + v);
          dp += dout * element(in.kv, in.dtype, id * in.qk_dim + v);
          grad_kv[id * in.qk_dim + v] += p * dout;  // through the value
        }
        const double dlogit = p * (dp - delta) * in.scale;
        for (int64_t d = 0; d < in.qk_dim; ++d) {
          grad_q[head * in.qk_dim + d] += dlogit * element(in.kv, in.dtype, id * in.qk_dim + d);
          grad_kv[id * in.qk_dim + d] += dlogit * element(in.q, in.dtype, head * in.qk_dim + d);
        }
      }
      if (grad_sinks != nullptr && in.sinks != nullptr && std::isfinite(s.lse_full)) {
        grad_sinks[h] -= std::exp(sink_of(in, h) - s.lse_full) * delta;
      }
    }
  }
}

}  // namespace sparsecp
