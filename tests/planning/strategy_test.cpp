// Strategies: registry, bit-exact seed adapters, hand-computed plans, coverage, and the
// cross-rank route property for every strategy.
#include "sparsecp/planning/strategy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/strategies/lpt_search.hpp"
#include "sparsecp/planning/strategies/seed_modes.hpp"
#include "support/plan_ranks.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using sparsecp::testing::ranks_of;

Plan plan_with(std::string_view name, std::vector<int64_t> lengths, int64_t cp, int64_t ratio,
               const StrategyParams& params = {}) {
  return find_strategy(name).plan(lengths, cp, ratio, params);
}

// The model: simulate every rank and check that what owner r sends to q, in order, is
// exactly what q expects from r, that kept rows land where q's tasks put them, and that
// every worker position is filled exactly once.
void expect_routes_consistent(const TaskPlan& plan, std::span<const int64_t> lengths,
                              int64_t ratio) {
  const int64_t cp = plan.cp();
  int64_t total = 0;
  std::vector<int64_t> starts{0};
  for (const int64_t length : lengths) starts.push_back(total += length);
  const int64_t local = total / cp;
  std::vector<IndexerRoute> routes;
  std::vector<std::vector<int64_t>> worker_rows(static_cast<size_t>(cp));  // global rows
  for (int64_t r = 0; r < cp; ++r) {
    routes.push_back(make_route(plan, lengths, r, ratio));
    for (const Task& task : plan.tasks(r)) {
      for (int64_t p = task.start; p < task.end; ++p) {
        worker_rows[static_cast<size_t>(r)].push_back(starts[static_cast<size_t>(task.document)] +
                                                      p);
      }
    }
  }
  for (int64_t q = 0; q < cp; ++q) {
    const IndexerRoute& worker = routes[static_cast<size_t>(q)];
    const auto& rows = worker_rows[static_cast<size_t>(q)];
    ASSERT_EQ(worker.query_count, static_cast<int64_t>(rows.size())) << "rank " << q;
    ASSERT_EQ(worker.query_count, plan.rows(q));
    std::vector<int> filled(rows.size(), 0);
    // Local rows: owner q keeps them and copies them to its own worker positions.
    ASSERT_EQ(worker.local_sources.size(), worker.local_targets.size());
    for (size_t i = 0; i < worker.local_sources.size(); ++i) {
      const int64_t target = worker.local_targets[i];
      ASSERT_GE(target, 0);
      ASSERT_LT(target, static_cast<int64_t>(rows.size()));
      EXPECT_EQ(q * local + worker.local_sources[i], rows[static_cast<size_t>(target)]);
      ++filled[static_cast<size_t>(target)];
    }
    EXPECT_EQ(worker.input_splits[static_cast<size_t>(q)], 0) << "rank " << q << " sends to itself";
    EXPECT_EQ(worker.output_splits[static_cast<size_t>(q)], 0);
    int64_t received = 0;
    for (int64_t r = 0; r < cp; ++r) {
      const IndexerRoute& owner = routes[static_cast<size_t>(r)];
      int64_t sent_offset = 0;
      for (int64_t peer = 0; peer < q; ++peer)
        sent_offset += owner.input_splits[static_cast<size_t>(peer)];
      const int64_t count = owner.input_splits[static_cast<size_t>(q)];
      ASSERT_EQ(count, worker.output_splits[static_cast<size_t>(r)]) << r << " -> " << q;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t sent = r * local + owner.send_rows[static_cast<size_t>(sent_offset + i)];
        const int64_t position = worker.receive_rows[static_cast<size_t>(received + i)];
        ASSERT_GE(position, 0);
        ASSERT_LT(position, static_cast<int64_t>(rows.size()));
        ASSERT_EQ(sent, rows[static_cast<size_t>(position)]) << r << " -> " << q << " row " << i;
        ++filled[static_cast<size_t>(position)];
      }
      received += count;
    }
    EXPECT_EQ(received, static_cast<int64_t>(worker.receive_rows.size()));
    for (size_t i = 0; i < filled.size(); ++i)
      ASSERT_EQ(filled[i], 1) << "rank " << q << " position " << i;
  }
}

