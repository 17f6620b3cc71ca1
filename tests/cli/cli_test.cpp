// The `sparsecp` tool as a user and a script see it: exit status, stderr, JSON.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "support/tool_runner.hpp"

namespace {

using sparsecp::all_strategies;
using sparsecp::check_plan_covers;
using sparsecp::IndexerRoute;
using sparsecp::make_route;
using sparsecp::Strategy;
using sparsecp::Task;
using sparsecp::TaskPlan;

using ::testing::HasSubstr;
using ::testing::StartsWith;

using Outcome = sparsecp::testing::ToolRun;
using sparsecp::testing::run_tool;

// One line on stderr beginning "error:", exit status 2, nothing on stdout.
void expect_user_error(const Outcome& outcome, const std::string& text) {
  EXPECT_EQ(outcome.status, 2) << outcome.err;
  EXPECT_THAT(outcome.err, StartsWith("error: "));
  EXPECT_THAT(outcome.err, HasSubstr(text));
  EXPECT_EQ(std::count(outcome.err.begin(), outcome.err.end(), '\n'), 1) << outcome.err;
  EXPECT_TRUE(outcome.out.empty()) << outcome.out;
}

TEST(Cli, PlanJsonHasTheDocumentedShape) {
  const Outcome outcome = run_tool("plan --lengths 5000,300,2699,1 --cp 4 --mode none --json");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const auto json = nlohmann::json::parse(outcome.out);
  EXPECT_EQ(json["cp"], 4);
  EXPECT_EQ(json["ratio"], 4);
  EXPECT_EQ(json["mode"], "none");
  ASSERT_EQ(json["ranks"].size(), 4u);
  EXPECT_EQ(json["ranks"][1]["work"], 1499500);
  EXPECT_EQ(json["ranks"][2]["tasks"],
            nlohmann::json::parse("[[0,4000,5000],[1,0,300],[2,0,700]]"));
  EXPECT_NEAR(json["imbalance"].get<double>(), 1.4829, 1e-4);
}

TEST(Cli, PlanWithoutModeComparesEveryStrategy) {
  const Outcome outcome = run_tool("plan --tokens 65536 --cp 4");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  for (const Strategy* strategy : all_strategies()) {
    EXPECT_THAT(outcome.out, HasSubstr("\n" + std::string(strategy->name()) + " "))
        << strategy->name();
  }
  const Outcome json = run_tool("plan --tokens 65536 --cp 4 --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto plans = nlohmann::json::parse(json.out)["plans"];
  ASSERT_EQ(plans.size(), all_strategies().size());
  for (size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(plans[i]["mode"], std::string(all_strategies()[i]->name()));
    EXPECT_EQ(plans[i]["ranks"].size(), 4u);
  }
}

// Every registered strategy prints task lists that cover every row exactly once, and a
// route for any rank whose counts match the plan (the acceptance check).
TEST(Cli, PlanAndRouteWorkForEveryStrategy) {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  for (const Strategy* strategy : all_strategies()) {
    const std::string name(strategy->name());
    SCOPED_TRACE(name);
    const Outcome plan =
        run_tool("plan --lengths 5000,300,2699,1 --cp 4 --mode " + name + " --json");
    ASSERT_EQ(plan.status, 0) << plan.err;
    const auto json = nlohmann::json::parse(plan.out);
    std::vector<std::vector<Task>> ranks;
    for (const auto& rank : json["ranks"]) {
      ranks.emplace_back();
      for (const auto& task : rank["tasks"]) {
        ranks.back().push_back(
            {task[0].get<int64_t>(), task[1].get<int64_t>(), task[2].get<int64_t>()});
      }
    }
    const TaskPlan parsed = TaskPlan::from_ranks(ranks);
    EXPECT_NO_THROW(check_plan_covers(parsed, lengths));
    const Outcome route =
        run_tool("route --lengths 5000,300,2699,1 --cp 4 --mode " + name + " --rank 3 --json");
    ASSERT_EQ(route.status, 0) << route.err;
    const auto fields = nlohmann::json::parse(route.out);
    EXPECT_EQ(fields["query_count"].get<int64_t>(), parsed.rows(3));
    const IndexerRoute expected = make_route(parsed, lengths, 3, 4);
    EXPECT_EQ(fields["send_rows"].get<std::vector<int64_t>>(), expected.send_rows);
    EXPECT_EQ(fields["receive_rows"].get<std::vector<int64_t>>(), expected.receive_rows);
  }
}

// One default for the hybrid threshold and a block clamped to the shard in every command
// (the seed's 2048 exceeds the 2000-row shard here).
TEST(Cli, DefaultsResolveAgainstTheShard) {
  const Outcome plan = run_tool("plan --lengths 5000,300,2699,1 --cp 4");
  ASSERT_EQ(plan.status, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("zigzag_min_length 2000 (default: the rows per rank)"));
  const Outcome hybrid = run_tool("plan --lengths 5000,300,2699,1 --cp 4 --mode hybrid --json");
  ASSERT_EQ(hybrid.status, 0) << hybrid.err;
  EXPECT_THAT(nlohmann::json::parse(hybrid.out)["parameters"].get<std::string>(),
              HasSubstr("block 2000"));
  EXPECT_EQ(run_tool("plan --tokens 32768 --cp 32").status, 0);
  EXPECT_EQ(run_tool("route --tokens 32768 --cp 32 --mode greedy --all-ranks").status, 0);
}

TEST(Cli, RouteJsonHasTheSeedFieldNames) {
  const Outcome outcome =
      run_tool("route --lengths '9 1' --cp 2 --ratio 1 --mode zigzag --rank 1 --json");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const auto json = nlohmann::ordered_json::parse(outcome.out);
  std::vector<std::string> keys;
  for (const auto& item : json.items()) keys.push_back(item.key());
  // The seed's IndexerRoute fields first, then the whole plan beside its two lower bounds.
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "segments", "input_splits", "output_splits", "send_rows", "receive_rows",
                      "local_sources", "local_targets", "query_count", "imbalance", "balance_bound",
                      "rows_moved", "rows_moved_lower_bound"}));
  EXPECT_EQ(json["send_rows"], nlohmann::ordered_json::parse("[2,3]"));
  EXPECT_EQ(json["segments"], nlohmann::ordered_json::parse("[[0,4,0,7,0],[4,5,9,10,0]]"));
}

