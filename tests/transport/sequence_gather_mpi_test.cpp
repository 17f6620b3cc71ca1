// Multi-rank tests of the KV gathers under mpirun (1-8 ranks), on the world and on
// sub-communicators whose CP order differs from the world order.
//
// Payloads verify themselves (nccl-tests style): bank row g, column c holds a function of
// (g, c), and a consumer's gradient is a function of (consumer, g, c), so each rank checks
// what it received against a brute-force model with no second exchange. Every rank draws
// the same random cases from the same seed, so all ranks issue the same collectives.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/compression_plan.hpp"
#include "sparsecp/planning/dispatch.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "sparsecp/transport/sequence_gather.hpp"
#include "support/random_batch.hpp"

namespace sparsecp {
namespace {

using ::sparsecp::testing::test_seed;

int64_t pick(SplitMix64& random, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(random.next() % static_cast<uint64_t>(hi - lo + 1));
}

// Random document boundaries over size * local tokens.
std::vector<int64_t> random_boundaries(SplitMix64& random, int64_t total) {
  static constexpr int64_t kDensity[] = {0, 3, 20, 100};  // percent of cut points
  const int64_t density = kDensity[pick(random, 0, 3)];
  std::vector<int64_t> boundaries = {0};
  for (int64_t token = 1; token < total; ++token) {
    if (pick(random, 1, 100) <= density) boundaries.push_back(token);
  }
  boundaries.push_back(total);
  return boundaries;
}

double payload(int64_t g, int64_t c) { return static_cast<double>(g * 1000 + c) + 0.25; }
double gradient(int64_t consumer, int64_t g, int64_t c) {
  return static_cast<double>((consumer + 1) * 7 + g * 3 + c) * 0.5;
}

std::vector<double> bank_rows(int64_t begin, int64_t end, int64_t width) {
  std::vector<double> rows;
  for (int64_t g = begin; g < end; ++g) {
    for (int64_t c = 0; c < width; ++c) rows.push_back(payload(g, c));
  }
  return rows;
}

// Checks forward and backward of one dispatch on `comm` against the brute-force model
// built from every rank's route (each rank computes them all; no communication).
void check_dispatch(Communicator& comm, const std::vector<SequenceDispatchRoute>& routes,
                    int64_t width) {
  const int64_t rank = comm.rank();
  const SequenceDispatchRoute& route = routes[rank];
  const std::vector<double> local = bank_rows(route.local_start, route.global_end, width);
  comm.reset_stats();
  const std::vector<double> block = sequence_dispatch<double>(local, width, route, comm);
  EXPECT_EQ(block, bank_rows(route.global_start, route.global_end, width));
  std::vector<double> grad;
  for (int64_t g = route.global_start; g < route.global_end; ++g) {
    for (int64_t c = 0; c < width; ++c) grad.push_back(gradient(rank, g, c));
  }
  const std::vector<double> local_grad =
      sequence_dispatch_backward<double>(grad, width, route, comm);
  std::vector<double> expected;
  for (int64_t g = route.local_start; g < route.global_end; ++g) {
    for (int64_t c = 0; c < width; ++c) {
      double sum = 0;
      bool first = true;
      for (const SequenceDispatchRoute& consumer : routes) {
        if (consumer.global_start <= g && g < consumer.global_end) {
          sum = first ? gradient(consumer.rank, g, c) : sum + gradient(consumer.rank, g, c);
          first = false;
        }
      }
      expected.push_back(sum);
    }
  }
  EXPECT_EQ(local_grad, expected);
  // Only the halo moved: forward receives it, backward returns it.
  const auto row_bytes = static_cast<int64_t>(width * sizeof(double));
  EXPECT_EQ(comm.stats().bytes_received, (route.received_rows() + route.sent_rows()) * row_bytes);
  EXPECT_EQ(comm.stats().exchanges, route.exchange_needed ? 2 : 0);
}

void run_random_dispatches(Communicator& comm, uint64_t seed, int trials) {
  SplitMix64 random(seed);
  const int64_t size = comm.size();
  for (int trial = 0; trial < trials; ++trial) {
    const int64_t local = pick(random, 1, 29);
    const std::vector<int64_t> boundaries = random_boundaries(random, size * local);
    const bool swa = pick(random, 0, 1) == 0;
    const int64_t parameter = swa ? pick(random, 1, 2 * local + 3) : pick(random, 1, 2);
    const int64_t width = pick(random, 1, 3);
    SCOPED_TRACE("size=" + std::to_string(size) + " local=" + std::to_string(local) +
                 (swa ? " window=" : " ratio=") + std::to_string(parameter) +
                 " trial=" + std::to_string(trial) + " seed=" + std::to_string(seed));
    std::vector<SequenceDispatchRoute> routes;
    for (int64_t q = 0; q < size; ++q) {
      routes.push_back(swa ? sliding_window_route(boundaries, local, size, q, parameter)
                           : document_prefix_route(boundaries, local, size, q, parameter));
    }
    check_dispatch(comm, routes, width);
  }
}

TEST(SequenceGatherMpi, DispatchMatchesBruteForceOnWorld) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  run_random_dispatches(comm, test_seed() ^ 0xD15, 25);
}

TEST(SequenceGatherMpi, DispatchOnSubCommunicators) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  // Two groups (even/odd world ranks), each in reversed world order: CP rank 0 of a
  // group is its highest world rank. Each group runs its own cases.
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &group);
  {
    MpiCommunicator comm(group);
    int group_rank = 0;
    MPI_Comm_rank(group, &group_rank);
    EXPECT_EQ(comm.rank(), group_rank);
    run_random_dispatches(comm, test_seed() ^ (0xAB + static_cast<uint64_t>(world_rank % 2)), 10);
  }
  MPI_Comm_free(&group);
}

