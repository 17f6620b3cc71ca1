// `sparsecp kl` end to end on .npy files (same bits as the library), its bad inputs
// (exit 2, one `error:` line), and a tiny `bench kl`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "sparsecp/io/npy.hpp"
#include "sparsecp/kernels/indexer_kl.hpp"
#include "support/indexer_kl_case.hpp"
#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

using testing::KlCase;
using testing::KlGrads;
using testing::random_kl_case;

class KlCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sparsecp_kl_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes the case: q and index_key bf16, the rest fp32, ids int64.
  void write_case(const KlCase& c) {
    const auto& s = c.spec;
    write_npy(path("q.npy"), NpyDType::kBFloat16, c.index_query.shape, c.index_query.b16.data());
    write_npy(path("k.npy"), NpyDType::kBFloat16, c.index_key.shape, c.index_key.b16.data());
    write_npy(path("w.npy"), NpyDType::kFloat32, c.merge_weight.shape, c.merge_weight.f32.data());
    write_npy(path("qa.npy"), NpyDType::kFloat32, c.attention_query.shape,
              c.attention_query.f32.data());
    write_npy(path("ka.npy"), NpyDType::kFloat32, c.compressed_key.shape,
              c.compressed_key.f32.data());
    write_npy(path("sinks.npy"), NpyDType::kFloat32, c.sinks.shape, c.sinks.f32.data());
    write_npy(path("idx.npy"), NpyDType::kInt64, std::vector<int64_t>{s.batch, s.rows, s.topk},
              c.ids64.data());
  }
  std::string arguments(const KlCase& c, const std::string& idx = "idx.npy") const {
    std::ostringstream text;
    text.precision(17);
    text << "kl --index-query " << path("q.npy") << " --index-key " << path("k.npy")
         << " --weights " << path("w.npy") << " --attention-query " << path("qa.npy")
         << " --attention-key " << path("ka.npy") << " --indices " << path(idx) << " --sinks "
         << path("sinks.npy") << " --attention-scale " << c.attention_scale
         << " --loss-coeff 1.5 --main-key-offset " << c.spec.offset;
    return text.str();
  }

  std::filesystem::path dir_;
};

// The library call the tool must reproduce bit for bit (same ISA, deterministic).
double library_loss(const KlCase& c, KlGrads& grads) {
  IndexerKlInputs in = c.inputs(DType::kFloat32, IndexDType::kInt64);
  in.index_query = c.index_query.view(DType::kBFloat16);
  in.index_key = c.index_key.view(DType::kBFloat16);
  IndexerKlOptions options;
  options.attention_scale = c.attention_scale;
  options.loss_coeff = 1.5;
  options.main_key_offset = c.spec.offset;
  return indexer_kl_loss(in, options, grads.spans());
}

std::vector<float> floats(const NpyArray& array) {
  return {array.as<float>(), array.as<float>() + array.elements()};
}

TEST_F(KlCli, WritesTheLibrarysLossAndGradients) {
  const uint64_t seed = testing::test_seed() + 41;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const KlCase c = random_kl_case(random, {2, 5, 3, 16, 2, 12, 9, 10, 3, 2});
  write_case(c);
  KlGrads want(c);
  const double loss = library_loss(c, want);

  const testing::ToolRun run =
      testing::run_tool(arguments(c) + " --out-dir " + path("out") + " --json");
  ASSERT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_EQ(nlohmann::json::parse(run.out).at("loss").get<double>(), loss) << run.out;
  const NpyArray saved_loss = read_npy(path("out/loss.npy"));
  EXPECT_EQ(saved_loss.dtype, NpyDType::kFloat64);
  EXPECT_TRUE(saved_loss.shape.empty());
  EXPECT_EQ(*saved_loss.as<double>(), loss);
  const NpyArray dq = read_npy(path("out/grad_index_query.npy"));
  const NpyArray dk = read_npy(path("out/grad_index_key.npy"));
  const NpyArray dw = read_npy(path("out/grad_weights.npy"));
  EXPECT_EQ(dq.dtype, NpyDType::kFloat32);
  EXPECT_EQ(dq.shape, c.index_query.shape);
  EXPECT_EQ(dk.shape, c.index_key.shape);
  EXPECT_EQ(dw.shape, c.merge_weight.shape);
  EXPECT_EQ(floats(dq), want.index_query);
  EXPECT_EQ(floats(dk), want.index_key);
  EXPECT_EQ(floats(dw), want.merge_weight);

  // --reference: the double-precision twin, close to the fused result.
  const testing::ToolRun reference = testing::run_tool(arguments(c) + " --reference --json");
  ASSERT_EQ(reference.status, 0) << reference.err;
  EXPECT_NEAR(nlohmann::json::parse(reference.out).at("loss").get<double>(), loss,
              1e-6 * std::abs(loss));

  const testing::ToolRun text = testing::run_tool(arguments(c) + " --out-dir " + path("out2"));
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("loss "), std::string::npos) << text.out;
  EXPECT_TRUE(std::filesystem::exists(path("out2/grad_weights.npy")));
}

