// Cross-rank agreement on the planning inputs (agreement.hpp) under mpirun: when one
// rank is handed different inputs, every rank throws the same Error naming the
// mismatch, and nobody hangs. Runs on 2 and 3 ranks (tests/mpi_main.cpp is main).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"

namespace sparsecp {
namespace {

using ::testing::HasSubstr;

struct Group {
  MpiCommunicator comm{MPI_COMM_WORLD};
  int64_t rank = comm.rank();
  int64_t size = comm.size();
};

// Runs the check on every rank and returns the error text ("" when it passed).
std::string outcome(Communicator& comm, const PlanningFingerprint& fingerprint) {
  try {
    check_agreement(comm, fingerprint);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Every rank's message must be identical: gather a hash of it (sum of one-hot slots).
void expect_same_message_everywhere(Communicator& comm, const std::string& message) {
  uint64_t fnv = 1469598103934665603ULL;  // FNV-1a, unsigned: wraps by definition
  for (const char c : message) fnv = (fnv ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  const auto hash = static_cast<int64_t>(fnv);
  int64_t extremes[2] = {hash, ~hash};
  comm.all_reduce(extremes, ReduceOp::kMin);
  EXPECT_EQ(extremes[0], ~extremes[1]) << "ranks got different messages; this rank: " << message;
}

const std::vector<int64_t> kLengths = {600, 300, 99, 201};

PlanOptions greedy() { return {Mode::kGreedy, 64, std::nullopt}; }

TEST(Agreement, EqualInputsPass) {
  Group g;
  PlanningFingerprint fingerprint = planning_fingerprint(kLengths, g.size, 4, greedy());
  fingerprint.add("topk", 512).add("qr width", 1536);
  EXPECT_EQ(outcome(g.comm, fingerprint), "");
}

TEST(Agreement, LastRankWithOtherLengthsFailsEveryRank) {
  Group g;
  if (g.size < 2) GTEST_SKIP() << "needs two ranks";
  // Same document count and total on the last rank: only the hash tells them apart.
  std::vector<int64_t> lengths = kLengths;
  if (g.rank == g.size - 1) lengths = {600, 300, 100, 200};
  const std::string message =
      outcome(g.comm, planning_fingerprint(lengths, g.size, 4, greedy()).add("topk", 512));
  EXPECT_THAT(message, HasSubstr("CP ranks disagree on the planning inputs: rank " +
                                 std::to_string(g.size - 1) + " has fingerprint "));
  EXPECT_THAT(message, HasSubstr(", rank 0 has "));
  // The first differing document and both values (not the equal counts and totals).
  EXPECT_THAT(message, HasSubstr("document lengths differ at document 2: rank " +
                                 std::to_string(g.size - 1) + " has 100, rank 0 has " +
                                 std::to_string(kLengths[2])));
  EXPECT_THAT(message, HasSubstr("1 of " + std::to_string(g.size) + " ranks differ from rank 0"));
  expect_same_message_everywhere(g.comm, message);
}

TEST(Agreement, RankZeroDifferentNamesTheFirstOtherRank) {
  Group g;
  if (g.size < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<int64_t> lengths = kLengths;
  if (g.rank == 0) lengths.push_back(g.size);  // one more document on rank 0
  const std::string message = outcome(g.comm, planning_fingerprint(lengths, g.size, 4, greedy()));
  EXPECT_THAT(message, HasSubstr("rank 1 has fingerprint"));
  EXPECT_THAT(message, HasSubstr("document counts differ: rank 1 has 4 documents (1200 tokens), "
                                 "rank 0 has 5 documents (" +
                                 std::to_string(1200 + g.size) + " tokens); the first 4 agree"));
  EXPECT_THAT(message, HasSubstr(std::to_string(g.size - 1) + " of " + std::to_string(g.size) +
                                 " ranks differ from rank 0"));
  expect_same_message_everywhere(g.comm, message);
}

TEST(Agreement, OptionsAndSettingsAreNamed) {
  Group g;
  if (g.size < 2) GTEST_SKIP() << "needs two ranks";
  const bool odd = g.rank == 1;
  PlanOptions options = odd ? PlanOptions{Mode::kHybrid, 32, 300} : greedy();
  PlanningFingerprint fingerprint = planning_fingerprint(kLengths, g.size, odd ? 2 : 4, options);
  fingerprint.add("topk", odd ? 10 : 9).add("repeats", 3);
  const std::string message = outcome(g.comm, fingerprint);
  EXPECT_THAT(message, HasSubstr("ratio differs: rank 1 has 2, rank 0 has 4"));
  EXPECT_THAT(message, HasSubstr("mode differs: rank 1 has 'hybrid', rank 0 has 'greedy'"));
  EXPECT_THAT(message, HasSubstr("block size differs: rank 1 has 32, rank 0 has 64"));
  EXPECT_THAT(message, HasSubstr("zigzag_min_length differs: rank 1 has 300, rank 0 has omitted"));
  EXPECT_THAT(message, HasSubstr("topk differs: rank 1 has 10, rank 0 has 9"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("repeats differs")));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("document lengths differ")));
  expect_same_message_everywhere(g.comm, message);
}

TEST(Agreement, DifferentSettingNamesAreReported) {
  Group g;
  if (g.size < 2) GTEST_SKIP() << "needs two ranks";
  PlanningFingerprint fingerprint = planning_fingerprint(kLengths, g.size, 4, greedy());
  fingerprint.add(g.rank == 0 ? "topk" : "top_k", 9);
  const std::string message = outcome(g.comm, fingerprint);
  EXPECT_THAT(message, HasSubstr("settings differ"));
  expect_same_message_everywhere(g.comm, message);
}

// After a failed check the group is still usable: the next check (equal inputs)
// passes on every rank, i.e. no rank was left behind in a collective.
TEST(Agreement, GroupStaysUsableAfterAMismatch) {
  Group g;
  for (int round = 0; round < 3; ++round) {
    std::vector<int64_t> lengths = kLengths;
    if (round == 1 && g.rank == g.size - 1) lengths[0] += 1;
    const std::string message = outcome(g.comm, planning_fingerprint(lengths, g.size, 4, greedy()));
    if (round == 1 && g.size > 1) {
      EXPECT_THAT(message, HasSubstr("document lengths differ"));
    } else {
      EXPECT_EQ(message, "");
    }
  }
}

// The exchange's own agreement names the planning inputs that differ: here the last
// rank splits the same total into other documents (its row counts differ too).
TEST(Agreement, InputExchangeNamesDifferentLengths) {
  Group g;
  const int64_t local = 9;
  std::vector<int64_t> lengths(static_cast<size_t>(g.size), local);
  if (g.rank == g.size - 1 && g.size > 1) {
    lengths[0] -= 4;
    lengths[1] += 4;
  }
  std::vector<float> qr(static_cast<size_t>(local * 4), 1.0f);
  std::vector<float> weights(static_cast<size_t>(local * 2), 1.0f);
  std::vector<float> cos(static_cast<size_t>(local), 1.0f);
  std::vector<float> sin(static_cast<size_t>(local), 0.0f);
  const IndexerInputs inputs{TensorView::tokens(MatrixView::f32(qr.data(), local, 4)),
                             TensorView::tokens(MatrixView::f32(weights.data(), local, 2)),
                             TensorView::tokens(MatrixView::f32(cos.data(), local, 1)),
                             TensorView::tokens(MatrixView::f32(sin.data(), local, 1))};
  std::string message;
  try {
    launch_indexer_inputs(inputs, lengths, 4, {Mode::kZigzag, std::nullopt, std::nullopt}, g.comm)
        .wait();
  } catch (const Error& error) {
    message = error.what();
  }
  if (g.size == 1) {
    EXPECT_EQ(message, "");
    return;
  }
  EXPECT_THAT(message, HasSubstr("Indexer input exchange: CP ranks disagree on the planning "
                                 "inputs: rank " +
                                 std::to_string(g.size - 1) + " has fingerprint "));
  EXPECT_THAT(message, HasSubstr("(document lengths differ at document 0: rank " +
                                 std::to_string(g.size - 1) + " has 5, rank 0 has 9)"));
  expect_same_message_everywhere(g.comm, message);
}

TEST(Agreement, FingerprintSeesEveryInput) {
  const PlanningFingerprint base = planning_fingerprint(kLengths, 4, 4, greedy());
  const auto differs = [&](const PlanningFingerprint& other) {
    return other.value() != base.value();
  };
  EXPECT_EQ(planning_fingerprint(kLengths, 4, 4, greedy()).value(), base.value());
  const std::vector<int64_t> swapped = {600, 300, 201, 99};
  EXPECT_TRUE(differs(planning_fingerprint(swapped, 4, 4, greedy())));
  EXPECT_TRUE(differs(planning_fingerprint(kLengths, 2, 4, greedy())));
  EXPECT_TRUE(differs(planning_fingerprint(kLengths, 4, 1, greedy())));
  EXPECT_TRUE(differs(planning_fingerprint(kLengths, 4, 4, {Mode::kGreedy, 65, std::nullopt})));
  EXPECT_TRUE(differs(planning_fingerprint(kLengths, 4, 4, {Mode::kGreedy, std::nullopt, {}})));
  EXPECT_TRUE(differs(planning_fingerprint(kLengths, 4, 4, {Mode::kHybrid, 64, 100})));
  EXPECT_TRUE(differs(planning_fingerprint(kLengths, 4, 4, greedy()).add("topk", 0)));
  // A strategy's parameters, the node map among them.
  StrategyParams spill_params;
  const PlanningFingerprint spill =
      planning_fingerprint(kLengths, 4, 4, find_strategy("spill"), spill_params);
  spill_params.ranks_per_node = 2;
  EXPECT_NE(planning_fingerprint(kLengths, 4, 4, find_strategy("spill"), spill_params).value(),
            spill.value());
  PlanningFingerprint a = planning_fingerprint(kLengths, 4, 4, greedy());
  PlanningFingerprint b = planning_fingerprint(kLengths, 4, 4, greedy());
  a.add("x", 1).add("y", 2);
  b.add("y", 2).add("x", 1);
  EXPECT_NE(a.value(), b.value());  // order matters
}

}  // namespace
}  // namespace sparsecp
