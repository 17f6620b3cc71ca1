// Fast selection vs its plain reference: exact on small-integer inputs over awkward
// shapes, every ISA this CPU runs, both dtypes; tolerance checks on real inputs;
// invariance to threads and batching.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

// The selection's private thread helper (src/kernels/select/), tested directly: the
// kernels only throw from worker threads when memory runs out.
#include "../../src/kernels/attention/batched_gemm.hpp"
#include "../../src/kernels/select/select_internal.hpp"
#include "../../src/kernels/select/top_candidates.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/select.hpp"
#include "support/error_of.hpp"
#include "support/select_test_support.hpp"

namespace sparsecp {
namespace {

using testing::pick;
using testing::random_matrix;
using testing::random_worker;

std::vector<KernelIsa> supported_isas() {
  std::vector<KernelIsa> isas;
  for (const KernelIsa isa : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (kernel_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

struct Shape {
  int64_t heads, head_dim, topk, ratio, documents, max_length, max_rows;
};

// Runs fast (every ISA) and reference on one random worker case; expects equality.
// Returns how many ids the reference selected, so callers can check the cases are not
// trivially empty.
int64_t expect_exact(SplitMix64& random, const Shape& shape, DType dtype) {
  SelectConfig config;
  config.heads = shape.heads;
  config.head_dim = shape.head_dim;
  config.topk = shape.topk;
  config.ratio = shape.ratio;
  const auto worker =
      random_worker(random, shape.ratio, shape.documents, shape.max_length, shape.max_rows, true);
  const auto q = random_matrix(random, worker.rows, shape.heads * shape.head_dim, 2);
  const auto weights = random_matrix(random, worker.rows, shape.heads, 2);
  const auto keys = random_matrix(random, worker.bank, shape.head_dim, 2);
  std::vector<int32_t> expected(static_cast<size_t>(worker.rows * shape.topk), 7);
  select_topk_reference(q.view(dtype), weights.view(DType::kFloat32), keys.view(dtype),
                        worker.segments, config, expected);
  for (const KernelIsa isa : supported_isas()) {
    config.isa = isa;
    for (const int threads : {1, 3}) {
      config.threads = threads;
      std::vector<int32_t> got(expected.size(), 7);
      select_topk(q.view(dtype), weights.view(DType::kFloat32), keys.view(dtype), worker.segments,
                  config, got);
      SCOPED_TRACE(::testing::Message()
                   << "isa " << kernel_isa_name(isa) << " threads " << threads);
      EXPECT_EQ(got, expected);
    }
  }
  return std::count_if(expected.begin(), expected.end(), [](int32_t id) { return id >= 0; });
}

// keep_largest against a full sort: the same set and its smallest value, on awkward sizes
// and on values that share long leading bits (a row's scores share sign and exponent) or
// differ only in their last bits (equal scores, different keys).
TEST(TopCandidates, KeepLargestKeepsExactlyTheLargestSet) {
  const uint64_t seed = testing::test_seed() + 21;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  select_detail::CandidateScratch scratch;
  for (const int64_t count : {0, 1, 2, 47, 48, 49, 97, 1024, 4099}) {
    for (const uint64_t shared :
         {uint64_t{0}, uint64_t{0xffffffffff000000}, uint64_t{0xffffffffffff0000}}) {
      std::vector<uint64_t> values;
      std::vector<uint64_t> seen;
      while (static_cast<int64_t>(values.size()) < count) {
        const uint64_t v = (random.next() & ~shared) | (0x4000000000000000ull & shared);
        if (v != 0 && std::find(seen.begin(), seen.end(), v) == seen.end()) {
          seen.push_back(v);
          values.push_back(v);
        }
      }
      std::vector<uint64_t> sorted = values;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      for (const int64_t keep : {int64_t{0}, int64_t{1}, count / 2, count - 1, count}) {
        if (keep < 0 || keep > count) continue;
        std::vector<uint64_t> got = values;
        const uint64_t smallest = select_detail::keep_largest(got.data(), count, keep, scratch);
        std::vector<uint64_t> kept(got.begin(), got.begin() + keep);
        std::sort(kept.begin(), kept.end(), std::greater<>());
        SCOPED_TRACE(::testing::Message()
                     << "count " << count << " keep " << keep << " shared " << std::hex << shared);
        EXPECT_EQ(kept, std::vector<uint64_t>(sorted.begin(), sorted.begin() + keep));
        EXPECT_EQ(smallest, keep == 0 ? 0 : sorted[static_cast<std::size_t>(keep - 1)]);
      }
    }
  }
}

TEST(TopCandidates, KeysComeOutInIncreasingOrderAcrossBitmapWindows) {
  const uint64_t seed = testing::test_seed() + 22;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  select_detail::CandidateScratch scratch;
  for (const int64_t span : {1, 63, 64, 65, 32768, 32769, 100003}) {
    const int64_t first_key = 17;
    std::vector<int32_t> ids;
    for (int64_t k = 0; k < span; ++k) {
      if (random.next() % 7 == 0 || k == span - 1)
        ids.push_back(static_cast<int32_t>(first_key + k));
    }
    std::vector<uint64_t> candidates;
    candidates.reserve(ids.size());
    for (const int32_t id : ids) {
      candidates.push_back(select_detail::candidate(static_cast<float>(random.next() % 5), id));
    }
    std::reverse(candidates.begin(), candidates.end());
    std::vector<int32_t> out(ids.size(), -7);
    select_detail::write_keys_in_order(candidates.data(), static_cast<int64_t>(candidates.size()),
                                       first_key, span, out.data(), scratch);
    SCOPED_TRACE(::testing::Message() << "span " << span);
    EXPECT_EQ(out, ids);
  }
}

// The avx512 helpers of the candidate buffers against score_order / candidate, on the
// values whose order is special: -0, +-inf, NaN of either sign, subnormals.
TEST(TopCandidates, VectorFiltersMatchTheScalarOrder) {
  if (!kernel_isa_supported(KernelIsa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const uint64_t seed = testing::test_seed() + 23;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const float specials[] = {0.0f, -0.0f, 1.0f,   -1.0f,   INFINITY, -INFINITY,
                            NAN,  -NAN,  1e-42f, -1e-42f, 3.5f,     -3.5f};
  for (const int64_t count : {0, 1, 15, 16, 17, 255, 256}) {
    std::vector<float> scores(static_cast<std::size_t>(count));
    for (auto& v : scores) {
      v = random.next() % 3 == 0
              ? specials[random.next() % std::size(specials)]
              : static_cast<float>(static_cast<int64_t>(random.next() % 2001) - 1000) / 64.0f;
    }
    const int64_t key0 = 1000;
    std::vector<uint64_t> got(static_cast<std::size_t>(count));
    select_detail::candidates_avx512(scores.data(), count, key0, got.data());
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_EQ(got[static_cast<std::size_t>(i)],
                select_detail::candidate(scores[static_cast<std::size_t>(i)], key0 + i))
          << "score " << scores[static_cast<std::size_t>(i)];
    }
    for (const float floor_score : {-INFINITY, -1.0f, 0.0f, 3.5f, INFINITY, NAN}) {
      const uint32_t floor = select_detail::score_order(floor_score);
      std::vector<int32_t> expected;
      for (int64_t i = 0; i < count; ++i) {
        if (select_detail::score_order(scores[static_cast<std::size_t>(i)]) >= floor) {
          expected.push_back(static_cast<int32_t>(i));
        }
      }
      std::vector<int32_t> passed(static_cast<std::size_t>(count) + 16, -1);
      const int64_t n =
          select_detail::scores_at_least_avx512(scores.data(), count, floor, passed.data());
      passed.resize(static_cast<std::size_t>(n));
      EXPECT_EQ(passed, expected) << "count " << count << " floor " << floor_score;
    }
  }
}

TEST(SelectKernel, MatchesReferenceExactlyOnSmallIntegers) {
  const uint64_t seed = testing::test_seed();
  SplitMix64 random(seed);
  const Shape shapes[] = {
      // heads, head_dim, topk, ratio, documents, max_length, max_rows
      {1, 16, 1, 1, 1, 1, 1},         // one row, one key
      {3, 16, 5, 4, 7, 61, 13},       // primes, documents shorter than ratio, topk > visible
      {64, 128, 512, 4, 3, 700, 17},  // DeepSeek-V4 shape, few rows
      {3, 128, 2048, 1, 2, 2600, 5},  // topk 2048 over raw tokens
      {5, 16, 7, 128, 3, 3000, 11},   // HCA ratio
      {8, 17, 3, 2, 5, 97, 23},       // odd head_dim, remainder panels
      {64, 16, 1, 1, 2, 131, 31},     // topk 1, many ties
      {13, 33, 512, 4, 4, 1200, 40},  // remainder head chunk, multi-tile
  };
  int64_t selected = 0;
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const Shape& shape : shapes) {
      for (int trial = 0; trial < 2; ++trial) {
        SCOPED_TRACE(::testing::Message()
                     << "seed " << seed << " dtype " << dtype_name(dtype) << " heads "
                     << shape.heads << " head_dim " << shape.head_dim << " topk " << shape.topk
                     << " ratio " << shape.ratio << " trial " << trial);
        selected += expect_exact(random, shape, dtype);
      }
    }
  }
  EXPECT_GT(selected, 1000);
}

TEST(SelectKernel, RowsThatSeeNothingAreAllMinusOne) {
  SelectConfig config;
  config.heads = 2;
  config.head_dim = 4;
  config.topk = 3;
  config.ratio = 4;
  // Document of 6 tokens, rows at positions 0..5: positions 0..2 see nothing, 3..5 see 1.
  const std::vector<Segment> segments{{0, 6, 0, 1, 2}};
  std::vector<float> q(6 * 8, 1.0f), w(6 * 2, 1.0f), k(4, 1.0f);
  std::vector<int32_t> out(6 * 3, 7);
  select_topk(MatrixView::f32(q.data(), 6, 8), MatrixView::f32(w.data(), 6, 2),
              MatrixView::f32(k.data(), 1, 4), segments, config, out);
  const std::vector<int32_t> expected{-1, -1, -1, -1, -1, -1, -1, -1, -1,
                                      0,  -1, -1, 0,  -1, -1, 0,  -1, -1};
  EXPECT_EQ(out, expected);
  // No row sees a key: everything -1, including rows outside any segment.
  std::vector<int32_t> none(6 * 3, 7);
  const std::vector<Segment> early{{1, 3, 0, 0, 2}};
  select_topk(MatrixView::f32(q.data(), 6, 8), MatrixView::f32(w.data(), 6, 2),
              MatrixView::f32(k.data(), 1, 4), early, config, none);
  EXPECT_EQ(none, std::vector<int32_t>(18, -1));
}

TEST(SelectKernel, TiesGoToTheLowerKeyAndOutputIsSorted) {
  SelectConfig config;
  config.heads = 1;
  config.head_dim = 16;
  config.topk = 4;
  config.ratio = 1;
  const int64_t bank = 300;  // crosses 128-key tiles
  std::vector<float> keys(static_cast<size_t>(bank * 16), 0.0f);
  for (int64_t s = 0; s < bank; ++s) keys[static_cast<size_t>(s * 16)] = s % 3 == 0 ? 2.0f : 1.0f;
  keys[static_cast<size_t>(290 * 16)] = 5.0f;
  std::vector<float> q(16, 0.0f), w(1, 1.0f);
  q[0] = 1.0f;
  const std::vector<Segment> segments{{0, 1, 0, bank, 0}};
  for (const KernelIsa isa : supported_isas()) {
    config.isa = isa;
    std::vector<int32_t> out(4);
    select_topk(MatrixView::f32(q.data(), 1, 16), MatrixView::f32(w.data(), 1, 1),
                MatrixView::f32(keys.data(), bank, 16), segments, config, out);
    EXPECT_EQ(out, (std::vector<int32_t>{0, 3, 6, 290})) << kernel_isa_name(isa);
  }
}

// Score of key s for row t, in double, for tolerance checks.
double score(const testing::Matrix& q, const testing::Matrix& w, const testing::Matrix& k,
             int64_t t, int64_t s, int64_t heads, int64_t dim) {
  double total = 0.0;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0.0;
    for (int64_t d = 0; d < dim; ++d) {
      dot += static_cast<double>(q.f32[static_cast<size_t>(t * heads * dim + h * dim + d)]) *
             k.f32[static_cast<size_t>(s * dim + d)];
    }
    total += w.f32[static_cast<size_t>(t * heads + h)] * std::max(dot, 0.0);
  }
  return total;
}

// Runs `check` with bf16 keys on each product path the build has: the default choice, oneDNN
// (SPARSECP_SELECT_GEMM=onednn, where built) and the VDPBF16PS / widening kernels (=native).
template <class Check>
void on_every_bf16_path(const Check& check) {
  for (const char* gemm : {"", "onednn", "native"}) {
    if (*gemm) {
      setenv("SPARSECP_SELECT_GEMM", gemm, 1);
    } else {
      unsetenv("SPARSECP_SELECT_GEMM");
    }
    SCOPED_TRACE(::testing::Message() << "SPARSECP_SELECT_GEMM='" << gemm << "'");
    check();
  }
  unsetenv("SPARSECP_SELECT_GEMM");
}

TEST(SelectKernel, RealValuedSelectionsScoreWithinToleranceOfTheKthBest) {
  on_every_bf16_path([] {
    const uint64_t seed = testing::test_seed() + 11;
    SplitMix64 random(seed);
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    SelectConfig config;
    config.heads = 16;
    config.head_dim = 64;
    config.topk = 20;
    config.ratio = 4;
    const auto worker = random_worker(random, 4, 4, 900, 9, true);
    const auto q = random_matrix(random, worker.rows, 16 * 64, 0, false);
    const auto w = random_matrix(random, worker.rows, 16, 0, false);
    const auto k = random_matrix(random, worker.bank, 64, 0, false);
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      std::vector<int32_t> fast(static_cast<size_t>(worker.rows * 20));
      std::vector<int32_t> reference(fast.size());
      select_topk(q.view(dtype), w.view(DType::kFloat32), k.view(dtype), worker.segments, config,
                  fast);
      select_topk_reference(q.view(dtype), w.view(DType::kFloat32), k.view(dtype), worker.segments,
                            config, reference);
      for (int64_t t = 0; t < worker.rows; ++t) {
        std::vector<double> ref_scores;
        for (int64_t i = 0; i < 20; ++i) {
          const int32_t r = reference[static_cast<size_t>(t * 20 + i)];
          const int32_t f = fast[static_cast<size_t>(t * 20 + i)];
          ASSERT_EQ(r < 0, f < 0) << "row " << t;  // same number of selections
          if (r >= 0) ref_scores.push_back(score(q, w, k, t, r, 16, 64));
        }
        if (ref_scores.empty()) continue;
        const double kth = *std::min_element(ref_scores.begin(), ref_scores.end());
        for (int64_t i = 0; i < 20; ++i) {
          const int32_t f = fast[static_cast<size_t>(t * 20 + i)];
          if (f >= 0) {
            EXPECT_GE(score(q, w, k, t, f, 16, 64), kth - 1e-3 * (1.0 + std::abs(kth)))
                << "row " << t << " key " << f << " dtype " << dtype_name(dtype);
          }
        }
      }
    }
  });
}

TEST(SelectKernel, RowResultsDoNotDependOnThreadsOrBatching) {
  on_every_bf16_path([] {
    const uint64_t seed = testing::test_seed() + 12;
    SplitMix64 random(seed);
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    SelectConfig config;
    config.heads = 8;
    config.head_dim = 32;
    config.topk = 16;
    config.ratio = 4;
    // One document of 2000 tokens, its last 70 rows: real-valued, so any change in the
    // summation order would show.
    const Segment whole{0, 70, 0, 500, 0};
    const auto q = random_matrix(random, 70, 8 * 32, 0, false);
    const auto w = random_matrix(random, 70, 8, 0, false);
    const auto k = random_matrix(random, 500, 32, 0, false);
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      std::vector<int32_t> base(70 * 16);
      config.threads = 1;
      select_topk(q.view(dtype), w.view(DType::kFloat32), k.view(dtype), std::span(&whole, 1),
                  config, base);
      for (const int threads : {2, 5}) {
        config.threads = threads;
        std::vector<int32_t> got(base.size());
        select_topk(q.view(dtype), w.view(DType::kFloat32), k.view(dtype), std::span(&whole, 1),
                    config, got);
        EXPECT_EQ(got, base) << "threads " << threads;
      }
      // Batching: the last `tail` rows alone, as their own segment (positions unchanged).
      for (const int64_t tail : {1, 3, 33, 41}) {
        const int64_t skip = 70 - tail;
        const Segment part{0, tail, 0, 500, 0};
        std::vector<int32_t> got(static_cast<size_t>(tail * 16));
        select_topk(MatrixView{dtype == DType::kFloat32
                                   ? static_cast<const void*>(q.f32.data() + skip * 256)
                                   : static_cast<const void*>(q.b16.data() + skip * 256),
                               dtype, tail, 256},
                    MatrixView::f32(w.f32.data() + skip * 8, tail, 8), k.view(dtype),
                    std::span(&part, 1), config, got);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), base.begin() + skip * 16))
            << "tail " << tail;
      }
    }
  });
}

