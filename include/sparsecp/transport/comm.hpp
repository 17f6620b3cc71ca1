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
// a device backend); the rules for how long they must live are below.
//
// Collective discipline: every rank of the group must issue the same sequence of
// collective calls with consistent arguments (as with MPI and NCCL). Nothing here is
// thread-safe; one thread drives a Communicator.
//
// Failure rules (every implementation and every collective entry point of the
// library follows them; tests/transport checks each):
//   1. Agree before blocking. An entry point that can fail on one rank only (a bad
//      argument, an allocation, a local resource) never throws on that rank before a
//      data-moving or blocking collective its peers enter. It checks locally first,
//      then folds the verdict into its first collective, so that every rank learns
//      that some rank failed and every rank throws: the failing rank its own error,
//      the others an error naming that rank. `all_to_all_rows` does this itself (its
//      first step is a small all-reduce that carries every rank's verdict on its own
//      arguments and the row size), so direct callers are protected too; the
//      exchanges (exchange.hpp) and sequence transfers (sequence_gather.hpp) also agree
//      on their inputs and allocate their buffers before that. `all_reduce` and
//      `all_to_all_counts` only check sizes the caller must pass identically on every
//      rank (the group size, a fixed count): their callers must pass them identically,
//      and the library's own callers do.
//   2. Transport failures. A failure of the backend (MPI returned an error code) raises
//      TransportError (error.hpp) on the ranks where the backend reports it, and breaks
//      the Communicator: every later call on it throws TransportError at once, without
//      entering the backend, so a rank that saw the failure never blocks in a later
//      collective. Peers that did not see it may be blocked in a collective with that
//      rank, and MPI offers no portable way to release them: a TransportError is fatal
//      to the job, and the caller ends it (MPI_Abort; the sparsecp tool does so within
//      10 s of an error on one rank). Nothing in the library retries, spins or waits
//      without bound on its own.
//   3. Buffers. The buffers of a non-blocking operation must stay valid and untouched
//      until its Work completed: wait() returned, or the Work was destroyed (which
//      waits first). When the operation failed (wait() or test() threw), the transport
//      may still read or write them: a failed MPI_Waitall leaves its requests in an
//      undefined state, and a non-blocking collective can be neither cancelled nor
//      freed. Such buffers are therefore never released: the Work keeps its Pending
//      (the backend's requests and argument arrays) until the process exits, and the
//      owner of the buffers does the same: Work::settle() says whether they may be
//      released, keep_until_exit() keeps them. The library's handles (exchange.hpp,
//      sequence_gather.hpp) do this; the memory is leaked on purpose, once per failed
//      operation, after an error that ends the job anyway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "sparsecp/error.hpp"

namespace sparsecp {

// Keeps `object` alive until the process exits, never destroying it: for buffers a
// transport may still access after their operation failed (rule 3 above). A moved
// std::vector keeps its heap block, so moving the buffers here keeps the addresses the
// transport holds valid. Terminates the process if even this small bookkeeping
// allocation fails: neither freeing nor keeping the buffers would then be safe.
template <typename T>
void keep_until_exit(T&& object) noexcept;
// Objects handed to keep_until_exit() so far in this process (tests, diagnostics).
int64_t kept_until_exit_count() noexcept;

// Completion of one non-blocking communication. Move-only and single-use, like the
// seed's `_PendingRows.work`: wait() consumes it, and a second wait() throws
// MisuseError("Communication work cannot be consumed twice").
//
// Destroying a Work that was never waited completes it first (blocking), so buffers
// are never released while a transfer may still write into them. This cannot hang
// on its own: the operation was already launched on every rank.
//
// Failure: when the operation fails (the Pending's wait() or test() throws), the
// Work records the error and rethrows it from every later wait() and test(), and it
// keeps the Pending alive until the process exits instead of destroying it (rule 3
// above); settle() tells the buffers' owner to do the same with the buffers.
class Work {
 public:
  // What a backend implements for one in-flight operation. The Work destroys a
  // Pending only after its wait() returned normally (or when it never had one).
  class Pending {
   public:
    virtual ~Pending() = default;
    // Blocks until the operation completed; throws TransportError on a transport
    // failure (and may then be called again only to rethrow).
    virtual void wait() = 0;
    // Drives progress without blocking; true once the operation completed.
    virtual bool test() = 0;
  };

