// Bad inputs against the `sparsecp` tool: every one must end with exactly one
// "error: ..." line on stderr and exit status 2 — no crash, abort, hang, sanitizer
// report or gigantic allocation. The cheap cases of the table in docs/RESULTS.md
// ("Bad inputs against the CLI"; fuzz/cli_limits.sh runs all of them, including the
// slow and multi-rank ones).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/tool_runner.hpp"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using Outcome = sparsecp::testing::ToolRun;

// The directory of bad input files, written once per test process (CTest runs each test
// in its own process, in parallel: a shared directory would be rewritten under a reader).
const std::string& data_dir() {
  static const std::string dir = [] {
    const std::string path =
        ::testing::TempDir() + "sparsecp_limits_test_" + std::to_string(::getpid()) + "/";
    ::mkdir(path.c_str(), 0755);
    // Every test process writes the directory (CTest runs them in parallel): write a
    // private file and rename it into place, so that no reader sees a half-written one.
    const auto write = [&](const std::string& name, const std::string& bytes) {
      const std::string temporary = path + name + ".tmp" + std::to_string(::getpid());
      std::ofstream(temporary, std::ios::binary) << bytes;
      std::rename(temporary.c_str(), (path + name).c_str());
    };
    // .npy: a valid 6-row selection problem, and broken images of it.
    const auto header = [](const std::string& dict) {
      std::string body = dict;
      while ((10 + body.size() + 1) % 64) body += ' ';
      body += '\n';
      std::string image = "\x93NUMPY\x01";
      image += '\0';
      image += static_cast<char>(body.size() & 0xff);
      image += static_cast<char>(body.size() >> 8);
      return image + body;
    };
    const auto floats = [](size_t n) {
      std::string bytes;
      for (size_t i = 0; i < n; ++i) bytes += std::string("\x00\x00\x80\x3f", 4);  // 1.0f
      return bytes;
    };
    write("k.npy",
          header("{'descr': '<f4', 'fortran_order': False, 'shape': (8, 16), }") + floats(128));
    write("w.npy",
          header("{'descr': '<f4', 'fortran_order': False, 'shape': (6, 2), }") + floats(12));
    write("q.npy",
          header("{'descr': '<f4', 'fortran_order': False, 'shape': (6, 2, 16), }") + floats(192));
    write("seg.json", "[[0,6,0,1,2]]");
    write("empty.npy", "");
    write("garbage.npy", "hello world this is not numpy\n");
    write("trunc.npy", std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17));
    write("hlen.npy", std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f{", 13));
    write("f8.npy", header("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }") +
                        std::string(32, '\0'));
    write("fortran.npy", header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }") +
                             std::string(16, '\0'));
    write("negshape.npy", header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 2), }") +
                              std::string(16, '\0'));
    write("hugeshape.npy",
          header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, "
                 "16), }") +
              std::string(16, '\0'));
    write("bigdata.npy",
          header("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 16), }") +
              std::string(16, '\0'));
    // Segments JSON.
    write("seg_garbage.json", "{{{ not json");
    write("seg_empty.json", "");
    write("seg_four.json", "[[0,6,0,1]]");
    write("seg_float.json", "[[0,6.5,0,1,2]]");
    write("seg_u64.json", "[[0,6,0,18446744073709551615,2]]");
    write("seg_range.json", "[[0,600,0,150,0]]");
    write("seg_keys.json", "[[0,6,0,200,0]]");
    write("seg_deep.json", std::string(100000, '[') + std::string(100000, ']'));
    // Lengths files.
    write("empty.txt", "");
    write("spaces.txt", "  \n\t ,, \n");
    write("garbage.txt", "hello, world\n");
    std::string binary;
    for (int i = 0; i < 512; ++i) binary += static_cast<char>(i % 256);
    write("binary.txt", binary);
    write("negative.txt", "100 -4 8\n");
    write("huge.txt", "99999999999999999999999\n");
    // Cost models whose coefficients would make a cost inf or nan (issue 30).
    write("huge_b.model", "a 0\nb 1e308\nc 0\ntopk 512\nunit pairs\n");
    write("huge_d.model", "a 1\nb 1\nc 0\nd 1.7976931348623157e308\ntopk 512\nunit pairs\n");
    write("topk4.model", "a 1\nb 1\nc 0\ntopk 4\nunit pairs\n");
    return path;
  }();
  // Removed when the test process ends.
  static const struct Cleanup {
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup;
  return dir;
}

