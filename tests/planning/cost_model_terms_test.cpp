// Cost model terms for every layer kind: the candidate cap and the width quantum (closed
// forms against per-row sums, plans they change as predicted), the fit with them, and the
// file with a model per layer kind (round trip, older files, bad inputs).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/cost_model_fit.hpp"
#include "sparsecp/planning/cost_model_set.hpp"
#include "sparsecp/planning/spill.hpp"
#include "support/error_of.hpp"

namespace sparsecp {
namespace {

using sparsecp::testing::error_of;
using ::testing::HasSubstr;

CostModel with_terms(int64_t candidates, int64_t quantum) {
  CostModel model = CostModel::linear(3, 2, 5, 7);
  model.candidates = candidates;
  model.quantum = quantum;
  return model;
}

// Per-row sums: the definition the closed forms must equal.
int64_t brute_widths(const CostModel& model, int64_t start, int64_t end, int64_t ratio) {
  int64_t sum = 0;
  for (int64_t p = start; p < end; ++p) sum += model.width(visible_keys(p, ratio));
  return sum;
}

double brute_cost(const CostModel& model, int64_t start, int64_t end, int64_t ratio) {
  double sum = 0;
  for (int64_t p = start; p < end; ++p) sum += model.row(visible_keys(p, ratio));
  return sum;
}

TEST(CostModelTerms, WidthRoundsTheCappedKeyCountUp) {
  const CostModel model = with_terms(10, 4);
  EXPECT_EQ(model.width(0), 0);
  EXPECT_EQ(model.width(1), 4);
  EXPECT_EQ(model.width(4), 4);
  EXPECT_EQ(model.width(5), 8);
  EXPECT_EQ(model.width(9), 12);   // min(9, 10) = 9 -> 12
  EXPECT_EQ(model.width(10), 12);  // the cap itself rounds up too
  EXPECT_EQ(model.width(1000), 12);
  EXPECT_EQ(with_terms(0, 1).width(1000), 1000);
  EXPECT_EQ(with_terms(16384, 1).width(20000), 16384);
}

TEST(CostModelTerms, RangeEqualsPerRowSumsOnAwkwardRanges) {
  // Caps and quanta that divide each other or not, ratio 1 and 128, ranges of one row,
  // prime ends, and ranges straddling the cap and quantum boundaries.
  const std::vector<std::pair<int64_t, int64_t>> terms = {
      {0, 1}, {16, 1}, {0, 8}, {16, 8}, {17, 8}, {13, 5}, {5, 13}, {1, 1}, {0, 3}, {97, 1}};
  for (const int64_t ratio : {1, 2, 3, 4, 7, 128}) {
    for (const auto& [candidates, quantum] : terms) {
      const CostModel model = with_terms(candidates, quantum);
      // Positions where a row's key count crosses the cap or a quantum multiple.
      std::vector<int64_t> points = {0, 1, 2, 3, 5, 7, 11, 13, 97, 101, 997, 1009, 4099};
      for (const int64_t keys : {candidates, quantum, 2 * quantum, candidates + quantum}) {
        for (const int64_t delta : {-2, -1, 0, 1, 2}) {
          points.push_back(std::max<int64_t>(0, keys * ratio - 1 + delta));
        }
      }
      std::sort(points.begin(), points.end());
      for (const int64_t start : points) {
        for (const int64_t end : points) {
          if (end < start) continue;
          for (const int64_t stop : {end, end + 1}) {  // the single-row range [end, end + 1)
            const int64_t begin = stop == end + 1 ? end : start;
            SCOPED_TRACE(::testing::Message() << "ratio " << ratio << " C " << candidates << " Q "
                                              << quantum << " [" << begin << ", " << stop << ")");
            ASSERT_EQ(model.width_prefix(stop, ratio) - model.width_prefix(begin, ratio),
                      brute_widths(model, begin, stop, ratio));
            ASSERT_DOUBLE_EQ(model.range(begin, stop, ratio),
                             brute_cost(model, begin, stop, ratio));
          }
        }
      }
    }
  }
}

TEST(CostModelTerms, DefaultsGiveExactlyTodaysCosts) {
  const CostModel plain = CostModel::linear(3, 2, 5, 7);
  EXPECT_TRUE(plain.exact_widths());
  for (const int64_t ratio : {1, 4, 128}) {
    for (const int64_t rows : {0, 1, 127, 128, 129, 5003}) {
      EXPECT_EQ(plain.width_prefix(rows, ratio), work_prefix(rows, ratio));
      const double expected = 3.0 * static_cast<double>(rows) +
                              2.0 * static_cast<double>(work_prefix(rows, ratio)) +
                              5.0 * brute_cost(CostModel::linear(0, 0, 1, 7), 0, rows, ratio);
      EXPECT_DOUBLE_EQ(plain.prefix(rows, ratio), expected);
    }
  }
  // The id of a model without the terms is what it was before them.
  CostModel capped = plain;
  capped.candidates = 16384;
  EXPECT_NE(cost_model_id(capped), cost_model_id(plain));
  EXPECT_EQ(cost_model_id(CostModel{}), cost_model_id(CostModel::linear(0, 1, 0, 512)));
  EXPECT_FALSE(capped.is_causal());
}

TEST(CostModelTerms, ExactAtATenMillionTokenDocument) {
  CostModel model = CostModel::linear(0, 1, 0, 512);
  model.candidates = 16384;
  model.quantum = 8192;
  // Rows below 16384 * 4 - 1 see fewer keys; every later row prices 16384.
  const int64_t rows = 10'000'000, ratio = 4, m = 16384 * ratio - 1;
  const int64_t below = brute_widths(model, 0, m, ratio);
  EXPECT_EQ(model.width_prefix(rows, ratio), below + 16384 * (rows - m));
}

// A batch with one document as long as two ranks and short documents: at ratio 4 the
// long document's later rows see up to 64K keys; a 16K cap prices each at 16K. The cap
// lowers the long-document ranks' excess less than it lowers the cost of the rows they
// can shed (their last rows), so the model predicts that spill moves MORE rows off them
// with the cap: the count is the excess over the flat capped row cost.
TEST(CostModelTerms, CandidateCapChangesSpillsPlanAsPredicted) {
  const int64_t cp = 4, ratio = 4;
  std::vector<int64_t> lengths = {262144};
  for (int i = 0; i < 256; ++i) lengths.push_back(1024);  // 2 ranks of 1K documents
  const int64_t local = std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) / cp;
  CostModel plain = CostModel::linear(0, 1, 0, 512);
  CostModel capped = plain;
  capped.candidates = 16384;
  SpillOptions options;
  options.target_imbalance = 1.01;
  std::vector<int64_t> moved;
  for (const CostModel& model : {plain, capped}) {
    options.cost = model;
    const SpillPlan spill = plan_spill(lengths, cp, ratio, options);
    // The prediction from the model: each rank's contiguous load, per-row sums.
    std::vector<double> before(cp, 0);
    int64_t position = 0;
    for (const int64_t length : lengths) {
      for (int64_t p = 0; p < length; ++p, ++position) {
        before[static_cast<size_t>(position / local)] += model.row(visible_keys(p, ratio));
      }
    }
    const double mean = std::accumulate(before.begin(), before.end(), 0.0) / cp;
    for (int64_t r = 0; r < cp; ++r) {
      EXPECT_NEAR(spill.load_before[static_cast<size_t>(r)], before[static_cast<size_t>(r)],
                  1e-9 * mean);
    }
    EXPECT_TRUE(spill.target_met);
    // Rank 1 holds the long document's heaviest rows: it must shed its excess over the
    // target, and no shed row costs more than its last one.
    const double excess = before[1] - options.target_imbalance * mean;
    ASSERT_GT(excess, 0);
    const double heaviest = model.row(visible_keys(2 * local - 1, ratio));
    EXPECT_GE(static_cast<double>(spill.rows_shed[1]), excess / heaviest - 1);
    // With the cap every row of rank 1 costs the same (it sees >= 16K keys), so the
    // rows it sheds are exactly its excess over that flat cost.
    if (model.candidates > 0) {
      EXPECT_EQ(model.row(visible_keys(local, ratio)), heaviest);
      EXPECT_NEAR(static_cast<double>(spill.rows_shed[1]), excess / heaviest, 2.0);
    }
    moved.push_back(spill.rows_shed[0] + spill.rows_shed[1]);
  }
  EXPECT_GT(moved[1], moved[0]) << "rows moved off the long document's ranks: no cap " << moved[0]
                                << ", 16K cap " << moved[1];
}

TEST(CostModelTerms, QuantumPricesShortRowsAsAFullWidth) {
  // With an 8192-wide quantum every row that sees a key prices 8192, so a batch of short
  // documents weighs as much per row as a long one: the contiguous split already balances.
  CostModel model = CostModel::linear(0, 1, 0, 512);
  model.quantum = 8192;
  EXPECT_EQ(model.range(0, 4, 4), 8192.0);  // rows 3 sees 1 key, rows 0-2 none
  EXPECT_EQ(model.range(100, 200, 4), 100 * 8192.0);
}

TEST(CostModelTerms, FitKeepsTheTermsAsSettings) {
  // Times generated from a capped, quantised model: the fit with the same settings
  // recovers a, b, c and carries the settings into the model.
  CostModel truth = CostModel::linear(50, 0.25, 2, 64);
  truth.candidates = 300;
  truth.quantum = 16;
  std::vector<CostSample> samples;
  for (const int64_t ratio : {1, 4}) {
    for (const int64_t end : {17, 640, 1300, 5000}) {
      const Task task{0, 0, end};
      CostSample s = cost_sample(std::span<const Task>(&task, 1), ratio, 64, 0, 300, 16);
      s.seconds = truth.range(0, end, ratio) * 1e-9;
      samples.push_back(s);
    }
  }
  CostFitOptions options;
  options.topk = 64;
  options.candidates = 300;
  options.quantum = 16;
  const CostFit fit = fit_cost_model(samples, options);
  EXPECT_NEAR(fit.model.a, 50, 1e-6);
  EXPECT_NEAR(fit.model.b, 0.25, 1e-9);
  EXPECT_NEAR(fit.model.c, 2, 1e-6);
  EXPECT_EQ(fit.model.candidates, 300);
  EXPECT_EQ(fit.model.quantum, 16);
  options.quantum = 0;
  EXPECT_THAT(error_of([&] { fit_cost_model(samples, options); }),
              HasSubstr("quantum must be in [1, 16777216], got 0"));
}

TEST(CostModelTerms, ModelFileRoundTripsTheTerms) {
  CostModel model = CostModel::linear(61.5, 0.0412, 0.0031, 512);
  model.candidates = 16384;
  model.quantum = 8192;
  model.unit = "ns";
  const std::string text = format_cost_model(model);
  EXPECT_THAT(text, HasSubstr("candidates 16384\n"));
  EXPECT_THAT(text, HasSubstr("quantum 8192\n"));
  const CostModel back = parse_cost_model(text, "m");
  EXPECT_EQ(back.candidates, 16384);
  EXPECT_EQ(back.quantum, 8192);
  EXPECT_EQ(cost_model_id(back), cost_model_id(model));
  // A model without the terms writes neither key (older readers keep reading it).
  EXPECT_THAT(format_cost_model(CostModel{}), ::testing::Not(HasSubstr("candidates")));
  EXPECT_THAT(format_cost_model(CostModel{}), ::testing::Not(HasSubstr("quantum")));
}

const char* const kSetText =
    "# sparsecp cost models, one per layer kind\n"
    "[csa]\n"
    "ratio 4\n"
    "a 60\nb 0.04\nc 0.003\ntopk 512\nunit ns\n"
    "[hca]\n"
    "ratio 128\n"
    "a 55\nb 0.05\nc 0.002\ntopk 512\nunit ns\n"
    "[candidates]\n"
    "ratio 4\n"
    "a 60\nb 0.04\nc 0.003\ntopk 512\ncandidates 16384\nunit ns\n";

TEST(CostModelSet, SelectsByRatioOrKind) {
  const CostModelSet set = parse_cost_model_set(kSetText, "models.txt");
  ASSERT_EQ(set.layers.size(), 3u);
  EXPECT_EQ(set.select(128).a, 55);
  EXPECT_EQ(set.select(4, "csa").candidates, 0);
  EXPECT_EQ(set.select(4, "candidates").candidates, 16384);
  EXPECT_THAT(error_of([&] { set.select(4); }),
              HasSubstr("several cost models fit ratio 4 ('csa' and 'candidates')"));
  EXPECT_THAT(error_of([&] { set.select(16); }), HasSubstr("no cost model for ratio 16"));
  EXPECT_THAT(error_of([&] { set.select(4, "hca"); }),
              HasSubstr("layer kind 'hca' is for ratio 128, not ratio 4"));
  EXPECT_THAT(error_of([&] { set.select(4, "mla"); }),
              HasSubstr("no cost model for layer kind 'mla' (the file has: csa (ratio 4), hca "
                        "(ratio 128), candidates (ratio 4))"));
}

TEST(CostModelSet, FileRoundTrip) {
  const CostModelSet set = parse_cost_model_set(kSetText, "models.txt");
  const std::string path =
      (std::filesystem::temp_directory_path() / "sparsecp_cost_model_set_test.txt").string();
  save_cost_model_set(path, set);
  const CostModelSet back = load_cost_model_set(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.layers.size(), set.layers.size());
  for (size_t i = 0; i < set.layers.size(); ++i) {
    EXPECT_EQ(back.layers[i].kind, set.layers[i].kind);
    EXPECT_EQ(back.layers[i].ratio, set.layers[i].ratio);
    EXPECT_EQ(cost_model_id(back.layers[i].model), cost_model_id(set.layers[i].model));
  }
  EXPECT_EQ(format_cost_model_set(back), format_cost_model_set(set));
}

TEST(CostModelSet, OldSingleModelFilesStillLoad) {
  // A file `sparsecp calibrate` wrote before these terms: one model for every ratio.
  const std::string old =
      "# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis)\n"
      "a 61.5\nb 0.0412\nc 0.0031\ntopk 512\nunit ns\nnote heads 64, AMD EPYC\n";
  const CostModelSet set = parse_cost_model_set(old, "old.txt");
  ASSERT_EQ(set.layers.size(), 1u);
  EXPECT_EQ(set.layers[0].kind, "");
  EXPECT_FALSE(set.layers[0].ratio.has_value());
  for (const int64_t ratio : {1, 4, 128}) EXPECT_EQ(set.select(ratio).a, 61.5);
  const CostModel direct = parse_cost_model(old, "old.txt");
  EXPECT_EQ(cost_model_id(set.select(4)), cost_model_id(direct));
  EXPECT_TRUE(direct.exact_widths());
  EXPECT_EQ(format_cost_model_set(set), format_cost_model(direct));
}

TEST(CostModelSet, BadInputsNameTheField) {
  const auto bad = [](const std::string& text) {
    return error_of([&] { parse_cost_model_set(text, "f.txt"); });
  };
  const std::string body = "a 1\nb 1\nc 0\ntopk 8\n";
  EXPECT_THAT(bad("[csa]\nratio 0\n" + body),
              HasSubstr("f.txt line 2: ratio '0' is not a positive"));
  EXPECT_THAT(bad("[csa]\nratio four\n" + body), HasSubstr("ratio 'four'"));
  EXPECT_THAT(bad("[csa]\nratio 4\nratio 4\n" + body), HasSubstr("line 3: 'ratio' given twice"));
  EXPECT_THAT(bad("[csa]\n" + body + "[csa]\n" + body),
              HasSubstr("line 6: layer kind 'csa' given twice"));
  EXPECT_THAT(bad("[c s]\n" + body), HasSubstr("layer kind 'c s' must be letters"));
  EXPECT_THAT(bad("[csa\n" + body), HasSubstr("line 1: section '[csa' must end with ']'"));
  EXPECT_THAT(bad("a 1\n[csa]\n" + body), HasSubstr("f.txt line 1: a key before the first"));
  EXPECT_THAT(bad("[csa]\na 1\nb 1\nc 0\n"), HasSubstr("f.txt [csa]: missing 'topk'"));
  EXPECT_THAT(bad("[csa]\n" + body + "candidates -1\n"),
              HasSubstr("candidates must be non-negative (0 = no cap), got -1"));
  EXPECT_THAT(bad("[csa]\n" + body + "quantum 2x\n"),
              HasSubstr("f.txt [csa] line 6: quantum '2x' is not an integer"));
  EXPECT_THAT(bad(body + "quantum 0\n"), HasSubstr("quantum must be in [1, 16777216], got 0"));
  EXPECT_THAT(bad("[csa]\n" + body + "ratiox 4\n"), HasSubstr("line 6: unknown key 'ratiox'"));
}

}  // namespace
}  // namespace sparsecp
