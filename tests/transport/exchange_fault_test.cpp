// The exchange's handles under a transport that fails (tests/support/fault_communicator.hpp,
// one process, no MPI): a failed or dropped transfer must never release buffers the
// transport may still write into (comm.hpp, rule 3), and the error kinds callers see.
// The late writes below are use-after-free reports under ASan if a buffer was released;
// the counters catch the same in any build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/sequence_gather.hpp"
#include "support/fault_communicator.hpp"
#include "support/raised.hpp"

namespace sparsecp {
namespace {

using test_support::FaultCommunicator;

// Rank 0 of 2 with two documents of 16 rows, zigzag: it sends 8 rows and receives 8.
struct Fixture {
  FaultCommunicator comm{0, 2};
  std::vector<int64_t> lengths = {16, 16};
  PlanOptions options{Mode::kZigzag, std::nullopt, std::nullopt};
  int64_t local = 16;
  std::vector<float> qr = std::vector<float>(static_cast<size_t>(local * 4), 1.0f);
  std::vector<float> weights = std::vector<float>(static_cast<size_t>(local * 2), 1.0f);
  std::vector<float> cos = std::vector<float>(static_cast<size_t>(local), 1.0f);
  std::vector<float> sin = std::vector<float>(static_cast<size_t>(local), 0.0f);