TEST(SelectKernel, RejectsBadShapesAndSegments) {
  SelectConfig config;
  config.heads = 2;
  config.head_dim = 4;
  config.topk = 2;
  config.ratio = 4;
  std::vector<float> q(3 * 8), w(3 * 2), k(5 * 4);
  std::vector<int32_t> out(3 * 2);
  const auto run = [&](std::vector<Segment> segments, int64_t q_cols = 8, int64_t k_cols = 4) {
    select_topk(MatrixView::f32(q.data(), 3, q_cols), MatrixView::f32(w.data(), 3, 2),
                MatrixView::f32(k.data(), 5, k_cols), segments, config, out);
  };
  EXPECT_NO_THROW(run({{0, 3, 0, 5, 0}}));
  EXPECT_THROW(run({{0, 3, 0, 5, 0}}, 7), Error);
  EXPECT_THROW(run({{0, 3, 0, 6, 0}}), Error);                   // keys past the bank
  EXPECT_THROW(run({{0, 4, 0, 5, 0}}), Error);                   // rows past q
  EXPECT_THROW(run({{0, 2, 0, 5, 0}, {1, 3, 0, 5, 0}}), Error);  // overlap
  EXPECT_THROW(run({{0, 3, 0, 5, 4}}), Error);                   // residual >= ratio
  EXPECT_THROW(run({{0, 3, 0, 0, 2}}), Error);                   // 3 rows, document of 2 positions
  EXPECT_THROW(run({{2, 1, 0, 5, 0}}), Error);
  config.topk = 0;
  EXPECT_THROW(run({{0, 3, 0, 5, 0}}), Error);
}

