// Simulation metrics, sweeps and summaries, and the report generators (JSON, CSV and
// SVG parsed back), including the `sparsecp simulate` command end to end.
#include "sparsecp/planning/simulate.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/io/report_svg.hpp"
#include "sparsecp/io/simulate_report.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/node_map.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategies/spill.hpp"
#include "support/error_of.hpp"
#include "support/random_batch.hpp"
#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

using sparsecp::testing::error_of;
using ::testing::HasSubstr;

const std::vector<int64_t> kSystemExample = {5000, 300, 2699, 1};

// --- small parsers for the report formats -------------------------------------------

// Splits CSV text into records of cells (RFC 4180 quoting). Fails the test on a
// malformed quote.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string cell;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      EXPECT_TRUE(cell.empty()) << "quote inside an unquoted cell";
      quoted = true;
    } else if (c == ',') {
      record.push_back(std::move(cell));
      cell.clear();
    } else if (c == '\n') {
      record.push_back(std::move(cell));
      cell.clear();
      records.push_back(std::move(record));
      record.clear();
    } else {
      cell += c;
    }
  }
  EXPECT_FALSE(quoted) << "unterminated quote";
  EXPECT_TRUE(record.empty() && cell.empty()) << "CSV must end with a newline";
  return records;
}

// A small XML well-formedness check: balanced, properly nested elements, quoted
// attributes, escaped text, one root. Returns the root element's name, or "" after
// reporting the first problem.
std::string check_xml(const std::string& text) {
  std::vector<std::string> open;
  std::string root;
  size_t i = 0;
  const auto fail = [&](const std::string& why) {
    ADD_FAILURE() << why << " at offset " << i << ": " << text.substr(i > 40 ? i - 40 : 0, 80);
    return std::string();
  };
  const auto check_entities = [&](std::string_view chunk) {
    for (size_t at = chunk.find('&'); at != std::string_view::npos; at = chunk.find('&', at + 1)) {
      const size_t end = chunk.find(';', at);
      if (end == std::string_view::npos) return false;
      const std::string_view entity = chunk.substr(at + 1, end - at - 1);
      if (entity != "amp" && entity != "lt" && entity != "gt" && entity != "quot" &&
          entity != "apos" && !(entity.size() > 1 && entity[0] == '#')) {
        return false;
      }
    }
    return true;
  };
  while (i < text.size()) {
    const size_t lt = text.find('<', i);
    const std::string_view chars(text.data() + i, (lt == std::string::npos ? text.size() : lt) - i);
    if (!check_entities(chars)) return fail("bad entity in text");
    if (chars.find('>') != std::string_view::npos) return fail("raw '>' in text");
    if (open.empty() && chars.find_first_not_of(" \n\r\t") != std::string_view::npos) {
      return fail("text outside the root");
    }
    if (lt == std::string::npos) break;
    i = lt;
    if (text.compare(i, 5, "<?xml") == 0) {
      if (i != 0) return fail("XML declaration not first");
      const size_t end = text.find("?>", i);
      if (end == std::string::npos) return fail("unterminated declaration");
      i = end + 2;
      continue;
    }
    if (text.compare(i, 4, "<!--") == 0) {
      const size_t end = text.find("-->", i);
      if (end == std::string::npos) return fail("unterminated comment");
      i = end + 3;
      continue;
    }
    const bool closing = text[i + 1] == '/';
    size_t p = i + (closing ? 2 : 1);
    const size_t name_begin = p;
    while (p < text.size() && (std::isalnum(static_cast<unsigned char>(text[p])) ||
                               text[p] == '-' || text[p] == ':' || text[p] == '_')) {
      ++p;
    }
    const std::string name = text.substr(name_begin, p - name_begin);
    if (name.empty()) return fail("missing element name");
    if (closing) {
      if (open.empty() || open.back() != name) return fail("mismatched </" + name + ">");
      open.pop_back();
      if (text[p] != '>') return fail("junk in closing tag");
      i = p + 1;
      continue;
    }
    // Attributes: name="value" pairs, values without '<' and with valid entities.
    std::vector<std::string> attributes;
    while (true) {
      while (p < text.size() && std::isspace(static_cast<unsigned char>(text[p]))) ++p;
      if (p >= text.size()) return fail("unterminated tag");
      if (text[p] == '>' || text.compare(p, 2, "/>") == 0) break;
      const size_t attr_begin = p;
      while (p < text.size() && text[p] != '=' &&
             !std::isspace(static_cast<unsigned char>(text[p])))
        ++p;
      const std::string attribute = text.substr(attr_begin, p - attr_begin);
      if (attribute.empty() || p >= text.size() || text[p] != '=' || text[p + 1] != '"') {
        return fail("attribute without a quoted value");
      }
      if (std::find(attributes.begin(), attributes.end(), attribute) != attributes.end()) {
        return fail("duplicate attribute " + attribute);
      }
      attributes.push_back(attribute);
      const size_t value_end = text.find('"', p + 2);
      if (value_end == std::string::npos) return fail("unterminated attribute value");
      const std::string_view value(text.data() + p + 2, value_end - p - 2);
      if (value.find('<') != std::string_view::npos || !check_entities(value)) {
        return fail("bad attribute value");
      }
      p = value_end + 1;
    }
    const bool self_closing = text[p] == '/';
    if (open.empty()) {
      if (!root.empty()) return fail("second root element");
      root = name;
    }
    if (!self_closing) open.push_back(name);
    i = p + (self_closing ? 2 : 1);
  }
  if (!open.empty()) return fail("unclosed <" + open.back() + ">");
  return root;
}

