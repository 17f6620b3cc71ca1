// spill: hand cases and properties on random batches (coverage, caps, balance within
// the target where the slack allows it, rows moved == the lower bound, determinism),
// and the registered spill / auto strategies.
#include "sparsecp/planning/spill.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/io/cost_model_file.hpp"
#include "sparsecp/planning/batch_plan.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/row_bytes.hpp"
#include "sparsecp/planning/strategies/auto.hpp"
#include "sparsecp/planning/strategies/spill.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "support/error_of.hpp"
#include "support/plan_ranks.hpp"
#include "support/random_batch.hpp"
#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using sparsecp::testing::ranks_of;

using sparsecp::testing::error_of;

// Rows of rank r's own shard that rank r still selects.
int64_t rows_kept(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t rank) {
  std::vector<int64_t> starts{0};
  for (const int64_t length : lengths) starts.push_back(starts.back() + length);
  const int64_t local = starts.back() / plan.cp();
  int64_t kept = 0;
  for (const Task& task : plan.tasks(rank)) {
    const int64_t begin = starts[static_cast<size_t>(task.document)] + task.start;
    const int64_t end = starts[static_cast<size_t>(task.document)] + task.end;
    kept += std::max<int64_t>(0, std::min(end, (rank + 1) * local) - std::max(begin, rank * local));
  }
  return kept;
}

TEST(Spill, SystemExampleMovesOnlyTheExcess) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  SpillOptions options;
  options.target_imbalance = 1.01;
  const SpillPlan spill = plan_spill(lengths, 4, 4, options);
  check_plan_covers(spill.plan, lengths);
  const PlanStats stats = plan_stats(spill.plan, lengths, 4);
  EXPECT_LE(stats.imbalance, 1.01);
  EXPECT_TRUE(spill.target_met);
  const RowsMovedBound bound = rows_moved_lower_bound(lengths, 4, 4, 1.01);
  EXPECT_EQ(stats.rows_moved, bound.total);
  EXPECT_EQ(spill.rows_moved, bound.total);
  // Ranks 1 and 2 are above 1.01 x mean and shed; ranks 0 and 3 only receive.
  EXPECT_EQ(spill.rows_shed[0], 0);
  EXPECT_GT(spill.rows_shed[1], 0);
  EXPECT_GT(spill.rows_shed[2], 0);
  EXPECT_EQ(spill.rows_shed[3], 0);
  EXPECT_EQ(spill.rows_received[1] + spill.rows_received[2], 0);
  // Every rank keeps all its own rows but the shed ones.
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_EQ(rows_kept(spill.plan, lengths, r), 2000 - spill.rows_shed[r]);
  // A small fraction of rows moves (zigzag moves most of them).
  EXPECT_LT(stats.rows_moved, 8000 / 10);
}

TEST(Spill, BalancedBatchMovesNothingAndOneRankIsContiguous) {
  const std::vector<int64_t> lengths(8, 64);
  const SpillPlan spill = plan_spill(lengths, 8, 4);
  EXPECT_EQ(spill.rows_moved, 0);
  EXPECT_TRUE(spill.target_met);
  const TaskPlan none = plan_tasks(lengths, 8, 4, PlanOptions{.mode = Mode::kNone});
  EXPECT_EQ(ranks_of(spill.plan), ranks_of(none));
  const std::vector<int64_t> one = {7, 100, 1};
  EXPECT_EQ(plan_spill(one, 1, 4).rows_moved, 0);
}