// Runs the tool with `arguments` (shell words; $D names the bad-input directory) and
// `environment` (shell assignments) in front.
Outcome run_tool(std::string arguments, const std::string& environment = "") {
  for (size_t at = arguments.find("$D/"); at != std::string::npos; at = arguments.find("$D/")) {
    arguments.replace(at, 3, data_dir());
  }
  // `run` initialises MPI, whose own allocations LeakSanitizer would report at exit (as
  // for the mpirun tests in tests/CMakeLists.txt); sparsecp's leaks are covered elsewhere.
  const bool initialises_mpi = arguments.rfind("run ", 0) == 0;
  return sparsecp::testing::run_tool(
      arguments, initialises_mpi ? "ASAN_OPTIONS=detect_leaks=0 " + environment : environment);
}

struct BadInput {
  const char* name;       // test name
  const char* arguments;  // after `sparsecp`
  const char* message;    // part of the expected error line
};

// Table order follows docs/RESULTS.md. Messages are the library's (seed texts where
// the seed has one).
const BadInput kBadInputs[] = {
    // Sums beyond 64 bits, lengths near 2^53 and 2^63.
    {"SumBeyond64Bits",
     "plan --lengths 4611686018427387904,4611686018427387904 --cp 2 --mode zigzag",
     "sum beyond 64 bits"},
    {"LengthMaxInt64PlusOne", "plan --lengths 9223372036854775807,1 --cp 2 --mode none",
     "sum beyond 64 bits"},
    {"WorkBeyond64Bits", "plan --lengths 9223372036854775807 --cp 1 --mode none",
     "causal work of the batch exceeds 64 bits"},
    {"LengthNear2To53", "plan --lengths 9007199254740993 --cp 1 --mode zigzag",
     "causal work of the batch exceeds 64 bits"},
    {"LengthBeyondInt64", "plan --lengths 9223372036854775808 --cp 1", "does not fit in 64 bits"},
    {"RouteNear2To53", "route --lengths 9007199254740993 --cp 1 --mode zigzag --rank 0",
     "exceeds 64 bits"},
    // CP larger than the token count, zero/negative values.
    {"CpLargerThanTokens", "plan --lengths 3 --cp 6 --mode zigzag",
     "equal contiguous CP partition"},
    {"CpZero", "plan --lengths 4,4 --cp 0", "equal contiguous CP partition"},
    {"CpNegative", "plan --lengths 4,4 --cp -2", "equal contiguous CP partition"},
    {"CpBeyondInt64", "plan --lengths 4,4 --cp 99999999999999999999",
     "equal contiguous CP partition"},
    {"CpBeyondLimit", "plan --lengths 2097152 --cp 2097152 --mode none", "supported maximum"},
    {"RatioZero", "plan --lengths 4,4 --cp 2 --ratio 0", "positive document lengths/ratio"},
    {"RatioNegative", "plan --lengths 4,4 --cp 2 --ratio -4", "positive document lengths/ratio"},
    {"LengthZero", "plan --lengths 5,0,3 --cp 2", "positive document lengths/ratio"},
    {"LengthNegative", "plan --lengths 5,-1,4 --cp 2", "positive document lengths/ratio"},
    {"BlockZero", "plan --lengths 8,8 --cp 2 --mode greedy --block-size 0",
     "indexer_balance_block_size must be a positive integer"},
    {"BlockBeyondLocal", "plan --lengths 8,8 --cp 2 --mode greedy --block-size 9",
     "exceeds the local query count 8"},
    {"BlockForZigzag", "plan --lengths 8,8 --cp 2 --mode zigzag --block-size 4",
     "indexer_balance_block_size requires"},
    {"ThresholdForGreedy", "plan --lengths 8,8 --cp 2 --mode greedy --zigzag-min-length 4",
     "indexer_zigzag_min_length requires indexer_load_balance='hybrid'"},
    {"HybridThresholdZero",
     "plan --lengths 8,8 --cp 2 --mode hybrid --block-size 4 --zigzag-min-length 0",
     "indexer_load_balance='hybrid' requires an explicit positive integer "
     "indexer_zigzag_min_length"},
    {"BlockZeroForZigzag", "plan --lengths 8,8 --cp 2 --mode zigzag --block-size 0",
     "indexer_balance_block_size requires indexer_load_balance='greedy' or 'hybrid'"},
    {"ThresholdZeroForGreedy", "plan --lengths 8,8 --cp 2 --mode greedy --zigzag-min-length 0",
     "indexer_zigzag_min_length requires indexer_load_balance='hybrid'"},
    // A directory as an input file names the flag; outputs that cannot be written fail
    // before "wrote" (io/output_set.hpp).
    {"QIsDirectory",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/. --segments $D/seg.json --out "
     "/tmp/limits_out.npy",
     "/.: is a directory, not a file"},
    {"SegmentsIsDirectory",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/. --out "
     "/tmp/limits_out.npy",
     "--segments "},
    {"LengthsFileIsDirectory", "plan --lengths-file $D/. --cp 2", "is a directory, not a file"},
    {"OutIsFullDevice",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "/dev/full",
     "--out /dev/full: write failed: No space left on device"},
    {"OutIsDirectory",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out $D/.",
     "/.: is a directory"},
    {"SelectTopkBeyondInt32",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --topk "
     "2147483648 --out /tmp/limits_out.npy",
     "Indexer topk 2147483648 is too large"},
    {"UnknownMode", "plan --lengths 8,8 --cp 2 --mode bogus",
     "unknown strategy 'bogus' (known: none, zigzag, greedy, hybrid, "},
    // Garbage text and files.
    {"LengthsEmpty", "plan --lengths '' --cp 1", "no document lengths given"},
    {"LengthsWords", "plan --lengths abc --cp 1", "is not an integer"},
    {"LengthsOnlySeparators", "plan --lengths ,,, --cp 1", "no document lengths given"},
    {"LengthsFloat", "plan --lengths 1.5,2 --cp 1", "is not an integer"},
    {"LengthsHex", "plan --lengths 0x10 --cp 1", "is not an integer"},
    {"LengthsFileMissing", "plan --lengths-file $D/nonexistent.txt --cp 1", "cannot open"},
    {"LengthsFileEmpty", "plan --lengths-file $D/empty.txt --cp 1", "no document lengths given"},
    {"LengthsFileSeparators", "plan --lengths-file $D/spaces.txt --cp 1", "no document lengths"},
    {"LengthsFileGarbage", "plan --lengths-file $D/garbage.txt --cp 1", "is not an integer"},
    {"LengthsFileBinary", "plan --lengths-file $D/binary.txt --cp 1",
     "document length '\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08' (entry 1) is not an integer"},
    {"LengthsFileNegative", "plan --lengths-file $D/negative.txt --cp 1",
     "positive document lengths/ratio"},
    {"LengthsFileHuge", "plan --lengths-file $D/huge.txt --cp 1", "does not fit in 64 bits"},
    {"TokensZero", "plan --tokens 0 --cp 1", "token count must be positive"},
    {"GeneratorTooManyDocuments", "batch --tokens 4611686018427387904 --dist fixed --scale 1",
     "documents; use a larger --scale"},
    {"UnknownDistribution", "batch --dist bogus", "unknown workload distribution"},
    // route
    {"RouteRankNegative", "route --lengths 8,8 --cp 2 --mode zigzag --rank -1", "rank"},
    {"RouteRankBeyondGroup", "route --lengths 8,8 --cp 2 --mode zigzag --rank 2", "rank"},
    {"RouteRepeatZero", "route --lengths 8,8 --cp 2 --mode zigzag --all-ranks --repeats 0",
     "--repeats must be within [1, 10000], got 0"},
    // dispatch
    {"DispatchWindowZero", "dispatch --kind swa --lengths 8,8 --cp 2 --window 0",
     "SWA dispatch requires positive dimensions and a valid CP rank"},
    {"DispatchRatioThree", "dispatch --kind prefix --lengths 8,8 --cp 2 --ratio 3",
     "Main KV dispatch requires a supported ratio"},
    {"DispatchHugeRankCount",
     "dispatch --kind swa --lengths 4611686018427387904 --cp 4611686018427387904",
     "exceeds the supported maximum"},
    {"DispatchCpLargerThanTokens", "dispatch --kind swa --lengths 5,3 --cp 16", ""},
    // select: .npy headers
    {"NpyMissing",
     "select --keys $D/nonexistent.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json "
     "--out $D/out.npy",
     "nonexistent.npy"},
    {"NpyEmpty",
     "select --keys $D/empty.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "$D/out.npy",
     "empty.npy"},
    {"NpyGarbage",
     "select --keys $D/garbage.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "$D/out.npy",
     "garbage.npy"},
    {"NpyTruncatedHeader",
     "select --keys $D/trunc.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "$D/out.npy",
     "trunc.npy"},
    {"NpyHeaderLengthBeyondFile",
     "select --keys $D/hlen.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "$D/out.npy",
     "hlen.npy"},
    {"NpyFloat64",
     "select --keys $D/f8.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "$D/out.npy",
     "f8.npy"},
    {"NpyFortranOrder",
     "select --keys $D/fortran.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "$D/out.npy",
     "fortran.npy"},
    {"NpyNegativeShape",
     "select --keys $D/negshape.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json "
     "--out $D/out.npy",
     "negshape.npy"},
    {"NpyShapeProductOverflows",
     "select --keys $D/hugeshape.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json "
     "--out $D/out.npy",
     "hugeshape.npy"},
    {"NpyShapeBeyondData",
     "select --keys $D/bigdata.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json "
     "--out $D/out.npy",
     "bigdata.npy"},
    // select: segments JSON
    {"SegmentsGarbage",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_garbage.json "
     "--out $D/out.npy",
     "invalid JSON"},
    {"SegmentsEmptyFile",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_empty.json "
     "--out $D/out.npy",
     "invalid JSON"},
    {"SegmentsFourFields",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_four.json "
     "--out $D/out.npy",
     "is not a list of 5 integers"},
    {"SegmentsFloat",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_float.json "
     "--out $D/out.npy",
     "is not a list of 5 integers"},
    {"SegmentsUnsigned64",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_u64.json "
     "--out $D/out.npy",
     ""},
    {"SegmentsRowsBeyondInputs",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_range.json "
     "--out $D/out.npy",
     ""},
    {"SegmentsKeysBeyondBank",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_keys.json "
     "--out $D/out.npy",
     ""},
    {"SegmentsDeeplyNested",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg_deep.json "
     "--out $D/out.npy",
     "is not a list of 5 integers: a nested array"},
    {"SelectTopkZero",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --topk 0 "
     "--out $D/out.npy",
     "topk"},
    {"SelectTopkOverflows",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --topk "
     "9223372036854775807 --out $D/out.npy",
     "Indexer topk 9223372036854775807 is too large"},
    {"SelectOutputUnwritable",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --out "
     "/nonexistent/dir/out.npy",
     "out.npy"},
    // bench select
    {"BenchDocLengthZero", "bench select --doc-length 0", "must be positive"},
    {"BenchRepeatZero", "bench select --repeats 0", "--repeats must be within [1, 10000], got 0"},
    {"BenchHeadsZero", "bench select --heads 0", "--heads must be positive, got 0"},
    {"BenchUnknownDtype", "bench select --dtype bogus", "--dtype must be fp32, bf16 or both"},
    {"BenchUnknownIsa", "bench select --isa bogus",
     "--isa must be auto, portable, avx2, avx512 or all, got 'bogus'"},
    {"BenchSizeOverflows", "bench select --documents 4611686018427387904 --doc-length 4",
     "buffer size overflows 64 bits"},
    {"BenchBeyondMemory", "bench select --sgemm-size 60000", "GiB of memory"},
    // Counts are capped: a valid but endless number is an error, not a run for ever.
    {"RouteRepeatHuge", "route --lengths 8,8 --cp 2 --all-ranks --repeats 9223372036854775807",
     "--repeats must be within [1, 10000]"},
    // Unsigned seeds: CLI11 alone would wrap -1 and saturate 2^64.
    {"SeedNegative", "plan --tokens 1024 --cp 4 --seed -1",
     "--seed: must be a non-negative integer, got '-1'"},
    {"SeedBeyond64Bits", "batch --tokens 8 --cp 1 --seed 18446744073709551616",
     "--seed: must be at most 2^64 - 1, got 18446744073709551616"},
    {"BenchSeedFraction", "bench select --seed 1.5", "--seed: must be a non-negative integer"},
    {"RunModelSeedNegative", "run --lengths 8,8 --model-seed -3",
     "--model-seed: must be a non-negative integer, got '-3'"},
    // An empty --mode must not fall back to the command's default strategies (issue 30).
    {"PlanEmptyMode", "plan --lengths 8,8 --cp 2 --mode \"\"", "--mode: is empty: name a strategy"},
    {"RunEmptyModeList", "run --lengths 8,8 --mode ,", "--mode: is empty: name a strategy"},
    {"DispatchSeedsHuge",
     "dispatch --kind swa --tokens 1024 --cp 4,8 --batches 9223372036854775807",
     "--batches must be within [1, 100000]"},
    {"BenchRepeatHuge", "bench select --repeats 9223372036854775807",
     "--repeats must be within [1, 10000]"},
    {"SimulateSeedsHuge", "simulate --cp 4 --tokens 1024 --seed 0-9223372036854775806",
     "bad range"},
    {"SpillRepeatsHuge", "spill --lengths 8,8 --cp 2 --repeats 9223372036854775807",
     "--repeats must be within [1, 10000]"},
    {"CalibrateRepeatsHuge", "calibrate --repeats 1000000 --out -",
     "--repeats must be within [1, 10000]"},
    // A tiny greedy block on a huge document: an error from the arithmetic, at once.
    {"GreedyTinyBlockHugeDocument", "plan --lengths 4294967296 --cp 2 --mode greedy --block-size 1",
     "Indexer greedy plan would hold more than 16777216 tasks"},
    // Model-shape products of `run` (one rank, MPI singleton): overflow and memory.
    {"RunQRankOverflow", "run --q-rank 4611686018427387904 --tokens 1024 --repeats 1",
     "run: buffer size overflows 64 bits"},
    {"RunTopkTooLarge", "run --topk 4611686018427387 --tokens 1024 --repeats 1 --no-calibrate",
     "Indexer topk 4611686018427387 is too large"},
    {"RunBeyondMemory", "run --q-rank 1000000000 --tokens 1048576 --repeats 1 --no-calibrate",
     "GiB of buffers, more than this machine's"},
    {"RunRepeatsHuge", "run --tokens 1024 --repeats 9223372036854775807",
     "--repeats must be within [1, 10000]"},
    {"RunRopeDimHuge", "run --rope-dim 4611686018427387904 --tokens 1024 --repeats 1",
     "--rope-dim must be even and within [0, head_dim 128]"},
    {"RunProjectionBeyondMemory",
     "run --heads 16384 --head-dim 1024 --q-rank 1048576 --tokens 1024 --repeats 1 --no-calibrate",
     "GiB of buffers, more than this machine's"},
    {"RunThreadsBeyondLimit", "run --threads 100000 --tokens 1024 --repeats 1",
     "--threads must be within [1, 1024], got 100000"},
    // Model-shape flags: every size product of bench select, calibrate and select.
    {"BenchHeadDimHuge", "bench select --head-dim 4611686018427387904", "is too large"},
    {"BenchQRankOverflows", "bench select --q-rank 4611686018427387904",
     "bench select: buffer size overflows 64 bits"},
    {"BenchRopeDimHuge", "bench select --rope-dim 4611686018427387904", "--rope-dim must be even"},
    {"BenchTopkHuge", "bench select --topk 4611686018427387904", "Indexer topk"},
    {"BenchRowsBeyondDocument", "bench select --rows 4611686018427387904", "--rows must be within"},
    {"BenchThreadsBeyondLimit", "bench select --threads 100000",
     "Indexer thread count 100000 exceeds the supported maximum 1024"},
    {"BenchProjectionBeyondMemory", "bench select --heads 16384 --head-dim 1024 --q-rank 1048576",
     "GiB of memory"},
    {"CalibrateHeadsHuge", "calibrate --heads 4611686018427387904 --out -", "is too large"},
    {"CalibrateHeadDimHuge", "calibrate --head-dim 4611686018427387904 --out -", "is too large"},
    {"CalibrateRopeDimOdd", "calibrate --rope-dim 7 --out -", "--rope-dim must be even"},
    {"CalibrateQRankZero", "calibrate --q-rank 0 --out -", "--q-rank must be positive"},
    {"CalibrateQRankOverflows", "calibrate --q-rank 4611686018427387904 --out -",
     "calibrate: buffer size overflows 64 bits"},
    {"CalibrateTopkHuge", "calibrate --topk 4611686018427387904 --out -", "Indexer topk"},
    {"CalibrateRowsHuge", "calibrate --rows 4611686018427387904 --out -",
     "--rows must be within [1, 2^20]"},
    {"CalibrateVisibleHuge", "calibrate --visible 0,64,4611686018427387904 --out -",
     "--visible: 4611686018427387904 is outside [0, 2^24] keys"},
    {"CalibratePositionBeyond64Bits",
     "calibrate --visible 0,64,4096 --ratio 4611686018427387904 --out -",
     "--visible 64 at --ratio 4611686018427387904 puts rows beyond 64-bit positions"},
    {"CalibrateWorkBeyond64Bits", "calibrate --visible 0,64,4096 --ratio 17592186044416 --out -",
     "--visible 4096 at ratio 17592186044416: the point's causal work overflows 64 bits"},
    {"CalibrateProjectionBeyondMemory",
     "calibrate --heads 16384 --head-dim 1024 --q-rank 1048576 --out -", "GiB of memory"},
    {"CalibrateThreadsBeyondLimit", "calibrate --threads 100000 --out -",
     "exceeds the supported maximum 1024"},
    {"SelectThreadsBeyondLimit",
     "select --keys $D/k.npy --weights $D/w.npy --q $D/q.npy --segments $D/seg.json --threads "
     "100000 --out $D/out.npy",
     "exceeds the supported maximum 1024"},
    // spill: the shard beyond 2^62 rows (its row cap overflowed; UBSan) and the modes it
    // compares against, which would build 4.5e15 tasks.
    // Issue 30: coefficients and owner costs that overflow a cost gave inf/nan loads and exit
    // 0; a model fitted for another top-k was used without a word.
    {"CostModelFileHugeB", "plan --lengths 8,8 --cp 2 --mode spill --cost-model $D/huge_b.model",
     "cost model coefficient b must be at most 1e+200"},
    {"CostModelFileHugeD", "simulate --cp 2 --tokens 1024 --seeds 1 --cost-model $D/huge_d.model",
     "cost model coefficient d must be at most 1e+200"},
    {"OwnerCostHuge", "spill --lengths 4,4 --cp 2 --owner-cost 1e308,1",
     "cost model coefficient a must be at most 1e+200"},
    {"CostModelOfAnotherTopk",
     "route --lengths 8,8 --cp 2 --rank 0 --mode spill --topk 512 --cost-model $D/topk4.model",
     "the model was fitted for topk 4, this command selects --topk 512"},
    {"SpillShardBeyond2To62",
     "spill --lengths 9223372036854775807 --cp 1 --ratio 9223372036854775807",
     "spill's comparison with hyper_parallel's mode greedy failed: Indexer greedy plan would "
     "hold more than 16777216 tasks"},
};

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, OneErrorLineAndExitStatus2) {
  const BadInput& input = GetParam();
  const Outcome outcome = run_tool(input.arguments);
  SCOPED_TRACE(std::string("sparsecp ") + input.arguments);
  EXPECT_EQ(outcome.status, 2) << outcome.err;
  EXPECT_THAT(outcome.err, StartsWith("error: "));
  EXPECT_THAT(outcome.err, HasSubstr(input.message));
  EXPECT_EQ(std::count(outcome.err.begin(), outcome.err.end(), '\n'), 1) << outcome.err;
}

