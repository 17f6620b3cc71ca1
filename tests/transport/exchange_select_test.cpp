// Multi-rank end-to-end test: for every mode and random packed batches, the balanced
// top-k (synchronous balanced_select and the overlapped handles) equals, bit for bit
// on every rank, selecting all of the rank's own rows locally without communication.
// Small shapes, small-integer tensors (exact scores, many ties: tie-breaking must
// not depend on the rank either).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "support/select_case.hpp"

namespace sparsecp {
namespace {

using testing::Case;

TEST(BalancedSelect, EqualsLocalSelectionBitForBitInEveryMode) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t cp = comm.size();
  const int64_t rank = comm.rank();
  int64_t selected_ids = 0;  // the comparison must not be between all -1 results
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Case c(cp, rank, seed);
    const SelectedKeys expected = c.local_selection(cp, rank);
    for (const int32_t id : expected.ids) {
      EXPECT_GE(id, -1);  // every row was written
      selected_ids += id >= 0 ? 1 : 0;
    }
    for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " mode " << mode_name(mode) << " cp " << cp << " local "
                   << c.local << " ratio " << c.config.ratio << " topk " << c.config.topk);
      PlanOptions options{mode, std::nullopt, std::nullopt};
      if (mode == Mode::kGreedy || mode == Mode::kHybrid) {
        options.block_size = 1 + static_cast<int64_t>(seed) % c.local;
      }
      if (mode == Mode::kHybrid) options.zigzag_min_length = 2 * cp + static_cast<int64_t>(seed);

      const Selector selector = [&c](const WorkerInputs& worker,
                                     std::span<const Segment> segments) {
        return c.select(worker, segments);
      };
      const SelectedKeys synchronous =
          balanced_select(c.inputs(), selector, c.lengths, c.config.ratio, options, comm);
      EXPECT_EQ(synchronous, expected);

      IndexerInputExchange exchange =
          launch_indexer_inputs(c.inputs(), c.lengths, c.config.ratio, options, comm);
      const WorkerInputs worker = exchange.wait();
      const SelectedKeys mine = c.select(worker, exchange.route().segments);
      const SelectedKeys overlapped = exchange.launch_result(mine).wait();
      EXPECT_EQ(overlapped, expected);
    }
  }
  EXPECT_GT(selected_ids, 0);
}

}  // namespace
}  // namespace sparsecp