// docs/guide/cli.md: `route` prints its figures beside the two lower bounds, as `plan` does.
TEST(Cli, RoutePrintsThePlanBesideItsLowerBounds) {
  const Outcome plan = run_tool("plan --lengths 5000,300,2699,1 --cp 4 --mode greedy --json");
  ASSERT_EQ(plan.status, 0) << plan.err;
  const auto planned = nlohmann::json::parse(plan.out);
  const Outcome json =
      run_tool("route --lengths 5000,300,2699,1 --cp 4 --mode greedy --rank 3 --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto route = nlohmann::json::parse(json.out);
  EXPECT_EQ(route["balance_bound"], planned["balance_bound"]);
  EXPECT_EQ(route["imbalance"], planned["imbalance"]);
  EXPECT_EQ(route["rows_moved"], planned["rows_moved"]);
  EXPECT_EQ(route["rows_moved_lower_bound"], planned["rows_moved_lower_bound"]);
  const Outcome text = run_tool("route --lengths 5000,300,2699,1 --cp 4 --mode greedy --rank 3");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("balance bound, no plan can do better"));
  EXPECT_THAT(text.out, HasSubstr("the fewest any plan this balanced must move"));
  const Outcome all = run_tool("route --lengths 5000,300,2699,1 --cp 4 --mode greedy --all-ranks");
  ASSERT_EQ(all.status, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("balance bound"));
}

// hyper_parallel's text first, then what is wrong with these inputs.
TEST(Cli, PartitionErrorsSayWhatIsWrong) {
  const std::string seed =
      "Indexer balance needs positive document lengths/ratio and an equal contiguous CP "
      "partition";
  expect_user_error(run_tool("plan --lengths 5000,300,2699 --cp 4"),
                    seed + " (7999 tokens do not divide into 4 equal shards)");
  expect_user_error(run_tool("plan --lengths 5,0 --cp 1 --mode none"),
                    seed + " (document 1 has length 0)");
  expect_user_error(run_tool("plan --lengths 8 --cp 2 --ratio 0 --mode none"),
                    seed + " (ratio 0 is not positive)");
}