  // An already completed (empty) operation; wait() on it returns at once, once.
  Work() = default;
  explicit Work(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  Work(Work&& other) noexcept;
  // Settles the operation this Work held (see settle()) before taking over `other`'s.
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work() { settle(); }

  // Blocks until the operation completed; after it returns the buffers may be read
  // and released. Throws MisuseError when called a second time, and the operation's
  // own error (usually TransportError) when it failed, now or before.
  void wait();
  // Non-blocking progress poll (MPI progresses non-blocking collectives only inside
  // MPI calls); returns true once complete. Does not consume the Work. Throws
  // MisuseError after wait(), and the operation's error once it failed.
  bool test();
  // True once wait() was called (whether it returned or threw).
  bool consumed() const { return consumed_; }
  // True once the operation failed: the transport may still access its buffers.
  bool failed() const { return failure_ != nullptr; }

  // For the destructors of buffer owners: completes the operation if it is still
  // pending (blocking, as the destructor would; a failure is recorded, not thrown) and
  // returns whether the buffers may be released: true once it completed, or for an
  // empty Work; false once it failed, in which case the owner passes the buffers to
  // keep_until_exit(). A failed Work's Pending is kept until the process exits.
  bool settle() noexcept;

 private:
  std::unique_ptr<Pending> pending_;
  std::exception_ptr failure_;
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
  // non-negative, and the buffers hold exactly sum(counts) * row_bytes bytes.
  // `receive_counts[p]` must equal what peer p sends here; callers that cannot
  // guarantee it check with all_to_all_counts first.
  // Collective even when it fails (rule 1): the arguments are checked, then every
  // rank's verdict and row size are agreed before anything is posted, so a bad
  // argument on one rank raises InvalidInputError on every rank (that rank: what is
  // wrong; the others: "all_to_all_rows aborted: rank r rejected its arguments"), and
  // so does a row size that differs between ranks. A transport failure while posting
  // is reported through the returned Work (its wait() throws), so that the Work and
  // the buffers' owner keep what was already posted alive (rule 3).
  // Seed: `dist.all_to_all_single(received, send, output_splits, input_splits,
  // group=group, async_op=True)`.
  virtual Work all_to_all_rows(std::span<const std::byte> send,
                               std::span<const int64_t> send_counts, std::span<std::byte> receive,
                               std::span<const int64_t> receive_counts, int64_t row_bytes) = 0;

  // Blocking element-wise reduction of `values` over all ranks, in place. Every rank
  // must pass the same number of values (not agreed: rule 1).
  virtual void all_reduce(std::span<int64_t> values, ReduceOp op) = 0;

  // Blocking all-to-all of one count per peer: returns, for every peer p, the value
  // peer p passed at index rank(). `counts` must have size() entries on every rank
  // (not agreed: rule 1).
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
template <typename T>
Work all_to_all_rows(Communicator& comm, std::span<const T> send,
                     std::span<const int64_t> send_counts, std::span<T> receive,
                     std::span<const int64_t> receive_counts, int64_t width) {
  return comm.all_to_all_rows(std::as_bytes(send), send_counts, std::as_writable_bytes(receive),
                              receive_counts, width * static_cast<int64_t>(sizeof(T)));
}

// ---------------------------------------------------------------------------
// Inline parts of Work and keep_until_exit (the rest is in src/transport/comm.cpp).

namespace detail {
// Stores `object` in a process-lifetime list that is never destroyed.
void keep_forever(std::shared_ptr<void> object) noexcept;
}  // namespace detail

template <typename T>
void keep_until_exit(T&& object) noexcept {
  // make_shared may throw std::bad_alloc: in a noexcept function that terminates,
  // which is the documented behaviour.
  detail::keep_forever(std::make_shared<std::decay_t<T>>(std::forward<T>(object)));
}

inline Work::Work(Work&& other) noexcept
    : pending_(std::move(other.pending_)),
      failure_(std::move(other.failure_)),
      consumed_(other.consumed_) {
  other.failure_ = nullptr;
  other.consumed_ = true;
}

inline Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    settle();
    pending_ = std::move(other.pending_);
    failure_ = std::move(other.failure_);
    consumed_ = other.consumed_;
    other.failure_ = nullptr;
    other.consumed_ = true;
  }
  return *this;
}

}  // namespace sparsecp
