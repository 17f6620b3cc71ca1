// `sparsecp select` end to end on .npy files, its errors, and a tiny `bench select`.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sparsecp/io/npy.hpp"
#include "sparsecp/kernels/select.hpp"
#include "support/select_test_support.hpp"
#include "support/tool_runner.hpp"

namespace sparsecp {
namespace {

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

Result run(const std::string& arguments) {
  const testing::ToolRun tool = testing::run_tool(arguments);
  return {tool.status, tool.out + tool.err};
}

class SelectCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sparsecp_select_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(SelectCli, SelectsLikeTheLibraryFromNpyFiles) {
  const uint64_t seed = testing::test_seed() + 31;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SelectConfig config;
  config.heads = 3;
  config.head_dim = 16;
  config.rope_dim = 8;
  config.topk = 5;
  config.ratio = 4;
  const auto worker = testing::random_worker(random, 4, 4, 120, 10, false);
  const auto q = testing::random_matrix(random, worker.rows, 48, 2);
  const auto w = testing::random_matrix(random, worker.rows, 3, 2);
  const auto k = testing::random_matrix(random, worker.bank, 16, 2);
  std::vector<int32_t> expected(static_cast<size_t>(worker.rows * 5));
  select_topk_reference(q.view(DType::kBFloat16), w.view(DType::kFloat32), k.view(DType::kBFloat16),
                        worker.segments, config, expected);
  // Q with a leading batch dim of 1, bf16 Q and keys, fp32 weights.
  write_npy(path("q.npy"), NpyDType::kBFloat16, std::vector<int64_t>{1, worker.rows, 3, 16},
            q.b16.data());
  write_npy(path("w.npy"), NpyDType::kFloat32, std::vector<int64_t>{worker.rows, 3}, w.f32.data());
  write_npy(path("k.npy"), NpyDType::kBFloat16, std::vector<int64_t>{worker.bank, 16},
            k.b16.data());
  {
    std::ofstream segments(path("s.json"));
    segments << "[";
    for (size_t i = 0; i < worker.segments.size(); ++i) {
      const Segment& s = worker.segments[i];
      segments << (i ? "," : "") << "[" << s.q_begin << "," << s.q_end << "," << s.key_begin << ","
               << s.key_end << "," << s.residual << "]";
    }
    segments << "]";
  }
  const std::string common = " --keys " + path("k.npy") + " --weights " + path("w.npy") +
                             " --segments " + path("s.json") + " --ratio 4 --topk 5";
  const Result ok = run("select" + common + " --q " + path("q.npy") + " --out " + path("o.npy"));
  ASSERT_EQ(ok.status, 0) << ok.output;
  const NpyArray out = read_npy(path("o.npy"));
  EXPECT_EQ(out.dtype, NpyDType::kInt32);
  EXPECT_EQ(out.shape, (std::vector<int64_t>{worker.rows, 5}));
  EXPECT_EQ(std::vector<int32_t>(out.as<int32_t>(), out.as<int32_t>() + out.elements()), expected);

  // A full device is an error, never "wrote"; a directory in the way names the flag.
  const Result full = run("select" + common + " --q " + path("q.npy") + " --out /dev/full");
  EXPECT_EQ(full.status, 2) << full.output;
  EXPECT_NE(full.output.find("--out /dev/full: write failed: No space left on device"),
            std::string::npos)
      << full.output;
  EXPECT_EQ(full.output.find("wrote"), std::string::npos) << full.output;
  std::filesystem::create_directories(path("dir.npy"));
  const Result dir = run("select" + common + " --q " + path("q.npy") + " --out " + path("dir.npy"));
  EXPECT_EQ(dir.status, 2) << dir.output;
  EXPECT_NE(dir.output.find("--out " + path("dir.npy") + ": is a directory"), std::string::npos)
      << dir.output;

