// Route tests: hand-checked cases and a brute-force model that simulates every rank.
#include "sparsecp/planning/route.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

// Global packed row of every worker position of `rank`, from its tasks.
std::vector<int64_t> worker_global_rows(const TaskPlan& plan, std::span<const int64_t> lengths,
                                        int64_t rank) {
  std::vector<int64_t> boundaries(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), boundaries.begin() + 1);
  std::vector<int64_t> rows;
  for (const Task& task : plan.tasks(rank)) {
    for (int64_t row = task.start; row < task.end; ++row) {
      rows.push_back(boundaries[static_cast<size_t>(task.document)] + row);
    }
  }
  return rows;
}

bool is_permutation_of_iota(std::vector<int64_t> values, int64_t count) {
  std::sort(values.begin(), values.end());
  std::vector<int64_t> expected(static_cast<size_t>(count));
  std::iota(expected.begin(), expected.end(), 0);
  return values == expected;
}

// The model: what owner r sends to worker q, in order, is exactly what q expects from r;
// every owner row leaves once or stays once; every worker position is filled once;
// segments describe the worker rows' document positions.
void check_routes_consistent(const TaskPlan& plan, std::span<const int64_t> lengths,
                             int64_t ratio) {
  const int64_t cp = plan.cp();
  const int64_t local = std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) / cp;
  std::vector<IndexerRoute> routes;
  for (int64_t rank = 0; rank < cp; ++rank)
    routes.push_back(make_route(plan, lengths, rank, ratio));
  for (int64_t owner = 0; owner < cp; ++owner) {
    const IndexerRoute& route = routes[static_cast<size_t>(owner)];
    EXPECT_EQ(route.input_splits[static_cast<size_t>(owner)], 0);
    EXPECT_EQ(route.output_splits[static_cast<size_t>(owner)], 0);
    std::vector<int64_t> owned = route.send_rows;
    owned.insert(owned.end(), route.local_sources.begin(), route.local_sources.end());
    ASSERT_TRUE(is_permutation_of_iota(owned, local)) << "owner " << owner;
    std::vector<int64_t> filled = route.receive_rows;
    filled.insert(filled.end(), route.local_targets.begin(), route.local_targets.end());
    ASSERT_EQ(route.query_count, plan.rows(owner));
    ASSERT_TRUE(is_permutation_of_iota(filled, route.query_count)) << "worker " << owner;
    const std::vector<int64_t> globals = worker_global_rows(plan, lengths, owner);
    for (size_t i = 0; i < route.local_sources.size(); ++i) {
      EXPECT_EQ(owner * local + route.local_sources[i],
                globals[static_cast<size_t>(route.local_targets[i])]);
    }
  }
  for (int64_t owner = 0; owner < cp; ++owner) {
    const IndexerRoute& sender = routes[static_cast<size_t>(owner)];
    int64_t send_offset = 0;
    for (int64_t worker = 0; worker < cp; ++worker) {
      const IndexerRoute& receiver = routes[static_cast<size_t>(worker)];
      const int64_t count = sender.input_splits[static_cast<size_t>(worker)];
      ASSERT_EQ(count, receiver.output_splits[static_cast<size_t>(owner)])
          << "owner " << owner << " worker " << worker;
      const int64_t receive_offset = std::accumulate(
          receiver.output_splits.begin(), receiver.output_splits.begin() + owner, int64_t{0});
      const std::vector<int64_t> globals = worker_global_rows(plan, lengths, worker);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t sent = owner * local + sender.send_rows[static_cast<size_t>(send_offset + i)];
        const int64_t landed = receiver.receive_rows[static_cast<size_t>(receive_offset + i)];
        ASSERT_EQ(sent, globals[static_cast<size_t>(landed)])
            << "owner " << owner << " worker " << worker << " row " << i;
      }
      send_offset += count;
    }
  }
  // Segments: row q_begin + j sits at document position end - (q_end - q_begin) + j.
  for (int64_t rank = 0; rank < cp; ++rank) {
    const auto tasks = plan.tasks(rank);
    const auto& segments = routes[static_cast<size_t>(rank)].segments;
    ASSERT_EQ(segments.size(), tasks.size());
    int64_t key_base = 0;
    size_t document = 0;
    for (size_t i = 0; i < tasks.size(); ++i) {
      while (document < static_cast<size_t>(tasks[i].document))
        key_base += lengths[document++] / ratio;
      const Segment& s = segments[i];
      EXPECT_EQ(s.q_end - s.q_begin, tasks[i].length());
      EXPECT_EQ(s.key_begin, key_base);
      EXPECT_EQ((s.key_end - s.key_begin) * ratio + s.residual, tasks[i].end);
    }
  }
}