  Fixture() { comm.arriving = indexer_route(lengths, 2, 0, 4, options).output_splits; }
  IndexerInputs inputs() const {
    return {TensorView::tokens(MatrixView::f32(qr.data(), local, 4)),
            TensorView::tokens(MatrixView::f32(weights.data(), local, 2)),
            TensorView::tokens(MatrixView::f32(cos.data(), local, 1)),
            TensorView::tokens(MatrixView::f32(sin.data(), local, 1))};
  }
  SelectedKeys selected(int64_t rows, int64_t topk = 3) const {
    return {rows, topk, std::vector<int32_t>(static_cast<size_t>(rows * topk), 1)};
  }
};

using test_support::Raised;
using test_support::raised_by;

TEST(ExchangeFault, FailedInputTransferKeepsItsBuffers) {
  Fixture f;
  f.comm.fail = true;
  const int64_t destroyed = FaultCommunicator::failing_pendings_destroyed();
  const int64_t kept = kept_until_exit_count();
  {
    IndexerInputExchange exchange =
        launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
    ASSERT_EQ(f.comm.receives.size(), 1u);  // one dtype group
    ASSERT_FALSE(f.comm.receives[0].empty());
    const Raised failed = raised_by([&] { exchange.wait(); });
    EXPECT_TRUE(failed.raised);
    EXPECT_EQ(failed.kind, ErrorKind::kTransport);
    EXPECT_EQ(failed.text, "injected transport failure");
    // The seed's handle rule still holds after a failure.
    const Raised again = raised_by([&] { exchange.wait(); });
    EXPECT_EQ(again.kind, ErrorKind::kMisuse);
    EXPECT_EQ(again.text, "Indexer input exchange cannot be consumed twice");
  }
  // The handle is gone, but neither the transport's operation nor its buffers were
  // released: the Pending and the (send, receive) pair are kept until exit.
  EXPECT_EQ(FaultCommunicator::failing_pendings_destroyed(), destroyed);
  EXPECT_EQ(kept_until_exit_count(), kept + 2);
  f.comm.write_late();
}

TEST(ExchangeFault, DroppedInputExchangeWhoseTransferFailsKeepsItsBuffers) {
  Fixture f;
  f.comm.fail = true;
  const int64_t destroyed = FaultCommunicator::failing_pendings_destroyed();
  const int64_t kept = kept_until_exit_count();
  {
    IndexerInputExchange dropped =
        launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  }
  EXPECT_EQ(FaultCommunicator::failing_pendings_destroyed(), destroyed);
  EXPECT_EQ(kept_until_exit_count(), kept + 2);
  f.comm.write_late();
}

TEST(ExchangeFault, FailedResultTransferKeepsItsBuffers) {
  Fixture f;
  IndexerInputExchange exchange =
      launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  const WorkerInputs worker = exchange.wait();
  f.comm.fail = true;
  f.comm.receives.clear();  // the input buffers were released legitimately
  const int64_t kept = kept_until_exit_count();
  {
    PendingRows pending = exchange.launch_result(f.selected(worker.query_residual.rows));
    const Raised failed = raised_by([&] { pending.wait(); });
    EXPECT_EQ(failed.kind, ErrorKind::kTransport);
    EXPECT_EQ(raised_by([&] { pending.wait(); }).text,
              "Indexer communication handle cannot be consumed twice");
  }
  EXPECT_EQ(kept_until_exit_count(), kept + 2);
  f.comm.write_late();
}

TEST(ExchangeFault, FailedSyncExchangeKeepsItsBuffers) {
  Fixture f;
  f.comm.fail = true;
  const int64_t kept = kept_until_exit_count();
  const Selector selector = [](const WorkerInputs& worker, std::span<const Segment>) {
    return SelectedKeys{worker.query_residual.rows, 1,
                        std::vector<int32_t>(static_cast<size_t>(worker.query_residual.rows), 0)};
  };
  const Raised failed =
      raised_by([&] { balanced_select(f.inputs(), selector, f.lengths, 4, f.options, f.comm); });
  EXPECT_EQ(failed.kind, ErrorKind::kTransport);
  EXPECT_EQ(kept_until_exit_count(), kept + 2);
  f.comm.write_late();
}

TEST(ExchangeFault, FailedSequenceGatherKeepsItsBuffers) {
  FaultCommunicator comm(0, 2);
  comm.fail = true;
  const std::vector<float> shard(12, 1.0f);
  const std::vector<int64_t> offsets = equal_shard_offsets(3, 2);
  const int64_t kept = kept_until_exit_count();
  {
    SequenceGatherHandle<float> handle = launch_all_gather_sequence<float>(shard, 4, offsets, comm);
    EXPECT_EQ(raised_by([&] { handle.wait(); }).kind, ErrorKind::kTransport);
  }
  EXPECT_EQ(kept_until_exit_count(), kept + 2);  // the Pending and the buffers
  comm.write_late();
}

TEST(ExchangeFault, LaunchResultIsSingleUse) {
  Fixture f;
  IndexerInputExchange exchange =
      launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  const WorkerInputs worker = exchange.wait();
  const SelectedKeys selected = f.selected(worker.query_residual.rows);
  const SelectedKeys owner = exchange.launch_result(selected).wait();
  EXPECT_EQ(owner.rows, f.local);
  const size_t exchanges = f.comm.receives.size();
  const Raised second = raised_by([&] { exchange.launch_result(selected); });
  EXPECT_TRUE(second.raised);
  EXPECT_EQ(second.kind, ErrorKind::kMisuse);
  EXPECT_EQ(second.text, "Indexer result exchange cannot be consumed twice");
  EXPECT_EQ(f.comm.receives.size(), exchanges);  // nothing was launched
  // A launch the agreement rejected does not consume the handle.
  IndexerInputExchange other = launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  const WorkerInputs again = other.wait();
  EXPECT_EQ(raised_by([&] { other.launch_result(f.selected(again.query_residual.rows + 1)); }).kind,
            ErrorKind::kInvalidInput);
  EXPECT_EQ(other.launch_result(f.selected(again.query_residual.rows)).wait().rows, f.local);
}

TEST(ExchangeFault, ErrorsSayWhatKindTheyAre) {
  Fixture f;
  // Invalid input: batch two.
  IndexerInputs inputs = f.inputs();
  inputs.query_residual.shape = {2, f.local, 4};
  const Raised invalid =
      raised_by([&] { launch_indexer_inputs(inputs, f.lengths, 4, f.options, f.comm); });
  EXPECT_EQ(invalid.kind, ErrorKind::kInvalidInput);
  EXPECT_EQ(invalid.text,
            "Indexer balance requires batch one and equal contiguous source query shards");
  // Misuse: a moved-from handle.
  IndexerInputExchange exchange =
      launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  IndexerInputExchange moved = std::move(exchange);
  const Raised misuse = raised_by([&] { exchange.route(); });  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(misuse.kind, ErrorKind::kMisuse);
  EXPECT_EQ(raised_by([&] { exchange.wait(); }).kind, ErrorKind::kMisuse);
  // Transport: a failed transfer.
  f.comm.fail = true;
  IndexerInputExchange failing = launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm);
  EXPECT_EQ(raised_by([&] { failing.wait(); }).kind, ErrorKind::kTransport);
  // Resource: a peer (rank 1) could not allocate its buffers; this rank learns it in
  // the agreement and raises the same kind.
  f.comm.fail = false;
  f.comm.on_all_reduce = [](std::span<int64_t> values) {
    values[0] = std::min<int64_t>(values[0], 1 * 4 + static_cast<int64_t>(ErrorKind::kResource));
  };
  const Raised peer =
      raised_by([&] { launch_indexer_inputs(f.inputs(), f.lengths, 4, f.options, f.comm); });
  f.comm.on_all_reduce = nullptr;
  EXPECT_EQ(peer.kind, ErrorKind::kResource);
  EXPECT_EQ(peer.text, "Indexer input exchange aborted: rank 1 failed (resource exhausted)");
#if !defined(__SANITIZE_ADDRESS__)  // ASan reports a failed operator new instead of throwing
  // Resource: a matrix that fits 64 bits but not in memory (2^62 bytes).
  const Raised resource =
      raised_by([] { RowMatrix(DType::kFloat32, int64_t{1} << 40, int64_t{1} << 20); });
  EXPECT_EQ(resource.kind, ErrorKind::kResource);
  EXPECT_NE(resource.text.find("could not allocate"), std::string::npos) << resource.text;
#endif
  // Where it came from is debug detail, not part of the user's message.
  try {
    launch_indexer_inputs(inputs, f.lengths, 4, f.options, f.comm);
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.file()), "src/transport/exchange.cpp");
    EXPECT_GT(error.line(), 0);
    EXPECT_EQ(std::string(error.what()).find("exchange.cpp"), std::string::npos);
    EXPECT_NE(error.detail().find("invalid input raised at src/transport/exchange.cpp:"),
              std::string::npos)
        << error.detail();
  }
}

TEST(ExchangeFault, WorkerMatrixSizesAreChecked) {
  // Worker rows can be twice the owner's: the byte size must be checked, not wrapped.
  const Raised overflow =
      raised_by([] { RowMatrix(DType::kFloat32, std::numeric_limits<int64_t>::max() / 2, 3); });
  EXPECT_EQ(overflow.kind, ErrorKind::kInvalidInput);
  EXPECT_NE(overflow.text.find("overflows 64 bits"), std::string::npos) << overflow.text;
  EXPECT_EQ(raised_by([] { RowMatrix(DType::kBFloat16, -1, 3); }).kind, ErrorKind::kInvalidInput);
  const RowMatrix empty(DType::kBFloat16, 0, 5);
  EXPECT_TRUE(empty.bytes.empty());
}

}  // namespace
}  // namespace sparsecp