INSTANTIATE_TEST_SUITE_P(Cli, BadInputTest, ::testing::ValuesIn(kBadInputs),
                         [](const ::testing::TestParamInfo<BadInput>& test) {
                           return std::string(test.param.name);
                         });

// Valid extremes must still work: a ratio larger than every document (no row sees a
// key: zero work), CP equal to the token count, sums beyond 32 bits.
TEST(Limits, RatioLargerThanEveryDocumentIsValid) {
  const Outcome outcome = run_tool("plan --lengths 3,5 --cp 2 --ratio 100 --mode zigzag --json");
  EXPECT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("\"total_work\":0"));
}

TEST(Limits, CpEqualToTheTokenCountIsValid) {
  const Outcome outcome = run_tool("plan --lengths 3,5 --cp 8 --mode greedy --block-size 1 --json");
  EXPECT_EQ(outcome.status, 0) << outcome.err;
}

TEST(Limits, ErrorDetailNamesKindAndPlaceOnlyOnRequest) {
  // The user's message is one line without source places; SPARSECP_ERROR_DETAIL=1 adds
  // the kind and the file and line that raised it.
  const std::string arguments = "plan --lengths 4,4 --cp 3";
  const Outcome plain = run_tool(arguments);
  EXPECT_EQ(plain.status, 2);
  EXPECT_EQ(std::count(plain.err.begin(), plain.err.end(), '\n'), 1) << plain.err;
  EXPECT_EQ(plain.err.find(".cpp"), std::string::npos) << plain.err;
  const Outcome detailed = run_tool(arguments, "SPARSECP_ERROR_DETAIL=1");
  EXPECT_EQ(detailed.status, 2);
  EXPECT_THAT(detailed.err, StartsWith(plain.err));
  EXPECT_THAT(detailed.err, HasSubstr("\nerror detail: invalid input raised at "
                                      "src/planning/plan.cpp:"));
}

TEST(Limits, HugeButSmallPlansAreValid) {
  // One document of 2^63 - 1 tokens at ratio 2^63 - 1: two greedy blocks, work 1.
  const Outcome outcome = run_tool(
      "plan --lengths 9223372036854775807 --cp 1 --mode greedy --ratio 9223372036854775807 "
      "--block-size 4611686018427387904 --json");
  EXPECT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("\"total_work\":1"));
}

TEST(Limits, SumsBeyond32BitsAreValid) {
  const Outcome outcome =
      run_tool("plan --lengths 4294967296,4294967296,8 --cp 8 --mode zigzag --json");
  EXPECT_EQ(outcome.status, 0) << outcome.err;
  EXPECT_THAT(outcome.out, HasSubstr("\"total_work\":4611686016279904262"));
}

}  // namespace
