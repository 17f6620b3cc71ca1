// spill's owner load (spill.hpp): per-rank work that stays on each row's owner (the KL
// loss) enters the balance, so a rank with heavy owner-side work selects less. Hand cases,
// `owner_cost` against a row-by-row sum, invalid inputs, properties on random batches, the
// registered spill / auto strategies and `sparsecp spill --owner-cost`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/batch_plan.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategies/auto.hpp"
#include "sparsecp/planning/strategies/spill.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "support/error_of.hpp"
#include "support/plan_ranks.hpp"
#include "support/random_batch.hpp"
#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

using sparsecp::testing::error_of;
using ::testing::HasSubstr;

using sparsecp::testing::ranks_of;

// Selection load of each rank under `model`, summed from its tasks.
std::vector<double> selection_loads(const TaskPlan& plan, int64_t ratio, const CostModel& model) {
  std::vector<double> loads;
  for (int64_t r = 0; r < plan.cp(); ++r) {
    double load = 0;
    for (const Task& task : plan.tasks(r)) load += model.range(task.start, task.end, ratio);
    loads.push_back(load);
  }
  return loads;
}

bool same_doubles(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<uint64_t>(x[i]) != std::bit_cast<uint64_t>(y[i])) return false;
  }
  return true;
}

// Everything a SpillPlan says, compared bit for bit (the owner_load field aside).
void expect_identical(const SpillPlan& x, const SpillPlan& y) {
  EXPECT_EQ(ranks_of(x.plan), ranks_of(y.plan));
  EXPECT_EQ(std::bit_cast<uint64_t>(x.target_load), std::bit_cast<uint64_t>(y.target_load));
  EXPECT_EQ(std::bit_cast<uint64_t>(x.mean_load), std::bit_cast<uint64_t>(y.mean_load));
  EXPECT_TRUE(same_doubles(x.load_before, y.load_before));
  EXPECT_TRUE(same_doubles(x.load_after, y.load_after));
  EXPECT_EQ(x.rows_shed, y.rows_shed);
  EXPECT_EQ(x.rows_received, y.rows_received);
  EXPECT_EQ(x.received_fragments, y.received_fragments);
  EXPECT_EQ(x.rows_moved, y.rows_moved);
  EXPECT_EQ(x.target_met, y.target_met);
  EXPECT_EQ(x.leftover_pieces, y.leftover_pieces);
  EXPECT_EQ(x.cross_node_rows, y.cross_node_rows);
}

TEST(SpillOwnerLoad, EmptyIsTheSpillWithoutOneBitForBit) {
  SplitMix64 random(testing::test_seed() + 40);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 12);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 5);
    const auto lengths = testing::random_batch(random, cp, 12, trial % 4 == 0 ? 2000 : 300);
    SpillOptions options;
    options.target_imbalance = trial % 5 == 0 ? 1.0 : 1.001 + 0.01 * (trial % 7);
    if (trial % 3 == 1) options.cost = CostModel::linear(3, 0.5, 0.25, 16);
    if (trial % 6 == 2 && cp % 2 == 0) options.ranks_per_node = 2;
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " cp " << cp << " ratio " << ratio);
    const SpillPlan without = plan_spill(lengths, cp, ratio, options);
    // The loads and target of spill without an owner load, computed independently.
    const BalanceBound bound = balance_bound(lengths, cp, ratio, options.cost);
    EXPECT_EQ(without.target_load,
              std::max(options.target_imbalance * without.mean_load, bound.largest_row));
    const TaskPlan none = plan_tasks(lengths, cp, ratio, PlanOptions{.mode = Mode::kNone});
    const std::vector<double> contiguous = selection_loads(none, ratio, options.cost);
    for (int64_t r = 0; r < cp; ++r) {
      EXPECT_DOUBLE_EQ(without.load_before[static_cast<size_t>(r)],
                       contiguous[static_cast<size_t>(r)]);
    }
    EXPECT_EQ(without.owner_load, std::vector<double>(static_cast<size_t>(cp), 0.0));
    // Explicit zeros: the same plan, bit for bit.
    options.owner_load.assign(static_cast<size_t>(cp), 0.0);
    expect_identical(plan_spill(lengths, cp, ratio, options), without);
  }
}

