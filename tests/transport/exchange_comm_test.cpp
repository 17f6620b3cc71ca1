// Multi-rank tests of MpiCommunicator (comm.hpp, mpi_communicator.hpp): variable
// all-to-all with self-verifying payloads (every byte a function of source rank,
// destination, row and seed, checked by the receiver alone), the point-to-point split
// path, sub-communicators, single-use Work and stats.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/comm.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "support/raised.hpp"

namespace sparsecp {
namespace {

using test_support::Raised;
using test_support::raised_by;

// Rows peer `from` sends peer `to` in round `round`: known to both sides.
int64_t rows_between(int64_t from, int64_t to, uint64_t seed) {
  SplitMix64 random(seed * 1000003 + static_cast<uint64_t>(from) * 131 + static_cast<uint64_t>(to));
  const uint64_t draw = random.next() % 8;
  return draw == 0 ? 0 : static_cast<int64_t>(random.next() % 17);  // many empty, primes
}

int32_t payload(int64_t from, int64_t to, int64_t row, int64_t column, uint64_t seed) {
  SplitMix64 random(seed ^ (static_cast<uint64_t>(from) << 48) ^ (static_cast<uint64_t>(to) << 32) ^
                    (static_cast<uint64_t>(row) << 12) ^ static_cast<uint64_t>(column));
  return static_cast<int32_t>(random.next());
}

// One random all-to-all on `comm`; returns the number of mismatching values.
int64_t exchange_and_verify(Communicator& comm, uint64_t seed, int64_t width) {
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  std::vector<int64_t> send_counts(size), receive_counts(size);
  for (int64_t peer = 0; peer < size; ++peer) {
    send_counts[peer] = rows_between(rank, peer, seed);
    receive_counts[peer] = rows_between(peer, rank, seed);
  }
  std::vector<int32_t> send;
  for (int64_t peer = 0; peer < size; ++peer) {
    for (int64_t row = 0; row < send_counts[peer]; ++row) {
      for (int64_t c = 0; c < width; ++c) send.push_back(payload(rank, peer, row, c, seed));
    }
  }
  int64_t total = 0;
  for (const int64_t count : receive_counts) total += count;
  std::vector<int32_t> receive(static_cast<size_t>(total * width), 0);
  Work work = all_to_all_rows<int32_t>(comm, send, send_counts, receive, receive_counts, width);
  work.wait();
  int64_t errors = 0;
  int64_t at = 0;
  for (int64_t peer = 0; peer < size; ++peer) {
    for (int64_t row = 0; row < receive_counts[peer]; ++row) {
      for (int64_t c = 0; c < width; ++c) {
        errors += receive[at++] != payload(peer, rank, row, c, seed) ? 1 : 0;
      }
    }
  }
  return errors;
}

TEST(MpiCommunicator, RandomAllToAllIsVerifiedByTheReceiver) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    const int64_t width = static_cast<int64_t>(seed % 5);  // includes width 0
    EXPECT_EQ(exchange_and_verify(comm, seed, width), 0);
  }
}

TEST(MpiCommunicator, SplitPathMatchesTheCollective) {
  // Messages of at most 3 rows force the point-to-point path with several
  // messages per peer, as int-overflowing exchanges would take.
  MpiCommunicator comm(MPI_COMM_WORLD, {.max_message_rows = 3});
  for (uint64_t seed = 100; seed < 110; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    EXPECT_EQ(exchange_and_verify(comm, seed, 3), 0);
  }
}