// --- metrics --------------------------------------------------------------------------

TEST(Simulate, NoneReproducesTheSystemExample) {
  const SimulationResult r = simulate_plan(find_strategy("none"), kSystemExample, 4, 4, {});
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_THAT(r.work, ::testing::ElementsAre(499500, 1499500, 1197000, 848825));
  EXPECT_EQ(r.total_work, 4044825);
  EXPECT_NEAR(r.imbalance, 1499500 / (4044825 / 4.0), 1e-12);
  EXPECT_DOUBLE_EQ(r.lower_bound, r.imbalance);  // its unit is the whole shard
  EXPECT_NEAR(r.row_lower_bound, 1.0, 1e-12);    // one row (1250 pairs) is below the mean
  EXPECT_EQ(r.rows_moved, 0);
  EXPECT_EQ(r.bytes_moved, 0);
  EXPECT_EQ(r.max_bytes_sent_per_rank, 0);
  EXPECT_EQ(r.rows_max, 2000);
  // Rank 0: rows [0, 2000) of document 0; rank 2: [4000, 5000) of 0, 300, and [0, 700) of 2.
  EXPECT_THAT(r.fragments, ::testing::ElementsAre(1, 1, 3, 2));
  EXPECT_EQ(r.fragments_max, 3);
  EXPECT_EQ(r.padding_rows, 0);
  EXPECT_GE(r.plan_ms, 0.0);
}

TEST(Simulate, RowBytesHaveV4Defaults) {
  const RowBytes bytes;
  EXPECT_EQ(bytes.input_bytes(), 1536 * 2 + 64 * 4 + 2 * 32 * 4);
  EXPECT_EQ(bytes.result_bytes(), 512 * 4);
}

TEST(Simulate, CountsRowsAndBytesLeavingTheirOwners) {
  // Round-robin on [3, 3] with cp 2: rank 0 owns packed rows 0-2 and selects the even
  // rows 0, 2, 4, so it sends row 1 away and serves row 4 for rank 1, which owns 3-5,
  // selects 1, 3, 5 and sends row 4 away.
  const RowBytes bytes;
  const SimulationResult r = simulate_plan(find_strategy("round-robin"), {{3, 3}}, 2, 1, {});
  EXPECT_EQ(r.rows_moved, 2);
  EXPECT_THAT(r.rows_sent, ::testing::ElementsAre(1, 1));
  EXPECT_EQ(r.max_rows_moved_per_rank, 1);
  EXPECT_EQ(r.bytes_moved, 2 * (bytes.input_bytes() + bytes.result_bytes()));
  EXPECT_EQ(r.max_bytes_sent_per_rank, bytes.input_bytes() + bytes.result_bytes());
  EXPECT_EQ(r.fragments_max, 3);
}

TEST(Simulate, ReportsPerDocumentZigzagPadding) {
  const SimulationResult r = simulate_plan(find_strategy("per-doc-zigzag"), {{5, 3}}, 2, 1, {});
  EXPECT_THAT(r.padding, ::testing::ElementsAre(3, 1));
  EXPECT_EQ(r.padding_rows, 4);
}