TEST(SpillOwnerLoad, HeavyOwnerSelectsLessAndTotalsMeetTheTarget) {
  // 8 documents of 1024 rows over 4 ranks: every rank's selection load is the same.
  const std::vector<int64_t> lengths(8, 1024);
  const SpillPlan plain = plan_spill(lengths, 4, 4);
  EXPECT_EQ(plain.rows_moved, 0);
  const double selection = plain.load_before[0];
  SpillOptions options;
  options.target_imbalance = 1.01;
  // Whole numbers, as the causal loads are: every sum below is exact.
  for (const double share : {0.1, 0.9, 0.2, 0.3}) {
    options.owner_load.push_back(std::round(share * selection));
  }
  const SpillPlan spill = plan_spill(lengths, 4, 4, options);
  check_plan_covers(spill.plan, lengths);
  EXPECT_EQ(spill.owner_load, options.owner_load);
  EXPECT_TRUE(spill.target_met);
  const double mean = std::accumulate(spill.load_before.begin(), spill.load_before.end(), 0.0) / 4;
  EXPECT_DOUBLE_EQ(spill.mean_load, mean);
  EXPECT_DOUBLE_EQ(spill.mean_load, selection + (options.owner_load[0] + options.owner_load[1] +
                                                 options.owner_load[2] + options.owner_load[3]) /
                                                    4);
  const std::vector<double> selected = selection_loads(spill.plan, 4, CostModel{});
  double busiest = 0;
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_DOUBLE_EQ(spill.load_before[r], selection + options.owner_load[r]) << "rank " << r;
    EXPECT_NEAR(spill.load_after[r], selected[r] + options.owner_load[r], 1e-9 * selection)
        << "rank " << r;
    busiest = std::max(busiest, spill.load_after[r]);
  }
  EXPECT_LE(busiest / spill.mean_load, 1.01);
  // Rank 1 (the heaviest owner load) sheds and selects least; the lightest receives.
  EXPECT_GT(spill.rows_shed[1], 0);
  EXPECT_EQ(spill.rows_received[1], 0);
  EXPECT_EQ(*std::min_element(selected.begin(), selected.end()), selected[1]);
  EXPECT_LT(selected[1], 0.7 * selection);
  EXPECT_GT(spill.rows_received[0], 0);
  EXPECT_EQ(spill.rows_shed[0], 0);
  // Selection alone is now unbalanced, on purpose; without the owner load it was not.
  EXPECT_GT(plan_stats(spill.plan, lengths, 4).imbalance, 1.1);
}

TEST(SpillOwnerLoad, OwnerLoadAboveTheMeanShedsEveryOwnRowAndNoMore) {
  const std::vector<int64_t> lengths = {3000, 1000, 2000, 2000};
  const SpillPlan plain = plan_spill(lengths, 4, 4);
  const double total = std::accumulate(plain.load_before.begin(), plain.load_before.end(), 0.0);
  SpillOptions options;
  options.owner_load = {0, 5 * total, 0, 0};  // rank 1's KL alone outweighs everything else
  const SpillPlan spill = plan_spill(lengths, 4, 4, options);
  check_plan_covers(spill.plan, lengths);
  EXPECT_EQ(spill.target_load, 5 * total);  // T = the largest owner load: still reachable
  EXPECT_TRUE(spill.target_met);
  // All its own rows that cost anything: it keeps only document 1's first 3 rows, which
  // see no key (causal cost 0), and receives nothing.
  EXPECT_EQ(spill.rows_shed[1], 1997);
  EXPECT_EQ(spill.rows_received[1], 0);
  ASSERT_EQ(spill.plan.tasks(1).size(), 1u);
  EXPECT_EQ(spill.plan.tasks(1)[0], (Task{1, 0, 3}));
  EXPECT_EQ(spill.load_after[1], 5 * total);  // its selection load is 0
  // The others shed nothing: T leaves them room for rank 1's rows.
  EXPECT_EQ(spill.rows_shed[0] + spill.rows_shed[2] + spill.rows_shed[3], 0);
  EXPECT_EQ(spill.rows_moved, 1997);

  // The costliest row must land on some rank: T is at least the least owner load plus it.
  // One row per rank costing 1, 2, 3, 4 and an owner load of 10 each: T = 10 + 4, not
  // 1.001 x 12.5, and nothing moves (moving rank 3's row could only make another rank 14).
  SpillOptions everywhere;
  everywhere.owner_load.assign(4, 10);
  const SpillPlan level = plan_spill(std::vector<int64_t>{4}, 4, 1, everywhere);
  EXPECT_EQ(level.target_load, 14);
  EXPECT_TRUE(level.target_met);
  EXPECT_EQ(level.rows_moved, 0);
}