TEST(Spill, PropertiesOnRandomBatches) {
  SplitMix64 random(testing::test_seed() + 10);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  int64_t met_checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t cp = 1 + static_cast<int64_t>(random.next() % 12);
    const int64_t ratio = 1 + static_cast<int64_t>(random.next() % 5);
    const auto lengths = testing::random_batch(random, cp, 12, trial % 4 == 0 ? 2000 : 300);
    SpillOptions options;
    options.target_imbalance =
        trial % 5 == 0 ? 1.0 : 1.0 + static_cast<double>(random.next() % 30) / 100;
    if (trial % 7 == 3)
      options.max_received_fragments = 1 + static_cast<int64_t>(random.next() % 3);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " cp " << cp << " ratio " << ratio << " target "
                 << options.target_imbalance << " bound " << options.max_received_fragments);
    const SpillPlan spill = plan_spill(lengths, cp, ratio, options);
    ASSERT_EQ(spill.plan.cp(), cp);
    check_plan_covers(spill.plan, lengths);  // every row exactly once
    int64_t total = 0;
    int64_t longest = 0;
    for (const int64_t length : lengths) {
      total += length;
      longest = std::max(longest, length);
    }
    const int64_t local = total / cp;
    const PlanStats stats = plan_stats(spill.plan, lengths, ratio);
    for (int64_t r = 0; r < cp; ++r) {
      EXPECT_LE(stats.rows[static_cast<size_t>(r)], 2 * local) << "rank " << r;  // seed cap
      EXPECT_EQ(rows_kept(spill.plan, lengths, r), local - spill.rows_shed[static_cast<size_t>(r)]);
      EXPECT_EQ(static_cast<double>(stats.work[static_cast<size_t>(r)]),
                spill.load_after[static_cast<size_t>(r)]);
    }
    // Rows moved equal the lower bound at the target load (tight by construction),
    // computed independently by the reference.
    const RowsMovedBound reference =
        rows_moved_lower_bound_reference(lengths, cp, ratio, spill.target_load);
    EXPECT_EQ(stats.rows_moved, reference.total);
    EXPECT_EQ(spill.rows_moved, reference.total);
    // Balance: target met means every rank at most T; and guaranteed with enough slack.
    const int64_t busiest = *std::max_element(stats.work.begin(), stats.work.end());
    if (spill.target_met) {
      EXPECT_LE(static_cast<double>(busiest), spill.target_load);
    }
    const double slack =
        static_cast<double>(cp) * spill.target_load - static_cast<double>(stats.total_work);
    const double largest_row = static_cast<double>(visible_keys(longest - 1, ratio));
    if (options.max_received_fragments == 0 && slack >= static_cast<double>(cp) * largest_row) {
      EXPECT_TRUE(spill.target_met) << "slack " << slack;
      ++met_checked;
    }
    if (spill.fragment_bound_met && options.max_received_fragments > 0) {
      for (const int64_t received : spill.received_fragments) {
        EXPECT_LE(received, options.max_received_fragments);
      }
    }
    // The same plan on every call (every rank plans alone).
    EXPECT_EQ(ranks_of(plan_spill(lengths, cp, ratio, options).plan), ranks_of(spill.plan));
  }
  EXPECT_GT(met_checked, 50);  // the balance guarantee was exercised
}

TEST(Spill, BalancesTheCostModelItIsGiven) {
  SplitMix64 random(testing::test_seed() + 11);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t cp = 2 + static_cast<int64_t>(random.next() % 7);
    const auto lengths = testing::random_batch(random, cp, 10, 3000);
    SpillOptions options;
    options.cost = CostModel::linear(2, 0.25, 1, 8);
    const SpillPlan spill = plan_spill(lengths, cp, 4, options);
    check_plan_covers(spill.plan, lengths);
    for (int64_t r = 0; r < cp; ++r) {
      double load = 0;
      for (const Task& task : spill.plan.tasks(r))
        load += options.cost.range(task.start, task.end, 4);
      EXPECT_EQ(load, spill.load_after[static_cast<size_t>(r)]);
      if (spill.target_met) {
        EXPECT_LE(load, spill.target_load);
      }
    }
    EXPECT_EQ(
        spill.rows_moved,
        rows_moved_lower_bound_reference(lengths, cp, 4, spill.target_load, options.cost).total);
  }
  // Every row alike: contiguous shards are already balanced, nothing moves.
  SpillOptions flat;
  flat.cost = CostModel::linear(1, 0, 0, 512);
  EXPECT_EQ(plan_spill(std::vector<int64_t>{1000, 24}, 4, 4, flat).rows_moved, 0);
}

