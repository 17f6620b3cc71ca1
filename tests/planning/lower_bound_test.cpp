// Lower bounds: hand cases, the fast bounds against the sort-every-row reference on
// random batches, and "no strategy moves fewer rows than the bound at its own load".
#include "sparsecp/planning/lower_bound.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "support/error_of.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using sparsecp::testing::error_of;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ContiguousPieces, SplitsDocumentsAtShardBoundaries) {
  const std::vector<int64_t> lengths = {5, 1, 9, 1};  // 16 rows, 4 per rank
  const auto ranks = contiguous_pieces(lengths, 4);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_THAT(ranks[0], ElementsAre(Task{0, 0, 4}));
  EXPECT_THAT(ranks[1], ElementsAre(Task{0, 4, 5}, Task{1, 0, 1}, Task{2, 0, 2}));
  EXPECT_THAT(ranks[2], ElementsAre(Task{2, 2, 6}));
  EXPECT_THAT(ranks[3], ElementsAre(Task{2, 6, 9}, Task{3, 0, 1}));
}

TEST(BalanceBound, SystemExample) {
  // SYSTEM.md: contiguous work (499500, 1499500, 1197000, 848825) on 4 ranks.
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const BalanceBound bound = balance_bound(lengths, 4, 4);
  EXPECT_DOUBLE_EQ(bound.mean_load, (499500.0 + 1499500 + 1197000 + 848825) / 4);
  EXPECT_EQ(bound.largest_row, 1250);  // the last row of the 5000-row document
  EXPECT_EQ(bound.bound, 1.0);
  const RowsMovedBound moved = rows_moved_lower_bound(lengths, 4, 4, 1.0);
  EXPECT_THAT(moved.load, ElementsAre(499500, 1499500, 1197000, 848825));
  EXPECT_EQ(moved.rows[0], 0);
  EXPECT_EQ(moved.rows[3], 0);
  EXPECT_GT(moved.rows[1], 0);
  EXPECT_EQ(moved.total, moved.rows[1] + moved.rows[2]);
  // One long document: the last row alone can exceed the mean.
  std::vector<int64_t> single(53, 1);  // one 12-row document and 52 keyless rows
  single[0] = 12;
  const BalanceBound tight = balance_bound(single, 8, 2);
  EXPECT_EQ(tight.mean_load, 36.0 / 8);
  EXPECT_EQ(tight.largest_row, 6);
  EXPECT_EQ(tight.bound, 6 / 4.5);
  // The rows-moved bound is then taken at the largest row, the best reachable level.
  EXPECT_EQ(rows_moved_lower_bound(single, 8, 2, 1.0).target_load, 6);
}

TEST(HeaviestRows, HandCase) {
  // Ratio 4, rows 0..15 of one document cost 0,0,0,1,1,1,1,2,2,2,2,3,3,3,3,4.
  const std::vector<Task> piece = {{0, 0, 16}};
  const CostModel causal;
  EXPECT_EQ(heaviest_rows(piece, 4, causal, 0).rows, 0);
  EXPECT_EQ(heaviest_rows(piece, 4, causal, -3).cut[0], 16);
  Shed shed = heaviest_rows(piece, 4, causal, 5);  // 4 + 3
  EXPECT_EQ(shed.rows, 2);
  EXPECT_EQ(shed.cut[0], 14);
  EXPECT_EQ(shed.cost, 7);
  shed = heaviest_rows(piece, 4, causal, 7.5);  // 4 + 3 + 3
  EXPECT_EQ(shed.rows, 3);
  EXPECT_EQ(shed.cost, 10);
  shed = heaviest_rows(piece, 4, causal, 1000);  // more than the piece holds: all
  EXPECT_EQ(shed.rows, 16);
  EXPECT_EQ(shed.cut[0], 0);
  EXPECT_EQ(shed.cost, 28);
}

TEST(HeaviestRows, TiesExtendExistingTailsFirst) {
  // Piece 0 ends at cost 2 (rows 7..8 of its document), piece 1 ends at cost 3.
  const std::vector<Task> pieces = {{0, 5, 9}, {1, 0, 12}};
  // Costs: piece 0 rows 5,6 -> 1,1; 7,8 -> 2,2. Piece 1 rows 0..2 -> 0; 3..6 -> 1;
  // 7..10 -> 2; 11 -> 3. Excess 5: 3 (piece 1), then one 2: piece 1 already sheds, so
  // the tie goes to it although piece 0 comes first in packed order.
  const Shed shed = heaviest_rows(pieces, 4, CostModel{}, 5);
  EXPECT_EQ(shed.rows, 2);
  EXPECT_EQ(shed.cut[0], 9);   // untouched
  EXPECT_EQ(shed.cut[1], 10);  // rows 10, 11
}