TEST(SpillOwnerLoad, RejectsInvalidOwnerLoads) {
  const std::vector<int64_t> lengths = {8, 8};
  const auto plan_with = [&](std::vector<double> owner) {
    return error_of([&] {
      SpillOptions options;
      options.owner_load = std::move(owner);
      plan_spill(lengths, 2, 4, options);
    });
  };
  EXPECT_THAT(plan_with({1, 2, 3}),
              HasSubstr("spill owner load needs one value per rank (cp 2) or none, got 3 values"));
  EXPECT_THAT(plan_with({1}), HasSubstr("got 1 values"));
  EXPECT_THAT(plan_with({1, -0.5}),
              HasSubstr("spill owner load of rank 1 must be finite and non-negative, got -0.5"));
  EXPECT_THAT(plan_with({std::numeric_limits<double>::quiet_NaN(), 0}),
              HasSubstr("owner load of rank 0 must be finite and non-negative, got nan"));
  EXPECT_THAT(plan_with({0, std::numeric_limits<double>::infinity()}),
              HasSubstr("owner load of rank 1 must be finite and non-negative, got inf"));
  EXPECT_EQ(plan_with({0, 0}), "");
  // The strategy parameters check the values (their count needs the batch).
  StrategyParams params;
  params.owner_load = {1, -2};
  EXPECT_THAT(error_of([&] { validate_strategy_params(params); }),
              HasSubstr("owner load of rank 1 must be finite and non-negative, got -2"));
  params.owner_load = {1, 2, 3};
  EXPECT_THAT(error_of([&] { find_strategy("spill").plan(lengths, 2, 4, params); }),
              HasSubstr("needs one value per rank (cp 2) or none, got 3 values"));
  EXPECT_THAT(error_of([&] { find_strategy("auto").plan(lengths, 2, 4, params); }),
              HasSubstr("needs one value per rank (cp 2) or none, got 3 values"));
  // owner_cost validates the batch and the model.
  EXPECT_THAT(error_of([&] { owner_cost(lengths, 3, 4, CostModel::linear(1, 0, 1, 8)); }),
              HasSubstr("equal contiguous CP partition"));
  EXPECT_THAT(error_of([&] { owner_cost(lengths, 2, 4, CostModel::linear(-1, 0, 1, 8)); }),
              HasSubstr("coefficient a must be finite and non-negative, got -1"));
}

TEST(SpillOwnerLoad, OwnerCostSumsEachOwnedRow) {
  SplitMix64 random(testing::test_seed() + 41);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 8);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 5);
    const int64_t topk = 1 + static_cast<int64_t>(random.next() % 64);
    const auto lengths = testing::random_batch(random, cp, 10, 1500);
    const CostModel kl = CostModel::linear(2.5, 0, 0.75, topk);  // a + c * min(topk, vis)
    const std::vector<double> cost = owner_cost(lengths, cp, ratio, kl);
    ASSERT_EQ(cost.size(), static_cast<size_t>(cp));
    // Row by row: global row g belongs to rank g / local.
    const int64_t local = std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) / cp;
    std::vector<double> expected(static_cast<size_t>(cp), 0.0);
    int64_t global = 0;
    for (const int64_t length : lengths) {
      for (int64_t p = 0; p < length; ++p, ++global) {
        const int64_t visible = visible_keys(p, ratio);
        expected[static_cast<size_t>(global / local)] +=
            2.5 + 0.75 * static_cast<double>(std::min(topk, visible));
      }
    }
    for (int64_t r = 0; r < cp; ++r) {
      EXPECT_NEAR(cost[static_cast<size_t>(r)], expected[static_cast<size_t>(r)],
                  1e-9 * std::max(1.0, expected[static_cast<size_t>(r)]))
          << "trial " << trial << " rank " << r;
    }
  }
}

