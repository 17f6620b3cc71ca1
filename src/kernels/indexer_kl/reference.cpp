// Plain-loop reference of the indexer KL loss in double: the executable specification
// the fused path is tested against (indexer_kl.hpp gives the math line by line).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "indexer_kl_internal.hpp"

namespace sparsecp {

using kl_detail::element;

double indexer_kl_loss_reference(const IndexerKlInputs& in, const IndexerKlOptions& options,
                                 const IndexerKlGradients& out) {
  const kl_detail::KlShape s = kl_detail::validate_indexer_kl(in, options, &out, true);
  std::fill(out.index_query.begin(), out.index_query.end(), 0.0f);
  std::fill(out.index_key.begin(), out.index_key.end(), 0.0f);
  std::fill(out.merge_weight.begin(), out.merge_weight.end(), 0.0f);
  if (options.loss_coeff == 0.0 || s.batch * s.rows == 0) return 0.0;

  const int64_t H = s.heads, D = s.head_dim, Hm = s.att_heads, Dm = s.att_dim, T = s.topk;
  const double c = options.loss_coeff / static_cast<double>(s.batch * s.rows);
  const double tiny = FLT_MIN;
  std::vector<double> grad_key(out.index_key.size(), 0.0);
  double total = 0.0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.rows; ++t) {
      const int64_t row = b * s.rows + t;
      std::vector<int64_t> slots;  // compact-bank key of every valid slot, in slot order
      for (int64_t j = 0; j < T; ++j) {
        const int64_t id = in.topk_indices.at(row * T + j);
        if (id != -1) slots.push_back(id - s.offset);
      }
      if (slots.empty()) continue;
      const auto n = static_cast<int64_t>(slots.size());
      const auto q = [&](int64_t h, int64_t d) {
        return double{element(in.index_query, (row * H + h) * D + d)};
      };
      const auto kidx = [&](int64_t key, int64_t d) {
        return double{element(in.index_key, (b * s.index_keys + s.offset + key) * D + d)};
      };
      const auto w = [&](int64_t h) { return double{element(in.merge_weight, row * H + h)}; };

      // Teacher: per head softmax with the sink column, sink dropped, summed, normalised.
      std::vector<double> p(static_cast<size_t>(n), 0.0);
      for (int64_t hm = 0; hm < Hm; ++hm) {
        const double sink = element(in.sinks, hm);
        std::vector<double> logits(static_cast<size_t>(n));
        double top = sink;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < Dm; ++d) {
            dot += double{element(in.attention_query, ((b * Hm + hm) * s.rows + t) * Dm + d)} *
                   double{element(in.compressed_key, (b * s.keys + slots[j]) * Dm + d)};
          }
          logits[j] = options.attention_scale * dot;
          top = std::max(top, logits[j]);
        }
        double z = std::exp(sink - top);
        for (const double l : logits) z += std::exp(l - top);
        for (int64_t j = 0; j < n; ++j) p[j] += std::exp(logits[j] - top) / z;
      }
      double mass = 0.0;
      for (const double v : p) mass += v;
      for (double& v : p) v /= std::max(mass, tiny);

      // Student: weighted ReLU scores and their log-softmax.
      std::vector<double> dots(static_cast<size_t>(n * H));
      std::vector<double> score(static_cast<size_t>(n), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += q(h, d) * kidx(slots[j], d);
          dots[j * H + h] = dot;
          score[j] += w(h) * std::max(dot, 0.0);
        }
      }
      const double top = *std::max_element(score.begin(), score.end());
      double sum = 0.0;
      for (const double v : score) sum += std::exp(v - top);
      const double log_sum = top + std::log(sum);

      // Loss and gradients.
      std::vector<double> g(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        total += p[j] * (std::log(std::max(p[j], tiny)) - (score[j] - log_sum));
        g[j] = (std::exp(score[j] - log_sum) - p[j]) * c;
      }
      for (int64_t h = 0; h < H; ++h) {
        double dw = 0.0;
        std::vector<double> dq(static_cast<size_t>(D), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double dot = dots[j * H + h];
          dw += g[j] * std::max(dot, 0.0);
          // As the torch formulation: dz = g * w * [dot > 0], a product (so a NaN g or w
          // gives NaN even where the mask is 0), and dense (an inactive slot adds 0 * Kidx
          // and 0 * q, so an Inf there gives NaN).
          const double dz = g[j] * w(h) * (dot > 0.0 ? 1.0 : 0.0);
          const int64_t key_row = b * s.index_keys + s.offset + slots[j];
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += dz * kidx(slots[j], d);
            grad_key[key_row * D + d] += dz * q(h, d);
          }
        }
        out.merge_weight[row * H + h] = static_cast<float>(dw);
        for (int64_t d = 0; d < D; ++d) {
          out.index_query[(row * H + h) * D + d] = static_cast<float>(dq[d]);
        }
      }
    }
  }
  for (size_t i = 0; i < grad_key.size(); ++i) out.index_key[i] = static_cast<float>(grad_key[i]);
  return total * c;
}

}  // namespace sparsecp