  // Batch dims other than one, wrong shapes and dtypes: clear errors, exit status 2.
  write_npy(path("q2.npy"), NpyDType::kBFloat16, std::vector<int64_t>{2, worker.rows / 2, 3, 16},
            q.b16.data());
  const Result batch =
      run("select" + common + " --q " + path("q2.npy") + " --out " + path("x.npy"));
  EXPECT_EQ(batch.status, 2);
  EXPECT_NE(batch.output.find("Packed Lightning Indexer requires batch size one"),
            std::string::npos)
      << batch.output;
  write_npy(path("q3.npy"), NpyDType::kBFloat16, std::vector<int64_t>{worker.rows, 16, 3},
            q.b16.data());
  const Result shape =
      run("select" + common + " --q " + path("q3.npy") + " --out " + path("x.npy"));
  EXPECT_EQ(shape.status, 2);
  EXPECT_NE(shape.output.find("expected shape"), std::string::npos) << shape.output;
  std::vector<int32_t> ints(static_cast<size_t>(worker.rows * 48));
  write_npy(path("qi.npy"), NpyDType::kInt32, std::vector<int64_t>{worker.rows, 3, 16},
            ints.data());
  const Result dtype =
      run("select" + common + " --q " + path("qi.npy") + " --out " + path("x.npy"));
  EXPECT_EQ(dtype.status, 2);
  EXPECT_NE(dtype.output.find("is not float32 or bfloat16"), std::string::npos) << dtype.output;
  const Result both = run("select" + common + " --out " + path("x.npy"));
  EXPECT_EQ(both.status, 2);
}

TEST_F(SelectCli, ProjectsFromTheResidual) {
  const uint64_t seed = testing::test_seed() + 32;
  SplitMix64 random(seed);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  SelectConfig config;
  config.heads = 2;
  config.head_dim = 8;
  config.rope_dim = 4;
  config.topk = 3;
  config.ratio = 2;
  const std::vector<Segment> segments{{0, 6, 0, 3, 0}};
  const auto qr = testing::random_matrix(random, 6, 4, 1);
  const auto wq = testing::random_matrix(random, 4, 16, 1);
  const auto cs = testing::random_matrix(random, 6, 2, 1);
  const auto w = testing::random_matrix(random, 6, 2, 2);
  const auto k = testing::random_matrix(random, 3, 8, 2);
  std::vector<int32_t> expected(18);
  select_worker_rows_reference(qr.view(DType::kFloat32), w.view(DType::kFloat32),
                               cs.view(DType::kFloat32), cs.view(DType::kFloat32),
                               wq.view(DType::kFloat32), k.view(DType::kFloat32), segments, config,
                               expected);
  write_npy(path("qr.npy"), NpyDType::kFloat32, std::vector<int64_t>{6, 4}, qr.f32.data());
  write_npy(path("wq.npy"), NpyDType::kFloat32, std::vector<int64_t>{4, 16}, wq.f32.data());
  write_npy(path("cs.npy"), NpyDType::kFloat32, std::vector<int64_t>{6, 2}, cs.f32.data());
  write_npy(path("w.npy"), NpyDType::kFloat32, std::vector<int64_t>{6, 2}, w.f32.data());
  write_npy(path("k.npy"), NpyDType::kFloat32, std::vector<int64_t>{3, 8}, k.f32.data());
  std::ofstream(path("s.json")) << "{\"segments\": [[0, 6, 0, 3, 0]]}";
  const Result ok = run("select --keys " + path("k.npy") + " --weights " + path("w.npy") +
                        " --q-residual " + path("qr.npy") + " --wq " + path("wq.npy") + " --cos " +
                        path("cs.npy") + " --sin " + path("cs.npy") + " --segments " +
                        path("s.json") + " --ratio 2 --topk 3 --out " + path("o.npy"));
  ASSERT_EQ(ok.status, 0) << ok.output;
  const NpyArray out = read_npy(path("o.npy"));
  EXPECT_EQ(std::vector<int32_t>(out.as<int32_t>(), out.as<int32_t>() + out.elements()), expected);
  write_npy(path("wq7.npy"), NpyDType::kFloat32, std::vector<int64_t>{4, 14}, wq.f32.data());
  const Result width =
      run("select --keys " + path("k.npy") + " --weights " + path("w.npy") + " --q-residual " +
          path("qr.npy") + " --wq " + path("wq7.npy") + " --cos " + path("cs.npy") + " --sin " +
          path("cs.npy") + " --segments " + path("s.json") + " --ratio 2 --topk 3 --out " +
          path("o.npy"));
  EXPECT_EQ(width.status, 2);
  EXPECT_NE(width.output.find("Indexer query width 14 is not divisible by head_dim 8"),
            std::string::npos)
      << width.output;
}

TEST_F(SelectCli, BenchSelectReportsJsonAndVerifies) {
  const Result bench =
      run("bench select --doc-length 64 --heads 3 --head-dim 16 --q-rank 8 --rope-dim 8 --topk 4 "
          "--repeats 1 --sgemm-size 32 --json");
  ASSERT_EQ(bench.status, 0) << bench.output;
  for (const char* key : {"\"score_gflops\"", "\"sgemm_gflops\"", "\"seconds\"",
                          "\"baseline_seconds\"", "\"verified\":true"}) {
    EXPECT_NE(bench.output.find(key), std::string::npos) << key << " in " << bench.output;
  }
  const Result help = run("bench select --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--doc-length"), std::string::npos);
}

}  // namespace
}  // namespace sparsecp
