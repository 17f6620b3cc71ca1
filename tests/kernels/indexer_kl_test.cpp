// Fused indexer KL loss against its double-precision reference (awkward shapes, both
// dtypes, every ISA this CPU runs, int32 and int64 ids), finite differences of the
// reference for all three gradients, thread-count determinism, and the validation texts.
// SPARSECP_KL_PRINT_ERRORS=1 prints every comparison's errors (how the bounds were chosen).
#include "sparsecp/kernels/indexer_kl.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../../src/kernels/indexer_kl/indexer_kl_internal.hpp"  // pair-kernel emulation hook
#include "sparsecp/error.hpp"
#include "support/error_of.hpp"
#include "support/indexer_kl_case.hpp"

namespace sparsecp {
namespace {

using testing::KlCase;
using testing::KlGrads;
using testing::KlShapeSpec;
using testing::random_kl_case;
using testing::relative_l2;

// Every ISA this CPU runs (an AVX-512 machine tests the AVX2 and portable kernels too).
std::vector<KernelIsa> kl_isas() {
  std::vector<KernelIsa> isas;
  for (const KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (kernel_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

// Bounds of the fused path against the double reference. The student's q and Kidx are
// on a 1/8 grid, so its dot products (and ReLU masks) are exact in both; everything else
// (weighted scores, the teacher's products, exp, the sums over at most 512 slots and 512
// channels) is fp32 in the fused path (bf16 inputs hold the same values, widened
// exactly). Observed: loss <= 1.0e-7, gradients <= 3.5e-7 (seeds 20261130 and 1-5, both
// ISAs); the bounds leave ~6-10x room:
//   loss:      |fused - reference| <= 1e-6 * max(|reference|, 1e-3)
//   gradients: ||fused - reference||_2 <= 2e-6 * ||reference||_2 for each of the three.
// Any missing, extra or misplaced term is orders of magnitude larger.
constexpr double kLossTolerance = 1e-6;
constexpr double kGradTolerance = 2e-6;

struct Errors {
  double loss = 0, index_query = 0, index_key = 0, merge_weight = 0;
};

struct Result {
  double loss = 0.0;
  std::vector<float> index_query, index_key, merge_weight;
};

Result run(const KlCase& c, DType dtype, IndexDType id_dtype, const IndexerKlOptions& options,
           bool reference) {
  KlGrads grads(c);
  const IndexerKlInputs in = c.inputs(dtype, id_dtype);
  Result r;
  r.loss = reference ? indexer_kl_loss_reference(in, options, grads.spans())
                     : indexer_kl_loss(in, options, grads.spans());
  r.index_query = std::move(grads.index_query);
  r.index_key = std::move(grads.index_key);
  r.merge_weight = std::move(grads.merge_weight);
  return r;
}

Errors errors(const Result& got, const Result& want) {
  Errors e;
  e.loss = std::abs(got.loss - want.loss) / std::max(std::abs(want.loss), 1e-3);
  if (!std::isfinite(got.loss)) e.loss = INFINITY;
  e.index_query = relative_l2(got.index_query, want.index_query);
  e.index_key = relative_l2(got.index_key, want.index_key);
  e.merge_weight = relative_l2(got.merge_weight, want.merge_weight);
  return e;
}

void expect_within_bounds(const Errors& e) {
  EXPECT_LE(e.loss, kLossTolerance);
  EXPECT_LE(e.index_query, kGradTolerance);
  EXPECT_LE(e.index_key, kGradTolerance);
  EXPECT_LE(e.merge_weight, kGradTolerance);
}

void expect_close(const KlCase& c, const IndexerKlOptions& options, const char* what) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Result want = run(c, dtype, IndexDType::kInt32, options, true);
    EXPECT_TRUE(std::isfinite(want.loss)) << what;
    for (const KernelIsa isa : kl_isas()) {
      for (const IndexDType id_dtype : {IndexDType::kInt32, IndexDType::kInt64}) {
        if (id_dtype == IndexDType::kInt64 && isa != kl_isas().back()) continue;
        SCOPED_TRACE(::testing::Message()
                     << what << ", " << dtype_name(dtype) << ", " << index_dtype_name(id_dtype)
                     << " ids, isa " << kernel_isa_name(isa) << ", reference loss " << want.loss);
        IndexerKlOptions fast = options;
        fast.isa = isa;
        fast.threads = 2;
        const Errors e = errors(run(c, dtype, id_dtype, fast, false), want);
        if (std::getenv("SPARSECP_KL_PRINT_ERRORS")) {
          std::printf("%s %s %s %s loss %.2e dq %.2e dk %.2e dw %.2e\n", what, dtype_name(dtype),
                      index_dtype_name(id_dtype), kernel_isa_name(isa), e.loss, e.index_query,
                      e.index_key, e.merge_weight);
        }
        expect_within_bounds(e);
      }
    }
  }
}

IndexerKlOptions options_for(const KlCase& c, double coeff = 1.7) {
  IndexerKlOptions options;
  options.attention_scale = c.attention_scale;
  options.loss_coeff = coeff;
  options.main_key_offset = c.spec.offset;
  return options;
}

TEST(IndexerKl, MatchesReferenceOnAwkwardShapes) {
  const uint64_t seed = testing::test_seed();
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // batch, rows, heads, head_dim, att_heads, att_dim, keys, topk, offset, extra keys
  const KlShapeSpec specs[] = {
      {1, 1, 1, 1, 1, 1, 1, 1},                 // everything 1
      {2, 7, 5, 13, 3, 17, 11, 11},             // primes, TopK == K < 512
      {1, 13, 17, 33, 19, 31, 7, 9},            // TopK > K (padding for a compact bank), odd dims
      {1, 5, 3, 16, 2, 8, 600, 512},            // TopK < K
      {3, 3, 16, 32, 16, 64, 37, 37, 5, 4},     // compact bank: offset 5, 4 rows past the view
      {1, 2, 64, 128, 8, 130, 520, 512, 3, 1},  // DeepSeek-V4 index shape, depth > one block
      {1, 1, 64, 128, 64, 512, 1000, 512},      // DeepSeek-V4 index and attention shapes
  };
  for (const KlShapeSpec& spec : specs) {
    const KlCase c = random_kl_case(random, spec);
    expect_close(c, options_for(c), "random case");
  }
}

// A model's own index_topk (any_topk): fewer ids per row than min(512, K), which the seed's
// rule refuses, on every dtype, ISA and id type, against the reference with the same option.
TEST(IndexerKl, AnyTopkTakesFewerIdsThanTheSeedRule) {
  const uint64_t seed = testing::test_seed() + 31;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const KlShapeSpec specs[] = {
      {1, 9, 4, 16, 3, 24, 40, 5},      // TopK 5 of 40 keys
      {2, 6, 7, 13, 2, 11, 600, 128},   // TopK 128 of 600 (the example model's index_topk)
      {1, 4, 3, 8, 2, 8, 30, 1, 2, 3},  // one id per row, a compact bank
  };
  for (const KlShapeSpec& spec : specs) {
    const KlCase c = random_kl_case(random, spec);
    IndexerKlOptions options = options_for(c);
    EXPECT_THAT(
        testing::error_of([&] { run(c, DType::kFloat32, IndexDType::kInt32, options, false); }),
        ::testing::HasSubstr("Fused KL requires ordinary TopK512 selections"));
    options.any_topk = true;
    expect_close(c, options, "any_topk case");
  }
  const KlCase c = random_kl_case(random, {1, 2, 2, 4, 2, 4, 10, 3});
  IndexerKlOptions options = options_for(c);
  options.any_topk = true;
  KlGrads grads(c);
  IndexerKlInputs in = c.inputs(DType::kFloat32, IndexDType::kInt32);
  in.topk_indices.shape[2] = 0;
  EXPECT_THAT(testing::error_of([&] { indexer_kl_loss(in, options, grads.spans()); }),
              ::testing::HasSubstr("Fused KL takes 1 <= TopK <= 512 ids per row"));
}

TEST(IndexerKl, DuplicatesEmptyRowsAndPaddingOnly) {
  const uint64_t seed = testing::test_seed() + 1;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  KlShapeSpec spec{2, 11, 6, 20, 5, 24, 9, 12};
  spec.duplicates = 0.6;  // many repeated ids: their key gradients add up
  spec.empty_rows = 0.3;
  const KlCase dup = random_kl_case(random, spec);
  expect_close(dup, options_for(dup), "duplicates");

  // Every id -1: nothing contributes; loss and gradients are exactly zero.
  spec.empty_rows = 1.0;
  const KlCase empty = random_kl_case(random, spec);
  for (const KernelIsa isa : kl_isas()) {
    KlGrads grads(empty);
    IndexerKlOptions options = options_for(empty);
    options.isa = isa;
    EXPECT_EQ(indexer_kl_loss(empty.inputs(DType::kFloat32), options, grads.spans()), 0.0);
    for (const auto* v : {&grads.index_query, &grads.index_key, &grads.merge_weight}) {
      EXPECT_TRUE(std::all_of(v->begin(), v->end(), [](float x) { return x == 0.0f; }));
    }
  }
}

TEST(IndexerKl, SinkLogitThatUnderflowsTheTeacher) {
  const uint64_t seed = testing::test_seed() + 2;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  KlCase c = random_kl_case(random, {1, 6, 4, 16, 3, 16, 20, 20});
  // Head 0's sink is 1000: its softmax puts all mass on the dropped sink column. With
  // every head so, each teacher probability underflows to 0 and the L1 denominator is
  // clamped at FLT_MIN: p = 0, row loss 0, g = softmax(I) * coeff.
  c.sinks.set(0, 1000.0f);
  expect_close(c, options_for(c), "one sink of 1000");
  for (int64_t h = 0; h < 3; ++h) c.sinks.set(static_cast<size_t>(h), 1000.0f);
  expect_close(c, options_for(c), "every sink 1000");
  KlGrads grads(c);
  EXPECT_EQ(indexer_kl_loss(c.inputs(DType::kFloat32), options_for(c), grads.spans()), 0.0);
  EXPECT_GT(relative_l2(grads.merge_weight, std::vector<float>(grads.merge_weight.size())), 0.0);
}

TEST(IndexerKl, SameBitsForAnyThreadCount) {
  const uint64_t seed = testing::test_seed() + 3;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  KlShapeSpec spec{2, 29, 16, 32, 8, 48, 13, 16, 2, 3};  // few keys, many rows: each key
  spec.duplicates = 0.3;                                 // gets many contributions
  const KlCase c = random_kl_case(random, spec);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const KernelIsa isa : kl_isas()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " isa " << kernel_isa_name(isa));
      IndexerKlOptions options = options_for(c);
      options.isa = isa;
      options.threads = 1;
      KlGrads first(c);
      const double loss = indexer_kl_loss(c.inputs(dtype), options, first.spans());
      for (const int threads : {2, 3, 5}) {
        options.threads = threads;
        KlGrads again(c);
        const double other = indexer_kl_loss(c.inputs(dtype), options, again.spans());
        EXPECT_EQ(std::memcmp(&loss, &other, sizeof loss), 0) << threads << " threads";
        EXPECT_EQ(again.index_query, first.index_query) << threads << " threads";
        EXPECT_EQ(again.index_key, first.index_key) << threads << " threads";
        EXPECT_EQ(again.merge_weight, first.merge_weight) << threads << " threads";
      }
    }
  }
}

