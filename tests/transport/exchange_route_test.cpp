// Multi-rank tests of the row exchange (exchange.hpp) on random routes.
//
// Model: every rank builds the same random global assignment (global row -> worker,
// worker position) from the seed, so each rank knows, without communicating, which
// global row must arrive at each of its worker positions. Payloads are functions of
// (global row = source rank * local + local row, field, column, seed); the receiver
// checks every value it gets. Results go back the reverse way and the owner checks
// them the same way. Mixed dtypes (bf16 qr, fp32 weights/cos/sin) exercise the dtype
// groups, and CommStats must equal the route's predicted bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"

namespace sparsecp {
namespace {

// A random global assignment and every rank's route under it.
struct RandomAssignment {
  int64_t size = 0;
  int64_t local = 0;
  std::vector<std::vector<int64_t>> worker_rows;  // worker -> global rows in worker order

  RandomAssignment(int64_t cp, int64_t local_rows, uint64_t seed) : size(cp), local(local_rows) {
    SplitMix64 random(seed);
    worker_rows.resize(static_cast<size_t>(cp));
    for (int64_t row = 0; row < cp * local_rows; ++row) {
      // Skewed: worker 0 gets more, some workers may get nothing.
      const uint64_t draw = random.next() % static_cast<uint64_t>(cp + 2);
      const int64_t worker = draw >= static_cast<uint64_t>(cp) ? 0 : static_cast<int64_t>(draw);
      worker_rows[worker].push_back(row);
    }
    for (auto& rows : worker_rows) {  // random worker order
      for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[random.next() % i]);
    }
  }

  // Route of `rank`: pairs (owner, worker) list rows by ascending owner row, which
  // is the order both sides derive independently.
  IndexerRoute route(int64_t rank) const {
    IndexerRoute route;
    route.input_splits.assign(size, 0);
    route.output_splits.assign(size, 0);
    for (int64_t peer = 0; peer < size; ++peer) {
      // As owner: rows of mine that worker `peer` selects, ascending.
      std::vector<std::pair<int64_t, int64_t>> mine;  // (local row, position at peer)
      for (size_t p = 0; p < worker_rows[peer].size(); ++p) {
        const int64_t row = worker_rows[peer][p];
        if (row / local == rank) mine.emplace_back(row % local, static_cast<int64_t>(p));
      }
      std::sort(mine.begin(), mine.end());
      // As worker: rows owned by `peer` that I select, ascending by owner row.
      std::vector<std::pair<int64_t, int64_t>> theirs;  // (owner row, my position)
      for (size_t p = 0; p < worker_rows[rank].size(); ++p) {
        const int64_t row = worker_rows[rank][p];
        if (row / local == peer) theirs.emplace_back(row % local, static_cast<int64_t>(p));
      }
      std::sort(theirs.begin(), theirs.end());
      if (peer == rank) {
        for (const auto& [row, position] : mine) {
          route.local_sources.push_back(row);
          route.local_targets.push_back(position);
        }
        continue;
      }
      route.input_splits[peer] = static_cast<int64_t>(mine.size());
      for (const auto& entry : mine) route.send_rows.push_back(entry.first);
      route.output_splits[peer] = static_cast<int64_t>(theirs.size());
      for (const auto& entry : theirs) route.receive_rows.push_back(entry.second);
    }
    route.query_count = static_cast<int64_t>(worker_rows[rank].size());
    return route;
  }
};

// Small integers: exact in fp32 and bf16, distinct per (row, field, column, seed).
float value_of(int64_t global_row, int field, int64_t column, uint64_t seed) {
  SplitMix64 random(seed * 7919 + static_cast<uint64_t>(global_row) * 64 +
                    static_cast<uint64_t>(field) * 16 + static_cast<uint64_t>(column));
  return static_cast<float>(static_cast<int64_t>(random.next() % 255) - 127);
}

uint16_t to_bf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);  // exact for small integers
}

float from_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value = 0;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

float read(const RowMatrix& matrix, int64_t row, int64_t column) {
  const int64_t index = row * matrix.cols + column;
  if (matrix.dtype == DType::kBFloat16) {
    uint16_t bits = 0;
    std::memcpy(&bits, matrix.bytes.data() + index * 2, 2);
    return from_bf16(bits);
  }
  float value = 0;
  std::memcpy(&value, matrix.bytes.data() + index * 4, 4);
  return value;
}