TEST(Route, SystemExampleZigzagRankZero) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const IndexerRoute route = indexer_route(lengths, 4, 0, 4, {.mode = Mode::kZigzag});
  EXPECT_EQ(route.query_count, 2000);
  EXPECT_EQ(route.input_splits[0], 0);
  EXPECT_EQ(route.output_splits[0], 0);
  EXPECT_EQ(route.segments.front().q_begin, 0);
  EXPECT_EQ(route.segments.back().q_end, 2000);
}

TEST(Route, NoneSendsNothing) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  for (int64_t rank = 0; rank < 4; ++rank) {
    const IndexerRoute route = indexer_route(lengths, 4, rank, 4, {.mode = Mode::kNone});
    EXPECT_TRUE(route.send_rows.empty());
    EXPECT_TRUE(route.receive_rows.empty());
    EXPECT_EQ(route.local_sources.size(), 2000u);
    EXPECT_EQ(route.local_sources, route.local_targets);
  }
}

TEST(Route, HandCheckedTwoRanks) {
  // {9, 1} on 2 ranks, zigzag: rank 0 = d0[0,3) + d0[7,9); rank 1 = d0[3,7) + d1[0,1).
  // Owner 0 holds packed rows 0..4, owner 1 rows 5..9.
  const std::vector<int64_t> lengths = {9, 1};
  const IndexerRoute r0 = indexer_route(lengths, 2, 0, 1, {.mode = Mode::kZigzag});
  EXPECT_EQ(r0.local_sources, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(r0.local_targets, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(r0.receive_rows, (std::vector<int64_t>{3, 4}));  // packed rows 7, 8 from owner 1
  EXPECT_EQ(r0.send_rows, (std::vector<int64_t>{3, 4}));     // packed rows 3, 4 to rank 1
  EXPECT_EQ(r0.input_splits, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r0.output_splits, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r0.segments, (std::vector<Segment>{{0, 3, 0, 3, 0}, {3, 5, 0, 9, 0}}));
  const IndexerRoute r1 = indexer_route(lengths, 2, 1, 1, {.mode = Mode::kZigzag});
  EXPECT_EQ(r1.send_rows, (std::vector<int64_t>{2, 3}));  // packed rows 7, 8 to rank 0
  EXPECT_EQ(r1.receive_rows, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r1.local_sources, (std::vector<int64_t>{0, 1, 4}));  // packed 5, 6 and d1 row 9
  EXPECT_EQ(r1.local_targets, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(r1.segments, (std::vector<Segment>{{0, 4, 0, 7, 0}, {4, 5, 9, 10, 0}}));
}

TEST(Route, RejectsRankOutsideGroupAndForeignPlans) {
  const std::vector<int64_t> lengths = {4, 4};
  EXPECT_THROW(indexer_route(lengths, 2, 2, 1, {.mode = Mode::kZigzag}), Error);
  EXPECT_THROW(indexer_route(lengths, 2, -1, 1, {.mode = Mode::kGreedy}), Error);
  const TaskPlan foreign = TaskPlan::from_ranks({{{0, 0, 4}}, {{5, 0, 4}}});
  EXPECT_THROW(make_route(foreign, lengths, 0, 1), Error);
}

TEST(Route, RandomBatchesAreConsistentAcrossRanks) {
  SplitMix64 random(testing::test_seed() + 2);
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 9);
    const std::vector<int64_t> lengths = testing::random_batch(random, cp, 8, 200);
    const int64_t local = std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) / cp;
    const int64_t ratio = std::vector<int64_t>{1, 3, 4, 128}[random.next() % 4];
    for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      PlanOptions options{.mode = mode};
      if (mode == Mode::kGreedy || mode == Mode::kHybrid) {
        options.block_size = 1 + static_cast<int64_t>(random.next() % static_cast<uint64_t>(local));
      }
      if (mode == Mode::kHybrid)
        options.zigzag_min_length = 1 + static_cast<int64_t>(random.next() % 300);
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << " mode " << mode_name(mode) << " cp " << cp);
      const TaskPlan plan = plan_tasks(lengths, cp, ratio, options);
      check_routes_consistent(plan, lengths, ratio);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Route, ZigzagFastPathEqualsFullPlan) {
  SplitMix64 random(testing::test_seed() + 3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 16);
    const std::vector<int64_t> lengths = testing::random_batch(random, cp, 12, 500);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 6);
    const TaskPlan plan = plan_tasks(lengths, cp, ratio, {.mode = Mode::kZigzag});
    for (int64_t rank = 0; rank < cp; ++rank) {
      const std::vector<Task> fast = zigzag_rank_tasks(lengths, cp, rank);
      ASSERT_TRUE(std::ranges::equal(fast, plan.tasks(rank)))
          << "trial " << trial << " rank " << rank;
      ASSERT_EQ(indexer_route(lengths, cp, rank, ratio, {.mode = Mode::kZigzag}),
                make_route(plan, lengths, rank, ratio))
          << "trial " << trial << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace sparsecp
