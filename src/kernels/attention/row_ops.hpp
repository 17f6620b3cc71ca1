// Private to the sparse attention kernel: the per-row softmax passes, one implementation
// (row_ops.inc) compiled once per ISA (row_ops_<isa>.cpp, each with its own flags) so the
// compiler vectorises the same loops for AVX-512, AVX2+FMA and the portable baseline.
#pragma once

#include <cstdint>

namespace sparsecp::attention_detail {

// One query row's scores, column-major over heads: logits[c * heads + h] for column c
// (id ids[c], -1: no key) and head h. Keeping heads innermost lets every pass run in vectors
// of heads, and lets the products read the gathered keys as their row-major left operand.
struct RowScores {
  const float* logits = nullptr;  // [columns, heads]: q . k, unscaled
  int64_t heads = 0;
  int64_t columns = 0;
  const int32_t* ids = nullptr;
  float scale = 1.0f;
};

// One query row's kv rows where they lie, for the direct products (float32, 1, 2, 4 or 8
// heads: direct_heads): row c is kv + ids[c] * qk_dim, none where ids[c] is -1.
struct DirectRow {
  const float* kv = nullptr;  // [keys, qk_dim]
  const int32_t* ids = nullptr;
  int64_t columns = 0;
  int64_t heads = 0;
  int64_t qk_dim = 0;
};

inline bool direct_heads(int64_t heads) {
  return heads == 1 || heads == 2 || heads == 4 || heads == 8;
}

struct RowOps {
  // Forward: probs[c, h] = exp(scale * l - L_h) on valid columns (0 elsewhere), with
  // L_h = log(sum_c exp(scale * l) + exp(sinks[h])) (sinks may be null); lse[h] = the log
  // over the keys only (-inf with no key). work: 2 * heads floats.
  void (*softmax)(const RowScores& s, const float* sinks, float* probs, float* lse, float* work);
  // Backward: probs[c, h] = exp(scale * l - full[h]) on valid columns (0 elsewhere; 0 where
  // full[h] is -inf), then grad[c, h] = probs * (dprobs[c, h] - delta[h]) * scale.
  void (*logit_gradient)(const RowScores& s, const float* full, const float* dprobs,
                         const float* delta, float* probs, float* grad);
  // The element loops around the products, vectorised with the ISA's flags:
  // table[ids[c]][lo, hi) += rows[c][lo, hi) for the columns with an id, in column order (the
  // scatter of one query row's kv-row gradients: one call a row, not one a column);
  void (*scatter_add)(const float* rows, const int32_t* ids, int64_t columns, int64_t dim,
                      int64_t lo, int64_t hi, float* table);
  // rows[c] = table[ids[c]] (zeros for -1), rows of `row_bytes` bytes, any element type (the
  // gather of a query row's kv rows: inline copies where a memcpy call a column cost as much
  // as the copy at 64 x 4 bytes a row);
  void (*gather_bytes)(const unsigned char* table, const int32_t* ids, int64_t columns,
                       int64_t row_bytes, unsigned char* rows);
  // bf16 -> float32 (exact) and float32 -> bf16 (nearest even, NaN kept: bf16.hpp's rules);
  void (*widen)(const uint16_t* from, int64_t n, float* to);
  void (*narrow)(const float* from, int64_t n, uint16_t* to);
  // sum_i a[i] * b[i] in float32, a and b float32 or bf16 (Delta = rowsum(d out * out)).
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*dot_bf16)(const uint16_t* a, const uint16_t* b, int64_t n);
  // The direct products of one row (direct_rows.inc), a [heads, dim] row-major:
  // out[c, h] = kv row c [0, dim) . a[h] (0 for a column with no key): logits (a = q, dim =
  // qk_dim) and d probs (a = d out, dim = value_dim);
  void (*direct_dots)(const DirectRow& row, const float* a, int64_t dim, float* out);
  // out[h][0, dim) = sum over listed columns, in order, of weights[c, h] * kv row c [0, dim):
  // the output (weights = probs, dim = value_dim) and d q (weights = the logit gradient);
  void (*direct_weighted_sum)(const DirectRow& row, const float* weights, int64_t dim, float* out);
  // each listed column's kv-row gradient, sum over heads in order of grad[c, h] * q[h] +
  // probs[c, h] * dout[h] (q, dout [heads, qk_dim], dout zero beyond value_dim), added into
  // to[ids[c]] (into_table: the table, in column order) or stored as to[c] (a block's slot).
  void (*direct_key_gradient)(const DirectRow& row, const float* grad, const float* probs,
                              const float* q, const float* dout, float* to, bool into_table);
};

RowOps row_ops_portable();
RowOps row_ops_avx2();    // -mavx2 -mfma
RowOps row_ops_avx512();  // -mavx512f ...

}  // namespace sparsecp::attention_detail
