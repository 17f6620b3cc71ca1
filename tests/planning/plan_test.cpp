// Unit and property tests of the cost model and the task planner.
#include "sparsecp/planning/plan.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/batch_plan.hpp"
#include "sparsecp/planning/cost.hpp"
#include "support/error_of.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using ::testing::HasSubstr;

using sparsecp::testing::error_of;

TEST(CostModel, WorkPrefixMatchesBruteForce) {
  for (int64_t ratio : {1, 2, 3, 4, 7, 128}) {
    int64_t brute = 0;
    for (int64_t rows = 0; rows <= 600; ++rows) {
      EXPECT_EQ(work_prefix(rows, ratio), brute) << "rows " << rows << " ratio " << ratio;
      brute += visible_keys(rows, ratio);  // row `rows` sees (rows + 1) / ratio keys
    }
  }
  EXPECT_EQ(range_work(3, 10, 4), work_prefix(10, 4) - work_prefix(3, 4));
}

TEST(CostModel, SystemExampleContiguousWork) {
  // SYSTEM.md: 4 ranks, documents (5000, 300, 2699, 1), ratio 4.
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const TaskPlan plan = plan_tasks(lengths, 4, 4, {.mode = Mode::kNone});
  const PlanStats stats = plan_stats(plan, lengths, 4);
  EXPECT_EQ(stats.work, (std::vector<int64_t>{499500, 1499500, 1197000, 848825}));
  EXPECT_NEAR(stats.imbalance, 1.4829, 1e-4);
  EXPECT_EQ(stats.rows_moved, 0);
}

TEST(Options, ModeNamesRoundTrip) {
  for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
    EXPECT_EQ(parse_mode(mode_name(mode)), mode);
  }
  EXPECT_THAT(error_of([] { parse_mode("Zigzag"); }),
              HasSubstr("indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'"));
}

TEST(Options, BlockSizeRules) {
  EXPECT_EQ(resolve_block_size(Mode::kGreedy, std::nullopt), 2048);
  EXPECT_EQ(resolve_block_size(Mode::kHybrid, 5), 5);
  EXPECT_EQ(resolve_block_size(Mode::kZigzag, std::nullopt), std::nullopt);
  EXPECT_EQ(resolve_block_size(Mode::kNone, std::nullopt), std::nullopt);
  EXPECT_THAT(
      error_of([] { resolve_block_size(Mode::kZigzag, 4); }),
      HasSubstr("indexer_balance_block_size requires indexer_load_balance='greedy' or 'hybrid'"));
  EXPECT_THAT(error_of([] { resolve_block_size(Mode::kGreedy, 0); }),
              HasSubstr("indexer_balance_block_size must be a positive integer"));
}

TEST(Options, HybridThresholdRules) {
  EXPECT_NO_THROW(validate_hybrid_threshold(Mode::kHybrid, 1));
  EXPECT_NO_THROW(validate_hybrid_threshold(Mode::kGreedy, std::nullopt));
  EXPECT_THAT(error_of([] { validate_hybrid_threshold(Mode::kHybrid, std::nullopt); }),
              HasSubstr("requires an explicit positive integer indexer_zigzag_min_length"));
  EXPECT_THAT(error_of([] { validate_hybrid_threshold(Mode::kHybrid, 0); }),
              HasSubstr("requires an explicit positive integer indexer_zigzag_min_length"));
  EXPECT_THAT(error_of([] { validate_hybrid_threshold(Mode::kZigzag, 3); }),
              HasSubstr("indexer_zigzag_min_length requires indexer_load_balance='hybrid'"));
}

TEST(Validation, RejectsBadBatches) {
  const std::string partition = "equal contiguous CP partition";
  const std::vector<int64_t> ok = {4, 4};
  EXPECT_THAT(error_of([&] { plan_tasks(std::vector<int64_t>{}, 1, 1, {}); }),
              HasSubstr(partition));
  EXPECT_THAT(error_of([&] {
                plan_tasks(std::vector<int64_t>{3, 0}, 1, 1, {});
              }),
              HasSubstr(partition));
  EXPECT_THAT(error_of([&] {
                plan_tasks(std::vector<int64_t>{3, -2}, 1, 1, {});
              }),
              HasSubstr(partition));
  EXPECT_THAT(error_of([&] { plan_tasks(ok, 0, 1, {}); }), HasSubstr(partition));
  EXPECT_THAT(error_of([&] { plan_tasks(ok, 3, 1, {}); }), HasSubstr(partition));
  EXPECT_THAT(error_of([&] { plan_tasks(ok, 2, 0, {}); }), HasSubstr(partition));
  EXPECT_THAT(error_of([&] { plan_tasks(ok, 2, 1, {.mode = Mode::kGreedy, .block_size = 5}); }),
              HasSubstr("Indexer greedy block size 5 exceeds the local query count 4"));
  // Beyond 64 bits: the lengths' sum, and the causal work at ratio 1.
  EXPECT_THAT(error_of([&] {
                plan_tasks(std::vector<int64_t>{INT64_MAX, INT64_MAX}, 1, 1, {});
              }),
              HasSubstr("sum beyond 64 bits"));
  EXPECT_THAT(error_of([&] { plan_tasks(std::vector<int64_t>{int64_t{1} << 40}, 1, 1, {}); }),
              HasSubstr("exceeds 64 bits"));
}