// Central differences of the double reference's loss in every input element of q, w
// and the whole index_key (rows outside the compact view included, where the gradient
// is 0), against the reference's gradients; then the fused gradients against the same.
TEST(IndexerKl, FiniteDifferencesOfAllThreeGradients) {
  const uint64_t seed = testing::test_seed() + 4;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  KlShapeSpec spec{2, 2, 3, 4, 2, 5, 5, 6, 1, 1};
  spec.empty_rows = 0.0;
  spec.duplicates = 0.3;
  KlCase c;
  // Resample until no student dot product lies within 0.05 of the ReLU kink, so that a
  // step of 1e-3 never crosses it.
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 1000);
    c = random_kl_case(random, spec);
    bool smooth = true;
    for (int64_t row = 0; row < 4 && smooth; ++row) {
      const int64_t b = row / 2;
      for (int64_t j = 0; j < 6 && smooth; ++j) {
        const int64_t id = c.ids64[static_cast<size_t>(row * 6 + j)];
        if (id < 0) continue;
        for (int64_t h = 0; h < 3; ++h) {
          double dot = 0.0;
          for (int64_t d = 0; d < 4; ++d) {
            dot += double{c.index_query.f32[static_cast<size_t>((row * 3 + h) * 4 + d)]} *
                   c.index_key.f32[static_cast<size_t>((b * 7 + id) * 4 + d)];
          }
          smooth = smooth && std::abs(dot) > 0.05;
        }
      }
    }
    if (smooth) break;
  }
  const IndexerKlOptions options = options_for(c);
  KlGrads analytic(c);
  indexer_kl_loss_reference(c.inputs(DType::kFloat32), options, analytic.spans());

  const auto loss_at = [&](const KlCase& perturbed) {
    KlGrads scratch(perturbed);
    return indexer_kl_loss_reference(perturbed.inputs(DType::kFloat32), options, scratch.spans());
  };
  const auto check = [&](testing::KlTensor KlCase::*field, const std::vector<float>& gradient,
                         const char* name) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < gradient.size(); ++i) {
      KlCase plus = c, minus = c;
      const float x = (c.*field).f32[i];
      (plus.*field).f32[i] = x + 1e-3f;
      (minus.*field).f32[i] = x - 1e-3f;
      const double step = double{(plus.*field).f32[i]} - double{(minus.*field).f32[i]};
      const double numeric = (loss_at(plus) - loss_at(minus)) / step;
      worst = std::max(worst, std::abs(numeric - gradient[i]));
      scale = std::max(scale, std::abs(numeric));
    }
    SCOPED_TRACE(name);
    EXPECT_GT(scale, 1e-4);  // the case has real gradients
    EXPECT_LE(worst, 1e-5 * std::max(scale, 1.0)) << "largest gradient " << scale;
  };
  check(&KlCase::index_query, analytic.index_query, "index_query");
  check(&KlCase::index_key, analytic.index_key, "index_key");
  check(&KlCase::merge_weight, analytic.merge_weight, "merge_weight");
  // Rows of index_key outside the compact view [1, 6) have zero gradient.
  for (const int64_t b : {0, 1}) {
    for (const int64_t key : {0, 6}) {
      for (int64_t d = 0; d < 4; ++d) {
        EXPECT_EQ(analytic.index_key[static_cast<size_t>((b * 7 + key) * 4 + d)], 0.0f);
      }
    }
  }
  expect_close(c, options, "finite-difference case");
}