TEST(Spill, FragmentBoundSpreadsPiecesOverReceivers) {
  // Rank 0 holds many short heavy-ish documents, ranks 1..3 almost nothing.
  std::vector<int64_t> lengths(16, 64);  // rank 0: 1024 rows in 16 documents
  for (int i = 0; i < 3 * 1024; ++i) lengths.push_back(1);
  SpillOptions bounded;
  bounded.max_received_fragments = 6;
  bounded.target_imbalance = 1.01;  // slack for the slivers each receiver leaves
  const SpillPlan spill = plan_spill(lengths, 4, 1, bounded);
  check_plan_covers(spill.plan, lengths);
  EXPECT_TRUE(spill.fragment_bound_met);
  for (const int64_t received : spill.received_fragments) EXPECT_LE(received, 6);
  // Without the bound the same rows move.
  SpillOptions unbounded;
  unbounded.target_imbalance = 1.01;
  EXPECT_EQ(plan_spill(lengths, 4, 1, unbounded).rows_moved, spill.rows_moved);
}

TEST(Spill, RejectsBadOptions) {
  const std::vector<int64_t> lengths = {4, 4};
  EXPECT_THAT(error_of([&] { plan_spill(lengths, 3, 4); }),
              HasSubstr("Indexer balance needs positive document lengths/ratio and an equal "
                        "contiguous CP partition"));
  EXPECT_THAT(error_of([&] {
                SpillOptions options;
                options.target_imbalance = 0.5;
                plan_spill(lengths, 2, 4, options);
                ;
              }),
              HasSubstr("spill target imbalance must be at least 1, got 0.5"));
  EXPECT_THAT(error_of([&] {
                SpillOptions options;
                options.max_received_fragments = -1;
                plan_spill(lengths, 2, 4, options);
              }),
              HasSubstr("fragment bound must be non-negative"));
}

TEST(Spill, RowCapSaturatesForShardsBeyond2To62) {
  // One document of 2^63 - 1 rows on one rank: 2 x local does not fit in 64 bits (it
  // overflowed, a UBSan report); spill shares plan.hpp's saturating cap.
  const std::vector<int64_t> lengths = {INT64_MAX};
  const SpillPlan spill = plan_spill(lengths, 1, INT64_MAX);
  check_plan_covers(spill.plan, lengths);
  EXPECT_EQ(spill.plan.rows(0), INT64_MAX);
  EXPECT_EQ(spill.rows_moved, 0);
  EXPECT_TRUE(spill.target_met);
}

TEST(PlanStats, WireBytesSaturateOnHugeBatches) {
  // Two ranks swap two documents of 2^61 rows: 2^62 rows move, and 2^62 x 5632 bytes
  // does not fit in 64 bits (a fuzz_strategies UBSan report on plan_spill's huge
  // batches). The byte figures saturate; the row figures stay exact.
  constexpr int64_t kHalf = int64_t{1} << 61;
  const std::vector<int64_t> lengths = {kHalf, kHalf};
  const TaskPlan swapped = TaskPlan::from_ranks({{Task{1, 0, kHalf}}, {Task{0, 0, kHalf}}});
  check_plan_covers(swapped, lengths);
  const PlanStats stats = plan_stats(swapped, lengths, INT64_MAX);
  EXPECT_EQ(stats.rows_moved, 2 * kHalf);
  EXPECT_EQ(stats.bytes_moved, INT64_MAX);
  EXPECT_EQ(stats.max_bytes_sent_per_rank, INT64_MAX);
  // Small counts are exact: 3 inputs sent and 2 results sent with the defaults.
  EXPECT_EQ(RowBytes{}.wire_bytes(3, 2), 3 * 3584 + 2 * 2048);
}

TEST(SpillStrategy, RegisteredAndRoutable) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const Strategy& spill = find_strategy("spill");
  const Plan planned = spill.plan(lengths, 4, 4, StrategyParams{});
  check_plan_covers(planned.tasks(), lengths);
  EXPECT_EQ(planned.largest_unit_work(), 1250);
  EXPECT_EQ(planned.note(), "");
  // Every rank's route is consistent with the plan's rows.
  for (int64_t r = 0; r < 4; ++r) {
    const IndexerRoute route = make_route(planned.tasks(), lengths, r, 4);
    EXPECT_EQ(route.query_count, planned.tasks().rows(r));
    EXPECT_EQ(static_cast<int64_t>(route.local_sources.size() + route.send_rows.size()), 2000);
  }
}