TEST(Validation, RejectsPlansBeyondTheTaskLimit) {
  // 2^32 tokens in blocks of one row: 2^32 tasks, far beyond kMaxPlanTasks. Rejected
  // before anything is allocated (it used to run out of memory).
  const std::vector<int64_t> huge = {int64_t{1} << 32};
  EXPECT_THAT(error_of([&] { plan_tasks(huge, 2, 4, {.mode = Mode::kGreedy, .block_size = 1}); }),
              HasSubstr("Indexer greedy plan would hold more than 16777216 tasks, the supported "
                        "maximum; use a larger indexer_balance_block_size"));
  EXPECT_THAT(error_of([&] {
                plan_tasks(huge, 2, 4,
                           {.mode = Mode::kHybrid,
                            .block_size = 1,
                            .zigzag_min_length = int64_t{1} << 40});  // all pooled
              }),
              HasSubstr("Indexer hybrid plan would hold more than"));
  // Many documents that each hold zigzag pairs at a large CP.
  const std::vector<int64_t> many(20, int64_t{1} << 21);
  EXPECT_THAT(error_of([&] { plan_tasks(many, int64_t{1} << 20, 4, {.mode = Mode::kZigzag}); }),
              HasSubstr("Indexer zigzag plan would hold more than 16777216 tasks"));
  // The same sizes with a block that keeps the count small plan fine, and so do
  // extreme but small plans (one block of 2^62 rows).
  EXPECT_LE(
      plan_tasks(huge, 2, 4, {.mode = Mode::kGreedy, .block_size = int64_t{1} << 20}).task_count(),
      4096);
  EXPECT_LE(plan_tasks(huge, 2, 4, {.mode = Mode::kHybrid, .block_size = 1, .zigzag_min_length = 1})
                .task_count(),
            6);  // zigzag pairs, no remainder to pool
  const std::vector<int64_t> longest = {INT64_MAX};
  const TaskPlan wide =
      plan_tasks(longest, 1, INT64_MAX, {.mode = Mode::kGreedy, .block_size = int64_t{1} << 62});
  EXPECT_EQ(wide.rows(0), INT64_MAX);
}

TEST(Validation, WorkerRowCapSaturates) {
  EXPECT_EQ(worker_row_cap(10, 2), 10);
  EXPECT_EQ(worker_row_cap(int64_t{1} << 62, 1), INT64_MAX);
  EXPECT_EQ(worker_row_cap(INT64_MAX, 1), INT64_MAX);
  EXPECT_EQ(worker_row_cap((int64_t{1} << 62) - 2, 2), (int64_t{1} << 62) - 2);
}

TEST(Zigzag, HandCheckedSmallCase) {
  // One document of 9 rows on 2 ranks: chunk 2, remainder 1 -> slots start at 1, 3, 5, 7.
  // Rank 0 gets slots 0 and 3 plus the single remainder row; rank 1 gets slots 1 and 2.
  const std::vector<int64_t> lengths = {9, 1};
  const TaskPlan plan = plan_tasks(lengths, 2, 1, {.mode = Mode::kZigzag});
  // Remainders: document 0 row 0 and document 1 row 0, capacity 1 each rank.
  EXPECT_EQ(std::vector<Task>(plan.tasks(0).begin(), plan.tasks(0).end()),
            (std::vector<Task>{{0, 0, 3}, {0, 7, 9}}));
  EXPECT_EQ(std::vector<Task>(plan.tasks(1).begin(), plan.tasks(1).end()),
            (std::vector<Task>{{0, 3, 7}, {1, 0, 1}}));
}

