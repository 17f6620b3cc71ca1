#include "sparsecp/transport/mpi_session.hpp"

#include <cstdio>
#include <ctime>
#include <string>

#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

constexpr int kLeaveTimeoutMs = 10000;

}  // namespace

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    owned_ = true;
  }
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Finalize();
}

void MpiSession::leave_on_error(const char* what) const {
  if (!owned_) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Request request = MPI_REQUEST_NULL;
  bool ok = MPI_Ibarrier(MPI_COMM_WORLD, &request) == MPI_SUCCESS;
  const timespec pause{0, 1000000};  // 1 ms
  for (int waited = 0; ok && waited < kLeaveTimeoutMs; ++waited) {
    int done = 0;
    ok = MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    if (ok && done) return;  // every rank is leaving on an error: finalise normally
    nanosleep(&pause, nullptr);
  }
  std::fprintf(stderr,
               "error: %s\nerror: rank %d failed while other ranks were still running; "
               "aborting the job\n",
               what, rank);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

void sleeping_barrier(const MpiCommunicator& comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  int code = MPI_Ibarrier(comm.handle(), &request);
  SPARSECP_CHECK_AS(ErrorKind::kTransport, code == MPI_SUCCESS,
                    "MPI_Ibarrier failed: ", mpi_error_text(code));
  const timespec pause{0, 200000};  // 0.2 ms
  while (true) {
    int done = 0;
    code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    SPARSECP_CHECK_AS(ErrorKind::kTransport, code == MPI_SUCCESS,
                      "MPI_Test of a barrier failed: ", mpi_error_text(code));
    if (done) return;
    nanosleep(&pause, nullptr);
  }
}

}  // namespace sparsecp