TEST(Simulate, TurnsStrategyErrorsIntoFailedResults) {
  const SimulationResult r = simulate_plan(find_strategy("greedy"), {{3, 2}}, 2, 4, {});
  EXPECT_THAT(r.error, HasSubstr("Indexer balance needs positive document lengths"));
  const auto rows = summarize(std::vector<SimulationResult>{r});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].failures, 1);
  EXPECT_TRUE(std::isnan(rows[0].imbalance));
  std::ostringstream json;
  write_json(json, rows);
  const auto parsed = nlohmann::json::parse(json.str());
  EXPECT_TRUE(parsed["results"][0]["imbalance"].is_null());
  EXPECT_THAT(parsed["results"][0]["note"].get<std::string>(), HasSubstr("Indexer balance"));
}

TEST(Simulate, MetricsAgreeWithThePlanOnRandomBatches) {
  const uint64_t seed = sparsecp::testing::test_seed();
  SplitMix64 random(seed + 61);
  const RowBytes bytes;
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t cp = std::vector<int64_t>{1, 2, 3, 5, 8}[static_cast<size_t>(trial % 5)];
    const int64_t ratio = std::vector<int64_t>{1, 4, 2, 128}[static_cast<size_t>(trial % 4)];
    const auto lengths = sparsecp::testing::random_batch(random, cp, 12, 500);
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    StrategyParams params;
    params.block_size = std::max<int64_t>(1, std::min<int64_t>(50, total / cp));
    for (const Strategy* strategy : all_strategies()) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) + " " +
                   std::string(strategy->name()));
      const SimulationResult r = simulate_plan(*strategy, lengths, cp, ratio, params);
      ASSERT_TRUE(r.error.empty()) << r.error;
      const int64_t sent = std::accumulate(r.rows_sent.begin(), r.rows_sent.end(), int64_t{0});
      EXPECT_EQ(sent, r.rows_moved);
      EXPECT_EQ(r.bytes_moved, r.rows_moved * (bytes.input_bytes() + bytes.result_bytes()));
      EXPECT_EQ(std::accumulate(r.rows.begin(), r.rows.end(), int64_t{0}), total);
      EXPECT_EQ(std::accumulate(r.work.begin(), r.work.end(), int64_t{0}), r.total_work);
      EXPECT_EQ(std::accumulate(r.fragments.begin(), r.fragments.end(), int64_t{0}),
                r.fragments_total);
      // No plan beats its own bound, and no bound beats the row-level limit.
      EXPECT_GE(r.imbalance, r.lower_bound - 1e-12);
      EXPECT_GE(r.lower_bound, r.row_lower_bound - 1e-12);
      EXPECT_GE(r.row_lower_bound, 1.0);
      if (cp == 1) {
        EXPECT_EQ(r.rows_moved, 0);
      }
    }
  }
}

// Reference for min_rows_to_balance: every owner lists its rows' costs, sorts them
// descending and sheds until it is at or below the mean.
int64_t min_rows_reference(const std::vector<int64_t>& lengths, int64_t cp, int64_t ratio) {
  std::vector<int64_t> costs;  // packed order
  for (const int64_t length : lengths) {
    for (int64_t p = 0; p < length; ++p) costs.push_back(visible_keys(p, ratio));
  }
  const int64_t total_work = std::accumulate(costs.begin(), costs.end(), int64_t{0});
  const int64_t local = static_cast<int64_t>(costs.size()) / cp;
  int64_t needed = 0;
  for (int64_t owner = 0; owner < cp; ++owner) {
    std::vector<int64_t> mine(costs.begin() + owner * local, costs.begin() + (owner + 1) * local);
    std::sort(mine.rbegin(), mine.rend());
    int64_t work = std::accumulate(mine.begin(), mine.end(), int64_t{0});
    // work <= total_work / cp, compared exactly: cp * work <= total_work.
    for (size_t i = 0; cp * work > total_work; ++i) {
      work -= mine[i];
      ++needed;
    }
  }
  return needed;
}