TEST(Auto, PicksTheLowestPredictedStep) {
  SplitMix64 random(testing::test_seed() + 12);
  SCOPED_TRACE(::testing::Message() << "SPARSECP_TEST_SEED=" << testing::test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t cp = 2 + static_cast<int64_t>(random.next() % 7);
    const auto lengths = testing::random_batch(random, cp, 10, 3000);
    const AutoChoice choice = choose_plan(lengths, cp, 4);
    ASSERT_FALSE(choice.candidates.empty());
    check_plan_covers(choice.plan.plan, lengths);
    for (const AutoCandidate& c : choice.candidates) {
      if (c.error.empty()) {
        EXPECT_LE(choice.candidates[choice.chosen].step_ns, c.step_ns) << c.name;
      }
    }
    const AutoCandidate again = predict_step(choice.plan.plan, lengths, 4, AutoOptions{});
    EXPECT_EQ(again.step_ns, choice.candidates[choice.chosen].step_ns);
    EXPECT_THAT(choice.reason, HasSubstr("chose " + choice.candidates[choice.chosen].name));
  }
}

TEST(Auto, PicksNoneWhenTheContiguousSplitMeetsTheTarget) {
  // Every rank's shard is one whole document of the same length: balanced as it is.
  const std::vector<int64_t> lengths = {3000, 3000, 3000, 3000};
  AutoOptions free;
  free.bandwidth_gbps = 1e12;  // even when moving costs nothing
  const AutoChoice choice = choose_plan(lengths, 4, 4, free);
  EXPECT_EQ(choice.candidates[choice.chosen].name, "none");
  EXPECT_EQ(choice.candidates[choice.chosen].rows_moved, 0);
  EXPECT_THAT(choice.reason, HasSubstr("the contiguous split already meets the target"));
  // A batch whose contiguous split is off the target still balances.
  const AutoChoice skewed = choose_plan(std::vector<int64_t>{5000, 300, 2699, 1}, 4, 4, free);
  EXPECT_NE(skewed.candidates[skewed.chosen].name, "none");
  EXPECT_THAT(skewed.reason, Not(HasSubstr("already meets")));
}

TEST(Auto, BandwidthDecides) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  AutoOptions slow;
  slow.bandwidth_gbps = 1e-9;  // any moved row costs more than all compute: stay put
  EXPECT_EQ(
      choose_plan(lengths, 4, 4, slow).candidates[choose_plan(lengths, 4, 4, slow).chosen].name,
      "none");
  AutoOptions free;
  free.bandwidth_gbps = 1e12;  // moving is free: the best-balanced candidate wins
  const AutoChoice choice = choose_plan(lengths, 4, 4, free);
  for (const AutoCandidate& c : choice.candidates) {
    EXPECT_LE(choice.candidates[choice.chosen].compute_ns, c.compute_ns * (1 + 1e-9)) << c.name;
  }
  EXPECT_NE(choice.candidates[choice.chosen].name, "none");
  EXPECT_THAT(error_of([&] {
                AutoOptions none;
                none.bandwidth_gbps = 0;
                choose_plan(lengths, 4, 4, none);
                ;
              }),
              HasSubstr("bandwidth must be positive"));
  const Plan registered = find_strategy("auto").plan(lengths, 4, 4, StrategyParams{});
  EXPECT_THAT(registered.note(), HasSubstr("chose "));
}

// --- the commands `sparsecp spill` and `sparsecp calibrate` ---------------------------