TEST(MpiCommunicator, RanksAgreeOnThePathWhenOnlySomeCountsFit) {
  // One row between every pair fits a 16-row message on every rank, except that rank 0
  // sends 40 rows to the last rank: those two must not take the point-to-point path
  // while the others wait in the collective (that deadlocked before the path was agreed).
  MpiCommunicator comm(MPI_COMM_WORLD, {.max_message_rows = 16});
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  const auto rows = [&](int64_t from, int64_t to) { return from == 0 && to == size - 1 ? 40 : 1; };
  std::vector<int64_t> send_counts(size), receive_counts(size);
  std::vector<int32_t> send;
  for (int64_t peer = 0; peer < size; ++peer) {
    send_counts[peer] = rows(rank, peer);
    receive_counts[peer] = rows(peer, rank);
    for (int64_t row = 0; row < send_counts[peer]; ++row)
      send.push_back(payload(rank, peer, row, 0, 7));
  }
  int64_t total = 0;
  for (const int64_t count : receive_counts) total += count;
  std::vector<int32_t> receive(static_cast<size_t>(total), 0);
  all_to_all_rows<int32_t>(comm, send, send_counts, receive, receive_counts, 1).wait();
  int64_t at = 0;
  for (int64_t peer = 0; peer < size; ++peer) {
    for (int64_t row = 0; row < receive_counts[peer]; ++row) {
      ASSERT_EQ(receive[static_cast<size_t>(at++)], payload(peer, rank, row, 0, 7))
          << "from " << peer;
    }
  }
}

TEST(MpiCommunicator, SubCommunicatorOfHalves) {
  // A CP group is usually a sub-communicator: split the world into interleaved
  // halves (world ranks 0,2,.. and 1,3,..) and exchange within each.
  int world_rank = 0;
  int world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
  {
    MpiCommunicator comm(half);
    EXPECT_EQ(comm.rank(), world_rank / 2);
    EXPECT_EQ(comm.size(), (world_size + 1 - world_rank % 2) / 2);
    for (uint64_t seed = 7; seed < 12; ++seed) {
      EXPECT_EQ(exchange_and_verify(comm, seed + static_cast<uint64_t>(world_rank % 2) * 1000, 2),
                0);
    }
    std::vector<int64_t> values = {world_rank};
    comm.all_reduce(values, ReduceOp::kSum);
    // Sum of the world ranks of this half only.
    int64_t expected = 0;
    for (int r = world_rank % 2; r < world_size; r += 2) expected += r;
    EXPECT_EQ(values[0], expected);
  }
  MPI_Comm_free(&half);
}

TEST(MpiCommunicator, StatsCountOnlyBytesToOtherRanks) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  // Every rank sends `peer + 1` rows of 8 bytes to each peer, itself included.
  std::vector<int64_t> send_counts(size), receive_counts(size, rank + 1);
  int64_t send_total = 0;
  for (int64_t peer = 0; peer < size; ++peer) send_total += send_counts[peer] = peer + 1;
  std::vector<std::byte> send(static_cast<size_t>(send_total * 8));
  std::vector<std::byte> receive(static_cast<size_t>(size * (rank + 1) * 8));
  comm.all_to_all_rows(send, send_counts, receive, receive_counts, 8).wait();
  EXPECT_EQ(comm.stats().exchanges, 1);
  EXPECT_EQ(comm.stats().bytes_sent, (send_total - (rank + 1)) * 8);
  EXPECT_EQ(comm.stats().bytes_received, (size - 1) * (rank + 1) * 8);
  comm.reset_stats();
  EXPECT_EQ(comm.stats().bytes_sent, 0);
}

TEST(MpiCommunicator, CountsExchangeAndReductions) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  std::vector<int64_t> counts(size);
  for (int64_t peer = 0; peer < size; ++peer) counts[peer] = rank * 1000 + peer;
  const std::vector<int64_t> arriving = comm.all_to_all_counts(counts);
  for (int64_t peer = 0; peer < size; ++peer) EXPECT_EQ(arriving[peer], peer * 1000 + rank);
  std::vector<int64_t> values = {rank, -rank, 1};
  comm.all_reduce(values, ReduceOp::kMax);
  EXPECT_EQ(values[0], size - 1);
  EXPECT_EQ(values[1], 0);
  values = {rank, 1};
  comm.all_reduce(values, ReduceOp::kMin);
  EXPECT_EQ(values[0], 0);
}

