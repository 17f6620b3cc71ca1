// Multi-rank misuse tests of the exchange (exchange.hpp): double waits, wrong
// shapes, inputs or row counts that differ between ranks, and a selector failing on
// one rank. Each must raise sparsecp::Error on every rank (no rank may hang in a
// collective), with the specific message on the rank at fault. If a case hung, the
// CTest timeout would fail the test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "support/error_of.hpp"

namespace sparsecp {
namespace {

// Batch of `size` equal documents of `local` rows; owner inputs of width 4/2/1/1.
struct Fixture {
  MpiCommunicator comm{MPI_COMM_WORLD};
  int64_t size = comm.size();
  int64_t rank = comm.rank();
  int64_t local = 9;
  std::vector<int64_t> lengths = std::vector<int64_t>(static_cast<size_t>(size), local);
  std::vector<float> qr = std::vector<float>(static_cast<size_t>(local * 4), 1.0f);
  std::vector<float> weights = std::vector<float>(static_cast<size_t>(local * 2), 1.0f);
  std::vector<float> cos = std::vector<float>(static_cast<size_t>(local), 1.0f);
  std::vector<float> sin = std::vector<float>(static_cast<size_t>(local), 0.0f);
  PlanOptions options{Mode::kZigzag, std::nullopt, std::nullopt};

