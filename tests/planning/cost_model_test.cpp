// Cost model: prefix sums against brute force, the causal default, the file format.
#include "sparsecp/planning/cost_model.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/planning/cost.hpp"
#include "support/error_of.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using ::testing::HasSubstr;

using sparsecp::testing::error_of;

TEST(CostModel, DefaultIsTheCausalPairCountExactly) {
  const CostModel model;
  EXPECT_TRUE(model.is_causal());
  for (const int64_t ratio : {1, 2, 3, 4, 7, 128}) {
    for (int64_t rows = 0; rows < 600; rows += 1 + rows / 7) {
      EXPECT_EQ(model.prefix(rows, ratio), static_cast<double>(work_prefix(rows, ratio)))
          << "rows " << rows << " ratio " << ratio;
    }
  }
  // Exact at a 10M-token document, ratio 1 (5e13 pairs, below 2^53).
  EXPECT_EQ(model.prefix(10'000'000, 1), static_cast<double>(work_prefix(10'000'000, 1)));
}

TEST(CostModel, PrefixEqualsSumOfRowsOnRandomModels) {
  SplitMix64 random(testing::test_seed());
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    CostModel model;
    // Multiples of 1/4: every sum below is exact in a double.
    model.a = static_cast<double>(random.next() % 9) / 4;
    model.b = static_cast<double>(random.next() % 9) / 4;
    model.c = static_cast<double>(random.next() % 9) / 4 + (model.a + model.b == 0 ? 1 : 0);
    model.topk = 1 + static_cast<int64_t>(random.next() % 40);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 7);
    const int64_t rows = static_cast<int64_t>(random.next() % 400);
    double sum = 0;
    for (int64_t p = 0; p < rows; ++p) {
      const int64_t vis = visible_keys(p, ratio);
      EXPECT_EQ(model.row(vis), model.a + model.b * vis + model.c * std::min(model.topk, vis));
      sum += model.row(vis);
    }
    EXPECT_EQ(model.prefix(rows, ratio), sum)
        << "a " << model.a << " b " << model.b << " c " << model.c << " topk " << model.topk
        << " ratio " << ratio << " rows " << rows;
    const int64_t start = rows > 0 ? static_cast<int64_t>(random.next() % rows) : 0;
    double part = 0;
    for (int64_t p = start; p < rows; ++p) part += model.row(visible_keys(p, ratio));
    EXPECT_EQ(model.range(start, rows, ratio), part);
  }
}

TEST(CostModel, RowCostNeverDecreasesAlongADocument) {
  const CostModel model = CostModel::linear(3, 0.5, 2, 5);
  for (int64_t vis = 0; vis < 50; ++vis) EXPECT_LE(model.row(vis), model.row(vis + 1));
}

TEST(CostModel, IdHashesTermsAndNote) {
  CostModel model = CostModel::linear(5700, 43, 22, 512);
  model.unit = "ns";
  model.note = "heads 16 head_dim 128 q_rank 256 ratio 4 isa avx2 threads 1, AMD EPYC";
  const std::string id = cost_model_id(model);
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(cost_model_id(model), id);  // deterministic
  // It survives the file round trip...
  EXPECT_EQ(cost_model_id(parse_cost_model(format_cost_model(model), "text")), id);
  // ... and changes with every term, the shape/device note and the unit.
  for (int field = 0; field < 7; ++field) {
    CostModel other = model;
    if (field == 6) other.d = 44;
    if (field == 0) other.a = std::nextafter(other.a, 1e9);
    if (field == 1) other.b = 44;
    if (field == 2) other.c = 0;
    if (field == 3) other.topk = 2048;
    if (field == 4) other.unit = "pairs";
    if (field == 5) other.note = "heads 16 head_dim 128 q_rank 256 ratio 4 isa avx512 threads 1";
    EXPECT_NE(cost_model_id(other), id) << "field " << field;
  }
}

