// `sparsecp run` as a person and a script see it: progress on a terminal only, a verdict
// only from enough rounds, and a job that sizes itself to the machine and its
// --time-budget (tools/sparsecp/cmd_run.cpp: size_to_budget, measure; progress.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

using sparsecp::testing::run_shell;

// A small model (the job's shape options) so that every round takes milliseconds.
constexpr const char* kSmall = "--heads 2 --head-dim 16 --rope-dim 8 --q-rank 12 --topk 9";

struct Job {
  int status = -1;
  std::string out;  // rank 0's report
  std::string err;  // stderr: progress lines, errors
};

// `sparsecp run <arguments>` on `ranks` MPI ranks, with `environment` (shell assignments).
Job run_job(int ranks, const std::string& arguments, const std::string& environment = "") {
  const std::string err_path = ::testing::TempDir() + "sparsecp_run_cli_" +
                               std::to_string(::getpid()) + "_" +
                               ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string command =
      "env ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 SPARSECP_CACHE_DIR=" +
      ::testing::TempDir() + "sparsecp_run_cli_cache " + environment + " " + SPARSECP_MPIEXEC +
      " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " +
      SPARSECP_CLI_PATH + " run " + kSmall + " " + arguments + " 2>" + err_path + " </dev/null";
  auto [status, out] = run_shell(command);
  Job job{status, out, ""};
  if (FILE* file = std::fopen(err_path.c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) job.err.append(buffer, n);
    std::fclose(file);
  }
  std::filesystem::remove(err_path);
  return job;
}

nlohmann::json parse(const Job& job) {
  try {
    return nlohmann::json::parse(job.out);
  } catch (const nlohmann::json::exception&) {
    ADD_FAILURE() << "not JSON:\n" << job.out << "\nstderr:\n" << job.err;
    return nlohmann::json::object();
  }
}

TEST(RunProgress, AtATerminalItShowsCalibrationAdaptStepsRoundsAndTimeLeft) {
  // SPARSECP_PROGRESS=1 stands for the terminal (the test reads stderr through a file).
  const Job job = run_job(2, "--tokens 4096 --no-cache", "SPARSECP_PROGRESS=1");
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  for (const char* line :
       {"sparsecp run [", "calibrating spill's cost model", "--adapt step 1 of 1",
        "sized to this machine", "round 1 of 6:", "round 6 of 6", "left"}) {
    EXPECT_NE(job.err.find(line), std::string::npos) << line << "\n" << job.err;
  }
  EXPECT_EQ(job.out.find("sparsecp run ["), std::string::npos) << "progress belongs on stderr";
}

TEST(RunProgress, NothingExtraWhenPipedOrWithJson) {
  const Job piped = run_job(2, "--tokens 4096 --no-calibrate");
  ASSERT_EQ(piped.status, 0) << piped.out << piped.err;
  EXPECT_EQ(piped.err, "");
  const Job json = run_job(2, "--tokens 4096 --no-calibrate --json", "SPARSECP_PROGRESS=1");
  ASSERT_EQ(json.status, 0) << json.out << json.err;
  EXPECT_EQ(json.err, "");
  EXPECT_TRUE(parse(json)["verified"].get<bool>());
}

TEST(RunVerdict, FewerThanSixRoundsClaimNoWinner) {
  for (const char* repeats : {"1", "2", "5"}) {
    const std::string limit = std::string("--repeats ") + repeats + " --max-repeats " + repeats;
    const Job text = run_job(2, "--tokens 4096 --no-calibrate " + limit);
    ASSERT_EQ(text.status, 0) << text.out << text.err;
    EXPECT_NE(text.out.find("too few repeats to compare"), std::string::npos) << text.out;
    EXPECT_EQ(text.out.find("is faster"), std::string::npos) << text.out;
    const nlohmann::json out = parse(run_job(2, "--tokens 4096 --no-calibrate --json " + limit));
    EXPECT_TRUE(out["too_few_repeats"].get<bool>()) << repeats;
    for (const auto& pair : out["comparisons"]) EXPECT_FALSE(pair["outside_noise"].get<bool>());
    for (const auto& s : out["strategies"]) {
      EXPECT_FALSE(s["speedup_slowest_rank"]["outside_noise"].get<bool>()) << s["mode"];
    }
  }
}

TEST(RunVerdict, MaxRepeatsAloneLowersTheFloorBothContradictingIsAnError) {
  const nlohmann::json out =
      parse(run_job(2, "--tokens 4096 --no-calibrate --max-repeats 3 --json"));
  EXPECT_EQ(out["repeats"].get<int>(), 3);
  EXPECT_TRUE(out["too_few_repeats"].get<bool>());
  const Job both = run_job(1, "--tokens 4096 --no-calibrate --repeats 4 --max-repeats 3");
  EXPECT_EQ(both.status, 2) << both.out << both.err;
  EXPECT_NE((both.out + both.err).find("--max-repeats 3 is below --repeats 4"), std::string::npos)
      << both.out << both.err;
}