TEST(SequenceGatherMpi, AllGatherAndSumReduceScatter) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  SplitMix64 random(test_seed() ^ 0xA11);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t local = pick(random, 1, 17);
    const int64_t width = pick(random, 1, 4);
    const std::vector<int64_t> boundaries = random_boundaries(random, size * local);
    // Equal raw shards, or the ragged compressed layout of ratio 2.
    const std::vector<int64_t> offsets = trial % 2 == 0
                                             ? equal_shard_offsets(local, size)
                                             : compressed_owner_offsets(boundaries, 2, local);
    SCOPED_TRACE("trial=" + std::to_string(trial) + " local=" + std::to_string(local));
    std::vector<float> shard;
    for (int64_t g = offsets[rank]; g < offsets[rank + 1]; ++g) {
      for (int64_t c = 0; c < width; ++c) shard.push_back(static_cast<float>(payload(g, c)));
    }
    const std::vector<float> bank = all_gather_sequence<float>(shard, width, offsets, comm);
    std::vector<float> expected_bank;
    for (int64_t g = 0; g < offsets[size]; ++g) {
      for (int64_t c = 0; c < width; ++c)
        expected_bank.push_back(static_cast<float>(payload(g, c)));
    }
    EXPECT_EQ(bank, expected_bank);
    std::vector<float> grad;
    for (int64_t g = 0; g < offsets[size]; ++g) {
      for (int64_t c = 0; c < width; ++c) grad.push_back(static_cast<float>(gradient(rank, g, c)));
    }
    const std::vector<float> local_grad =
        all_gather_sequence_backward<float>(grad, width, offsets, comm);
    std::vector<float> expected;
    for (int64_t g = offsets[rank]; g < offsets[rank + 1]; ++g) {
      for (int64_t c = 0; c < width; ++c) {
        float sum = static_cast<float>(gradient(0, g, c));
        for (int64_t p = 1; p < size; ++p) sum += static_cast<float>(gradient(p, g, c));
        expected.push_back(sum);
      }
    }
    EXPECT_EQ(local_grad, expected);
  }
}

TEST(SequenceGatherMpi, OverlappedDeferredLaunchesResolveInAnyOrder) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  const int64_t local = 12;
  // One long document over everything and a few short ones.
  std::vector<int64_t> boundaries = {0, 5};
  if (size * local > 9) boundaries.push_back(9);
  boundaries.push_back(size * local);
  const SequenceDispatchRoute raw = sliding_window_route(boundaries, local, size, rank, 7);
  const SequenceDispatchRoute main = document_prefix_route(boundaries, local, size, rank, 2);
  const std::vector<double> raw_local = bank_rows(raw.local_start, raw.global_end, 3);
  const std::vector<double> main_local = bank_rows(main.local_start, main.global_end, 2);
  DeferredGatherLaunch<double> deferred(
      [&] { return launch_sequence_dispatch<double>(main_local, 2, main, comm); });
  SequenceGatherHandle<double> raw_handle =
      launch_sequence_dispatch<double>(raw_local, 3, raw, comm);
  deferred.start();  // both transfers in flight
  EXPECT_FALSE(deferred.holds_launcher());
  const std::vector<double> main_block = deferred.wait();  // resolved before the earlier launch
  const std::vector<double> raw_block = raw_handle.wait();
  EXPECT_EQ(main_block, bank_rows(main.global_start, main.global_end, 2));
  EXPECT_EQ(raw_block, bank_rows(raw.global_start, raw.global_end, 3));
  EXPECT_THROW(deferred.wait(), Error);
  EXPECT_THROW(raw_handle.wait(), Error);
}