TEST(IndexerKl, ZeroCoefficientReturnsZerosWithoutComputing) {
  SplitMix64 random(testing::test_seed() + 5);
  KlCase c = random_kl_case(random, {1, 4, 2, 8, 2, 8, 6, 6});
  c.set_id(3, 999);  // an invalid id is not even inspected
  for (const KernelIsa isa : kl_isas()) {
    KlGrads grads(c);
    IndexerKlOptions options = options_for(c, 0.0);
    options.isa = isa;
    EXPECT_EQ(indexer_kl_loss(c.inputs(DType::kFloat32), options, grads.spans()), 0.0);
    for (const auto* v : {&grads.index_query, &grads.index_key, &grads.merge_weight}) {
      EXPECT_TRUE(std::all_of(v->begin(), v->end(), [](float x) { return x == 0.0f; }));
    }
  }
  KlGrads grads(c);
  EXPECT_EQ(
      indexer_kl_loss_reference(c.inputs(DType::kFloat32), options_for(c, 0.0), grads.spans()),
      0.0);
  EXPECT_EQ(indexer_kl_flops(c.inputs(DType::kFloat32), options_for(c, 0.0)), 0.0);
}

TEST(IndexerKl, EmulatedBf16PairKernelMatchesReference) {
  if (!kernel_isa_supported(KernelIsa::kAvx512)) GTEST_SKIP() << "no AVX-512";
  const uint64_t seed = testing::test_seed() + 6;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  kl_detail::set_bf16_pair_emulation_for_testing(true);
  for (const KlShapeSpec& spec :
       {KlShapeSpec{1, 7, 5, 14, 3, 18, 11, 11}, KlShapeSpec{2, 5, 64, 128, 20, 64, 40, 40, 2, 1},
        KlShapeSpec{1, 4, 17, 6, 33, 10, 9, 9}}) {
    const KlCase c = random_kl_case(random, spec);
    IndexerKlOptions options = options_for(c);
    const Result want = run(c, DType::kBFloat16, IndexDType::kInt32, options, true);
    options.isa = KernelIsa::kAvx512;
    options.threads = 2;
    expect_within_bounds(
        errors(run(c, DType::kBFloat16, IndexDType::kInt32, options, false), want));
  }
  kl_detail::set_bf16_pair_emulation_for_testing(false);
}