TEST(SpillOwnerLoad, PropertiesOnRandomBatches) {
  SplitMix64 random(testing::test_seed() + 42);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  int64_t met_checked = 0;
  int64_t capped = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 12);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 5);
    const auto lengths = testing::random_batch(random, cp, 12, trial % 4 == 0 ? 2000 : 300);
    SpillOptions options;
    options.target_imbalance =
        trial % 5 == 0 ? 1.0 : 1.0 + static_cast<double>(random.next() % 30) / 100;
    if (trial % 3 == 1) options.cost = CostModel::linear(4, 1, 0.5, 32);
    const SpillPlan plain = plan_spill(lengths, cp, ratio, options);
    const double mean_selection = plain.mean_load;
    // Owner loads from 0 to `scale` x the mean selection load; a few ranks heavier.
    const double scale = trial % 4 == 3 ? 3.0 : 0.6;
    for (int64_t r = 0; r < cp; ++r) {
      const double unit = static_cast<double>(random.next() % 1000) / 1000;
      options.owner_load.push_back(std::floor(scale * unit * mean_selection));  // exact sums
    }
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " cp " << cp << " ratio " << ratio << " target "
                 << options.target_imbalance << " owner scale " << scale);
    const SpillPlan spill = plan_spill(lengths, cp, ratio, options);
    ASSERT_EQ(spill.plan.cp(), cp);
    check_plan_covers(spill.plan, lengths);
    int64_t longest = 0;
    for (const int64_t length : lengths) longest = std::max(longest, length);
    const int64_t local = std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) / cp;
    const PlanStats stats = plan_stats(spill.plan, lengths, ratio, options.cost);
    const std::vector<double> selected = selection_loads(spill.plan, ratio, options.cost);
    double total = 0;
    double busiest = 0;
    bool at_cap = false;
    for (int64_t r = 0; r < cp; ++r) {
      const size_t i = static_cast<size_t>(r);
      EXPECT_LE(stats.rows[i], 2 * local) << "rank " << r;  // the seed's cap
      at_cap = at_cap || stats.rows[i] == 2 * local;
      EXPECT_NEAR(spill.load_after[i], selected[i] + options.owner_load[i],
                  1e-9 * std::max(1.0, spill.load_after[i]))
          << "rank " << r;
      EXPECT_DOUBLE_EQ(spill.load_before[i], plain.load_before[i] + options.owner_load[i]);
      total += spill.load_after[i];
      busiest = std::max(busiest, spill.load_after[i]);
    }
    // T: the target on the totals, at least the costliest row on the least owner load
    // and the largest owner load.
    const double largest_row = options.cost.row(visible_keys(longest - 1, ratio));
    const auto [least, most] =
        std::minmax_element(options.owner_load.begin(), options.owner_load.end());
    EXPECT_DOUBLE_EQ(spill.target_load, std::max({options.target_imbalance * spill.mean_load,
                                                  *least + largest_row, *most}));
    EXPECT_NEAR(spill.mean_load * static_cast<double>(cp), total, 1e-9 * total);
    if (spill.target_met) {
      EXPECT_LE(busiest, spill.target_load);
    }
    // Met whenever the slack allows it and the row cap does not bind.
    const double slack = static_cast<double>(cp) * spill.target_load - total;
    if (slack >= static_cast<double>(cp) * largest_row) {
      if (at_cap && !spill.target_met) {
        ++capped;
      } else {
        EXPECT_TRUE(spill.target_met) << "slack " << slack;
        ++met_checked;
      }
    }
    // Owners keep their rows but the shed ones; ranks below T shed nothing.
    for (int64_t r = 0; r < cp; ++r) {
      const size_t i = static_cast<size_t>(r);
      if (spill.load_before[i] <= spill.target_load) {
        EXPECT_EQ(spill.rows_shed[i], 0) << "rank " << r;
      }
    }
    // The same plan on every call.
    EXPECT_EQ(ranks_of(plan_spill(lengths, cp, ratio, options).plan), ranks_of(spill.plan));
  }
  std::printf("owner-load properties: target checked on %lld plans, %lld missed at the row cap\n",
              static_cast<long long>(met_checked), static_cast<long long>(capped));
  EXPECT_GT(met_checked, 100);  // the balance guarantee was exercised
  EXPECT_LT(capped, met_checked / 10);
}