TEST(StrategyRegistry, ListsEveryStrategyInOrder) {
  std::vector<std::string> names;
  for (const Strategy* s : all_strategies()) {
    names.emplace_back(s->name());
    EXPECT_FALSE(s->source().empty()) << s->name();
    EXPECT_FALSE(s->summary().empty()) << s->name();
    EXPECT_FALSE(s->unit().empty()) << s->name();
  }
  // Later strategies (spill, auto) may be added; the built-ins keep this order.
  const std::vector<std::string> built_in = {
      "none", "zigzag", "greedy", "hybrid", "per-doc-zigzag", "round-robin", "snake", "lpt-search"};
  ASSERT_GE(names.size(), built_in.size());
  std::vector<std::string> seen;
  for (const auto& name : names) {
    if (std::find(built_in.begin(), built_in.end(), name) != built_in.end()) seen.push_back(name);
  }
  EXPECT_EQ(seen, built_in);
}

TEST(StrategyRegistry, FindsAndParsesNames) {
  EXPECT_EQ(find_strategy("snake").name(), "snake");
  try {
    find_strategy("zig-zag");
    FAIL() << "unknown name accepted";
  } catch (const Error& error) {
    EXPECT_THAT(error.what(), HasSubstr("unknown strategy 'zig-zag'"));
    EXPECT_THAT(error.what(), HasSubstr("lpt-search"));
  }
  const auto chosen = parse_strategy_list("snake,none,snake");
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen[0]->name(), "snake");
  EXPECT_EQ(chosen[1]->name(), "none");
  EXPECT_EQ(parse_strategy_list("all").size(), all_strategies().size());
  EXPECT_THROW(parse_strategy_list("snake,,none"), Error);
  EXPECT_THROW(parse_strategy_list(""), Error);
  EXPECT_THROW(parse_strategy_list("all,none"), Error);
  EXPECT_EQ(parse_row_cost("causal"), RowCost::kCausal);
  EXPECT_THROW(parse_row_cost("exact"), Error);
}

TEST(Strategies, RejectInvalidBatchesWithTheSeedText) {
  for (const Strategy* s : all_strategies()) {
    SCOPED_TRACE(std::string(s->name()));
    for (const auto& [lengths, cp, ratio] :
         {std::tuple<std::vector<int64_t>, int64_t, int64_t>{{}, 2, 4},
          {{3, 0, 1}, 2, 4},
          {{3, 2}, 2, 4},
          {{4}, 0, 4},
          {{4}, 2, 0},
          {{-4, 8}, 2, 1}}) {
      try {
        s->plan(lengths, cp, ratio, {});
        ADD_FAILURE() << "accepted an invalid batch";
      } catch (const Error& error) {
        EXPECT_THAT(error.what(), HasSubstr("Indexer balance needs positive document lengths"));
      }
    }
  }
}

TEST(SeedModes, AreBitExactAdaptersOverPlanTasks) {
  SplitMix64 random(sparsecp::testing::test_seed());
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t cp = std::vector<int64_t>{1, 2, 3, 4, 7, 8}[static_cast<size_t>(trial % 6)];
    const int64_t ratio = std::vector<int64_t>{1, 2, 4, 128}[static_cast<size_t>(trial % 4)];
    const auto lengths = sparsecp::testing::random_batch(random, cp, 12, 300);
    SCOPED_TRACE("trial " + std::to_string(trial) + " cp " + std::to_string(cp));
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    StrategyParams params;
    params.block_size = std::max<int64_t>(1, std::min<int64_t>(7 + trial, total / cp));
    for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      PlanOptions options{.mode = mode};
      if (mode == Mode::kGreedy || mode == Mode::kHybrid) options.block_size = params.block_size;
      if (mode == Mode::kHybrid) options.zigzag_min_length = total / cp;
      const auto expected = ranks_of(plan_tasks(lengths, cp, ratio, options));
      const auto got = find_strategy(mode_name(mode)).plan(lengths, cp, ratio, params);
      EXPECT_EQ(ranks_of(got.tasks()), expected) << mode_name(mode);
      EXPECT_EQ(got.padding_rows(), std::vector<int64_t>(static_cast<size_t>(cp), 0));
    }
    // An explicit hybrid threshold is passed through unchanged.
    params.zigzag_min_length = 5;
    const auto got = find_strategy("hybrid").plan(lengths, cp, ratio, params);
    const auto expected = ranks_of(plan_tasks(
        lengths, cp, ratio,
        {.mode = Mode::kHybrid, .block_size = params.block_size, .zigzag_min_length = 5}));
    EXPECT_EQ(ranks_of(got.tasks()), expected);
  }
}