TEST(RunVerdict, TheDefaultJobRunsTheSixRoundsAVerdictNeeds) {
  const Job job = run_job(2, "--tokens 4096 --no-calibrate");
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  EXPECT_EQ(job.out.find("too few repeats"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("each pair (the same per-repeat ratios"), std::string::npos) << job.out;
  const nlohmann::json out = parse(run_job(2, "--tokens 4096 --no-calibrate --json"));
  EXPECT_GE(out["repeats"].get<int>(), 6);
  EXPECT_FALSE(out["too_few_repeats"].get<bool>());
  EXPECT_EQ(out["comparisons"].size(), 3u);  // none, hybrid, spill: every pair
}

TEST(RunSizing, TheBuiltInBatchShrinksToFitTheBudgetAndSaysWhy) {
  // No machine runs the 65,536-token batch 6 times in a millisecond: it must shrink, and
  // the job still ends with a verdict from 6 rounds.
  const Job text = run_job(2, "--no-calibrate --time-budget 0.001");
  ASSERT_EQ(text.status, 0) << text.out << text.err;
  EXPECT_NE(text.out.find("scaled to this machine: the built-in batch is"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("instead of 65536"), std::string::npos) << text.out;
  const nlohmann::json out = parse(run_job(2, "--no-calibrate --time-budget 0.001 --json"));
  EXPECT_TRUE(out["sizing"]["scaled"].get<bool>());
  EXPECT_EQ(out["sizing"]["requested_tokens"].get<int64_t>(), 65536);
  EXPECT_LT(out["tokens"].get<int64_t>(), 65536);
  EXPECT_GT(out["sizing"]["round_s"].get<double>(), 0);
  EXPECT_EQ(out["repeats"].get<int>(), 6);  // the floor; no round fits past the budget
  EXPECT_FALSE(out["too_few_repeats"].get<bool>());
  EXPECT_TRUE(out["verified"].get<bool>());
}

TEST(RunSizing, ABatchYouGaveKeepsItsSize) {
  const nlohmann::json out =
      parse(run_job(2, "--tokens 8192 --no-calibrate --time-budget 0.001 --json"));
  EXPECT_FALSE(out["sizing"]["scaled"].get<bool>());
  EXPECT_EQ(out["tokens"].get<int64_t>(), 8192);
  EXPECT_EQ(out["sizing"]["text"].get<std::string>().rfind("not scaled", 0), 0u)
      << out["sizing"]["text"];
  EXPECT_EQ(out["repeats"].get<int>(), 6);
  const nlohmann::json listed =
      parse(run_job(2, "--lengths 3000,1000,96 --no-calibrate --time-budget 0.001 --json"));
  EXPECT_FALSE(listed["sizing"]["scaled"].get<bool>());
  EXPECT_EQ(listed["tokens"].get<int64_t>(), 4096);
}

TEST(RunSizing, RanksThatWouldSizeDifferentlyAreRefusedFirst) {
  // One rank may shrink the built-in batch, the other was given --tokens: they would plan
  // different batches after the first round, so the agreement check refuses them at once.
  const std::string rank =
      std::string(SPARSECP_CLI_PATH) + " run " + kSmall + " --no-calibrate --time-budget 0";
  const std::string command = std::string("env ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 ") +
                              SPARSECP_MPIEXEC + " --allow-run-as-root --oversubscribe -np 1 " +
                              rank + " : -np 1 " + rank + " --tokens 65536 2>&1 </dev/null";
  const auto [status, out] = run_shell(command);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("scalable_batch differs"), std::string::npos) << out;
}

TEST(RunSizing, WithoutAdaptStepsTheFirstRoundMeasures) {
  const nlohmann::json out =
      parse(run_job(2, "--mode hybrid --no-calibrate --time-budget 0.001 --json"));
  EXPECT_TRUE(out["sizing"]["scaled"].get<bool>());
  EXPECT_NE(out["sizing"]["text"].get<std::string>().find("measured by the first round"),
            std::string::npos);
  EXPECT_EQ(out["repeats"].get<int>(), 6);  // the probe round was measured on the old batch
  EXPECT_TRUE(out["verified"].get<bool>());
}

TEST(RunSvg, WritesEveryStrategysPerRankTimeAndWork) {
  const std::string path =
      ::testing::TempDir() + "sparsecp_run_cli_" + std::to_string(::getpid()) + "_ranks.svg";
  const Job job = run_job(2, "--tokens 4096 --no-calibrate --svg " + path);
  ASSERT_EQ(job.status, 0) << job.out << job.err;
  std::string svg;
  if (FILE* file = std::fopen(path.c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) svg.append(buffer, n);
    std::fclose(file);
  }
  std::filesystem::remove(path);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  for (const char* text :
       {"sparsecp run: none, hybrid, spill on 2 ranks", "Selection CPU time per rank",
        "Causal (query, key) pairs", "none: imbalance", "hybrid: imbalance", "spill: imbalance",
        "rank 1: ", " kernels)"}) {
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  }
  EXPECT_NE(job.out.find("machine: "), std::string::npos) << job.out;
}

// The other long commands: progress on stderr at a terminal (SPARSECP_PROGRESS=1 stands
// for it), none when piped or with --json.
TEST(LongCommandsProgress, CalibrateBenchAndSimulateSayWhatTheyAreDoing) {
  using sparsecp::testing::run_tool;
  const char* calibrate =
      "calibrate --heads 2 --head-dim 16 --rope-dim 8 --q-rank 12 --topk 9 --max-residual 0 "
      "--out -";
  const char* bench =
      "bench select --doc-length 512 --heads 2 --head-dim 16 --rope-dim 8 --q-rank 12 --topk 9 "
      "--sgemm-size 64 --repeats 2";
  const char* simulate = "simulate --cp 4,8 --tokens 65536 --seed 1-2";
  const struct {
    const char* arguments;
    const char* line;
  } commands[] = {{calibrate, "sparsecp calibrate [   0 s] timing the selection at"},
                  {bench, "sparsecp bench select ["},
                  {simulate, "batches"}};
  for (const auto& command : commands) {
    const auto shown = run_tool(command.arguments, "SPARSECP_PROGRESS=1");
    EXPECT_EQ(shown.status, 0) << command.arguments << shown.err;
    EXPECT_NE(shown.err.find(command.line), std::string::npos) << command.arguments << shown.err;
    const auto piped = run_tool(command.arguments);
    EXPECT_EQ(piped.status, 0) << command.arguments << piped.err;
    EXPECT_EQ(piped.err.find(command.line), std::string::npos) << command.arguments << piped.err;
    const auto json = run_tool(std::string(command.arguments) + " --json", "SPARSECP_PROGRESS=1");
    EXPECT_EQ(json.status, 0) << command.arguments << json.err;
    EXPECT_EQ(json.err.find(command.line), std::string::npos) << command.arguments << json.err;
  }
}

// The guide's command examples (docs/guide/cli.md, its first block) run as written, but
// the `mpirun` one (the main job, minutes under the sanitizers: the tests above run it).
TEST(GuideCommands, TheCliPagesExamplesRunAsWritten) {
  const std::string page = std::string(SPARSECP_TEST_DATA_DIR) + "/../../docs/guide/cli.md";
  std::ifstream file(page);
  ASSERT_TRUE(file) << page;
  std::string line, block;
  bool inside = false;
  while (std::getline(file, line)) {
    if (line.rfind("```", 0) == 0) {
      if (inside) break;
      inside = true;
      continue;
    }
    if (inside) block += line + "\n";
  }
  const std::string dir = ::testing::TempDir() + "sparsecp_guide_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  int ran = 0;
  std::istringstream lines(block);
  while (std::getline(lines, line)) {
    const std::string tool = "build/release/sparsecp";
    if (line.rfind(tool, 0) != 0) continue;                  // the mpirun line
    std::string command = line.substr(0, line.find("  #"));  // without the comment
    command = std::string("cd ") + dir + " && OMP_NUM_THREADS=1 " + SPARSECP_CLI_PATH +
              command.substr(tool.size()) +
              (command.find('>') == std::string::npos ? " > /dev/null" : "");
    EXPECT_EQ(run_shell(command).first, 0) << line;
    ++ran;
  }
  std::filesystem::remove_all(dir);
  EXPECT_GE(ran, 5) << block;
}

TEST(RunFlags, AnEmptyModeIsAnError) {
  for (const char* mode : {"\"\"", "\",\""}) {
    const Job job = run_job(1, std::string("--tokens 4096 --no-calibrate --mode ") + mode);
    EXPECT_EQ(job.status, 2) << mode << "\n" << job.out << job.err;
    EXPECT_NE((job.out + job.err).find("--mode"), std::string::npos) << job.out << job.err;
    EXPECT_NE((job.out + job.err).find("empty"), std::string::npos) << job.out << job.err;
  }
}

}  // namespace
}  // namespace sparsecp