TEST(SpillOwnerLoad, StrategiesCarryIt) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  StrategyParams params;
  params.owner_load = {10000, 0, 500000, 0};
  SpillOptions options;
  options.target_imbalance = params.target_imbalance;
  options.owner_load = params.owner_load;
  const Plan registered = find_strategy("spill").plan(lengths, 4, 4, params);
  EXPECT_EQ(ranks_of(registered.tasks()), ranks_of(plan_spill(lengths, 4, 4, options).plan));
  EXPECT_NE(ranks_of(registered.tasks()), ranks_of(plan_spill(lengths, 4, 4).plan));
  // The seed's modes never see it.
  StrategyParams plain;
  for (const char* mode : {"none", "zigzag", "greedy", "hybrid"}) {
    EXPECT_EQ(ranks_of(find_strategy(mode).plan(lengths, 4, 4, params).tasks()),
              ranks_of(find_strategy(mode).plan(lengths, 4, 4, plain).tasks()))
        << mode;
  }
  // auto predicts each rank's compute as its selection cost plus its owner load.
  AutoOptions with_owner = auto_options(params);
  const TaskPlan none = plan_tasks(lengths, 4, 4, PlanOptions{.mode = Mode::kNone});
  const AutoCandidate predicted = predict_step(none, lengths, 4, with_owner);
  const PlanStats stats = plan_stats(none, lengths, 4, with_owner.cost);
  double busiest = 0;
  double total = 0;
  for (size_t r = 0; r < 4; ++r) {
    busiest = std::max(busiest, stats.cost[r] + params.owner_load[r]);
    total += stats.cost[r] + params.owner_load[r];
  }
  EXPECT_DOUBLE_EQ(predicted.compute_ns, busiest);
  EXPECT_DOUBLE_EQ(predicted.imbalance, busiest * 4 / total);
  const AutoChoice choice = choose_plan(lengths, 4, 4, with_owner);
  EXPECT_DOUBLE_EQ(choice.candidates.front().compute_ns, busiest);
  // The fingerprint tells plans with and without it apart (ranks must agree on it).
  const Strategy& spill = find_strategy("spill");
  const uint64_t with = planning_fingerprint(lengths, 4, 4, spill, params).value();
  EXPECT_NE(with, planning_fingerprint(lengths, 4, 4, spill, plain).value());
  StrategyParams other = params;
  other.owner_load[3] = 1;
  EXPECT_NE(with, planning_fingerprint(lengths, 4, 4, spill, other).value());
  EXPECT_EQ(with, planning_fingerprint(lengths, 4, 4, spill, params).value());
}