  IndexerInputs inputs() const {
    return {TensorView::tokens(MatrixView::f32(qr.data(), local, 4)),
            TensorView::tokens(MatrixView::f32(weights.data(), local, 2)),
            TensorView::tokens(MatrixView::f32(cos.data(), local, 1)),
            TensorView::tokens(MatrixView::f32(sin.data(), local, 1))};
  }
};

using sparsecp::testing::error_of;

// Every rank threw: no rank can be left inside a collective.
void expect_all_ranks_failed(Communicator& comm, const std::string& message) {
  std::vector<int64_t> threw = {message.empty() ? 0 : 1};
  comm.all_reduce(threw, ReduceOp::kMin);
  EXPECT_EQ(threw[0], 1) << "some rank did not throw; this rank: '" << message << "'";
}

TEST(ExchangeMisuse, InputExchangeCannotBeConsumedTwice) {
  Fixture f;
  IndexerInputExchange exchange =
      launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  const WorkerInputs worker = exchange.wait();
  EXPECT_EQ(error_of([&] { exchange.wait(); }), "Indexer input exchange cannot be consumed twice");
  EXPECT_EQ(error_of([&] { exchange.test(); }), "Indexer input exchange cannot be consumed twice");
  SelectedKeys selected{
      worker.query_residual.rows, 2,
      std::vector<int32_t>(static_cast<size_t>(worker.query_residual.rows * 2), 5)};
  PendingRows pending = exchange.launch_result(selected);
  const SelectedKeys owner = pending.wait();
  EXPECT_EQ(owner.rows, f.local);
  EXPECT_EQ(error_of([&] { pending.wait(); }),
            "Indexer communication handle cannot be consumed twice");
  // launch_result launches once (raised locally: no rank enters a collective alone).
  EXPECT_EQ(error_of([&] { exchange.launch_result(selected); }),
            "Indexer result exchange cannot be consumed twice");
  // Moved-from handles are spent too.
  IndexerInputExchange moved = std::move(exchange);
  EXPECT_EQ(error_of([&] { exchange.wait(); }),  // NOLINT(bugprone-use-after-move)
            "Indexer input exchange cannot be consumed twice");
  PendingRows empty;
  EXPECT_EQ(error_of([&] { empty.wait(); }),
            "Indexer communication handle cannot be consumed twice");
}

TEST(ExchangeMisuse, DroppedHandlesCompleteTheirTransfers) {
  Fixture f;
  {
    // Never waited: the destructor completes the transfers (ASan would flag a
    // transfer writing into freed buffers).
    IndexerInputExchange exchange =
        launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  }
  IndexerInputExchange exchange =
      launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  const WorkerInputs worker = exchange.wait();
  SelectedKeys selected{worker.query_residual.rows, 1,
                        std::vector<int32_t>(static_cast<size_t>(worker.query_residual.rows), 3)};
  { PendingRows dropped = exchange.launch_result(selected); }
  // The result exchange is single-use too; a second one needs a second input exchange.
  IndexerInputExchange second = launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  second.wait();
  const SelectedKeys owner = second.launch_result(selected).wait();
  for (const int32_t id : owner.ids) EXPECT_EQ(id, 3);
}

TEST(ExchangeMisuse, WrongShapeOnOneRankFailsEveryRank) {
  Fixture f;
  const int64_t bad = f.size - 1;  // the last rank gets the bad input
  IndexerInputs inputs = f.inputs();
  if (f.rank == bad) inputs.query_residual.shape = {2, f.local, 4};  // batch two
  const std::string batch =
      error_of([&] { launch_indexer_inputs(inputs, f.lengths, 4, f.options, f.comm); });
  expect_all_ranks_failed(f.comm, batch);
  if (f.rank == bad) {
    EXPECT_EQ(batch, "Indexer balance requires batch one and equal contiguous source query shards");
  } else {
    EXPECT_EQ(batch, "Indexer input exchange aborted: rank " + std::to_string(bad) +
                         " rejected its inputs");
  }

  inputs = f.inputs();
  if (f.rank == bad) inputs.weights.shape = {1, f.local - 1, 2};  // token axis mismatch
  const std::string axes =
      error_of([&] { launch_indexer_inputs(inputs, f.lengths, 4, f.options, f.comm); });
  expect_all_ranks_failed(f.comm, axes);
  if (f.rank == bad) {
    EXPECT_EQ(axes, "Indexer qr, weights and rotary embeddings must share token axes and device");
  }

  // The synchronous path uses the seed's other wording.
  const Selector never = [](const WorkerInputs&, std::span<const Segment>) -> SelectedKeys {
    ADD_FAILURE() << "selector ran";
    return {};
  };
  const std::string sync =
      error_of([&] { balanced_select(inputs, never, f.lengths, 4, f.options, f.comm); });
  expect_all_ranks_failed(f.comm, sync);
  if (f.rank == bad) {
    EXPECT_EQ(sync,
              "Indexer qr, weights and rotary embeddings must have matching batch/token axes "
              "and device");
  }

  // Shards that do not add up to the batch.
  std::vector<int64_t> lengths = f.lengths;
  lengths[0] += 1;
  const std::string shards =
      error_of([&] { launch_indexer_inputs(f.inputs(), lengths, 4, f.options, f.comm); });
  EXPECT_EQ(shards, "Indexer balance requires batch one and equal contiguous source query shards");
}

TEST(ExchangeMisuse, InputsThatDifferBetweenRanksFailEveryRank) {
  Fixture f;
  // Same total, different document split on rank 0 only.
  std::vector<int64_t> lengths = f.lengths;
  if (f.rank == 0 && f.size > 1) {
    lengths[0] -= 4;
    lengths[1] += 4;
  }
  const std::string split =
      error_of([&] { launch_indexer_inputs(f.inputs(), lengths, 4, f.options, f.comm); });
  if (f.size > 1) {
    expect_all_ranks_failed(f.comm, split);
    EXPECT_NE(split.find("Indexer input exchange"), std::string::npos) << split;
  } else {
    EXPECT_EQ(split, "");
  }

  // A field width that differs on one rank would corrupt the packed rows.
  std::vector<float> wide(static_cast<size_t>(f.local * 3), 1.0f);
  IndexerInputs inputs = f.inputs();
  if (f.rank == 0) inputs.cos = TensorView::tokens(MatrixView::f32(wide.data(), f.local, 3));
  const std::string width =
      error_of([&] { launch_indexer_inputs(inputs, f.lengths, 4, f.options, f.comm); });
  if (f.size > 1) {
    expect_all_ranks_failed(f.comm, width);
    EXPECT_EQ(width,
              "Indexer input exchange inputs differ between ranks: lengths, ratio, options, field "
              "widths, dtypes and topk must be identical on every rank");
  }
}

TEST(ExchangeMisuse, MismatchedRowCountsFailEveryRank) {
  Fixture f;
  if (f.size < 2) GTEST_SKIP() << "needs two ranks";
  // Rank 1 believes it receives one row fewer from rank 0 than rank 0 sends:
  // rank 0 keeps its route, rank 1 moves one worker position to local.
  IndexerRoute route;
  route.input_splits.assign(f.size, 0);
  route.output_splits.assign(f.size, 0);
  if (f.rank == 0) {
    route.input_splits[1] = 2;
    route.send_rows = {0, 1};
    route.local_sources = {2};
    route.local_targets = {0};
    route.query_count = 1;
  } else if (f.rank == 1) {
    route.output_splits[0] = 1;  // rank 0 sends 2
    route.receive_rows = {0};
    route.local_sources = {0, 1, 2};
    route.local_targets = {1, 2, 3};
    route.query_count = 4;
  } else {
    route.local_sources = {0, 1, 2};
    route.local_targets = {0, 1, 2};
    route.query_count = 3;
  }
  std::vector<float> values(12, 1.0f);
  const MatrixView field = MatrixView::f32(values.data(), 3, 4);
  const std::string message = error_of([&] { exchange_rows({&field, 1}, route, f.comm); });
  expect_all_ranks_failed(f.comm, message);
  if (f.rank == 1) {
    EXPECT_EQ(message,
              "Indexer row exchange row counts disagree: rank 1 expects 1 rows from rank 0, which "
              "sends 2");
  } else {
    EXPECT_EQ(message,
              "Indexer row exchange aborted: rank 1 received row counts that disagree with its "
              "route (routes differ between ranks)");
  }
}

TEST(ExchangeMisuse, BadResultsOnOneRankFailEveryRank) {
  Fixture f;
  IndexerInputExchange exchange =
      launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  const WorkerInputs worker = exchange.wait();
  const int64_t rows = worker.query_residual.rows + (f.rank == 0 ? 1 : 0);  // wrong on rank 0
  SelectedKeys selected{rows, 2, std::vector<int32_t>(static_cast<size_t>(rows * 2), 1)};
  const std::string message = error_of([&] { exchange.launch_result(selected).wait(); });
  expect_all_ranks_failed(f.comm, message);
  if (f.rank == 0) {
    EXPECT_NE(message.find("Indexer selection returned"), std::string::npos) << message;
  } else {
    EXPECT_EQ(message, "Indexer result exchange aborted: rank 0 rejected its inputs");
  }

  // topk that differs between ranks.
  const int64_t topk = f.rank == 0 ? 3 : 2;
  const int64_t good = worker.query_residual.rows;
  SelectedKeys uneven{good, topk, std::vector<int32_t>(static_cast<size_t>(good * topk), 1)};
  const std::string topk_message = error_of([&] { exchange.launch_result(uneven).wait(); });
  if (f.size > 1) expect_all_ranks_failed(f.comm, topk_message);
}

TEST(ExchangeMisuse, SelectorFailingOnOneRankFailsEveryRank) {
  Fixture f;
  const int64_t bad = f.size / 2;
  const Selector selector = [&](const WorkerInputs& worker,
                                std::span<const Segment>) -> SelectedKeys {
    if (f.rank == bad) throw Error("selector exploded");
    return {worker.query_residual.rows, 1,
            std::vector<int32_t>(static_cast<size_t>(worker.query_residual.rows), 0)};
  };
  const std::string message =
      error_of([&] { balanced_select(f.inputs(), selector, f.lengths, 4, f.options, f.comm); });
  expect_all_ranks_failed(f.comm, message);
  if (f.rank == bad) {
    EXPECT_EQ(message, "selector exploded");
  } else {
    EXPECT_EQ(message, "Indexer result exchange aborted: rank " + std::to_string(bad) +
                           " rejected its inputs");
  }
}

}  // namespace
}  // namespace sparsecp
