// Property test: NaN and Inf in any input of any kernel reach the fast path's outputs
// exactly as they reach the reference's. For the fused indexer KL: the loss and every
// gradient element is NaN in the fast path iff it is NaN in the reference (and +-Inf iff
// +-Inf), for a NaN, +Inf or -Inf in one random element of each float input, and for an
// all-NaN index_query; fp32 and bf16, every ISA this CPU runs. For the selection: the
// selected ids equal the reference's (NaN scores rank above +Inf) for the same poisons in
// q, weights and keys. Each case prints its seed on failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "sparsecp/kernels/indexer_kl.hpp"
#include "sparsecp/kernels/select.hpp"
#include "support/indexer_kl_case.hpp"
#include "support/select_test_support.hpp"

namespace sparsecp {
namespace {

using testing::KlCase;
using testing::KlGrads;
using testing::KlShapeSpec;
using testing::KlTensor;

std::vector<KernelIsa> every_isa() {
  std::vector<KernelIsa> isas;
  for (const KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (kernel_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

// 0 finite, 1 NaN, 2 +Inf, 3 -Inf.
int kind(double v) {
  if (std::isnan(v)) return 1;
  if (std::isinf(v)) return v > 0 ? 2 : 3;
  return 0;
}

// Counts the elements whose kind differs; reports the first.
int64_t mismatches(const std::vector<float>& got, const std::vector<float>& want,
                   const char* name) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (kind(got[i]) == kind(want[i])) continue;
    if (bad++ == 0) {
      ADD_FAILURE() << name << "[" << i << "]: fast " << got[i] << ", reference " << want[i];
    }
  }
  return bad;
}

const float kPoisons[] = {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};

struct Field {
  KlTensor KlCase::*tensor;
  const char* name;
};
const Field kKlFields[] = {
    {&KlCase::index_query, "index_query"},       {&KlCase::index_key, "index_key"},
    {&KlCase::merge_weight, "merge_weight"},     {&KlCase::attention_query, "attention_query"},
    {&KlCase::compressed_key, "compressed_key"}, {&KlCase::sinks, "sinks"},
};

// Runs the reference and every ISA on `c`; returns how many reference outputs were NaN
// (so callers can check that the poison reached something).
int64_t expect_same_nan_pattern(const KlCase& c, const char* what) {
  IndexerKlOptions options;
  options.attention_scale = c.attention_scale;
  options.loss_coeff = 1.3;
  options.main_key_offset = c.spec.offset;
  int64_t nans = 0;
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    KlGrads want(c);
    const double want_loss = indexer_kl_loss_reference(c.inputs(dtype), options, want.spans());
    for (const auto* v : {&want.index_query, &want.index_key, &want.merge_weight}) {
      for (const float x : *v) nans += std::isnan(x);
    }
    nans += std::isnan(want_loss);
    for (const KernelIsa isa : every_isa()) {
      SCOPED_TRACE(::testing::Message()
                   << what << ", " << dtype_name(dtype) << ", isa " << kernel_isa_name(isa));
      IndexerKlOptions fast = options;
      fast.isa = isa;
      fast.threads = 2;
      KlGrads got(c);
      const double loss = indexer_kl_loss(c.inputs(dtype), fast, got.spans());
      EXPECT_EQ(kind(loss), kind(want_loss))
          << "loss: fast " << loss << ", reference " << want_loss;
      EXPECT_EQ(mismatches(got.index_query, want.index_query, "grad_index_query"), 0);
      EXPECT_EQ(mismatches(got.index_key, want.index_key, "grad_index_key"), 0);
      EXPECT_EQ(mismatches(got.merge_weight, want.merge_weight, "grad_merge_weight"), 0);
    }
  }
  return nans;
}

TEST(NanPropagation, IndexerKlEveryInputEveryPoison) {
  const uint64_t seed = testing::test_seed() + 40;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset, extra keys
  const KlShapeSpec specs[] = {
      {2, 5, 3, 16, 2, 8, 9, 9, 1, 1},
      {1, 3, 20, 34, 17, 24, 30, 30},  // more than one vector of heads, masked tails
  };
  for (const KlShapeSpec& spec : specs) {
    KlShapeSpec s = spec;
    s.empty_rows = 0.0;
    const KlCase base = testing::random_kl_case(random, s);
    int64_t reached = 0;
    for (const Field& field : kKlFields) {
      for (const float poison : kPoisons) {
        for (int trial = 0; trial < 2; ++trial) {
          KlCase c = base;
          KlTensor& t = c.*field.tensor;
          const auto at = static_cast<size_t>(random.next() % static_cast<uint64_t>(t.size()));
          t.set(at, poison);
          SCOPED_TRACE(::testing::Message() << field.name << "[" << at << "] = " << poison);
          reached += expect_same_nan_pattern(c, field.name) > 0;
        }
      }
    }
    EXPECT_GT(reached, 10);  // most poisons land where a selected slot reads them
  }
  // Every index_query NaN: loss and all gradients of rows with slots are NaN.
  KlShapeSpec s = specs[0];
  s.empty_rows = 0.0;
  KlCase c = testing::random_kl_case(random, s);
  for (size_t i = 0; i < c.index_query.f32.size(); ++i) {
    c.index_query.set(i, std::numeric_limits<float>::quiet_NaN());
  }
  EXPECT_GT(expect_same_nan_pattern(c, "all of index_query NaN"), 0);
}

TEST(NanPropagation, SelectionEveryInputEveryPoison) {
  const uint64_t seed = testing::test_seed() + 41;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SelectConfig config;
  config.heads = 13;
  config.head_dim = 33;
  config.topk = 7;
  config.ratio = 4;
  const auto worker = testing::random_worker(random, config.ratio, 3, 300, 40, true);
  const auto base_q =
      testing::random_matrix(random, worker.rows, config.heads * config.head_dim, 2);
  const auto base_w = testing::random_matrix(random, worker.rows, config.heads, 2);
  const auto base_k = testing::random_matrix(random, worker.bank, config.head_dim, 2);
  ASSERT_GT(worker.bank, 0);
  for (int which = 0; which < 3; ++which) {
    for (const float poison : kPoisons) {
      for (int trial = 0; trial < 3; ++trial) {
        auto q = base_q, w = base_w, k = base_k;
        testing::Matrix& m = which == 0 ? q : which == 1 ? w : k;
        const auto at = static_cast<size_t>(random.next() % m.f32.size());
        m.f32[at] = poison;
        m.b16[at] = float_to_bf16(poison);
        for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          SCOPED_TRACE(::testing::Message()
                       << (which == 0   ? "q"
                           : which == 1 ? "weights"
                                        : "keys")
                       << "[" << at << "] = " << poison << ", " << dtype_name(dtype));
          std::vector<int32_t> want(static_cast<size_t>(worker.rows * config.topk), 7);
          select_topk_reference(q.view(dtype), w.view(DType::kFloat32), k.view(dtype),
                                worker.segments, config, want);
          for (const KernelIsa isa : every_isa()) {
            SelectConfig fast = config;
            fast.isa = isa;
            fast.threads = 2;
            std::vector<int32_t> got(want.size(), 7);
            select_topk(q.view(dtype), w.view(DType::kFloat32), k.view(dtype), worker.segments,
                        fast, got);
            EXPECT_EQ(got, want) << "isa " << kernel_isa_name(isa);
          }
        }
      }
    }
  }
}

// A NaN dot product is not ReLU'd away (as torch.relu): head 0 has a NaN channel, so its
// dot product with every key is NaN, and every score of the row is NaN (above +Inf, equal
// among themselves): each row selects its lowest visible ids. Were the NaN dropped (the
// old ReLU, x > 0 ? x : 0), head 1 alone would rank key s by s and pick the highest ids.
TEST(NanPropagation, SelectionNanDotProductRanksFirst) {
  SelectConfig config;
  config.heads = 2;
  config.head_dim = 16;
  config.topk = 2;
  config.ratio = 1;
  const std::vector<Segment> segments{{0, 5, 0, 5, 0}};  // row r sees keys [0, r + 1)
  std::vector<float> q(5 * 32, 0.0f), w(5 * 2, 1.0f), keys(5 * 16, 0.0f);
  for (int64_t s = 0; s < 5; ++s) keys[static_cast<size_t>(s * 16)] = static_cast<float>(s);
  for (int64_t r = 0; r < 5; ++r) {
    q[static_cast<size_t>(r * 32)] = 1.0f;
    q[static_cast<size_t>(r * 32 + 1)] = std::numeric_limits<float>::quiet_NaN();
    q[static_cast<size_t>(r * 32 + 16)] = 1.0f;
  }
  const std::vector<int32_t> expected{0, -1, 0, 1, 0, 1, 0, 1, 0, 1};
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::vector<uint16_t> q16, k16;
    for (const float v : q) q16.push_back(float_to_bf16(v));
    for (const float v : keys) k16.push_back(float_to_bf16(v));
    const bool f = dtype == DType::kFloat32;
    const MatrixView qv =
        f ? MatrixView::f32(q.data(), 5, 32) : MatrixView::bf16(q16.data(), 5, 32);
    const MatrixView kv =
        f ? MatrixView::f32(keys.data(), 5, 16) : MatrixView::bf16(k16.data(), 5, 16);
    const MatrixView wv = MatrixView::f32(w.data(), 5, 2);
    for (const KernelIsa isa : every_isa()) {
      config.isa = isa;
      std::vector<int32_t> out(10, 7);
      select_topk(qv, wv, kv, segments, config, out);
      EXPECT_EQ(out, expected) << kernel_isa_name(isa) << " " << dtype_name(dtype);
    }
    std::vector<int32_t> out(10, 7);
    select_topk_reference(qv, wv, kv, segments, config, out);
    EXPECT_EQ(out, expected) << "reference " << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace sparsecp