TEST(SequenceGatherMpi, CompressionHaloComputesTheGlobalBank) {
  // End to end: gather each rank's raw halo per the document compression plan, compress
  // its own blocks (a toy compressor: the sum of the block's raw rows), all-gather the
  // ragged compressed bank, and compare with compressing the global sequence directly.
  MpiCommunicator comm(MPI_COMM_WORLD);
  SplitMix64 random(test_seed() ^ 0xC0);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  int planned = 0;
  for (int trial = 0; trial < 15; ++trial) {
    const int64_t local = pick(random, 1, 13);
    const int64_t ratio = pick(random, 2, 2 * local + 1);
    const std::vector<int64_t> boundaries = random_boundaries(random, size * local);
    SCOPED_TRACE("trial=" + std::to_string(trial) + " local=" + std::to_string(local) +
                 " ratio=" + std::to_string(ratio));
    const auto plan = document_compression_plan(boundaries, ratio, local, size, rank);
    if (!plan) continue;  // aligned: same verdict on every rank
    ++planned;
    const std::vector<double> raw_local = bank_rows(rank * local, (rank + 1) * local, 1);
    const std::vector<double> raw = sequence_dispatch<double>(raw_local, 1, plan->halo, comm);
    std::vector<double> compressed;
    for (const CompressedRun& run : plan->runs) {
      for (int64_t i = 0; i < run.count; ++i) {
        double sum = 0;
        for (int64_t t = 0; t < ratio; ++t)
          sum += raw[static_cast<size_t>(run.raw_begin + i * ratio + t)];
        compressed.push_back(sum);
      }
    }
    const std::vector<int64_t> owners = compressed_owner_offsets(boundaries, ratio, local);
    const std::vector<double> bank = all_gather_sequence<double>(compressed, 1, owners, comm);
    std::vector<double> expected;
    for (size_t d = 0; d + 1 < boundaries.size(); ++d) {
      for (int64_t start = boundaries[d]; start + ratio <= boundaries[d + 1]; start += ratio) {
        double sum = 0;
        for (int64_t t = 0; t < ratio; ++t) sum += payload(start + t, 0);
        expected.push_back(sum);
      }
    }
    EXPECT_EQ(bank, expected);
  }
  EXPECT_GT(planned, 0);
}

TEST(SequenceGatherMpi, InputErrorOnOneRankRaisesEverywhere) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<int64_t> boundaries = {0, size * 4};  // one document: everyone exchanges
  const SequenceDispatchRoute route = sliding_window_route(boundaries, 4, size, rank, 3);
  ASSERT_TRUE(route.exchange_needed);
  std::vector<float> local(rank == size - 1 ? 5 : 4, 1.0f);
  try {
    sequence_dispatch<float>(local, 1, route, comm);
    ADD_FAILURE() << "no error on rank " << rank;
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 rank == size - 1
                     ? "sequence dispatch owner length does not match the bank's physical layout"
                     : "sequence gather input was rejected on another rank");
  }
  // The group is still usable afterwards.
  std::vector<float> good(4, static_cast<float>(rank));
  const std::vector<float> block = sequence_dispatch<float>(good, 1, route, comm);
  EXPECT_EQ(static_cast<int64_t>(block.size()), route.block_rows());
}

// A later unrelated collective still pairs correctly: {100, 200 + rank, 300} summed.
void expect_group_intact(Communicator& comm) {
  const int64_t size = comm.size();
  std::vector<int64_t> values = {100, 200 + comm.rank(), 300};
  comm.all_reduce(values, ReduceOp::kSum);
  EXPECT_EQ(values,
            (std::vector<int64_t>{100 * size, 200 * size + size * (size - 1) / 2, 300 * size}));
}

// Runs `launch` on every rank and expects an Error on every rank whose message holds
// `needle`, then checks the group is intact.
template <typename Launch>
void expect_disagreement(Communicator& comm, const std::string& needle, Launch&& launch) {
  try {
    launch();
    ADD_FAILURE() << "no error on rank " << comm.rank() << " (expected '" << needle << "')";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
        << "rank " << comm.rank() << ": " << error.what();
    EXPECT_NE(std::string(error.what()).find("CP ranks disagree"), std::string::npos)
        << error.what();
  }
  expect_group_intact(comm);
}