TEST(Greedy, HandCheckedSmallCase) {
  // Two documents of 4 rows, ratio 1, block 2, two ranks, cap 8 rows each.
  // Blocks and work (W(n) = n(n+1)/2 at ratio 1): d0[2,4)=7, d1[2,4)=7, d0[0,2)=3, d1[0,2)=3.
  const std::vector<int64_t> lengths = {4, 4};
  const TaskPlan plan = plan_tasks(lengths, 2, 1, {.mode = Mode::kGreedy, .block_size = 2});
  // Order: (d0,2,4) -> rank 0, (d1,2,4) -> rank 1, (d0,0,2) -> rank 0 (tie on work, rows;
  // lower rank), (d1,0,2) -> rank 1.
  EXPECT_EQ(std::vector<Task>(plan.tasks(0).begin(), plan.tasks(0).end()),
            (std::vector<Task>{{0, 0, 4}}));
  EXPECT_EQ(std::vector<Task>(plan.tasks(1).begin(), plan.tasks(1).end()),
            (std::vector<Task>{{1, 0, 4}}));
}

TEST(Plans, FromRanksSortsMergesAndDropsEmpty) {
  const TaskPlan plan = TaskPlan::from_ranks({{{1, 4, 6}, {0, 0, 2}, {1, 2, 4}, {0, 5, 5}}, {}});
  EXPECT_EQ(plan.cp(), 2);
  EXPECT_EQ(std::vector<Task>(plan.tasks(0).begin(), plan.tasks(0).end()),
            (std::vector<Task>{{0, 0, 2}, {1, 2, 6}}));
  EXPECT_TRUE(plan.tasks(1).empty());
  EXPECT_EQ(plan.rows(0), 6);
  EXPECT_THROW(plan.tasks(2), Error);
}

TEST(Plans, CoverageCheckFindsGapsAndOverlaps) {
  const std::vector<int64_t> lengths = {4, 2};
  EXPECT_NO_THROW(check_plan_covers(TaskPlan::from_ranks({{{0, 0, 4}}, {{1, 0, 2}}}), lengths));
  EXPECT_THROW(check_plan_covers(TaskPlan::from_ranks({{{0, 0, 3}}, {{1, 0, 2}}}), lengths), Error);
  EXPECT_THROW(
      check_plan_covers(TaskPlan::from_ranks({{{0, 0, 4}}, {{0, 3, 4}, {1, 0, 2}}}), lengths),
      Error);
  EXPECT_THROW(check_plan_covers(TaskPlan::from_ranks({{{0, 0, 4}}, {{2, 0, 2}}}), lengths), Error);
}

// Every row of every document on exactly one rank; greedy/hybrid within 2x local rows;
// zigzag and none with exactly local rows on every rank.
TEST(Plans, RandomBatchesCoverEveryRowOnceAndRespectCaps) {
  SplitMix64 random(testing::test_seed());
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 12);
    const std::vector<int64_t> lengths = testing::random_batch(random, cp, 9, 300);
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    const int64_t local = total / cp;
    const int64_t ratio = std::vector<int64_t>{1, 2, 4, 128}[random.next() % 4];
    const int64_t block = 1 + static_cast<int64_t>(random.next() % static_cast<uint64_t>(local));
    const int64_t threshold = 1 + static_cast<int64_t>(random.next() % 400);
    for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      PlanOptions options{.mode = mode};
      if (mode == Mode::kGreedy || mode == Mode::kHybrid) options.block_size = block;
      if (mode == Mode::kHybrid) options.zigzag_min_length = threshold;
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " mode " << mode_name(mode)
                                        << " cp " << cp << " ratio " << ratio);
      const TaskPlan plan = plan_tasks(lengths, cp, ratio, options);
      ASSERT_NO_THROW(check_plan_covers(plan, lengths));
      const PlanStats stats = plan_stats(plan, lengths, ratio);
      EXPECT_EQ(stats.total_work, [&] {
        int64_t work = 0;
        for (const int64_t length : lengths) work += work_prefix(length, ratio);
        return work;
      }());
      for (int64_t rank = 0; rank < cp; ++rank) {
        const int64_t rows = plan.rows(rank);
        if (mode == Mode::kNone || mode == Mode::kZigzag) {
          EXPECT_EQ(rows, local) << "rank " << rank;
        } else {
          EXPECT_LE(rows, 2 * local) << "rank " << rank;
        }
      }
      if (mode == Mode::kNone) {
        EXPECT_EQ(stats.rows_moved, 0);
      }
    }
  }
}

TEST(Plans, SameInputsSamePlan) {
  SplitMix64 random(testing::test_seed() + 1);
  const std::vector<int64_t> lengths = testing::random_batch(random, 8, 40, 5000);
  const PlanOptions options{.mode = Mode::kHybrid, .block_size = 64, .zigzag_min_length = 500};
  const TaskPlan first = plan_tasks(lengths, 8, 4, options);
  const TaskPlan second = plan_tasks(lengths, 8, 4, options);
  for (int64_t rank = 0; rank < 8; ++rank) {
    EXPECT_TRUE(std::ranges::equal(first.tasks(rank), second.tasks(rank)));
  }
}

}  // namespace
}  // namespace sparsecp