// One line on stderr, beginning "error:", containing `text`; exit status 2.
void expect_one_error(const testing::ToolRun& run, const std::string& text) {
  EXPECT_EQ(run.status, 2) << run.out << run.err;
  EXPECT_EQ(run.err.rfind("error: ", 0), 0u) << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_NE(run.err.find(text), std::string::npos) << run.err << " expected: " << text;
}

TEST_F(KlCli, BadFilesAndShapesExitTwoWithOneErrorLine) {
  SplitMix64 random(testing::test_seed() + 42);
  KlCase c = random_kl_case(random, {1, 4, 2, 8, 2, 8, 6, 6});
  write_case(c);
  const std::string out = " --out-dir " + path("out");

  // Indices of the wrong shape: the seed's text.
  write_npy(path("idx_shape.npy"), NpyDType::kInt64, std::vector<int64_t>{1, 3, 8}, c.ids64.data());
  expect_one_error(testing::run_tool(arguments(c, "idx_shape.npy") + out),
                   "Fused KL indices must have shape [B, Q, TopK] matching Indexer Q");
  // TopK below min(512, K).
  write_npy(path("idx_narrow.npy"), NpyDType::kInt64, std::vector<int64_t>{1, 4, 4},
            c.ids64.data());
  expect_one_error(testing::run_tool(arguments(c, "idx_narrow.npy") + out),
                   "Fused KL requires ordinary TopK512 selections, allowing padding for a compact "
                   "bank; got K=6, TopK=4");
  // An id outside the bank.
  c.set_id(2, 6);
  write_npy(path("idx_bad.npy"), NpyDType::kInt64, std::vector<int64_t>{1, 4, 6}, c.ids64.data());
  expect_one_error(testing::run_tool(arguments(c, "idx_bad.npy") + out),
                   "topk id 6 at [0, 0, 2] is outside the bank's keys [0, 6)");
  // Float indices, float64 inputs, a missing file, a truncated file.
  const std::vector<float> float_ids(24, 0.0f);
  write_npy(path("idx_float.npy"), NpyDType::kFloat32, std::vector<int64_t>{1, 4, 6},
            float_ids.data());
  expect_one_error(testing::run_tool(arguments(c, "idx_float.npy") + out),
                   "dtype float32 is not int32 or int64");
  const double sinks64[2] = {0.5, -0.5};
  write_npy(path("sinks.npy"), NpyDType::kFloat64, std::vector<int64_t>{2}, sinks64);
  expect_one_error(testing::run_tool(arguments(c) + out),
                   "--sinks " + path("sinks.npy") + ": dtype float64 is not float32 or bfloat16");
  write_case(c);
  std::filesystem::remove(path("ka.npy"));
  expect_one_error(testing::run_tool(arguments(c) + out), "cannot open .npy file");
  { std::ofstream(path("ka.npy")) << "\x93NUMPY"; }
  expect_one_error(testing::run_tool(arguments(c) + out), "ka.npy");
  write_case(c);
  // Shapes that disagree: weights with the wrong head count, sinks with the wrong length.
  write_npy(path("w.npy"), NpyDType::kFloat32, std::vector<int64_t>{1, 4, 1},
            c.merge_weight.f32.data());
  expect_one_error(testing::run_tool(arguments(c) + out),
                   "merge_weight must have shape [B, S, H] = [1, 4, 2]");
  write_case(c);
  write_npy(path("sinks.npy"), NpyDType::kFloat32, std::vector<int64_t>{1}, c.sinks.f32.data());
  expect_one_error(testing::run_tool(arguments(c) + out), "sinks must have shape [Hm] = [2]");
  write_case(c);
  // Options.
  std::string shifted = arguments(c);
  shifted.replace(shifted.find("--main-key-offset 0"), 19, "--main-key-offset 1");
  expect_one_error(testing::run_tool(shifted + out),
                   "index_key has 6 rows, fewer than main_key_offset 1");
  expect_one_error(testing::run_tool(arguments(c) + out + " --isa avx3"),
                   "--isa must be auto, portable, avx2 or avx512, got 'avx3'");
  expect_one_error(testing::run_tool(arguments(c)), "kl needs --out-dir, --json or both");
  expect_one_error(testing::run_tool("kl --index-query " + path("q.npy")), "required");
}