// The error text of a one-row fp32 selection ("" if it runs), which must not write its output
// when it refuses (the output is preset to 7: EXPECT on `written`).
std::string one_row_selection_error(bool& written) {
  SelectConfig config;
  config.heads = 1;
  config.head_dim = 4;
  config.topk = 1;
  config.ratio = 1;
  std::vector<float> q(4, 1.0f), w(1, 1.0f), k(4, 1.0f);
  std::vector<int32_t> out(1, 7);
  const std::vector<Segment> segments{{0, 1, 0, 1, 0}};
  std::string error = testing::error_of([&] {
    select_topk(MatrixView::f32(q.data(), 1, 4), MatrixView::f32(w.data(), 1, 1),
                MatrixView::f32(k.data(), 1, 4), segments, config, out);
  });
  written = out[0] != 7;
  return error;
}

// bf16 scores take oneDNN where its products run on AMX (or the CPU has no AVX512_BF16) and
// the VDPBF16PS kernel on other AVX512_BF16 CPUs; SPARSECP_SELECT_GEMM forces either, and a
// bad value is an error naming it, for bf16 and fp32 calls alike, with nothing written.
TEST(SelectKernel, Bf16ProductsFollowTheMatrixUnitsAndTheEnvironment) {
  struct Restore {
    ~Restore() { unsetenv("SPARSECP_SELECT_GEMM"); }
  } restore;
  namespace ad = attention_detail;
  const bool onednn = ad::onednn_fast(ad::Element::kBFloat16);
  const bool avx512 = kernel_isa_supported(KernelIsa::kAvx512);
  const std::string own = avx512 && select_detail::cpu_has_avx512_bf16() ? "vdpbf16ps" : "widened";
  const std::string library = ad::gemm_library_name(true);
  unsetenv("SPARSECP_SELECT_GEMM");
  const bool amx_or_no_pairs =
      ad::onednn_uses_amx(ad::Element::kBFloat16) || !select_detail::cpu_has_avx512_bf16();
  EXPECT_EQ(select_bf16_products(KernelIsa::kAuto),
            avx512 && onednn && amx_or_no_pairs ? library : own);
  setenv("SPARSECP_SELECT_GEMM", "native", 1);
  EXPECT_EQ(select_bf16_products(KernelIsa::kAuto), own);
  setenv("SPARSECP_SELECT_GEMM", "onednn", 1);
  EXPECT_EQ(select_bf16_products(KernelIsa::kAuto), avx512 && onednn ? library : own);
  EXPECT_STREQ(select_bf16_products(KernelIsa::kPortable), "widened");

  setenv("SPARSECP_SELECT_GEMM", "amx", 1);
  EXPECT_EQ(testing::error_of([] { select_bf16_products(KernelIsa::kAuto); }),
            "SPARSECP_SELECT_GEMM must be onednn or native, got 'amx'");
  bool written = true;
  EXPECT_EQ(one_row_selection_error(written),
            "SPARSECP_SELECT_GEMM must be onednn or native, got 'amx'");
  EXPECT_FALSE(written);
}

