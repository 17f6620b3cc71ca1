// GoogleTest main for multi-rank test programs run under mpirun.
//
// Initialises MPI, runs the tests on every rank, and makes all ranks agree on the
// outcome: the program exits non-zero on every rank when any rank failed. Rank 0
// prints GoogleTest's usual report; the other ranks print only their failures, each
// line prefixed with "[rank r]", so a failure that happens on one rank only is still
// visible and attributable.
//
// Tests in these programs must keep every rank in the same sequence of collective
// calls: prefer EXPECT_* to ASSERT_* before a collective, and never return early on
// one rank only.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n[rank %d] %s\n", rank_,
                 result.file_name() ? result.file_name() : "unknown", result.line_number(), rank_,
                 result.message());
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  int failed_ranks = 0;
  MPI_Allreduce(&local_failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::fflush(stdout);
    std::printf("[mpi] %d rank(s): %s (%d rank(s) failed)\n", size,
                failed_ranks == 0 ? "PASSED on every rank" : "FAILED", failed_ranks);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return failed_ranks == 0 ? 0 : 1;
}
