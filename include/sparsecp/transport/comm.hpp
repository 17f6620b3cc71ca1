// sparsecp: Communicator — the collective operations a CP group needs, and the
// single-use Work handle that non-blocking operations return.
//
// A Communicator is one CP group in sequence-shard order: rank r owns global rows
// [r * local, (r + 1) * local) of the packed sequence. It is usually a
// sub-communicator of the job (data-, tensor- and pipeline-parallel groups are cut
// out of the world), so implementations wrap a group handed in by the caller and
// never assume the world.
//
// The interface is deliberately small so that an NCCL (or any device) backend can
// implement it without changing callers:
//   * `all_to_all_rows` is the one data-moving operation: a non-blocking,
//     variable-split all-to-all of fixed-size rows (seed:
//     `dist.all_to_all_single(..., async_op=True)`). Counts and row sizes are 64-bit;
//     an implementation must never truncate them to `int` (MPI counts in rows with
//     a contiguous row datatype and splits messages that still do not fit).
//   * `all_reduce` and `all_to_all_counts` are small blocking control collectives,
//     used to make every rank agree on input validity *before* data moves, so that
//     a bad input on one rank raises an error on every rank instead of a hang.
// Buffers live in the backend's memory space (host memory for MPI, device memory for
// a device backend) and must stay valid and untouched until the returned Work has
// completed (wait() returned, or the Work was destroyed).
//
// Collective discipline: every rank of the group must issue the same sequence of
// collective calls with consistent arguments (as with MPI and NCCL). Nothing here is
// thread-safe; one thread drives a Communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sparsecp/error.hpp"

namespace sparsecp {

// Completion of one non-blocking communication. Move-only and single-use, like the
// seed's `_PendingRows.work`: wait() consumes it, and a second wait() throws
// sparsecp::Error("Communication work cannot be consumed twice").
//
// Destroying a Work that was never waited completes it first (blocking), so buffers
// are never released while a transfer may still write into them. This cannot hang
// on its own: the operation was already launched on every rank.
class Work {
 public:
  // What a backend implements for one in-flight operation.
  class Pending {
   public:
    virtual ~Pending() = default;
    // Blocks until the operation completed; throws Error on a transport failure.
    virtual void wait() = 0;
    // Drives progress without blocking; true once the operation completed.
    virtual bool test() = 0;
  };

  // An already completed (empty) operation; wait() on it returns at once, once.
  Work() = default;
  explicit Work(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  Work(Work&& other) noexcept;
  // Completes the operation this Work held before taking over `other`'s.
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // Blocks until the operation completed; after it returns the buffers may be read
  // and released. Throws Error when called a second time.
  void wait();
  // Non-blocking progress poll (MPI progresses non-blocking collectives only inside
  // MPI calls); returns true once complete. Does not consume the Work. Throws Error
  // after wait().
  bool test();
  // True once wait() returned.
  bool consumed() const { return consumed_; }

 private:
  void complete_quietly() noexcept;

  std::unique_ptr<Pending> pending_;
  bool consumed_ = false;
};

enum class ReduceOp { kMin, kMax, kSum };

// Bytes this rank handed to and received from *other* ranks through
// all_to_all_rows (rows a rank sends to itself are not counted: the exchanges of
// exchange.hpp never send to self). Control collectives are not counted.
struct CommStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t exchanges = 0;  // all_to_all_rows calls
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, 0 <= rank() < size(). Seed: `dist.get_rank(group)`.
  virtual int64_t rank() const = 0;
  // Ranks in the group. Seed: `dist.get_world_size(group)`.
  virtual int64_t size() const = 0;

  // Non-blocking variable-split all-to-all of rows of `row_bytes` bytes each.
  // `send_counts[p]` rows go to peer p, taken consecutively from `send` in peer
  // order; `receive_counts[p]` rows arrive from peer p, stored consecutively in
  // `receive` in peer order. Both count spans have size() entries, every count is
  // non-negative, and the buffers hold exactly sum(counts) * row_bytes bytes
  // (checked; Error otherwise). `receive_counts[p]` must equal what peer p sends
  // here; callers that cannot guarantee it check with all_to_all_counts first.
  // Seed: `dist.all_to_all_single(received, send, output_splits, input_splits,
  // group=group, async_op=True)`.
  virtual Work all_to_all_rows(std::span<const std::byte> send,
                               std::span<const int64_t> send_counts, std::span<std::byte> receive,
                               std::span<const int64_t> receive_counts, int64_t row_bytes) = 0;

  // Blocking element-wise reduction of `values` over all ranks, in place. Every rank
  // passes the same number of values.
  virtual void all_reduce(std::span<int64_t> values, ReduceOp op) = 0;

  // Blocking all-to-all of one count per peer: returns, for every peer p, the value
  // peer p passed at index rank(). `counts` has size() entries.
  virtual std::vector<int64_t> all_to_all_counts(std::span<const int64_t> counts) = 0;

  // Traffic through all_to_all_rows since construction or the last reset_stats().
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  // Implementations call this once per all_to_all_rows with the bytes that leave
  // for and arrive from other ranks.
  void record_exchange(int64_t bytes_sent, int64_t bytes_received) {
    stats_.bytes_sent += bytes_sent;
    stats_.bytes_received += bytes_received;
    ++stats_.exchanges;
  }

 private:
  CommStats stats_;
};

// Typed convenience over Communicator::all_to_all_rows for rows of `width` values
// of T: counts are in rows, spans hold sum(counts) * width values.
// ---------------------------------------------------------------------------
// Work: small enough to live here.

inline Work::Work(Work&& other) noexcept
    : pending_(std::move(other.pending_)), consumed_(other.consumed_) {
  other.consumed_ = true;
}

inline Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    complete_quietly();
    pending_ = std::move(other.pending_);
    consumed_ = other.consumed_;
    other.consumed_ = true;
  }
  return *this;
}

inline Work::~Work() { complete_quietly(); }

inline void Work::wait() {
  SPARSECP_CHECK(!consumed_, "Communication work cannot be consumed twice");
  consumed_ = true;
  // Release the backend's request even when waiting fails.
  std::unique_ptr<Pending> pending = std::move(pending_);
  if (pending) pending->wait();
}

inline bool Work::test() {
  SPARSECP_CHECK(!consumed_, "Communication work cannot be consumed twice");
  return !pending_ || pending_->test();
}

inline void Work::complete_quietly() noexcept {
  if (pending_) {
    try {
      pending_->wait();
    } catch (...) {
      // A destructor cannot report; the transport error was the caller's to see
      // through wait().
    }
    pending_.reset();
  }
}

template <typename T>
Work all_to_all_rows(Communicator& comm, std::span<const T> send,
                     std::span<const int64_t> send_counts, std::span<T> receive,
                     std::span<const int64_t> receive_counts, int64_t width) {
  return comm.all_to_all_rows(std::as_bytes(send), send_counts, std::as_writable_bytes(receive),
                              receive_counts, width * static_cast<int64_t>(sizeof(T)));
}

}  // namespace sparsecp