TEST(SeedModes, DefaultsResolveAgainstTheLocalRowCount) {
  const std::vector<int64_t> lengths = {600, 400};  // 125 rows per rank on 8 ranks
  StrategyParams params;
  PlanOptions hybrid = resolve_seed_options(Mode::kHybrid, lengths, 8, params);
  EXPECT_EQ(hybrid.zigzag_min_length, 125);
  EXPECT_EQ(hybrid.block_size, 125);  // the seed's 2048 clamped to the shard
  EXPECT_EQ(
      resolve_seed_options(Mode::kGreedy, std::vector<int64_t>{3000, 1000}, 1, params).block_size,
      2048);
  params.zigzag_min_length = 7;
  params.block_size = 100;
  hybrid = resolve_seed_options(Mode::kHybrid, lengths, 8, params);
  EXPECT_EQ(hybrid.zigzag_min_length, 7);
  EXPECT_EQ(hybrid.block_size, 100);
  // Only the options the seed allows for each mode are set.
  const PlanOptions zigzag = resolve_seed_options(Mode::kZigzag, lengths, 8, params);
  EXPECT_FALSE(zigzag.block_size.has_value());
  EXPECT_FALSE(zigzag.zigzag_min_length.has_value());
  EXPECT_FALSE(resolve_seed_options(Mode::kGreedy, lengths, 8, params).zigzag_min_length);
  // An explicit block above the shard keeps the seed's error.
  params.block_size = 126;
  EXPECT_THROW(find_strategy("greedy").plan(lengths, 8, 4, params), Error);
}

TEST(SeedModes, RoutesAreTheSeedsIndexerRoute) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  StrategyParams params;
  params.zigzag_min_length = 1000;
  for (const char* name : {"none", "zigzag", "greedy", "hybrid"}) {
    const Mode mode = parse_mode(name);
    const PlanOptions options = resolve_seed_options(mode, lengths, 4, params);
    for (int64_t rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(find_strategy(name).route(lengths, 4, rank, 4, params),
                indexer_route(lengths, 4, rank, 4, options))
          << name << " rank " << rank;
    }
  }
}

TEST(Strategies, EveryRouteMatchesTheGenericRouteOfItsPlan) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  for (const Strategy* strategy : all_strategies()) {
    const Plan planned = strategy->plan(lengths, 4, 4, {});
    for (int64_t rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(strategy->route(lengths, 4, rank, 4, {}),
                make_route(planned.tasks(), lengths, rank, 4))
          << strategy->name() << " rank " << rank;
    }
  }
  EXPECT_THROW(find_strategy("spill").route(lengths, 4, 4, 4, {}), Error);
}

TEST(SeedModes, NoneUnitIsTheBusiestShard) {
  // SYSTEM.md: contiguous work (499500, 1499500, 1197000, 848825).
  const auto planned = plan_with("none", {5000, 300, 2699, 1}, 4, 4);
  EXPECT_EQ(planned.largest_unit_work(), 1499500);
  // Zigzag is row-granular: the costliest row is the last of the 5000-row document.
  EXPECT_EQ(plan_with("zigzag", {5000, 300, 2699, 1}, 4, 4).largest_unit_work(), 1250);
}

TEST(PerDocumentZigzag, HandComputedCaseWithPadding) {
  // cp 2: documents padded to multiples of 4. Length 5 -> chunk 2, slots 0..3 cover
  // [0,2) [2,4) [4,6) [6,8): rank 0 gets slots 0 and 3 = [0,2) and nothing (2 padding),
  // rank 1 gets [2,4) and [4,5) (1 padding). Length 3 -> chunk 1: rank 0 gets [0,1)
  // and [3,4) = padding, rank 1 gets [1,2) and [2,3).
  const auto planned = plan_with("per-doc-zigzag", {5, 3}, 2, 1);
  EXPECT_THAT(ranks_of(planned.tasks()), ElementsAre(ElementsAre(Task{0, 0, 2}, Task{1, 0, 1}),
                                                     ElementsAre(Task{0, 2, 5}, Task{1, 1, 3})));
  EXPECT_THAT(planned.padding_rows(), ElementsAre(3, 1));
  EXPECT_EQ(planned.largest_unit_work(), 5);  // ratio 1: the last row of 5 sees 5 keys
}