TEST(SpillCommand, JsonMatchesTheLibrary) {
  const auto [status, out] = testing::run_shell(std::string(SPARSECP_CLI_PATH) +
                                                " spill --lengths 5000,300,2699,1 --cp 4 --json");
  ASSERT_EQ(status, 0) << out;
  const auto json = nlohmann::json::parse(out);
  ASSERT_EQ(json["batches"].size(), 1u);
  const auto& batch = json["batches"][0];
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const SpillPlan spill = plan_spill(lengths, 4, 4);
  EXPECT_EQ(batch["rows_moved"].get<int64_t>(), spill.rows_moved);
  EXPECT_EQ(batch["rows_moved_lower_bound"].get<int64_t>(),
            rows_moved_lower_bound(lengths, 4, 4, 1.001).total);
  EXPECT_TRUE(batch["target_met"].get<bool>());
  EXPECT_LE(batch["imbalance"].get<double>(), 1.001);
  ASSERT_EQ(batch["ranks"].size(), 4u);
  ASSERT_EQ(batch["seed_modes"].size(), 3u);
  for (const auto& mode : batch["seed_modes"]) {
    EXPECT_GT(mode["busiest_rows_sent_received"].get<int64_t>(),
              batch["busiest_rows_sent_received"].get<int64_t>())
        << mode["strategy"];
  }
}

TEST(SpillCommand, BadInputExitsWithStatusTwo) {
  const auto [status, out] = testing::run_shell(
      std::string(SPARSECP_CLI_PATH) + " spill --lengths 4,4 --cp 2 --target-imbalance 0.5 2>&1");
  EXPECT_EQ(status, 2);
  EXPECT_THAT(out, HasSubstr("error: spill target imbalance must be at least 1, got 0.5"));
}

TEST(CalibrateCommand, FitsAndSavesALoadableModel) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("sparsecp_calibrate_test_" + std::to_string(testing::test_seed()) + ".txt"))
          .string();
  const auto [status, out] =
      testing::run_shell(std::string(SPARSECP_CLI_PATH) +
                         " calibrate --heads 2 --head-dim 16 --rope-dim 8 --q-rank 8 "
                         "--topk 4 --rows 8 --visible 0,2,8,32 --repeats 1 --json "
                         "--max-residual 0 --out " +
                         path);
  ASSERT_EQ(status, 0) << out;
  const auto json = nlohmann::json::parse(out);
  EXPECT_EQ(json["id"].get<std::string>().size(), 16u);
  EXPECT_EQ(json["points"].size(), 8u);  // 4 points at 8 and 2 rows
  const CostModel model = load_cost_model(path);
  EXPECT_EQ(model.a, json["a_ns"].get<double>());
  EXPECT_EQ(model.b, json["b_ns"].get<double>());
  EXPECT_EQ(model.c, json["c_ns"].get<double>());
  EXPECT_EQ(model.topk, 4);
  EXPECT_EQ(model.unit, "ns");
  EXPECT_EQ(cost_model_id(model), json["id"].get<std::string>());
  std::filesystem::remove(path);
  // A bound no timing meets: refused with the reason, nothing saved.
  const auto [refused_status, refused_out] = testing::run_shell(
      std::string(SPARSECP_CLI_PATH) +
      " calibrate --heads 2 --head-dim 16 --rope-dim 8 --q-rank 8 --topk 4 --rows 8 "
      "--visible 0,2,8,32 --repeats 1 --max-residual 1e-12 --out " +
      path + " 2>&1");
  EXPECT_NE(refused_status, 0) << refused_out;
  EXPECT_THAT(refused_out, HasSubstr("cost model fit refused: its rms relative residual"));
  EXPECT_FALSE(std::filesystem::exists(path));
  // The saved model drives spill.
  save_cost_model(path, model.a + model.b + model.c > 0 ? model : CostModel{});
  const auto [spill_status, spill_out] =
      testing::run_shell(std::string(SPARSECP_CLI_PATH) +
                         " spill --lengths 5000,300,2699,1 --cp 4 "
                         "--cost-model " +
                         path + " --json");
  EXPECT_EQ(spill_status, 0) << spill_out;
  // Issue 30: a model fitted for another top-k was used without a word; now it is named.
  const auto [other_status, other_out] = testing::run_shell(
      std::string(SPARSECP_CLI_PATH) +
      " plan --lengths 5000,300,2699,1 --cp 4 --mode spill --topk 512 --cost-model " + path +
      " 2>&1");
  EXPECT_EQ(other_status, 2) << other_out;
  EXPECT_THAT(other_out,
              HasSubstr("the model was fitted for topk 4, this command selects --topk 512"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sparsecp