// Rank 0 builds its route from other inputs than its peers: every rank raises, naming
// the difference, before any data moves (issue: different windows used to return
// unwritten halo rows, different boundaries aborted inside the transport, and a rank
// whose route needed no exchange skipped the agreement and paired with the next
// unrelated collective).
TEST(SequenceGatherMpi, DisagreeingRoutesRaiseOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const int64_t local = 64;
  const std::vector<int64_t> one_document = {0, size * local};
  const std::vector<double> rows = bank_rows(rank * local, (rank + 1) * local, 2);

  // Window 4 on rank 0, 64 elsewhere.
  const SequenceDispatchRoute window =
      sliding_window_route(one_document, local, size, rank, rank == 0 ? 4 : 64);
  expect_disagreement(comm, "window differs",
                      [&] { sequence_dispatch<double>(rows, 2, window, comm); });
  // The backward agrees too.
  const std::vector<double> grad(static_cast<size_t>(window.block_rows() * 2), 1.0);
  expect_disagreement(comm, "window differs",
                      [&] { sequence_dispatch_backward<double>(grad, 2, window, comm); });

  // Boundaries: the first document ends at 30 on rank 0, at 50 elsewhere.
  const std::vector<int64_t> boundaries = {0, rank == 0 ? 30 : 50, size * local};
  const SequenceDispatchRoute cut = sliding_window_route(boundaries, local, size, rank, 16);
  expect_disagreement(comm, "document lengths differ at document 0: rank 1 has 50, rank 0 has 30",
                      [&] { sequence_dispatch<double>(rows, 2, cut, comm); });

  // Ratio: compressed prefixes at ratio 1 on rank 0, 2 elsewhere.
  const int64_t ratio = rank == 0 ? 1 : 2;
  const SequenceDispatchRoute prefix =
      document_prefix_route(one_document, local, size, rank, ratio);
  const std::vector<int64_t> owners = compressed_owner_offsets(one_document, ratio, local);
  const std::vector<double> compressed = bank_rows(owners[rank], owners[rank + 1], 2);
  expect_disagreement(comm, "ratio differs",
                      [&] { sequence_dispatch<double>(compressed, 2, prefix, comm); });

  // One rank needs no exchange: rank 0 sees every shard as its own document, the others
  // one document spanning them all.
  std::vector<int64_t> per_shard;
  for (int64_t r = 0; r <= size; ++r) per_shard.push_back(r * local);
  const SequenceDispatchRoute lone =
      sliding_window_route(rank == 0 ? per_shard : one_document, local, size, rank, 16);
  ASSERT_EQ(lone.exchange_needed, rank != 0);
  expect_disagreement(comm, "document", [&] { sequence_dispatch<double>(rows, 2, lone, comm); });

  // A deferred launch agrees when it starts.
  DeferredGatherLaunch<double> deferred(
      [&] { return launch_sequence_dispatch<double>(rows, 2, window, comm); });
  expect_disagreement(comm, "window differs", [&] { deferred.wait(); });

  // The row width must agree as well.
  const SequenceDispatchRoute same = sliding_window_route(one_document, local, size, rank, 16);
  const int64_t width = rank == 0 ? 1 : 2;
  const std::vector<double> narrow = bank_rows(rank * local, (rank + 1) * local, width);
  expect_disagreement(comm, "row width differs",
                      [&] { sequence_dispatch<double>(narrow, width, same, comm); });

  // All-gather: rank 0 is given another shard layout.
  std::vector<int64_t> layout = equal_shard_offsets(local, size);
  if (rank == 0) {
    layout[1] -= 1;  // rank 0 believes it holds one row less, rank 1 one more
  }
  const int64_t own = layout[rank + 1] - layout[rank];
  const std::vector<double> shard = bank_rows(0, own, 2);
  expect_disagreement(comm, "document lengths differ at document 0",
                      [&] { all_gather_sequence<double>(shard, 2, layout, comm); });

  // And the agreed case still works afterwards.
  const std::vector<double> block = sequence_dispatch<double>(rows, 2, same, comm);
  EXPECT_EQ(block, bank_rows(same.global_start, same.global_end, 2));
}

}  // namespace
}  // namespace sparsecp