TEST(PerDocumentZigzag, MultiplesOfTwoCpNeedNoPadding) {
  const auto planned = plan_with("per-doc-zigzag", {8, 4}, 2, 4);
  EXPECT_THAT(planned.padding_rows(), ElementsAre(0, 0));
  EXPECT_THAT(ranks_of(planned.tasks()),
              ElementsAre(ElementsAre(Task{0, 0, 2}, Task{0, 6, 8}, Task{1, 0, 1}, Task{1, 3, 4}),
                          ElementsAre(Task{0, 2, 6}, Task{1, 1, 3})));
}

TEST(RoundRobin, HandComputedCase) {
  // Packed rows 0..5; even rows to rank 0: doc 0 rows 0 and 2, doc 1 row 1 (packed 4).
  const auto planned = plan_with("round-robin", {3, 3}, 2, 1);
  EXPECT_THAT(ranks_of(planned.tasks()),
              ElementsAre(ElementsAre(Task{0, 0, 1}, Task{0, 2, 3}, Task{1, 1, 2}),
                          ElementsAre(Task{0, 1, 2}, Task{1, 0, 1}, Task{1, 2, 3})));
  // cp 1 keeps whole documents.
  EXPECT_THAT(ranks_of(plan_with("round-robin", {3, 3}, 1, 1).tasks()),
              ElementsAre(ElementsAre(Task{0, 0, 3}, Task{1, 0, 3})));
}

TEST(Snake, HandComputedCase) {
  // Ratio 1, blocks of 2 over one 8-row document: works 3, 7, 11, 15. Sorted: b3, b2,
  // b1, b0. Round 0 -> ranks 0, 1: b3, b2; round 1 reversed -> ranks 1, 0: b1, b0.
  StrategyParams params;
  params.snake_block = 2;
  const auto planned = plan_with("snake", {8}, 2, 1, params);
  EXPECT_THAT(ranks_of(planned.tasks()),
              ElementsAre(ElementsAre(Task{0, 0, 2}, Task{0, 6, 8}), ElementsAre(Task{0, 2, 6})));
  EXPECT_EQ(planned.largest_unit_work(), 15);
  // Blocks that span documents become one task per document piece.
  params.snake_block = 3;
  const auto spanning = plan_with("snake", {2, 4}, 2, 1, params);
  // Blocks [0,3) = doc0 [0,2) + doc1 [0,1): work 3 + 1 = 4; [3,6) = doc1 [1,4): 2+3+4 = 9.
  EXPECT_THAT(ranks_of(spanning.tasks()),
              ElementsAre(ElementsAre(Task{1, 1, 4}), ElementsAre(Task{0, 0, 2}, Task{1, 0, 1})));
  EXPECT_EQ(spanning.largest_unit_work(), 9);
}

TEST(Snake, PartialLastRoundKeepsTheSnakeDirection) {
  // Ratio 1, blocks of 2 over 6 rows: works 3, 7, 11. Round 0: b2 -> rank 0, b1 -> rank 1;
  // round 1 (odd, partial) starts from the last rank: b0 -> rank 1.
  StrategyParams params;
  params.snake_block = 2;
  EXPECT_THAT(ranks_of(plan_with("snake", {6}, 2, 1, params).tasks()),
              ElementsAre(ElementsAre(Task{0, 4, 6}), ElementsAre(Task{0, 0, 4})));
}

TEST(LptSearch, HandComputedCase) {
  // Causal cost, ratio 1, fragments of 2 rows over one 8-row document: costs 3, 7, 11,
  // 15. LPT: 15 -> rank 0, 11 -> rank 1, 7 -> rank 1 (load 11 < 15; now full at 4 rows),
  // 3 -> rank 0. Both ranks carry 18; no move fits the cap and no swap improves.
  StrategyParams params;
  params.lpt_align = 2;
  params.lpt_cost = RowCost::kCausal;
  const auto planned = plan_with("lpt-search", {8}, 2, 1, params);
  EXPECT_THAT(ranks_of(planned.tasks()),
              ElementsAre(ElementsAre(Task{0, 0, 2}, Task{0, 6, 8}), ElementsAre(Task{0, 2, 6})));
  EXPECT_EQ(planned.largest_unit_work(), 15);
  // A fragment cap of 1 cannot hold rank 0's two fragments: contiguous fallback.
  params.lpt_fragment_cap = 1;
  const auto fallback = plan_with("lpt-search", {8}, 2, 1, params);
  EXPECT_THAT(ranks_of(fallback.tasks()),
              ElementsAre(ElementsAre(Task{0, 0, 4}), ElementsAre(Task{0, 4, 8})));
  EXPECT_THAT(fallback.note(), HasSubstr("contiguous fallback"));
}