TEST(Simulate, MinRowsToBalanceMatchesTheReference) {
  EXPECT_EQ(min_rows_to_balance(kSystemExample, 4, 4), min_rows_reference(kSystemExample, 4, 4));
  EXPECT_GT(min_rows_to_balance(kSystemExample, 4, 4), 0);
  EXPECT_EQ(min_rows_to_balance(std::vector<int64_t>{4, 4}, 2, 1), 0);  // already balanced
  EXPECT_EQ(min_rows_to_balance(std::vector<int64_t>{7}, 1, 2), 0);
  // Hand case: one document of 4 rows at ratio 1 on 2 ranks: costs 1, 2 | 3, 4; mean 5;
  // rank 1 (7) sheds its 4-cost row to reach 3.
  EXPECT_EQ(min_rows_to_balance(std::vector<int64_t>{4}, 2, 1), 1);
  const uint64_t seed = sparsecp::testing::test_seed();
  SplitMix64 random(seed + 17);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t cp = std::vector<int64_t>{1, 2, 3, 5, 8}[static_cast<size_t>(trial % 5)];
    const int64_t ratio = std::vector<int64_t>{1, 4, 2, 7}[static_cast<size_t>(trial % 4)];
    const auto lengths = sparsecp::testing::random_batch(random, cp, 12, 600);
    SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial));
    EXPECT_EQ(min_rows_to_balance(lengths, cp, ratio), min_rows_reference(lengths, cp, ratio));
  }
  EXPECT_THROW(min_rows_to_balance(std::vector<int64_t>{3}, 2, 1), Error);
}

TEST(Simulate, MedianOfOddEvenAndEmpty) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
}

// --- sweeps -------------------------------------------------------------------------

SweepSpec small_sweep() {
  SweepSpec spec;
  spec.strategies = parse_strategy_list("all");
  spec.cps = {2, 4};
  spec.distributions = {"lognormal", "bimodal"};
  spec.seeds = {1, 2, 3};
  spec.tokens = 4096;
  return spec;
}

