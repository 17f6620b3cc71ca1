// A downstream project using every layer through the installed package: plans a batch
// with sparsecp's own strategy, routes it, and runs the selection kernel on one
// rank's rows over an MPI group of one.
#include <mpi.h>

#include <cstdio>
#include <sparsecp/kernels/select.hpp>
#include <sparsecp/planning/route.hpp>
#include <sparsecp/planning/strategy.hpp>
#include <sparsecp/transport/mpi_communicator.hpp>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    sparsecp::MpiCommunicator comm(MPI_COMM_WORLD);
    const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
    const sparsecp::Plan planned =
        sparsecp::find_strategy("spill").plan(lengths, 4, 4, sparsecp::StrategyParams{});
    const sparsecp::IndexerRoute route = sparsecp::make_route(planned.tasks(), lengths, 0, 4);
    // One row at document position 7 sees two keys; select the best one.
    const std::vector<float> q = {1, 0}, weights = {1}, keys = {1, 0, 2, 0};
    const std::vector<sparsecp::Segment> segments = {{0, 1, 0, 2, 0}};
    sparsecp::SelectConfig config;
    config.heads = 1;
    config.head_dim = 2;
    config.topk = 1;
    std::vector<int32_t> out(1);
    sparsecp::select_topk(sparsecp::MatrixView::f32(q.data(), 1, 2),
                          sparsecp::MatrixView::f32(weights.data(), 1, 1),
                          sparsecp::MatrixView::f32(keys.data(), 2, 2), segments, config, out);
    std::printf("rank %lld of %lld: route of %lld rows, selected key %d\n",
                static_cast<long long>(comm.rank()), static_cast<long long>(comm.size()),
                static_cast<long long>(route.query_count), out[0]);
    status = route.query_count > 0 && out[0] == 1 ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