TEST(MpiCommunicator, WorkIsSingleUse) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  std::vector<int64_t> ones(size, 1);
  std::vector<int64_t> send(size, comm.rank());
  std::vector<int64_t> receive(size, -1);
  Work work = all_to_all_rows<int64_t>(comm, send, ones, receive, ones, 1);
  while (!work.test()) {
  }
  work.wait();
  for (int64_t peer = 0; peer < size; ++peer) EXPECT_EQ(receive[peer], peer);
  EXPECT_TRUE(work.consumed());
  try {
    work.wait();
    ADD_FAILURE() << "second wait did not throw";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "Communication work cannot be consumed twice");
  }
  EXPECT_THROW(work.test(), Error);
  // A moved-from Work is spent, and dropping an unwaited Work completes it first.
  Work moved = all_to_all_rows<int64_t>(comm, send, ones, receive, ones, 1);
  Work owner = std::move(moved);
  EXPECT_THROW(moved.wait(), Error);  // NOLINT(bugprone-use-after-move): the point
}

TEST(MpiCommunicator, BadCountsOnOneRankFailEveryRank) {
  // A direct caller passes a negative count on the last rank only: the others must not
  // be left in the collective (the CTest timeout fails the test if they hang).
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  const int64_t bad = size - 1;
  std::vector<int64_t> ones(size, 1);
  std::vector<int64_t> send_counts = ones;
  if (rank == bad) send_counts[0] = -1;
  std::vector<int32_t> send(static_cast<size_t>(size), 1);
  std::vector<int32_t> receive(static_cast<size_t>(size), 0);
  const Raised message = raised_by(
      [&] { all_to_all_rows<int32_t>(comm, send, send_counts, receive, ones, 1).wait(); });
  EXPECT_EQ(message.kind, ErrorKind::kInvalidInput);
  if (rank == bad) {
    EXPECT_EQ(message.text, "all_to_all_rows send count for peer 0 is negative: -1");
  } else {
    EXPECT_EQ(message.text,
              "all_to_all_rows aborted: rank " + std::to_string(bad) + " rejected its arguments");
  }
  // A count list of the wrong length on rank 0 only.
  std::vector<int64_t> longer(size + 1, 1);
  const Raised length = raised_by([&] {
    all_to_all_rows<int32_t>(
        comm, send, rank == 0 ? std::span<const int64_t>(longer) : std::span<const int64_t>(ones),
        receive, ones, 1)
        .wait();
  });
  EXPECT_TRUE(length.raised);
  // Row sizes that differ between ranks would mismatch the MPI datatypes.
  std::vector<int64_t> wide(static_cast<size_t>(2 * size), 1);
  std::vector<int64_t> wide_receive(static_cast<size_t>(2 * size), 0);
  const Raised width = raised_by([&] {
    if (rank == 0 && size > 1) {
      all_to_all_rows<int64_t>(comm, wide, ones, wide_receive, ones, 2).wait();
    } else {
      all_to_all_rows<int64_t>(comm, std::span<const int64_t>(wide).first(size), ones,
                               std::span<int64_t>(wide_receive).first(size), ones, 1)
          .wait();
    }
  });
  if (size > 1) {
    EXPECT_EQ(width.text, "all_to_all_rows row size differs between ranks (8 to 16 bytes)");
  }
  // The group is still usable.
  EXPECT_EQ(exchange_and_verify(comm, 99, 2), 0);
}

TEST(MpiCommunicator, RejectsBadArgumentsOnEveryRank) {
  // Every rank passes the same bad arguments: every rank throws (after agreeing).
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  std::vector<int64_t> zeros(size, 0);
  std::vector<int64_t> short_counts(size + 1, 0);
  std::vector<int64_t> negative(size, 0);
  negative[0] = -1;
  std::vector<std::byte> empty;
  std::vector<std::byte> extra(4);
  EXPECT_THROW(comm.all_to_all_rows(empty, short_counts, empty, zeros, 4), Error);
  EXPECT_THROW(comm.all_to_all_rows(empty, negative, empty, zeros, 4), Error);
  EXPECT_THROW(comm.all_to_all_rows(extra, zeros, empty, zeros, 4), Error);
  EXPECT_THROW(comm.all_to_all_rows(empty, zeros, empty, zeros, -1), Error);
  EXPECT_THROW(comm.all_to_all_counts(short_counts), Error);
  EXPECT_THROW(MpiCommunicator(MPI_COMM_NULL), Error);
  EXPECT_THROW(MpiCommunicator(MPI_COMM_WORLD, {.max_message_rows = 0}), Error);
}

}  // namespace
}  // namespace sparsecp