TEST(Sweep, PlansEveryStrategyOnEveryBatchAndReportsProgress) {
  const SweepSpec spec = small_sweep();
  std::vector<std::pair<int64_t, int64_t>> calls;
  const auto results =
      run_sweep(spec, [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  EXPECT_EQ(sweep_batches(spec), 12);
  ASSERT_EQ(results.size(), 12 * spec.strategies.size());
  ASSERT_EQ(calls.size(), 12u);
  EXPECT_EQ(calls.back(), std::make_pair(int64_t{12}, int64_t{12}));
  for (const auto& r : results) EXPECT_TRUE(r.error.empty()) << r.strategy << ": " << r.error;
  // All strategies of one batch saw the same batch: equal total work.
  for (size_t i = 0; i < results.size(); i += spec.strategies.size()) {
    for (size_t j = 1; j < spec.strategies.size(); ++j) {
      EXPECT_EQ(results[i + j].total_work, results[i].total_work);
      EXPECT_EQ(results[i + j].batch, results[i].batch);
      EXPECT_EQ(results[i + j].rows_moved_bound, results[i].rows_moved_bound);
    }
  }
  const auto rows = summarize(results);
  ASSERT_EQ(rows.size(), 2 * 2 * spec.strategies.size());
  for (const auto& row : rows) {
    EXPECT_EQ(row.batches, 3);
    EXPECT_FALSE(row.batch.has_value());
    // The median of three batches is one of them.
    std::vector<double> values;
    for (const auto& r : results) {
      if (r.strategy == row.strategy && r.cp == row.cp && r.workload == row.workload) {
        values.push_back(r.imbalance);
      }
    }
    ASSERT_EQ(values.size(), 3u);
    EXPECT_NE(std::find(values.begin(), values.end(), row.imbalance), values.end());
  }
  EXPECT_EQ(per_batch_rows(results).size(), results.size());
}

// With a node map every strategy reports its cross-node rows and bytes, beside the
// bound at spill's target; spill plans topology-aware and crosses at the bound.
TEST(Sweep, ReportsCrossNodeRowsAndBytesForEveryStrategy) {
  SweepSpec spec;
  spec.strategies = parse_strategy_list("all");
  spec.cps = {4, 8};
  spec.distributions = {"lognormal", "pareto"};
  spec.seeds = {1, 2, 3};
  spec.tokens = 16384;
  spec.params.ranks_per_node = 2;
  const auto results = run_sweep(spec);
  ASSERT_EQ(results.size(), 12 * all_strategies().size());
  int64_t spill_at_bound = 0;
  int64_t spill_batches = 0;
  int64_t zigzag_above = 0;
  for_each_sweep_batch(spec, [&](const SweepBatch& batch) {
    const int64_t bound = cross_node_rows_lower_bound(batch.lengths, batch.cp, spec.ratio, 2,
                                                      spec.params.target_imbalance)
                              .total;
    for (const SimulationResult& r : results) {
      if (r.cp != batch.cp || r.workload != batch.workload || r.batch != batch.batch) continue;
      SCOPED_TRACE(::testing::Message()
                   << r.strategy << " cp " << r.cp << " " << r.workload << " batch " << r.batch);
      ASSERT_TRUE(r.error.empty()) << r.error;
      const Plan plan =
          find_strategy(r.strategy).plan(batch.lengths, batch.cp, spec.ratio, spec.params);
      EXPECT_EQ(r.ranks_per_node, 2);
      EXPECT_EQ(r.cross_node_rows, cross_node_rows(plan.tasks(), batch.lengths, 2));
      EXPECT_EQ(r.cross_node_bytes, r.cross_node_rows * (spec.params.row_bytes.input_bytes() +
                                                         spec.params.row_bytes.result_bytes()));
      EXPECT_LE(r.cross_node_rows, r.rows_moved);  // a crossing row is a moved row
      EXPECT_EQ(r.cross_node_bound, bound);
      EXPECT_EQ(r.cross_node_bytes_bound, spec.params.row_bytes.wire_bytes(bound, bound));
      if (r.strategy == "spill") {
        SpillOptions options = spill_options(spec.params);
        EXPECT_EQ(r.cross_node_rows,
                  plan_spill(batch.lengths, batch.cp, spec.ratio, options).cross_node_rows);
        ++spill_batches;
        spill_at_bound += r.cross_node_rows == bound;
      }
      if (r.strategy == "zigzag") zigzag_above += r.cross_node_rows > bound;
    }
  });
  EXPECT_EQ(spill_batches, 12);
  EXPECT_GE(spill_at_bound, 10);  // at the bound unless a leftover piece crossed
  EXPECT_EQ(zigzag_above, 12);
  // The medians carry the node map; the reports show it.
  const auto rows = summarize(results);
  for (const SummaryRow& row : rows) {
    EXPECT_EQ(row.ranks_per_node, 2) << row.strategy;
    EXPECT_GE(row.cross_node_fraction, 0);
    EXPECT_LE(row.cross_node_fraction, 1);
  }
  std::ostringstream json;
  write_json(json, rows);
  const auto parsed = nlohmann::json::parse(json.str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& entry = parsed["results"][i];
    EXPECT_EQ(entry["ranks_per_node"], 2);
    for (const char* key :
         {"cross_node_rows", "cross_node_fraction", "cross_node_bytes", "cross_node_bound",
          "cross_node_bound_fraction", "cross_node_bytes_bound"}) {
      ASSERT_TRUE(entry.contains(key)) << key;
    }
    EXPECT_DOUBLE_EQ(entry["cross_node_bytes"].get<double>(), rows[i].cross_node_bytes);
  }
  std::ostringstream csv;
  write_csv(csv, rows);
  const auto records = parse_csv(csv.str());
  ASSERT_EQ(records.size(), rows.size() + 1);
  const auto& header = records[0];
  const auto column = std::find(header.begin(), header.end(), "cross_node_rows");
  ASSERT_NE(column, header.end());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(records[i + 1].size(), header.size());
    EXPECT_DOUBLE_EQ(std::stod(records[i + 1][static_cast<size_t>(column - header.begin())]),
                     rows[i].cross_node_rows);
  }
  std::ostringstream table;
  write_table(table, rows);
  EXPECT_THAT(table.str(), HasSubstr("x-node%  bound%  MiB x-node"));
  // Without a node map none of it appears.
  std::ostringstream plain;
  write_json(plain, summarize(run_sweep(small_sweep())));
  EXPECT_THAT(plain.str(), ::testing::Not(HasSubstr("cross_node")));
}

TEST(Sweep, RejectsANodeMapThatDoesNotDivideEveryCpSize) {
  SweepSpec spec = small_sweep();
  spec.params.ranks_per_node = 4;  // cp 2 is smaller
  bool planned = false;
  EXPECT_THAT(error_of([&] { run_sweep(spec, [&](int64_t, int64_t) { planned = true; }); }),
              HasSubstr("ranks per node (4) must divide the CP size (2)"));
  EXPECT_FALSE(planned);
  spec.params.ranks_per_node = -1;
  EXPECT_THAT(error_of([&] { run_sweep(spec); }),
              HasSubstr("ranks per node must be non-negative (0 = no node map), got -1"));
}

TEST(Sweep, UsesFileBatchesForEveryCpSize) {
  SweepSpec spec;
  spec.strategies = parse_strategy_list("none,zigzag");
  spec.cps = {1, 2, 4};
  spec.file_batches = {kSystemExample, {8, 8}};
  const auto results = run_sweep(spec);
  ASSERT_EQ(results.size(), 3u * 2u * 2u);
  EXPECT_EQ(results[0].workload, "file");
  EXPECT_EQ(results[0].batch, 1);
  EXPECT_EQ(results[2].batch, 2);
  spec.file_batches = {{3, 3}};
  EXPECT_THAT([&] { run_sweep(spec); }, ::testing::ThrowsMessage<Error>(
                                            HasSubstr("batch 1 holds 6 tokens, which CP size 4")));
  // Lengths are not validated before the sum (the strategies do that): the sum itself must
  // not overflow (it did, a UBSan report, found by fuzz_strategies through hybrid).
  spec.file_batches = {{INT64_MIN, -3}};
  EXPECT_THAT(
      [&] { run_sweep(spec); },
      ::testing::ThrowsMessage<Error>(HasSubstr("batch 1: document lengths sum beyond 64 bits")));
}

TEST(Simulate, HybridRejectsLengthsWhoseSumOverflows) {
  // The hybrid strategy's default threshold needs the sum of the (not yet validated)
  // lengths: a clean rejection, not a signed overflow.
  const std::vector<int64_t> lengths = {INT64_MIN, -3};
  EXPECT_THROW(find_strategy("hybrid").plan(lengths, 2, 4, StrategyParams{}), Error);
  const std::vector<int64_t> huge = {INT64_MAX, 1};
  EXPECT_THROW(find_strategy("hybrid").plan(huge, 2, 4, StrategyParams{}), Error);
}

TEST(Sweep, RejectsUnusableSpecsBeforePlanning) {
  SweepSpec spec = small_sweep();
  spec.cps = {3};
  EXPECT_THAT([&] { run_sweep(spec); },
              ::testing::ThrowsMessage<Error>(HasSubstr("not divisible by CP size 3")));
  spec = small_sweep();
  spec.distributions = {"zipf"};
  EXPECT_THAT([&] { run_sweep(spec); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown workload distribution 'zipf'")));
  spec = small_sweep();
  spec.strategies.clear();
  EXPECT_THROW(run_sweep(spec), Error);
  spec = small_sweep();
  spec.cps = {0};
  EXPECT_THROW(run_sweep(spec), Error);
}

TEST(Sweep, ClampsTheGreedyBlockToSmallShards) {
  SweepSpec spec;
  spec.strategies = parse_strategy_list("greedy,hybrid");
  spec.cps = {8};
  spec.distributions = {"uniform"};
  spec.seeds = {1};
  spec.tokens = 1024;  // 128 local rows, below the default block of 2048
  for (const auto& r : run_sweep(spec)) EXPECT_TRUE(r.error.empty()) << r.error;
}

// --- report generators ----------------------------------------------------------------

TEST(Reports, JsonHasTheDocumentedShape) {
  const auto results = run_sweep(small_sweep());
  for (const bool all : {false, true}) {
    const auto rows = all ? per_batch_rows(results) : summarize(results);
    std::ostringstream out;
    write_json(out, rows);
    const auto parsed = nlohmann::json::parse(out.str());
    ASSERT_TRUE(parsed.contains("results"));
    ASSERT_EQ(parsed["results"].size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& entry = parsed["results"][i];
      EXPECT_EQ(entry["strategy"], rows[i].strategy);
      EXPECT_EQ(entry["cp"], rows[i].cp);
      EXPECT_EQ(entry["workload"], rows[i].workload);
      for (const char* key :
           {"imbalance", "lower_bound", "rows_moved", "max_rows_moved_per_rank", "bytes_moved",
            "fragments_max", "rows_max", "padding_rows", "plan_ms"}) {
        ASSERT_TRUE(entry.contains(key)) << key;
        EXPECT_TRUE(entry[key].is_number()) << key;
      }
      EXPECT_DOUBLE_EQ(entry["imbalance"].get<double>(), rows[i].imbalance);
      EXPECT_DOUBLE_EQ(entry["bytes_moved"].get<double>(), rows[i].bytes_moved);
      EXPECT_EQ(entry.contains("batch"), all);
    }
  }
}

TEST(Reports, JsonEscapesStrings) {
  SummaryRow row;
  row.strategy = "a\"b\\c\n\x01";
  row.workload = "file";
  std::ostringstream out;
  write_json(out, std::vector<SummaryRow>{row});
  const auto parsed = nlohmann::json::parse(out.str());
  EXPECT_EQ(parsed["results"][0]["strategy"], row.strategy);
}

TEST(Reports, CsvHasAHeaderAndOneRecordPerRow) {
  const auto rows = summarize(run_sweep(small_sweep()));
  std::ostringstream out;
  write_csv(out, rows);
  const auto records = parse_csv(out.str());
  ASSERT_EQ(records.size(), rows.size() + 1);
  const auto& header = records[0];
  for (const char* column : {"strategy", "cp", "workload", "imbalance", "lower_bound", "rows_moved",
                             "max_rows_moved_per_rank", "bytes_moved", "fragments_max", "rows_max",
                             "padding_rows", "plan_ms"}) {
    EXPECT_NE(std::find(header.begin(), header.end(), column), header.end()) << column;
  }
  const auto column = [&](const char* name) {
    return static_cast<size_t>(std::find(header.begin(), header.end(), name) - header.begin());
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(records[i + 1].size(), header.size());
    EXPECT_EQ(records[i + 1][column("strategy")], rows[i].strategy);
    EXPECT_DOUBLE_EQ(std::stod(records[i + 1][column("imbalance")]), rows[i].imbalance);
  }
  // Awkward text is quoted and survives the round trip.
  SummaryRow awkward;
  awkward.strategy = "x,\"y\"";
  awkward.note = "line\nbreak";
  std::ostringstream quoted;
  write_csv(quoted, std::vector<SummaryRow>{awkward});
  const auto back = parse_csv(quoted.str());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1][0], awkward.strategy);
  EXPECT_EQ(back[1].back(), awkward.note);
}

TEST(Reports, TableNamesEveryStrategy) {
  const auto rows = summarize(run_sweep(small_sweep()));
  std::ostringstream out;
  write_table(out, rows);
  for (const Strategy* s : all_strategies())
    EXPECT_THAT(out.str(), HasSubstr(std::string(s->name())));
  EXPECT_THAT(out.str(), HasSubstr("lognormal, cp 2 (median of 3 batches)"));
}

TEST(Reports, SvgIsWellFormed) {
  const auto results = run_sweep(small_sweep());
  const std::vector<SimulationResult> first(
      results.begin(), results.begin() + static_cast<long>(all_strategies().size()));
  const std::string svg = render_simulation_svg(first, summarize(results), "title <&> \"quoted\"");
  EXPECT_EQ(check_xml(svg), "svg");
  EXPECT_THAT(svg, HasSubstr("xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("title &lt;&amp;&gt; &quot;quoted&quot;"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // Degenerate inputs still give a valid document.
  EXPECT_EQ(check_xml(render_simulation_svg({}, {}, "empty")), "svg");
  SimulationResult failed;
  failed.strategy = "greedy";
  failed.error = "boom";
  EXPECT_EQ(check_xml(render_simulation_svg(std::vector<SimulationResult>{failed},
                                            summarize(std::vector<SimulationResult>{failed}), "x")),
            "svg");
}

TEST(Reports, XmlCheckerCatchesMistakes) {
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    check_xml("<svg><g></svg>");
    check_xml("<svg a=b/>");
    check_xml("<svg>a & b</svg>");
    check_xml("<svg/><svg/>");
  }
  EXPECT_EQ(failures.size(), 4);
}

// --- the command ------------------------------------------------------------------

TEST(SimulateCommand, PrintsJsonCsvTableAndSvg) {
  const std::string cli = SPARSECP_CLI_PATH;
  const std::string sweep = " simulate --cp 2,4 --dist lognormal,pareto --seed 1-2 --tokens 4096";
  auto [status, out] = testing::run_shell(cli + sweep + " --json");
  ASSERT_EQ(status, 0) << out;
  const auto parsed = nlohmann::json::parse(out);
  EXPECT_EQ(parsed["results"].size(), 2 * 2 * all_strategies().size());
  EXPECT_EQ(parsed["results"][0]["batches"], 2);

  std::tie(status, out) = testing::run_shell(cli + sweep + " --csv --all-batches");
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(parse_csv(out).size(), 1 + 2 * 2 * 2 * all_strategies().size());

  const std::string svg_path = ::testing::TempDir() + "sparsecp_simulate_test.svg";
  std::tie(status, out) = testing::run_shell(cli + sweep + " --svg " + svg_path + " 2>/dev/null");
  ASSERT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("hybrid threshold: the rows per rank"));
  EXPECT_THAT(out, HasSubstr("lpt-search"));
  std::ifstream file(svg_path);
  std::stringstream svg;
  svg << file.rdbuf();
  EXPECT_EQ(check_xml(svg.str()), "svg");
  std::remove(svg_path.c_str());

  std::tie(status, out) = testing::run_shell(
      cli + " simulate --lengths 5000,300,2699,1 --cp 4 --strategies none --json");
  ASSERT_EQ(status, 0) << out;
  EXPECT_NEAR(nlohmann::json::parse(out)["results"][0]["imbalance"].get<double>(),
              1499500 / (4044825 / 4.0), 1e-12);
}

TEST(SimulateCommand, RejectsBadInputWithStatusTwo) {
  const std::string cli = SPARSECP_CLI_PATH;
  for (const std::string args :
       {" simulate --cp 3 --tokens 4096", " simulate --strategies bogus", " simulate --seed 5-1",
        " simulate --cp 4,,8", " simulate --lpt-cost exact", " simulate --json --csv",
        " simulate --lengths-file /nonexistent/file"}) {
    const auto [status, out] = testing::run_shell(cli + args + " 2>&1");
    EXPECT_EQ(status, 2) << args << ": " << out;
    EXPECT_THAT(out, HasSubstr("error")) << args;
  }
  {
    const auto [status, out] =
        testing::run_shell(cli + " simulate --cp 8 --tokens 8192 --ranks-per-node 3 2>&1");
    EXPECT_EQ(status, 2) << out;
    EXPECT_THAT(out, HasSubstr("error: ranks per node (3) must divide the CP size (8)"));
  }
  {
    const std::string mapped =
        " simulate --cp 8 --tokens 8192 --seed 1 --ranks-per-node 4 --strategies zigzag,spill";
    auto [status, out] = testing::run_shell(cli + mapped + " --json");
    ASSERT_EQ(status, 0) << out;
    const auto parsed = nlohmann::json::parse(out);
    ASSERT_EQ(parsed["results"].size(), 3u * 2u);  // three distributions
    for (const auto& entry : parsed["results"]) {
      EXPECT_EQ(entry["ranks_per_node"], 4);
      EXPECT_GT(entry["cross_node_bound"].get<double>(), 0) << entry["strategy"];
      if (entry["strategy"] == "zigzag") {
        EXPECT_GT(entry["cross_node_rows"].get<double>(), entry["cross_node_bound"].get<double>());
      }
    }
    std::tie(status, out) = testing::run_shell(cli + mapped);
    ASSERT_EQ(status, 0) << out;
    EXPECT_THAT(out, HasSubstr("Node map: 4 consecutive ranks per node"));
    EXPECT_THAT(out, HasSubstr("node map of 4 ranks per node"));
    EXPECT_THAT(out, HasSubstr("MiB x-node"));
  }
  const auto [status, out] = testing::run_shell(cli + " simulate --help");
  EXPECT_EQ(status, 0);
  EXPECT_THAT(out, HasSubstr("--zigzag-min-length"));
  EXPECT_THAT(out, HasSubstr("Examples"));
}

}  // namespace
}  // namespace sparsecp