TEST(IndexerKl, ScratchIsIndependentOfRowsAndFlopsCountValidPairs) {
  SplitMix64 random(testing::test_seed() + 7);
  const KlCase small = random_kl_case(random, {1, 3, 8, 16, 4, 32, 40, 40});
  const KlCase large = random_kl_case(random, {4, 50, 8, 16, 4, 32, 40, 40});
  IndexerKlOptions options = options_for(small);
  options.threads = 2;
  EXPECT_EQ(indexer_kl_scratch_bytes(small.inputs(DType::kFloat32), options),
            indexer_kl_scratch_bytes(large.inputs(DType::kFloat32), options));
  int64_t valid = 0;
  for (const int64_t id : large.ids64) valid += id != -1;
  EXPECT_DOUBLE_EQ(indexer_kl_flops(large.inputs(DType::kFloat32), options),
                   static_cast<double>(valid) * (2.0 * 4 * 32 + 6.0 * 8 * 16));
}

// --- validation -----------------------------------------------------------------------

void expect_error(const KlCase& c, const IndexerKlOptions& options, const std::string& text,
                  IndexerKlInputs in) {
  KlGrads grads(c);
  for (const bool reference : {false, true}) {
    try {
      if (reference) {
        indexer_kl_loss_reference(in, options, grads.spans());
      } else {
        indexer_kl_loss(in, options, grads.spans());
      }
      ADD_FAILURE() << "no error, expected: " << text;
    } catch (const InvalidInputError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(text));
    }
  }
}