TEST(CostModel, TextRoundTripsExactly) {
  CostModel model = CostModel::linear(61.52345678901234, 0.041, 1e-3, 2048);
  model.unit = "ns";
  model.note = "heads 64 head_dim 128, test machine";
  const CostModel back = parse_cost_model(format_cost_model(model), "text");
  EXPECT_EQ(back.a, model.a);
  EXPECT_EQ(back.b, model.b);
  EXPECT_EQ(back.c, model.c);
  EXPECT_EQ(back.topk, model.topk);
  EXPECT_EQ(back.unit, "ns");
  EXPECT_EQ(back.note, model.note);
  EXPECT_EQ(back.d, 0);
  EXPECT_EQ(format_cost_model(model).find("\nd "), std::string::npos);  // 3-term files as before
  model.d = 44.123456789012345;
  const CostModel with_heap = parse_cost_model(format_cost_model(model), "text");
  EXPECT_EQ(with_heap.d, model.d);
  EXPECT_EQ(cost_model_id(with_heap), cost_model_id(model));
}

// heap(vis) = topk * ln(max(min(vis, C), topk) / topk): none up to topk keys, topk * ln 2
// at twice topk, flat beyond a candidate cap; never decreasing.
TEST(CostModel, HeapTermCountsExpectedReplacements) {
  CostModel model = CostModel::linear(0, 0, 0, 512);
  EXPECT_EQ(model.heap(0), 0);
  EXPECT_EQ(model.heap(512), 0);
  EXPECT_NEAR(model.heap(1024), 512 * std::log(2.0), 1e-9);
  EXPECT_GT(model.heap(513), 0);
  model.candidates = 2048;
  EXPECT_EQ(model.heap(100000), model.heap(2048));
  EXPECT_NEAR(model.heap(100000), 512 * std::log(4.0), 1e-9);
  model.candidates = 256;  // a cap at or below topk: every scored key stays in the heap
  EXPECT_EQ(model.heap(100000), 0);
  model.candidates = 0;
  for (int64_t vis = 0; vis < 3000; ++vis) EXPECT_LE(model.heap(vis), model.heap(vis + 1));
}

// The closed form of the heap prefix against per-row sums: random topk, ratio, caps and
// ranges of awkward lengths (1 row, primes, ranges straddling topk * ratio and the cap).
TEST(CostModel, HeapPrefixEqualsSumOfRows) {
  SplitMix64 random(testing::test_seed());
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 300; ++trial) {
    CostModel model = CostModel::linear(1, 0.5, 2, 1 + static_cast<int64_t>(random.next() % 64));
    model.d = 0.25 + static_cast<double>(random.next() % 8);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 9);
    if (random.next() % 3 == 0) model.candidates = 1 + static_cast<int64_t>(random.next() % 300);
    if (random.next() % 4 == 0) model.quantum = 1 + static_cast<int64_t>(random.next() % 17);
    const int64_t rows = static_cast<int64_t>(random.next() % 3001);
    const int64_t start = rows > 0 ? static_cast<int64_t>(random.next() % rows) : 0;
    double heap = 0, cost = 0;
    for (int64_t p = start; p < rows; ++p) {
      heap += model.heap(visible_keys(p, ratio));
      cost += model.row(visible_keys(p, ratio));
    }
    SCOPED_TRACE(::testing::Message()
                 << "topk " << model.topk << " ratio " << ratio << " C " << model.candidates
                 << " Q " << model.quantum << " [" << start << ", " << rows << ")");
    const double closed = model.heap_prefix(rows, ratio) - model.heap_prefix(start, ratio);
    ASSERT_NEAR(closed, heap, 1e-9 * std::max(1.0, heap));
    ASSERT_NEAR(model.range(start, rows, ratio), cost, 1e-9 * std::max(1.0, cost));
  }
  // Far along a 10M-token document (ratio 1): still a tight relative error, and one more
  // row adds that row's heap(vis) (the prefix never decreases).
  const CostModel big = [] {
    CostModel m = CostModel::linear(0, 0, 0, 2048);
    m.d = 1;
    return m;
  }();
  const int64_t far = 10'000'000;
  const double step = big.heap_prefix(far + 1, 1) - big.heap_prefix(far, 1);
  EXPECT_NEAR(step, big.heap(visible_keys(far, 1)), 1e-6 * step);
}

TEST(CostModel, FileRoundTripAndMissingFile) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("sparsecp_cost_model_test_" + std::to_string(testing::test_seed()) + ".txt"))
          .string();
  const CostModel model = CostModel::linear(2, 0.25, 0.5, 64);
  save_cost_model(path, model);
  const CostModel back = load_cost_model(path);
  EXPECT_EQ(back.a, 2);
  EXPECT_EQ(back.b, 0.25);
  EXPECT_EQ(back.c, 0.5);
  EXPECT_EQ(back.topk, 64);
  std::filesystem::remove(path);
  EXPECT_THAT(error_of([&] { load_cost_model(path); }), HasSubstr("cannot open cost model file"));
}