// SPARSECP_ISA forces what kAuto runs, for the selection and the KL kernels alike (one
// mechanism: resolve_kernel_isa); an unknown value or an ISA the CPU lacks is an error
// naming it, from every entry point, before any output is written.
TEST(KernelIsaSelection, EnvironmentForcesAutoAndRefusesClearly) {
  struct Restore {
    ~Restore() { unsetenv("SPARSECP_ISA"); }
  } restore;
  unsetenv("SPARSECP_ISA");
  EXPECT_EQ(resolve_kernel_isa(KernelIsa::kAuto), best_kernel_isa());
  setenv("SPARSECP_ISA", "", 1);
  EXPECT_EQ(resolve_kernel_isa(KernelIsa::kAuto), best_kernel_isa());
  for (const KernelIsa isa : supported_isas()) {
    setenv("SPARSECP_ISA", kernel_isa_name(isa), 1);
    EXPECT_EQ(resolve_kernel_isa(KernelIsa::kAuto), isa);
    // An explicit ISA wins over the environment.
    EXPECT_EQ(resolve_kernel_isa(KernelIsa::kPortable), KernelIsa::kPortable);
  }
  setenv("SPARSECP_ISA", "auto", 1);
  EXPECT_EQ(resolve_kernel_isa(KernelIsa::kAuto), best_kernel_isa());

  setenv("SPARSECP_ISA", "avx3", 1);
  EXPECT_EQ(testing::error_of([] { resolve_kernel_isa(KernelIsa::kAuto); }),
            "SPARSECP_ISA must be auto, portable, avx2 or avx512, got 'avx3'");
  bool written = true;
  EXPECT_EQ(one_row_selection_error(written),
            "SPARSECP_ISA must be auto, portable, avx2 or avx512, got 'avx3'");
  EXPECT_FALSE(written);
  for (const KernelIsa isa : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (kernel_isa_supported(isa)) continue;
    setenv("SPARSECP_ISA", kernel_isa_name(isa), 1);
    EXPECT_THAT(testing::error_of([] { resolve_kernel_isa(KernelIsa::kAuto); }),
                ::testing::HasSubstr("is not supported by this CPU"));
    unsetenv("SPARSECP_ISA");
    EXPECT_THAT(testing::error_of([&] { resolve_kernel_isa(isa); }),
                ::testing::HasSubstr("is not supported by this CPU"));
  }
}

}  // namespace
}  // namespace sparsecp