TEST(AutoNodeMap, SpillCandidatesAreTheTopologyAwarePlans) {
  SplitMix64 random(testing::test_seed() + 43);
  const auto lengths = testing::random_batch(random, 8, 12, 2000);
  AutoOptions options;
  options.cost = CostModel{};  // causal pairs: spill's own measure
  options.spill_targets = {1.001};
  options.params.ranks_per_node = 4;
  const AutoChoice choice = choose_plan(lengths, 8, 4, options);
  const auto spill = std::find_if(choice.candidates.begin(), choice.candidates.end(),
                                  [](const AutoCandidate& c) { return c.name == "spill(1.001)"; });
  ASSERT_NE(spill, choice.candidates.end());
  ASSERT_TRUE(spill->error.empty()) << spill->error;
  SpillOptions topology;
  topology.ranks_per_node = 4;
  const SpillPlan expected = plan_spill(lengths, 8, 4, topology);
  EXPECT_EQ(spill->rows_moved, expected.rows_moved);
  // A node map that does not divide cp is an error of the call, not of every candidate.
  options.params.ranks_per_node = 3;
  EXPECT_THAT(error_of([&] { choose_plan(lengths, 8, 4, options); }), HasSubstr("(3)"));
}

// --- `sparsecp spill --owner-cost` ----------------------------------------------------

TEST(SpillOwnerCommand, JsonGivesSelectionOwnerAndTotalPerRank) {
  const auto [status, out] =
      testing::run_shell(std::string(SPARSECP_CLI_PATH) +
                         " spill --lengths 5000,300,2699,1 --cp 4 --owner-cost 3,400 --json");
  ASSERT_EQ(status, 0) << out;
  const auto json = nlohmann::json::parse(out);
  EXPECT_EQ(json["owner_cost"]["a"].get<double>(), 3);
  EXPECT_EQ(json["owner_cost"]["c"].get<double>(), 400);
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  SpillOptions options;
  options.owner_load = owner_cost(lengths, 4, 4, CostModel::linear(3, 0, 400, 512));
  const SpillPlan spill = plan_spill(lengths, 4, 4, options);
  const auto& ranks = json["batches"][0]["ranks"];
  ASSERT_EQ(ranks.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_DOUBLE_EQ(ranks[r]["owner_load"].get<double>(), options.owner_load[r]);
    EXPECT_DOUBLE_EQ(ranks[r]["load_after"].get<double>(), spill.load_after[r]);
    EXPECT_DOUBLE_EQ(ranks[r]["selection_load_after"].get<double>(),
                     spill.load_after[r] - options.owner_load[r]);
    EXPECT_EQ(ranks[r]["rows_shed"].get<int64_t>(), spill.rows_shed[r]);
  }
  EXPECT_EQ(json["batches"][0]["rows_moved"].get<int64_t>(), spill.rows_moved);
  // Without the option: no owner load anywhere.
  const auto [plain_status, plain] = testing::run_shell(
      std::string(SPARSECP_CLI_PATH) + " spill --lengths 5000,300,2699,1 --cp 4 --json");
  ASSERT_EQ(plain_status, 0) << plain;
  const auto plain_json = nlohmann::json::parse(plain);
  EXPECT_TRUE(plain_json["owner_cost"].is_null());
  EXPECT_EQ(plain_json["batches"][0]["ranks"][0]["owner_load"].get<double>(), 0);
}

TEST(SpillOwnerCommand, BadOwnerCostNamesTheValue) {
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"1", "--owner-cost takes two numbers a,c"},
           {"1,2,3", "--owner-cost takes two numbers a,c"},
           {"1,x", "--owner-cost: 'x' is not a number"},
           {"-1,2", "--owner-cost: a must be finite and non-negative, got -1"},
           {"1,inf", "--owner-cost: c must be finite and non-negative, got inf"},
           {"0,0", "--owner-cost: a and c are both 0"},
           // Issue 30: 1e308 gave inf/nan loads and exit 0.
           {"1e308,1", "cost model coefficient a must be at most 1e+200"},
           {"1,1e300", "cost model coefficient c must be at most 1e+200"}}) {
    const auto [status, out] =
        testing::run_shell(std::string(SPARSECP_CLI_PATH) +
                           " spill --lengths 4,4 --cp 2 --owner-cost=" + flag + " 2>&1");
    EXPECT_EQ(status, 2) << flag;
    EXPECT_THAT(out, HasSubstr("error: " + message)) << flag;
  }
}

}  // namespace
}  // namespace sparsecp