// The four outputs appear together or not at all: a directory in the way of one of them
// fails the run before any file is replaced, and a full device is an error, never "wrote".
TEST_F(KlCli, OutputsAreWholeOrAbsent) {
  const uint64_t seed = testing::test_seed() + 43;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const KlCase c = random_kl_case(random, {2, 5, 3, 16, 2, 12, 9, 10, 3, 2});
  write_case(c);
  std::filesystem::create_directories(path("out/grad_index_key.npy"));
  { std::ofstream(path("out/loss.npy")) << "earlier run"; }
  expect_one_error(testing::run_tool(arguments(c) + " --out-dir " + path("out")),
                   "--out-dir " + path("out/grad_index_key.npy") + ": is a directory");
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(path("out"))) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"grad_index_key.npy", "loss.npy"}));
  std::ifstream earlier(path("out/loss.npy"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(earlier), {}), "earlier run");
}

TEST_F(KlCli, ZeroCoefficientAndHelp) {
  SplitMix64 random(testing::test_seed() + 43);
  const KlCase c = random_kl_case(random, {1, 3, 2, 8, 2, 8, 6, 6});
  write_case(c);
  std::string args = arguments(c);
  args.replace(args.find("--loss-coeff 1.5"), 16, "--loss-coeff 0");
  const testing::ToolRun run = testing::run_tool(args + " --json");
  ASSERT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(nlohmann::json::parse(run.out).at("loss").get<double>(), 0.0);
  const testing::ToolRun help = testing::run_tool("kl --help");
  EXPECT_EQ(help.status, 0);
  for (const char* text : {"attention-sink", "--main-key-offset", "Example", "[B, Hm, S, Dm]"}) {
    EXPECT_NE(help.out.find(text), std::string::npos) << text;
  }
}

TEST_F(KlCli, BenchKlReportsJsonAndVerifies) {
  const testing::ToolRun bench = testing::run_tool(
      "bench kl --rows 8 --doc-length 64 --heads 3 --head-dim 16 --att-heads 2 --att-dim 24 "
      "--topk 16 --repeats 1 --sgemm-size 32 --json");
  ASSERT_EQ(bench.status, 0) << bench.out << bench.err;
  const auto json = nlohmann::json::parse(bench.out);
  for (const char* key : {"seconds", "gflops", "sgemm_gflops", "fraction_of_sgemm", "scratch_bytes",
                          "bf16_speedup", "verified"}) {
    EXPECT_TRUE(json.contains(key)) << key << " in " << bench.out;
  }
  EXPECT_TRUE(json.at("verified").get<bool>());
  expect_one_error(testing::run_tool("bench kl --rows 0"), "bench kl needs");
}

}  // namespace
}  // namespace sparsecp