TEST(IndexerKl, ValidationUsesTheSeedTextsAndNamesValues) {
  SplitMix64 random(testing::test_seed() + 8);
  KlCase c = random_kl_case(random, {2, 4, 3, 8, 2, 8, 6, 6, 2, 1});
  const IndexerKlOptions options = options_for(c);
  const IndexerKlInputs good = c.inputs(DType::kFloat32);
  {
    IndexerKlInputs in = good;
    in.topk_indices.shape = {2, 3, 6};
    expect_error(c, options,
                 "Fused KL indices must have shape [B, Q, TopK] matching Indexer Q: topk_indices "
                 "and index_query must share batch/query dimensions (got topk_indices [2, 3, 6] "
                 "and index_query [2, 4, 3, 8])",
                 in);
    in.topk_indices.shape = {2, 4};
    expect_error(c, options, "Fused KL indices must have shape [B, Q, TopK]", in);
  }
  {
    // TopK 6 over K = 5 keys passes (padding); TopK 4 < min(512, K = 6) does not.
    KlCase narrow = random_kl_case(random, {1, 2, 3, 8, 2, 8, 6, 4});
    expect_error(narrow, options_for(narrow),
                 "Fused KL requires ordinary TopK512 selections, allowing padding for a compact "
                 "bank; got K=6, TopK=4",
                 narrow.inputs(DType::kFloat32));
    KlCase wide = random_kl_case(random, {1, 2, 3, 8, 2, 8, 600, 513});
    expect_error(wide, options_for(wide), "got K=600, TopK=513", wide.inputs(DType::kFloat32));
  }
  {
    KlCase bad = c;
    bad.set_id(5, 9);  // global ids are valid in [2, 8)
    expect_error(bad, options,
                 "Indexer KL topk id 9 at [0, 0, 5] is outside the compact bank's keys "
                 "[main_key_offset, main_key_offset + K) = [2, 8)",
                 bad.inputs(DType::kFloat32));
    bad.set_id(5, 1);
    expect_error(bad, options, "topk id 1 at [0, 0, 5]", bad.inputs(DType::kFloat32));
    bad.set_id(5, -2);
    expect_error(bad, options, "topk id -2 at [0, 0, 5]", bad.inputs(DType::kFloat32));
    KlCase plain = random_kl_case(random, {1, 2, 3, 8, 2, 8, 6, 6});
    plain.set_id(5, 6);
    expect_error(plain, options_for(plain),
                 "topk id 6 at [0, 0, 5] is outside the bank's keys [0, 6)",
                 plain.inputs(DType::kFloat32));
  }
  {
    IndexerKlOptions far = options;
    far.main_key_offset = 4;  // index_key has 9 rows: 4 + 6 > 9
    expect_error(c, far,
                 "Indexer KL index_key has 9 rows, fewer than main_key_offset 4 + the compact "
                 "bank's K = 6",
                 good);
    far.main_key_offset = -1;
    expect_error(c, far, "main_key_offset must be non-negative, got -1", good);
    IndexerKlOptions nan = options;
    nan.loss_coeff = NAN;
    expect_error(c, nan, "loss_coeff must be finite", good);
    nan = options;
    nan.attention_scale = INFINITY;
    expect_error(c, nan, "attention_scale must be finite", good);
  }
  {
    IndexerKlInputs in = good;
    in.attention_query.shape = {2, 2, 4, 7};
    expect_error(c, options, "attention_query must have shape [B, Hm, S, Dm] = [2, Hm, 4, 8]", in);
    in = good;
    in.sinks.shape = {3};
    expect_error(c, options, "sinks must have shape [Hm] = [2]", in);
    in = good;
    in.merge_weight.shape = {2, 4, 2};
    expect_error(c, options, "merge_weight must have shape [B, S, H] = [2, 4, 3]", in);
    in = good;
    in.index_key.shape = {2, 9, 7};
    expect_error(c, options, "index_key must have shape [B, K, D] = [2, K, 8]", in);
    in = good;
    in.index_query.shape = {2, 4, 3, -8};
    expect_error(c, options, "index_query has a negative extent", in);
    in = good;
    in.index_query.shape = {2, 4, int64_t{1} << 40, int64_t{1} << 40};
    expect_error(c, options, "index_query shape [2, 4, 1099511627776, 1099511627776] is too large",
                 in);
  }
  {
    KlGrads grads(c);
    grads.index_key.pop_back();
    try {
      indexer_kl_loss(good, options, grads.spans());
      ADD_FAILURE() << "no error";
    } catch (const InvalidInputError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(
                                "index_key gradient holds 143 floats, expected 144 (shape [2, 9, "
                                "8])"));
    }
  }
}

TEST(IndexerKl, NoRowsIsZero) {
  SplitMix64 random(testing::test_seed() + 9);
  const KlCase c = random_kl_case(random, {1, 0, 3, 8, 2, 8, 6, 6});
  KlGrads grads(c);
  EXPECT_EQ(indexer_kl_loss(c.inputs(DType::kFloat32), options_for(c), grads.spans()), 0.0);
  EXPECT_TRUE(std::all_of(grads.index_key.begin(), grads.index_key.end(),
                          [](float x) { return x == 0.0f; }));
}

}  // namespace
}  // namespace sparsecp