TEST(CostModel, SavingIsWholeOrNothing) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("sparsecp_cost_model_save_" + std::to_string(testing::test_seed()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.txt").string();
  save_cost_model(path, CostModel::linear(2, 0.25, 0.5, 64));
  // A full device fails loudly instead of reporting a saved model.
  EXPECT_THAT(error_of([] { save_cost_model("/dev/full", CostModel::linear(1, 1, 1, 8)); }),
              HasSubstr("No space left on device"));
  // A directory in the way fails, and leaves no temporary beside it.
  EXPECT_THAT(error_of([&] { save_cost_model(dir.string(), CostModel::linear(1, 1, 1, 8)); }),
              HasSubstr("is a directory"));
  // An invalid model is refused before anything is written: the earlier file stays.
  EXPECT_FALSE(error_of([&] { save_cost_model(path, CostModel::linear(-1, 1, 1, 8)); }).empty());
  EXPECT_EQ(load_cost_model(path).a, 2);
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
  std::filesystem::remove_all(dir);
}

TEST(CostModel, ParseErrorsNameTheLine) {
  EXPECT_THAT(error_of([] { parse_cost_model("a 1\nb 2\nc 3\n", "m.txt"); }),
              HasSubstr("m.txt: missing 'topk'"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 1\nb x\nc 3\ntopk 4\n", "m.txt"); }),
              HasSubstr("m.txt line 2: b 'x' is not a number"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 1\nb 1\nc 3\ntopk 4.5\n", "m"); }),
              HasSubstr("topk '4.5' is not an integer"));
  EXPECT_THAT(error_of([] { parse_cost_model("# c\ne 1\n", "m"); }),
              HasSubstr("m line 2: unknown key 'e'"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 1\nb 1\nc 0\nd -2\ntopk 4\n", "m"); }),
              HasSubstr("coefficient d must be finite and non-negative, got -2"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 1\nb 1\nc 0\nd x\ntopk 4\n", "m"); }),
              HasSubstr("m line 4: d 'x' is not a number"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 1\na 1\n", "m"); }), HasSubstr("given twice"));
  EXPECT_THAT(error_of([] { parse_cost_model("a -1\nb 1\nc 0\ntopk 4\n", "m"); }),
              HasSubstr("coefficient a must be finite and non-negative, got -1"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 0\nb 0\nc 0\ntopk 4\n", "m"); }),
              HasSubstr("needs a positive coefficient"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 0\nb 1\nc 0\ntopk 0\n", "m"); }),
              HasSubstr("topk must be positive, got 0"));
  EXPECT_THAT(error_of([] { parse_cost_model("a 0\nb inf\nc 0\ntopk 1\n", "m"); }),
              HasSubstr("finite"));
  // Comments, blank lines, CRLF and any order are fine.
  const CostModel model = parse_cost_model("\r\n# x\ntopk 3\r\nc 0\nb 1.5\na 0\n", "m");
  EXPECT_EQ(model.b, 1.5);
  EXPECT_EQ(model.topk, 3);
}

}  // namespace
}  // namespace sparsecp

namespace sparsecp {
namespace {

TEST(CostModel, CoefficientsThatCouldOverflowACostAreRefused) {
  // Issue 30: a model file with 1e308 coefficients planned inf/nan loads and exited 0.
  for (const double huge : {1e308, 1e201, std::numeric_limits<double>::max()}) {
    CostModel model = CostModel::linear(0, huge, 0, 512);
    EXPECT_THROW(validate_cost_model(model), InvalidInputError) << huge;
    model = CostModel::linear(1, 1, 0, 512);
    model.d = huge;
    EXPECT_THROW(validate_cost_model(model), InvalidInputError) << huge;
  }
  // At the bound every cost of the largest batch stays finite.
  const CostModel edge = CostModel::linear(kMaxCostModelCoefficient, kMaxCostModelCoefficient,
                                           kMaxCostModelCoefficient, 512);
  validate_cost_model(edge);
  const int64_t rows = int64_t{1} << 31;  // about 2^60 pairs at ratio 1
  EXPECT_TRUE(std::isfinite(edge.prefix(rows, 1)));
  EXPECT_TRUE(std::isfinite(edge.range(rows / 2, rows, 1)));
}

}  // namespace
}  // namespace sparsecp