// Owner inputs of one rank: qr bf16 [local, 5], weights fp32 [local, 3],
// cos/sin fp32 [local, 2].
struct OwnerData {
  std::vector<uint16_t> qr;
  std::vector<float> weights, cos, sin;
  int64_t local;
  IndexerInputs inputs() const {
    return {TensorView::tokens(MatrixView::bf16(qr.data(), local, 5)),
            TensorView::tokens(MatrixView::f32(weights.data(), local, 3)),
            TensorView::tokens(MatrixView::f32(cos.data(), local, 2)),
            TensorView::tokens(MatrixView::f32(sin.data(), local, 2))};
  }
};
constexpr int64_t kWidths[] = {5, 3, 2, 2};

OwnerData owner_data(int64_t rank, int64_t local, uint64_t seed) {
  OwnerData data;
  data.local = local;
  for (int64_t row = 0; row < local; ++row) {
    const int64_t global = rank * local + row;
    for (int64_t c = 0; c < 5; ++c) data.qr.push_back(to_bf16(value_of(global, 0, c, seed)));
    for (int64_t c = 0; c < 3; ++c) data.weights.push_back(value_of(global, 1, c, seed));
    for (int64_t c = 0; c < 2; ++c) data.cos.push_back(value_of(global, 2, c, seed));
    for (int64_t c = 0; c < 2; ++c) data.sin.push_back(value_of(global, 3, c, seed));
  }
  return data;
}

// Mismatching values of the worker inputs against the model.
int64_t verify_worker(const WorkerInputs& worker, const std::vector<int64_t>& global_rows,
                      uint64_t seed) {
  const RowMatrix* fields[] = {&worker.query_residual, &worker.weights, &worker.cos, &worker.sin};
  int64_t errors = 0;
  for (int field = 0; field < 4; ++field) {
    errors += fields[field]->rows != static_cast<int64_t>(global_rows.size()) ? 1 : 0;
    errors += fields[field]->cols != kWidths[field] ? 1 : 0;
    if (errors) return errors;
    for (size_t p = 0; p < global_rows.size(); ++p) {
      for (int64_t c = 0; c < kWidths[field]; ++c) {
        errors += read(*fields[field], static_cast<int64_t>(p), c) !=
                          value_of(global_rows[p], field, c, seed)
                      ? 1
                      : 0;
      }
    }
  }
  return errors;
}

int32_t id_of(int64_t global_row, int64_t k, uint64_t seed) {
  return static_cast<int32_t>((global_row * 31 + k * 7 + static_cast<int64_t>(seed)) % 100003);
}

SelectedKeys worker_result(const std::vector<int64_t>& global_rows, int64_t topk, uint64_t seed) {
  SelectedKeys selected{static_cast<int64_t>(global_rows.size()), topk, {}};
  for (const int64_t row : global_rows) {
    for (int64_t k = 0; k < topk; ++k) selected.ids.push_back(id_of(row, k, seed));
  }
  return selected;
}

int64_t verify_owner(const SelectedKeys& owner, int64_t rank, int64_t local, int64_t topk,
                     uint64_t seed) {
  if (owner.rows != local || owner.topk != topk) return 1;
  int64_t errors = 0;
  for (int64_t row = 0; row < local; ++row) {
    for (int64_t k = 0; k < topk; ++k) {
      errors += owner.row(row)[k] != id_of(rank * local + row, k, seed) ? 1 : 0;
    }
  }
  return errors;
}

TEST(Exchange, RandomRoutesOverlappedPathRoundTrips) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const int64_t local = static_cast<int64_t>(seed % 4 == 0 ? 1 : seed * 3 % 23);  // 1, primes
    const int64_t topk = static_cast<int64_t>(seed % 3 + 1);
    SCOPED_TRACE(testing::Message() << "seed " << seed << " local " << local << " cp " << size);
    const RandomAssignment model(size, local, seed);
    auto route = std::make_shared<const IndexerRoute>(model.route(rank));
    const OwnerData data = owner_data(rank, local, seed);
    comm.reset_stats();
    IndexerInputExchange exchange = launch_indexer_inputs(data.inputs(), route, comm);
    EXPECT_EQ(exchange.owner_queries(), local);
    const WorkerInputs worker = exchange.wait();
    EXPECT_EQ(verify_worker(worker, model.worker_rows[rank], seed), 0);
    PendingRows pending =
        exchange.launch_result(worker_result(model.worker_rows[rank], topk, seed));
    const SelectedKeys owner = pending.wait();
    EXPECT_EQ(verify_owner(owner, rank, local, topk, seed), 0);

    // Bytes moved equal the route's prediction: bf16 qr + fp32 (weights, cos, sin).
    const ExchangeBytes expected =
        expected_exchange_bytes(*route, input_row_bytes(data.inputs()), topk);
    EXPECT_EQ(input_row_bytes(data.inputs()), 5 * 2 + (3 + 2 + 2) * 4);
    EXPECT_EQ(comm.stats().bytes_sent, expected.sent());
    EXPECT_EQ(comm.stats().bytes_received, expected.received());
    EXPECT_EQ(comm.stats().exchanges, 3);  // two dtype groups, one result
  }
}

