// Node maps: the cross-node bound against a brute-force reference on small batches,
// cross_node_rows of hand plans, and topology-aware spill on random batches (coverage,
// the same target and a busiest rank within one row of plain spill's, cross-node rows
// exactly at the bound when step 5 placed nothing, at least the bound when the target
// is met, fewer than plain spill's on most batches).
#include "sparsecp/planning/node_map.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sparsecp/planning/batch_plan.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "support/error_of.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using sparsecp::testing::error_of;
using ::testing::HasSubstr;

// Reference: every row's cost of each node, sorted descending; the fewest whose sum
// reaches the node's excess over per_node * T.
int64_t cross_bound_reference(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                              int64_t per_node, double target) {
  const CostModel model;
  const auto ranks = contiguous_pieces(lengths, cp);
  int64_t total = 0;
  for (int64_t node = 0; node < cp / per_node; ++node) {
    std::vector<double> costs;
    double load = 0;
    for (int64_t r = node * per_node; r < (node + 1) * per_node; ++r) {
      for (const Task& piece : ranks[static_cast<size_t>(r)]) {
        for (int64_t row = piece.start; row < piece.end; ++row) {
          costs.push_back(model.range(row, row + 1, ratio));
          load += costs.back();
        }
      }
    }
    std::sort(costs.rbegin(), costs.rend());
    double excess = load - static_cast<double>(per_node) * target;
    int64_t rows = 0;
    for (size_t i = 0; excess > 0 && i < costs.size(); ++i, ++rows) excess -= costs[i];
    total += rows;
  }
  return total;
}

TEST(NodeMap, CrossNodeRowsOfHandPlans) {
  // Two documents of 4 rows, 4 ranks of 2 rows, 2 nodes of 2 ranks.
  const std::vector<int64_t> lengths{4, 4};
  // Rank 0 selects document 1 rows [0, 2) (owner rank 2, node 1): 2 rows cross.
  // Rank 2 selects document 0 rows [0, 2) (owner rank 0, node 0): 2 rows cross.
  // Rank 1 selects document 0 rows [2, 4) (its own); rank 3 document 1 rows [2, 4).
  const TaskPlan swapped =
      TaskPlan::from_ranks({{{1, 0, 2}}, {{0, 2, 4}}, {{0, 0, 2}}, {{1, 2, 4}}});
  EXPECT_EQ(cross_node_rows(swapped, lengths, 2), 4);
  EXPECT_EQ(cross_node_rows(swapped, lengths, 4), 0);  // one node
  EXPECT_EQ(cross_node_rows(swapped, lengths, 1), 4);  // every rank a node
  // Ranks 0 and 1 swap their rows: moves inside node 0, nothing crosses.
  const TaskPlan inside =
      TaskPlan::from_ranks({{{0, 2, 4}}, {{0, 0, 2}}, {{1, 0, 2}}, {{1, 2, 4}}});
  EXPECT_EQ(cross_node_rows(inside, lengths, 2), 0);
  EXPECT_EQ(cross_node_rows(inside, lengths, 1), 4);
}

TEST(NodeMap, BoundMatchesTheReference) {
  SplitMix64 random(testing::test_seed() + 40);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t per_node = 1 + static_cast<int64_t>(random.next() % 4);
    const int64_t cp = per_node * (1 + static_cast<int64_t>(random.next() % 4));
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 4);
    const auto lengths = testing::random_batch(random, cp, 8, 120);
    const double target = 1.0 + static_cast<double>(random.next() % 20) / 100;
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " cp " << cp << " per node " << per_node);
    const CrossNodeBound bound = cross_node_rows_lower_bound(lengths, cp, ratio, per_node, target);
    EXPECT_EQ(bound.total, cross_bound_reference(lengths, cp, ratio, per_node, bound.target_load));
    // Never above the flat rows-moved bound; equal to it with one rank per node.
    const RowsMovedBound flat = rows_moved_lower_bound_at(lengths, cp, ratio, bound.target_load);
    EXPECT_LE(bound.total, flat.total);
    if (per_node == 1) {
      EXPECT_EQ(bound.total, flat.total);
    }
  }
}

