// Multi-rank end-to-end test of spill: on random packed batches, selecting through a
// spill plan's routes (overlapped handles and the synchronous row exchange) gives, bit
// for bit on every rank, the top-k of selecting all of the rank's own rows locally;
// and each rank sends exactly the rows the plan says it sheds. Small shapes,
// small-integer tensors (exact scores, many ties).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "sparsecp/balanced_select.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/spill.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "support/select_case.hpp"

namespace sparsecp {
namespace {

using testing::Case;

TEST(SpillSelect, EqualsLocalSelectionBitForBit) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t cp = comm.size();
  const int64_t rank = comm.rank();
  int64_t selected_ids = 0;  // the comparison must not be between all -1 results
  int64_t rows_moved = 0;    // and some rows must actually move
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Case c(cp, rank, seed);
    const SelectedKeys expected = c.local_selection(cp, rank);
    for (const int32_t id : expected.ids) selected_ids += id >= 0 ? 1 : 0;
    for (const double target : {1.0, 1.001, 1.2}) {
      SpillOptions options;
      options.target_imbalance = target;
      options.max_received_fragments = seed % 2 ? 0 : 2;
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " target " << target << " cp " << cp << " local "
                   << c.local << " ratio " << c.config.ratio << " topk " << c.config.topk);
      const SpillPlan spill = plan_spill(c.lengths, cp, c.config.ratio, options);
      rows_moved += spill.rows_moved;
      auto route = std::make_shared<const IndexerRoute>(
          make_route(spill.plan, c.lengths, rank, c.config.ratio));
      EXPECT_EQ(static_cast<int64_t>(route->send_rows.size()),
                spill.rows_shed[static_cast<size_t>(rank)]);
      EXPECT_EQ(route->query_count, spill.plan.rows(rank));

      // Overlapped path: launch, wait, select, launch the results back, wait.
      IndexerInputExchange exchange = launch_indexer_inputs(c.inputs(), route, comm);
      const WorkerInputs worker = exchange.wait();
      const SelectedKeys mine = c.select(worker, route->segments);
      const SelectedKeys overlapped = exchange.launch_result(mine).wait();
      EXPECT_EQ(overlapped, expected);

      // Synchronous row exchange, the same route.
      const int64_t half = c.config.rope_dim / 2;
      const MatrixView fields[] = {MatrixView::f32(c.qr.data(), c.local, c.q_rank),
                                   MatrixView::f32(c.weights.data(), c.local, c.config.heads),
                                   MatrixView::f32(c.cos.data(), c.local, half),
                                   MatrixView::f32(c.sin.data(), c.local, half)};
      comm.reset_stats();
      std::vector<RowMatrix> moved = exchange_rows(fields, *route, comm);
      ASSERT_EQ(moved.size(), 4u);
      const WorkerInputs synchronous_worker{std::move(moved[0]), std::move(moved[1]),
                                            std::move(moved[2]), std::move(moved[3])};
      const SelectedKeys back =
          return_rows(c.select(synchronous_worker, route->segments), *route, comm);
      EXPECT_EQ(back, expected);
      const ExchangeBytes predicted =
          expected_exchange_bytes(*route, input_row_bytes(c.inputs()), c.config.topk);
      EXPECT_EQ(comm.stats().bytes_sent, predicted.sent());
      EXPECT_EQ(comm.stats().bytes_received, predicted.received());
    }
  }
  EXPECT_GT(selected_ids, 0);
  if (cp > 1) {
    EXPECT_GT(rows_moved, 0);
  }
}

}  // namespace
}  // namespace sparsecp