TEST(Exchange, SynchronousRowsAndResults) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  for (uint64_t seed = 50; seed < 56; ++seed) {
    const int64_t local = static_cast<int64_t>(seed % 7 + 1);
    SCOPED_TRACE(testing::Message() << "seed " << seed << " local " << local);
    const RandomAssignment model(size, local, seed);
    const IndexerRoute route = model.route(rank);
    const OwnerData data = owner_data(rank, local, seed);
    const MatrixView fields[] = {
        MatrixView::bf16(data.qr.data(), local, 5), MatrixView::f32(data.weights.data(), local, 3),
        MatrixView::f32(data.cos.data(), local, 2), MatrixView::f32(data.sin.data(), local, 2)};
    std::vector<RowMatrix> moved = exchange_rows(fields, route, comm);
    ASSERT_EQ(moved.size(), 4u);
    const WorkerInputs worker{moved[0], moved[1], moved[2], moved[3]};
    EXPECT_EQ(verify_worker(worker, model.worker_rows[rank], seed), 0);
    const SelectedKeys owner =
        return_rows(worker_result(model.worker_rows[rank], 2, seed), route, comm);
    EXPECT_EQ(verify_owner(owner, rank, local, 2, seed), 0);
  }
}

TEST(Exchange, SubCommunicatorGroupsExchangeIndependently) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm group = MPI_COMM_NULL;
  // Contiguous halves: world 4 -> {0, 1} and {2, 3}, each its own CP group.
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const int color = world_rank < (world_size + 1) / 2 ? 0 : 1;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank, &group);
  {
    MpiCommunicator comm(group);
    const uint64_t seed = 300 + static_cast<uint64_t>(color);  // different per group
    const int64_t local = 11;
    const RandomAssignment model(comm.size(), local, seed);
    auto route = std::make_shared<const IndexerRoute>(model.route(comm.rank()));
    const OwnerData data = owner_data(comm.rank(), local, seed);
    IndexerInputExchange exchange = launch_indexer_inputs(data.inputs(), route, comm);
    const WorkerInputs worker = exchange.wait();
    EXPECT_EQ(verify_worker(worker, model.worker_rows[comm.rank()], seed), 0);
    const SelectedKeys owner =
        exchange.launch_result(worker_result(model.worker_rows[comm.rank()], 3, seed)).wait();
    EXPECT_EQ(verify_owner(owner, comm.rank(), local, 3, seed), 0);
  }
  MPI_Comm_free(&group);
}

TEST(Exchange, PlannerRoutesForEveryMode) {
  // Routes from indexer_route on random packed batches, through the lengths API.
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const int64_t local = 37 + static_cast<int64_t>(seed) * 8;
    WorkloadSpec spec;
    spec.distribution = seed % 2 ? "lognormal" : "pareto";
    spec.tokens = local * size;
    spec.cp = size;
    spec.seed = seed;
    const std::vector<int64_t> lengths = generate_batch(spec);
    for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << " mode " << mode_name(mode));
      PlanOptions options{mode, std::nullopt, std::nullopt};
      if (mode == Mode::kGreedy || mode == Mode::kHybrid) options.block_size = 7;
      if (mode == Mode::kHybrid) options.zigzag_min_length = 4 * size;
      const IndexerRoute route = indexer_route(lengths, size, rank, 4, options);
      // The global rows each worker position must hold, from every rank's route.
      const OwnerData data = owner_data(rank, local, seed);
      IndexerInputExchange exchange =
          launch_indexer_inputs(data.inputs(), lengths, 4, options, comm);
      EXPECT_EQ(exchange.route(), route);
      const WorkerInputs worker = exchange.wait();
      // Worker order = task order: rebuild global rows from the segments' documents.
      std::vector<int64_t> starts(lengths.size() + 1, 0);
      std::partial_sum(lengths.begin(), lengths.end(), starts.begin() + 1);
      std::vector<int64_t> global_rows(static_cast<size_t>(route.query_count), -1);
      const TaskPlan plan = plan_tasks(lengths, size, 4, options);
      int64_t cursor = 0;
      for (const Task& task : plan.tasks(rank)) {
        for (int64_t p = task.start; p < task.end; ++p)
          global_rows[cursor++] = starts[task.document] + p;
      }
      EXPECT_EQ(verify_worker(worker, global_rows, seed), 0);
      const SelectedKeys owner = exchange.launch_result(worker_result(global_rows, 4, seed)).wait();
      EXPECT_EQ(verify_owner(owner, rank, local, 4, seed), 0);
    }
  }
}

}  // namespace
}  // namespace sparsecp