TEST(NodeMap, TopologyAwareSpillKeepsBalanceAndCrossesAtTheBound) {
  SplitMix64 random(testing::test_seed() + 41);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  int64_t at_bound = 0;
  int64_t fewer_than_plain = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t per_node = 2 + static_cast<int64_t>(random.next() % 3);
    const int64_t cp = per_node * (2 + static_cast<int64_t>(random.next() % 4));
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 4);
    const auto lengths = testing::random_batch(random, cp, 12, trial % 3 == 0 ? 2000 : 300);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " cp " << cp << " per node " << per_node);
    SpillOptions plain;
    plain.target_imbalance = 1.0 + static_cast<double>(random.next() % 30) / 100;
    SpillOptions topology = plain;
    topology.ranks_per_node = per_node;
    const SpillPlan flat = plan_spill(lengths, cp, ratio, plain);
    const SpillPlan aware = plan_spill(lengths, cp, ratio, topology);
    check_plan_covers(aware.plan, lengths);
    EXPECT_EQ(aware.target_load, flat.target_load);
    const PlanStats stats = plan_stats(aware.plan, lengths, ratio);
    for (int64_t r = 0; r < cp; ++r) {
      EXPECT_EQ(static_cast<double>(stats.work[static_cast<size_t>(r)]),
                aware.load_after[static_cast<size_t>(r)]);
    }
    // Same balance: where plain spill meets the target, so does the topology-aware one
    // (up to one costliest row where its leftovers went elsewhere).
    const double busiest_flat = *std::max_element(flat.load_after.begin(), flat.load_after.end());
    const double busiest = *std::max_element(aware.load_after.begin(), aware.load_after.end());
    const double largest_row = static_cast<double>(
        visible_keys(*std::max_element(lengths.begin(), lengths.end()) - 1, ratio));
    EXPECT_LE(busiest, std::max(busiest_flat, aware.target_load) + largest_row);
    const int64_t bound =
        cross_node_rows_lower_bound_at(lengths, cp, ratio, per_node, aware.target_load).total;
    EXPECT_EQ(aware.cross_node_bound, bound);
    EXPECT_EQ(aware.cross_node_rows, cross_node_rows(aware.plan, lengths, per_node));
    if (aware.target_met) {
      EXPECT_GE(aware.cross_node_rows, bound);  // a bound on plans whose busiest is at most T
    }

    if (aware.leftover_pieces == 0) {
      EXPECT_EQ(aware.cross_node_rows, bound);
    }
    at_bound += aware.cross_node_rows == bound;
    fewer_than_plain += aware.cross_node_rows < cross_node_rows(flat.plan, lengths, per_node);
  }
  EXPECT_GT(at_bound, 200);          // the bound is reached on most batches ...
  EXPECT_GT(fewer_than_plain, 200);  // ... and beats plain spill's cross-node rows on most
}

TEST(NodeMap, RejectsBadNodeMaps) {
  const std::vector<int64_t> lengths{8, 4};
  EXPECT_THAT(error_of([&] { cross_node_rows_lower_bound(lengths, 4, 1, 3, 1.0); }),
              HasSubstr("ranks per node (3) must divide the CP size (4)"));
  EXPECT_THAT(error_of([&] { cross_node_rows_lower_bound(lengths, 4, 1, 0, 1.0); }),
              HasSubstr("ranks per node must be at least 1, got 0"));
  SpillOptions options;
  options.ranks_per_node = -1;
  EXPECT_THAT(error_of([&] { plan_spill(lengths, 4, 1, options); }),
              HasSubstr("spill ranks per node must be non-negative (0 = no node map), got -1"));
  options.ranks_per_node = 3;
  EXPECT_THAT(error_of([&] { plan_spill(lengths, 4, 1, options); }),
              HasSubstr("ranks per node (3) must divide the CP size (4)"));
}

// The registered strategy "spill" takes the node map from StrategyParams (the CLI's and
// Python's path): the same plan as plan_spill with SpillOptions::ranks_per_node, other
// strategies unaffected, and the parameter's checks name the value.
TEST(NodeMap, SpillStrategyTakesTheNodeMapFromStrategyParams) {
  SplitMix64 random(testing::test_seed() + 43);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  int64_t changed = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t per_node = 2;
    const int64_t cp = per_node * (2 + static_cast<int64_t>(random.next() % 3));
    const auto lengths = testing::random_batch(random, cp, 12, 2000);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " cp " << cp);
    StrategyParams flat;
    StrategyParams mapped;
    mapped.ranks_per_node = per_node;
    SpillOptions options;
    options.ranks_per_node = per_node;
    const SpillPlan reference = plan_spill(lengths, cp, 4, options);
    const Plan plan = find_strategy("spill").plan(lengths, cp, 4, mapped);
    for (int64_t r = 0; r < cp; ++r) {
      const auto got = plan.tasks().tasks(r);
      const auto want = reference.plan.tasks(r);
      ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end(),
                             [](const Task& a, const Task& b) {
                               return a.document == b.document && a.start == b.start &&
                                      a.end == b.end;
                             }))
          << "rank " << r;
    }
    EXPECT_EQ(cross_node_rows(plan.tasks(), lengths, per_node), reference.cross_node_rows);
    const Plan plain = find_strategy("spill").plan(lengths, cp, 4, flat);
    changed += cross_node_rows(plain.tasks(), lengths, per_node) != reference.cross_node_rows;
    for (const char* seed_mode : {"zigzag", "hybrid"}) {
      const Plan a = find_strategy(seed_mode).plan(lengths, cp, 4, flat);
      const Plan b = find_strategy(seed_mode).plan(lengths, cp, 4, mapped);
      EXPECT_EQ(a.stats().work, b.stats().work) << seed_mode;
      EXPECT_EQ(a.tasks().task_count(), b.tasks().task_count()) << seed_mode;
    }
  }
  EXPECT_GT(changed, 0);  // the node map changes some plans
  StrategyParams bad;
  bad.ranks_per_node = -2;
  EXPECT_THAT(error_of([&] { validate_strategy_params(bad); }),
              HasSubstr("spill ranks per node must be non-negative (0 = no node map), got -2"));
  bad.ranks_per_node = 3;
  const std::vector<int64_t> lengths{8, 4};
  EXPECT_THAT(error_of([&] { find_strategy("spill").plan(lengths, 4, 1, bad); }),
              HasSubstr("ranks per node (3) must divide the CP size (4)"));
}

}  // namespace
}  // namespace sparsecp