TEST(LowerBound, FastEqualsReferenceOnRandomBatches) {
  SplitMix64 random(testing::test_seed() + 1);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 9);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 5);
    const auto lengths = testing::random_batch(random, cp, 9, 200);
    CostModel model;
    if (trial % 3 == 1) {
      model = CostModel::linear(0.5, 0.25, 1, 1 + int64_t(random.next() % 20));
    } else if (trial % 3 == 2) {
      model = CostModel::linear(1, 0, 0, 512);  // every row alike
    }
    const BalanceBound fast = balance_bound(lengths, cp, ratio, model);
    const BalanceBound slow = balance_bound_reference(lengths, cp, ratio, model);
    EXPECT_EQ(fast.mean_load, slow.mean_load);
    EXPECT_EQ(fast.largest_row, slow.largest_row);
    EXPECT_EQ(fast.bound, slow.bound);
    for (const double target : {1.0, 1.01, 1.1, 1.5}) {
      const RowsMovedBound bound = rows_moved_lower_bound(lengths, cp, ratio, target, model);
      const RowsMovedBound reference =
          rows_moved_lower_bound_reference(lengths, cp, ratio, bound.target_load, model);
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " cp " << cp << " ratio " << ratio
                                        << " target " << target);
      EXPECT_EQ(bound.target_load, std::max(target * fast.mean_load, fast.largest_row));
      EXPECT_EQ(bound.load, reference.load);
      EXPECT_EQ(bound.rows, reference.rows);
      EXPECT_EQ(bound.total, reference.total);
      EXPECT_EQ(bound.max_per_rank, reference.max_per_rank);
    }
  }
}

TEST(LowerBound, ShedRowsAreTailsThatCoverTheExcess) {
  SplitMix64 random(testing::test_seed() + 2);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 6);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 4);
    const auto lengths = testing::random_batch(random, cp, 8, 300);
    const auto ranks = contiguous_pieces(lengths, cp);
    for (const auto& pieces : ranks) {
      double load = 0;
      for (const Task& piece : pieces) load += range_work(piece.start, piece.end, ratio);
      const double excess = load * static_cast<double>(random.next() % 100) / 100;
      const Shed shed = heaviest_rows(pieces, ratio, CostModel{}, excess);
      double cost = 0;
      int64_t rows = 0;
      int64_t cheapest_shed = INT64_MAX;
      int64_t dearest_kept = -1;
      for (size_t i = 0; i < pieces.size(); ++i) {
        ASSERT_GE(shed.cut[i], pieces[i].start);
        ASSERT_LE(shed.cut[i], pieces[i].end);
        cost += range_work(shed.cut[i], pieces[i].end, ratio);
        rows += pieces[i].end - shed.cut[i];
        if (shed.cut[i] < pieces[i].end) {
          cheapest_shed = std::min(cheapest_shed, visible_keys(shed.cut[i], ratio));
        }
        if (shed.cut[i] > pieces[i].start) {
          dearest_kept = std::max(dearest_kept, visible_keys(shed.cut[i] - 1, ratio));
        }
      }
      EXPECT_EQ(rows, shed.rows);
      EXPECT_EQ(cost, shed.cost);
      if (excess > 0) {
        EXPECT_GE(cost, excess) << "trial " << trial;
      }
      if (rows > 0 && dearest_kept >= 0) {
        EXPECT_LE(dearest_kept, cheapest_shed);  // the heaviest rows left
      }
    }
  }
}

TEST(LowerBound, NoStrategyMovesFewerRowsThanTheBoundAtItsOwnLoad) {
  SplitMix64 random(testing::test_seed() + 3);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 8);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 4);
    const auto lengths = testing::random_batch(random, cp, 10, 400);
    int64_t total = 0;
    for (const int64_t length : lengths) total += length;
    StrategyParams params;
    params.block_size = std::max<int64_t>(1, std::min<int64_t>(16, total / cp));
    params.snake_block = 8;
    params.lpt_align = 8;
    for (const Strategy* strategy : all_strategies()) {
      const Plan planned = strategy->plan(lengths, cp, ratio, params);
      const PlanStats stats = plan_stats(planned.tasks(), lengths, ratio);
      const int64_t busiest = *std::max_element(stats.work.begin(), stats.work.end());
      const RowsMovedBound bound =
          rows_moved_lower_bound_at(lengths, cp, ratio, static_cast<double>(busiest));
      EXPECT_GE(stats.rows_moved, bound.total)
          << strategy->name() << " trial " << trial << " cp " << cp << " ratio " << ratio;
    }
  }
}

TEST(LowerBound, RejectsBadInputs) {
  const std::vector<int64_t> lengths = {4, 4};
  EXPECT_THAT(error_of([&] { rows_moved_lower_bound(lengths, 3, 4, 1.0); }),
              HasSubstr("equal contiguous CP partition"));
  EXPECT_THAT(error_of([&] { rows_moved_lower_bound(lengths, 2, 4, 0.99); }),
              HasSubstr("target imbalance must be at least 1, got 0.99"));
  EXPECT_THAT(error_of([&] { balance_bound(lengths, 2, 4, CostModel::linear(-1, 1, 0, 512)); }),
              HasSubstr("coefficient a"));
}

}  // namespace
}  // namespace sparsecp
