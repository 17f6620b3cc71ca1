// MpiCommunicator when MPI itself fails. The MPI profiling interface lets this program
// put its own MPI_Waitall / MPI_Ialltoallv in front of the library's calls (they forward
// to PMPI_*), and make them report an error on every rank at once, so the collectives
// stay matched. Checks the rules of comm.hpp: a failure is a TransportError, the
// communicator is broken afterwards (later calls throw at once, without calling MPI),
// a failure while posting is reported by the Work, and a failed Work is kept.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/transport/comm.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"
#include "support/raised.hpp"

namespace {

bool fail_waitall = false;     // MPI_Waitall completes, then reports MPI_ERR_OTHER
int64_t waitall_calls = 0;     // MPI_Waitall calls that reached MPI
bool fail_ialltoallv = false;  // MPI_Ialltoallv posts nothing and reports MPI_ERR_OTHER
int64_t allreduce_calls = 0;   // MPI_Allreduce calls that reached MPI

}  // namespace

extern "C" int MPI_Waitall(int count, MPI_Request array_of_requests[],
                           MPI_Status* array_of_statuses) {
  ++waitall_calls;
  const int code = PMPI_Waitall(count, array_of_requests, array_of_statuses);
  return fail_waitall ? MPI_ERR_OTHER : code;
}

extern "C" int MPI_Ialltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[],
                              MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                              const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                              MPI_Request* request) {
  if (fail_ialltoallv) return MPI_ERR_OTHER;
  return PMPI_Ialltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls,
                         recvtype, comm, request);
}

extern "C" int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype,
                             MPI_Op op, MPI_Comm comm) {
  ++allreduce_calls;
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

namespace sparsecp {
namespace {

using test_support::Raised;
using test_support::raised_by;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// One row of one int64 to every peer, itself included.
struct Buffers {
  explicit Buffers(const Communicator& comm)
      : counts(static_cast<size_t>(comm.size()), 1),
        send(static_cast<size_t>(comm.size()), comm.rank()),
        receive(static_cast<size_t>(comm.size()), -1) {}
  std::vector<int64_t> counts;
  std::vector<int64_t> send;
  std::vector<int64_t> receive;
};

TEST(MpiFault, FailedWaitIsATransportErrorAndBreaksTheCommunicator) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  Buffers buffers(comm);
  Work work = all_to_all_rows<int64_t>(comm, buffers.send, buffers.counts, buffers.receive,
                                       buffers.counts, 1);
  fail_waitall = true;
  const Raised failed = raised_by([&] { work.wait(); });
  fail_waitall = false;
  EXPECT_TRUE(failed.raised);
  EXPECT_EQ(failed.kind, ErrorKind::kTransport);
  EXPECT_TRUE(starts_with(failed.text, "MPI_Waitall failed: ")) << failed.text;
  EXPECT_TRUE(comm.broken());
  // The Work reports the failure again; the buffers' owner keeps them (rule 3).
  EXPECT_EQ(raised_by([&] { work.wait(); }).text, failed.text);
  const int64_t kept = kept_until_exit_count();
  if (!work.settle()) keep_until_exit(std::move(buffers));
  EXPECT_EQ(kept_until_exit_count(), kept + 2);  // the Pending, then the buffers

  // Every later call throws at once, without entering MPI.
  const int64_t calls = allreduce_calls;
  std::vector<int64_t> values = {1};
  const Raised reduce = raised_by([&] { comm.all_reduce(values, ReduceOp::kSum); });
  EXPECT_EQ(reduce.kind, ErrorKind::kTransport);
  EXPECT_EQ(reduce.text, "MPI communicator is unusable after an earlier transport failure (" +
                             failed.text + ")");
  Buffers more(comm);
  EXPECT_EQ(raised_by([&] {
              all_to_all_rows<int64_t>(comm, more.send, more.counts, more.receive, more.counts, 1);
            }).kind,
            ErrorKind::kTransport);
  EXPECT_EQ(raised_by([&] { comm.all_to_all_counts(more.counts); }).kind, ErrorKind::kTransport);
  EXPECT_EQ(allreduce_calls, calls);
}

TEST(MpiFault, OperationsInFlightWhenTheCommunicatorBreaksAreKept) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  Buffers first(comm);
  Buffers second(comm);
  Work failing =
      all_to_all_rows<int64_t>(comm, first.send, first.counts, first.receive, first.counts, 1);
  Work in_flight =
      all_to_all_rows<int64_t>(comm, second.send, second.counts, second.receive, second.counts, 1);
  fail_waitall = true;
  EXPECT_EQ(raised_by([&] { failing.wait(); }).kind, ErrorKind::kTransport);
  fail_waitall = false;
  // The second operation is not waited on through a broken communicator (MPI might never
  // return): it fails at once and is kept like the first.
  const int64_t calls = waitall_calls;
  const Raised second_wait = raised_by([&] { in_flight.wait(); });
  EXPECT_EQ(second_wait.kind, ErrorKind::kTransport);
  EXPECT_TRUE(starts_with(second_wait.text,
                          "MPI communicator is unusable after an earlier transport failure"))
      << second_wait.text;
  EXPECT_EQ(waitall_calls, calls);
  EXPECT_FALSE(in_flight.settle());
  if (!failing.settle()) keep_until_exit(std::move(first));
  keep_until_exit(std::move(second));
}

TEST(MpiFault, FailureWhilePostingIsReportedByTheWork) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  Buffers buffers(comm);
  fail_ialltoallv = true;
  Raised launched;
  Work work;
  launched = raised_by([&] {
    work = all_to_all_rows<int64_t>(comm, buffers.send, buffers.counts, buffers.receive,
                                    buffers.counts, 1);
  });
  fail_ialltoallv = false;
  // Not thrown by the launch: the Work reports it, so that whatever was posted stays
  // alive with the Work and the buffers.
  EXPECT_FALSE(launched.raised) << launched.text;
  const Raised failed = raised_by([&] { work.wait(); });
  EXPECT_EQ(failed.kind, ErrorKind::kTransport);
  EXPECT_TRUE(starts_with(failed.text, "MPI_Ialltoallv failed: ")) << failed.text;
  EXPECT_TRUE(comm.broken());
  if (!work.settle()) keep_until_exit(std::move(buffers));
}

TEST(MpiFault, AFreshCommunicatorStillWorks) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  Buffers buffers(comm);
  all_to_all_rows<int64_t>(comm, buffers.send, buffers.counts, buffers.receive, buffers.counts, 1)
      .wait();
  for (int64_t peer = 0; peer < comm.size(); ++peer) EXPECT_EQ(buffers.receive[peer], peer);
  EXPECT_FALSE(comm.broken());
}

}  // namespace
}  // namespace sparsecp
