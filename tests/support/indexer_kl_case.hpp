// Test helper for the indexer KL loss: a seeded random case (every float tensor held
// as fp32 and as bf16 with the same values), its views, and error measures.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/indexer_kl.hpp"
#include "sparsecp/planning/workload.hpp"
#include "support/random_batch.hpp"

namespace sparsecp::testing {

// A float tensor stored as bf16-exact fp32 values and as their bf16 bits.
struct KlTensor {
  std::vector<int64_t> shape;
  std::vector<float> f32;
  std::vector<uint16_t> b16;

  TensorView view(DType dtype) const {
    return {dtype == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                     : static_cast<const void*>(b16.data()),
            dtype, shape};
  }
  int64_t size() const { return static_cast<int64_t>(f32.size()); }
  void set(size_t i, float value) {
    b16[i] = float_to_bf16(value);
    f32[i] = bf16_to_float(b16[i]);
  }
};

// Uniform reals in [-scale, scale) rounded to bf16; with `grid`, multiples of 1/8 in
// [-1, 1] instead (so that every dot product of two such tensors over up to 2^16
// channels is exact in fp32 as in double, and a ReLU mask [dot > 0] is the same bit).
inline KlTensor random_kl_tensor(SplitMix64& random, std::vector<int64_t> shape, double scale,
                                 bool grid = false) {
  KlTensor t{std::move(shape), {}, {}};
  int64_t count = 1;
  for (const int64_t extent : t.shape) count *= extent;
  t.f32.resize(static_cast<size_t>(count));
  t.b16.resize(static_cast<size_t>(count));
  for (size_t i = 0; i < t.f32.size(); ++i) {
    t.set(i, grid ? static_cast<float>(static_cast<int>(random.next() % 17) - 8) / 8.0f
                  : static_cast<float>(scale * (2.0 * random.uniform() - 1.0)));
  }
  return t;
}

struct KlShapeSpec {
  int64_t batch, rows, heads, head_dim, att_heads, att_dim, keys, topk;
  int64_t offset = 0;       // main_key_offset
  int64_t extra_keys = 0;   // index_key rows past the compact bank's view
  double padding = 0.2;     // probability of a -1 slot
  double empty_rows = 0.1;  // probability of a row of all -1
  double duplicates = 0.1;  // probability that a slot repeats an earlier slot's id
};

struct KlCase {
  KlShapeSpec spec;
  KlTensor index_query, index_key, merge_weight, attention_query, compressed_key, sinks;
  std::vector<int32_t> ids32;
  std::vector<int64_t> ids64;
  double attention_scale = 1.0;

  IndexerKlInputs inputs(DType dtype, IndexDType id_dtype = IndexDType::kInt32) const {
    IndexerKlInputs in;
    in.index_query = index_query.view(dtype);
    in.index_key = index_key.view(dtype);
    in.merge_weight = merge_weight.view(dtype);
    in.attention_query = attention_query.view(dtype);
    in.compressed_key = compressed_key.view(dtype);
    in.sinks = sinks.view(dtype);
    in.topk_indices = {id_dtype == IndexDType::kInt32 ? static_cast<const void*>(ids32.data())
                                                      : static_cast<const void*>(ids64.data()),
                       id_dtype,
                       {spec.batch, spec.rows, spec.topk}};
    return in;
  }
  void set_id(size_t i, int64_t id) {
    ids32[i] = static_cast<int32_t>(id);
    ids64[i] = id;
  }
};

// Student q and Kidx on the 1/8 grid (exact dot products: the fused and the reference
// path see the same ReLU masks), every other tensor real; ids uniform over the compact bank (global
// ids, i.e. shifted up by the offset) with -1 padding, empty rows and duplicates per the spec.
inline KlCase random_kl_case(SplitMix64& random, const KlShapeSpec& spec) {
  KlCase c;
  c.spec = spec;
  const int64_t index_keys = spec.offset + spec.keys + spec.extra_keys;
  c.index_query =
      random_kl_tensor(random, {spec.batch, spec.rows, spec.heads, spec.head_dim}, 1.0, true);
  c.index_key = random_kl_tensor(random, {spec.batch, index_keys, spec.head_dim}, 1.0, true);
  // Merge weights as the model scales them: head_dim^-1/2 * heads^-1/2 (times a
  // random factor, positive and negative).
  c.merge_weight =
      random_kl_tensor(random, {spec.batch, spec.rows, spec.heads},
                       4.0 / std::sqrt(static_cast<double>(spec.head_dim * spec.heads)));
  c.attention_query =
      random_kl_tensor(random, {spec.batch, spec.att_heads, spec.rows, spec.att_dim}, 1.0);
  c.compressed_key = random_kl_tensor(random, {spec.batch, spec.keys, spec.att_dim}, 1.0);
  c.sinks = random_kl_tensor(random, {spec.att_heads}, 2.0);
  c.attention_scale = 2.0 / std::sqrt(static_cast<double>(spec.att_dim));
  const auto count = static_cast<size_t>(spec.batch * spec.rows * spec.topk);
  c.ids32.assign(count, -1);
  c.ids64.assign(count, -1);
  for (int64_t row = 0; row < spec.batch * spec.rows; ++row) {
    if (random.uniform() < spec.empty_rows) continue;
    for (int64_t j = 0; j < spec.topk; ++j) {
      const auto i = static_cast<size_t>(row * spec.topk + j);
      if (random.uniform() < spec.padding) continue;
      int64_t id =
          spec.offset + static_cast<int64_t>(random.next() % static_cast<uint64_t>(spec.keys));
      if (j > 0 && random.uniform() < spec.duplicates) {
        const auto earlier = static_cast<size_t>(row * spec.topk) +
                             static_cast<size_t>(random.next() % static_cast<uint64_t>(j));
        if (c.ids64[earlier] != -1) id = c.ids64[earlier];
      }
      c.set_id(i, id);
    }
  }
  return c;
}

// Gradient buffers of a case.
struct KlGrads {
  std::vector<float> index_query, index_key, merge_weight;
  explicit KlGrads(const KlCase& c)
      : index_query(c.index_query.f32.size(), 7.0f),
        index_key(c.index_key.f32.size(), 7.0f),
        merge_weight(c.merge_weight.f32.size(), 7.0f) {}
  IndexerKlGradients spans() { return {index_query, index_key, merge_weight}; }
};

// ||got - want||_2 / ||want||_2 (0 when both are 0; got's norm when want is 0).
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  if (norm == 0.0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

}  // namespace sparsecp::testing
