// sparsecp: MpiCommunicator — the Communicator of comm.hpp over an MPI communicator.
//
// Wraps a communicator the caller hands in (the CP group, usually a
// sub-communicator such as one produced by MPI_Comm_split; never assumed to be
// MPI_COMM_WORLD). The constructor duplicates it (MPI_Comm_dup, collective over the
// group) so that sparsecp's traffic can never match the caller's own messages, and
// the destructor frees the duplicate (MPI_Comm_free, also collective: destroy on
// every rank, before MPI_Finalize).
//
// Large exchanges: MPI counts and displacements are `int`. Rows are sent with a
// contiguous datatype of `row_bytes` bytes, so counts are in rows, not bytes; when
// even the row counts or row displacements exceed `max_message_rows` (INT_MAX by
// default), the exchange falls back to per-peer non-blocking point-to-point
// messages of at most `max_message_rows` rows each, addressed by pointer, so no
// count or displacement is ever truncated. Tests lower `max_message_rows` to
// exercise the split path with small buffers.
//
// Progress: OpenMPI progresses non-blocking operations inside MPI calls; call
// Work::test() now and then during long overlapped computations to keep a transfer
// moving.
//
// Failures (the rules of comm.hpp): the duplicate uses MPI_ERRORS_RETURN, so MPI
// errors come back as codes and become TransportError instead of aborting the job.
// The first one breaks this communicator: every later call throws TransportError
// naming it, without calling MPI. A failed wait leaves its requests (and the count
// arrays MPI reads) alive for the rest of the process, with the buffers (comm.hpp,
// rule 3).
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>

#include "sparsecp/transport/comm.hpp"

namespace sparsecp {

// MPI's text for an error code ("MPI error N" when MPI cannot say).
std::string mpi_error_text(int code);

struct MpiCommunicatorOptions {
  // Largest count (in rows) or displacement put into one MPI call before the
  // exchange is split into point-to-point messages. Must be in [1, INT_MAX].
  int64_t max_message_rows = INT_MAX;
};

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `group`. MPI must be initialised; `group` stays owned by the
  // caller and may be freed after construction.
  explicit MpiCommunicator(MPI_Comm group, MpiCommunicatorOptions options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }

  Work all_to_all_rows(std::span<const std::byte> send, std::span<const int64_t> send_counts,
                       std::span<std::byte> receive, std::span<const int64_t> receive_counts,
                       int64_t row_bytes) override;
  void all_reduce(std::span<int64_t> values, ReduceOp op) override;
  std::vector<int64_t> all_to_all_counts(std::span<const int64_t> counts) override;

  // The duplicated communicator sparsecp talks on.
  MPI_Comm handle() const { return comm_; }
  // True once an MPI call on it failed; every later call then throws TransportError.
  bool broken() const { return !failure_->empty(); }

 private:
  // Throws TransportError when the communicator is broken.
  void check_usable() const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  // The first MPI failure ("MPI_Waitall failed: ..."), empty while healthy. Shared with
  // the Pendings of in-flight operations, whose waits can break the communicator.
  std::shared_ptr<std::string> failure_ = std::make_shared<std::string>();
  int64_t rank_ = 0;
  int64_t size_ = 0;
  MpiCommunicatorOptions options_;
};

}  // namespace sparsecp