TEST(LptSearch, MagiRowCostByHand) {
  // ratio 2, window 2, topk 1, rows 0..3: min(p+1, 2) = 1,2,2,2 (7); vis = 0,1,1,2 (4);
  // min(1, vis) = 0,1,1,1 (3); 0.25 per row (1). Total 15.
  EXPECT_DOUBLE_EQ(magi_row_cost(0, 4, 2, 2, 1), 15.0);
  EXPECT_DOUBLE_EQ(magi_row_cost(1, 3, 2, 2, 1), 2 + 2 + 1 + 1 + 1 + 1 + 0.5);
  EXPECT_DOUBLE_EQ(magi_row_cost(3, 3, 4, 128, 512), 0.0);
}

TEST(LptSearch, BalancesAHeavyTailBetterThanContiguous) {
  StrategyParams params;
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const auto lpt = plan_with("lpt-search", lengths, 4, 4, params);
  const auto none = plan_with("none", lengths, 4, 4, params);
  EXPECT_LT(plan_stats(lpt.tasks(), lengths, 4).imbalance, 1.05);
  EXPECT_GT(plan_stats(none.tasks(), lengths, 4).imbalance, 1.48);
  // The row cap (the local 2000 rows) holds up to one fragment: 2000 is not a multiple
  // of 128, so two of the 62 full fragments cannot fit under it.
  for (int64_t r = 0; r < 4; ++r) EXPECT_LE(lpt.tasks().rows(r), 2000 + 128);
}

TEST(Strategies, RejectBadParameters) {
  StrategyParams params;
  params.snake_block = 0;
  EXPECT_THROW(plan_with("snake", {8}, 2, 1, params), Error);
  params = {};
  params.lpt_align = 0;
  EXPECT_THROW(plan_with("lpt-search", {8}, 2, 1, params), Error);
  params = {};
  params.lpt_row_cap = 0.5;
  EXPECT_THROW(plan_with("lpt-search", {8}, 2, 1, params), Error);
  params = {};
  params.block_size = 0;
  EXPECT_THROW(plan_with("greedy", {8}, 2, 1, params), Error);
}

// Every strategy on random awkward batches: each row exactly once, padding reported
// per rank, units no larger than the busiest rank, and consistent routes.
TEST(Strategies, CoverEveryRowOnceAndRouteConsistently) {
  const uint64_t seed = sparsecp::testing::test_seed();
  SplitMix64 random(seed + 6);
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t cp = std::vector<int64_t>{1, 2, 3, 5, 7, 8}[static_cast<size_t>(trial % 6)];
    const int64_t ratio = std::vector<int64_t>{1, 4, 2, 128}[static_cast<size_t>(trial % 4)];
    const auto lengths = sparsecp::testing::random_batch(random, cp, 10, 400);
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    StrategyParams params;
    params.block_size = std::max<int64_t>(1, std::min<int64_t>(64, total / cp));
    params.snake_block = 1 + trial % 37;
    params.lpt_align = 1 + trial % 29;
    params.lpt_row_cap = trial % 3 == 0 ? 1.0 : 1.5;
    for (const Strategy* strategy : all_strategies()) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " trial " + std::to_string(trial) + " cp " +
                   std::to_string(cp) + " ratio " + std::to_string(ratio) + " strategy " +
                   std::string(strategy->name()));
      const Plan planned = strategy->plan(lengths, cp, ratio, params);
      ASSERT_EQ(planned.tasks().cp(), cp);
      EXPECT_NO_THROW(check_plan_covers(planned.tasks(), lengths));
      ASSERT_EQ(planned.padding_rows().size(), static_cast<size_t>(cp));
      const PlanStats stats = plan_stats(planned.tasks(), lengths, ratio);
      const int64_t busiest = *std::max_element(stats.work.begin(), stats.work.end());
      EXPECT_LE(planned.largest_unit_work(), busiest);
      expect_routes_consistent(planned.tasks(), lengths, ratio);
    }
  }
}

}  // namespace
}  // namespace sparsecp