TEST(Cli, RouteAllRanksReportsTiming) {
  const Outcome outcome =
      run_tool("route --tokens 65536 --cp 8 --mode greedy --all-ranks --repeats 3 --json");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  const auto json = nlohmann::json::parse(outcome.out);
  EXPECT_GT(json["seconds_per_rank"].get<double>(), 0.0);
  EXPECT_EQ(json["repeats"], 3);
  const Outcome text = run_tool("route --tokens 65536 --cp 8 --mode zigzag --all-ranks");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("us per rank"));
}

TEST(Cli, LengthsFileAcceptsCommasAndWhitespace) {
  const std::string path = ::testing::TempDir() + "sparsecp_cli_lengths.txt";
  std::ofstream(path) << "5000, 300\n2699\t1\n";
  const Outcome outcome = run_tool("plan --lengths-file " + path + " --cp 4 --mode zigzag --json");
  ASSERT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_EQ(nlohmann::json::parse(outcome.out)["ranks"][0]["rows"], 2000);
}

TEST(Cli, InvalidInputsGiveOneErrorLineAndStatusTwo) {
  expect_user_error(run_tool("plan --lengths 5,abc --cp 1 --mode none"),
                    "'abc' (entry 2) is not an integer");
  expect_user_error(run_tool("plan --lengths 5,99999999999999999999 --cp 1 --mode none"),
                    "does not fit in 64 bits");
  expect_user_error(
      run_tool("plan --lengths 5,0 --cp 1 --mode none"),
      "Indexer balance needs positive document lengths/ratio and an equal contiguous CP partition");
  expect_user_error(run_tool("plan --lengths 5,4 --cp 2 --mode zigzag"),
                    "equal contiguous CP partition");
  expect_user_error(run_tool("plan --lengths 8 --cp 2 --mode fancy"),
                    "unknown strategy 'fancy' (known: none, zigzag, greedy, hybrid, ");
  expect_user_error(run_tool("plan --lengths 8 --cp 2 --mode hybrid --zigzag-min-length -1"),
                    "indexer_load_balance='hybrid' requires an explicit positive integer "
                    "indexer_zigzag_min_length");
  expect_user_error(
      run_tool("plan --lengths 8 --cp 2 --mode zigzag --block-size 2"),
      "indexer_balance_block_size requires indexer_load_balance='greedy' or 'hybrid'");
  expect_user_error(run_tool("plan --lengths 8 --cp 2 --mode greedy --block-size 5"),
                    "Indexer greedy block size 5 exceeds the local query count 4");
  expect_user_error(run_tool("route --lengths 8 --cp 2 --mode zigzag --rank 2"),
                    "Indexer balance rank must be inside its CP group");
  expect_user_error(run_tool("route --lengths 8 --cp 2 --mode zigzag"),
                    "exactly one of --rank R and --all-ranks");
  // The seed's order in indexer_route (issue 30): the rank before the lengths, the lengths
  // before the options.
  expect_user_error(run_tool("route --lengths 5,0,3 --cp 4 --mode greedy --rank -1 --block-size 1"),
                    "Indexer balance rank must be inside its CP group");
  expect_user_error(run_tool("route --lengths 5,4 --cp 4 --mode zigzag --rank 1 --block-size 1000"),
                    "Indexer balance needs positive document lengths/ratio and an equal contiguous "
                    "CP partition");
  expect_user_error(run_tool("plan --lengths-file /nonexistent/file --cp 2"),
                    "cannot open lengths file");
  expect_user_error(run_tool("plan --lengths ' , ' --cp 2"), "no document lengths given");
  expect_user_error(run_tool("plan --cp notanumber"), "--cp");
  expect_user_error(run_tool("frobnicate"), "unknown command 'frobnicate'");
}

TEST(Cli, HelpTeachesAndSucceeds) {
  const Outcome outcome = run_tool("plan --help");
  EXPECT_EQ(outcome.status, 0);
  EXPECT_THAT(outcome.out, HasSubstr("--zigzag-min-length"));
  EXPECT_THAT(outcome.out, HasSubstr("Examples:"));
}

}  // namespace
