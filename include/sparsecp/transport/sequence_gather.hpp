// sparsecp: moving KV rows along the sequence dimension — routed dispatch, all-gather,
// their backward passes, and the single-use handles that non-blocking launches return.
//
// Tensors are plain row-major buffers viewed as [rows, width] with the sequence dimension
// at the front (move_sequence_dim_to_front converts an arbitrary tensor). Every function
// here is collective over the Communicator `comm` (the CP group in sequence-shard order):
// every rank calls it in the same order with the same route/layout inputs.
//
// Forward and backward:
//   * sequence_dispatch (seed `sequence_dispatch`): each rank receives the rows of its
//     SequenceDispatchRoute interval as one contiguous block in global order. Its
//     backward SUMs every consumer's gradient rows back into the owner's rows.
//   * all_gather_sequence: every rank receives the whole bank. Its backward is a SUM
//     reduce-scatter into the owner's shard (seed: the autograd function whose backward
//     calls `dist.reduce_scatter_tensor(..., op=SUM)`).
// Gradient sums are deterministic: a row's contributions are added in ascending rank
// order of the consumers, so results do not depend on message arrival order and equal a
// plain loop over ranks bit for bit.
//
// Handles (seed `SequenceGatherHandle`, `_DeferredBankLaunch`): every `launch_*` starts
// the transfer and returns a move-only SequenceGatherHandle whose wait() completes it,
// assembles the result and releases all transfer storage; a second wait() throws. A
// DeferredGatherLaunch captures a launcher; start() launches once (dropping the launcher
// and whatever it captured) and wait() resolves that same handle.
//
// Validity and inputs are agreed before data moves, on every rank of a group of two or
// more, whatever its own route says: the ranks first check their inputs and allocate
// their buffers, then one allreduce compares the verdict and a fingerprint of what must
// be identical everywhere (transport/agreement.hpp): for a dispatch the route's defining
// inputs (kind, document boundaries, window or ratio, raw shard length, CP size;
// dispatch_route_fingerprint), for an all-gather the shard layout, and the row width and
// element size. Ranks whose inputs differ all raise Error naming the difference, e.g.
//   Sequence dispatch: CP ranks disagree on the planning inputs: rank 1 has fingerprint
//   ..., rank 0 has ... (window differs: rank 1 has 64, rank 0 has 4); 1 of 2 ranks
//   differ from rank 0
// and no data moves, so later collectives stay paired. An input error on one rank raises
// on every rank (the bad rank with the precise message, the others with "sequence gather
// input was rejected on another rank"; a failed allocation is a ResourceError on every
// rank). A dispatch whose route says no exchange is needed moves no data, but still takes
// part in the agreement (a rank handed other inputs might need an exchange).
//
// Element types: the forward functions accept float, double, uint16_t (bf16/fp16 bit
// patterns), int32_t and int64_t rows; the backward functions float and double.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/dispatch.hpp"
#include "sparsecp/transport/comm.hpp"

namespace sparsecp {

// Single-use result of a launched sequence transfer. Move-only. wait() blocks until the
// transfer completed, returns the assembled rows ([rows(), width()] row-major) and
// releases the transfer buffers; a second wait() throws MisuseError("Sequence gather
// handle cannot be consumed twice"). Destroying an unwaited handle completes the transfer
// first (see Work), so buffers never disappear under an in-flight transfer, and the
// buffers of a failed transfer are kept until the process exits (comm.hpp, rule 3).
// Seed: `SequenceGatherHandle`.
template <typename T>
class SequenceGatherHandle {
 public:
  SequenceGatherHandle() = default;
  // `finish` assembles the result once `work` completed; it owns the buffers.
  SequenceGatherHandle(Work work, std::function<std::vector<T>()> finish, int64_t rows,
                       int64_t width)
      : finish_(std::move(finish)), work_(std::move(work)), rows_(rows), width_(width) {}
  SequenceGatherHandle(SequenceGatherHandle&& other) noexcept
      : finish_(std::move(other.finish_)),
        work_(std::move(other.work_)),
        rows_(other.rows_),
        width_(other.width_),
        consumed_(other.consumed_) {
    other.consumed_ = true;
  }
  // Completes the transfer this handle held before taking over `other`'s.
  SequenceGatherHandle& operator=(SequenceGatherHandle&& other) noexcept {
    if (this != &other) {
      release();  // completes our own transfer first
      work_ = std::move(other.work_);
      finish_ = std::move(other.finish_);
      rows_ = other.rows_;
      width_ = other.width_;
      consumed_ = other.consumed_;
      other.consumed_ = true;
    }
    return *this;
  }
  SequenceGatherHandle(const SequenceGatherHandle&) = delete;
  SequenceGatherHandle& operator=(const SequenceGatherHandle&) = delete;
  ~SequenceGatherHandle() { release(); }

  std::vector<T> wait();
  // Drives progress without blocking; true once the transfer completed. Throws after wait().
  bool test();
  bool consumed() const { return consumed_; }
  int64_t rows() const { return rows_; }
  int64_t width() const { return width_; }

 private:
  // Completes the transfer (blocking) and drops the buffers, or keeps them until the
  // process exits when the transfer failed (comm.hpp, rule 3).
  void release() noexcept {
    if (!work_.settle()) keep_until_exit(std::move(finish_));
    finish_ = nullptr;
  }

  // The buffers, owned by the assembling function.
  std::function<std::vector<T>()> finish_;
  Work work_;
  int64_t rows_ = 0;
  int64_t width_ = 0;
  bool consumed_ = false;
};

// A launch deferred to a chosen point (e.g. issued in the forward, started just before
// the consumer's own compute so the transfer overlaps it). start() calls the launcher
// once, drops it (releasing captured inputs) and returns the handle; later start() calls
// return the same handle. wait() = start().wait(), so it is single-use like the handle.
// Seed: `_DeferredBankLaunch` (`start`, `wait`).
template <typename T>
class DeferredGatherLaunch {
 public:
  using Launcher = std::function<SequenceGatherHandle<T>()>;
  explicit DeferredGatherLaunch(Launcher launcher) : launcher_(std::move(launcher)) {
    SPARSECP_CHECK(static_cast<bool>(launcher_), "Deferred gather launch needs a launcher");
  }

  SequenceGatherHandle<T>& start() {
    if (!started_) {
      Launcher launcher = std::move(launcher_);
      launcher_ = nullptr;
      started_ = true;
      handle_ = launcher();
    }
    return handle_;
  }
  std::vector<T> wait() { return start().wait(); }
  bool started() const { return started_; }
  // True while the launcher (and what it captured) is still held.
  bool holds_launcher() const { return static_cast<bool>(launcher_); }

 private:
  Launcher launcher_;
  SequenceGatherHandle<T> handle_;
  bool started_ = false;
};

// ---------------------------------------------------------------------------
// Routed dispatch (seed `sequence_dispatch(tensor, dim, route, group)`).

// Starts moving this rank's `local` rows ([route.local_length, width]) per `route`; the
// handle yields [route.block_rows(), width]: bank rows [global_start, global_end) in
// global order. Own rows are copied into place before the call returns (local bypass,
// never sent to self). Errors: "sequence dispatch owner length does not match the bank's
// physical layout" (seed text) when local.size() != route.local_length * width; a
// non-positive width; a route made for another rank or group size than `comm`.
template <typename T>
SequenceGatherHandle<T> launch_sequence_dispatch(std::span<const T> local, int64_t width,
                                                 const SequenceDispatchRoute& route,
                                                 Communicator& comm);

// Blocking form: launch_sequence_dispatch(...).wait().
template <typename T>
std::vector<T> sequence_dispatch(std::span<const T> local, int64_t width,
                                 const SequenceDispatchRoute& route, Communicator& comm);

// Backward of sequence_dispatch: `block_grad` is the gradient of this rank's gathered
// block ([route.block_rows(), width]); returns the gradient of its local rows
// ([route.local_length, width]): for each local row, the sum over every consumer whose
// block holds it (itself included) of that consumer's gradient row, in ascending consumer
// rank order.
template <typename T>
SequenceGatherHandle<T> launch_sequence_dispatch_backward(std::span<const T> block_grad,
                                                          int64_t width,
                                                          const SequenceDispatchRoute& route,
                                                          Communicator& comm);
template <typename T>
std::vector<T> sequence_dispatch_backward(std::span<const T> block_grad, int64_t width,
                                          const SequenceDispatchRoute& route, Communicator& comm);

// ---------------------------------------------------------------------------
// All-gather along the sequence dimension.

// Rank r holds bank rows [shard_offsets[r], shard_offsets[r + 1]) (size + 1 entries,
// starting at 0, non-decreasing; equal shards are r * local, ragged ones e.g.
// compressed_owner_offsets). `local` is this rank's shard; the handle yields the whole
// bank [shard_offsets[size], width] in global order.
template <typename T>
SequenceGatherHandle<T> launch_all_gather_sequence(std::span<const T> local, int64_t width,
                                                   std::span<const int64_t> shard_offsets,
                                                   Communicator& comm);
template <typename T>
std::vector<T> all_gather_sequence(std::span<const T> local, int64_t width,
                                   std::span<const int64_t> shard_offsets, Communicator& comm);

// Backward of all_gather_sequence, a SUM reduce-scatter: `bank_grad` is this rank's
// gradient of the whole gathered bank ([shard_offsets[size], width]); returns the
// gradient of its own shard, summed over all ranks in ascending rank order.
template <typename T>
SequenceGatherHandle<T> launch_all_gather_sequence_backward(std::span<const T> bank_grad,
                                                            int64_t width,
                                                            std::span<const int64_t> shard_offsets,
                                                            Communicator& comm);
template <typename T>
std::vector<T> all_gather_sequence_backward(std::span<const T> bank_grad, int64_t width,
                                            std::span<const int64_t> shard_offsets,
                                            Communicator& comm);

// Equal shards of `local_rows` rows each: offsets r * local_rows for r in [0, size].
std::vector<int64_t> equal_shard_offsets(int64_t local_rows, int64_t size);

// ---------------------------------------------------------------------------
// Tensor layout (seed `_move_dim_to_front`, `_move_dim_from_front`).

// The [shape[dim], prod(other dims)] row-major view of a row-major tensor of `shape`:
// row s holds, in order, every element whose index along `dim` is s. `dim` may be
// negative (counted from the end). Error "sequence dispatch dimension is outside the
// input tensor dimensions" (seed text) when dim is out of range.
template <typename T>
std::vector<T> move_sequence_dim_to_front(std::span<const T> values, std::span<const int64_t> shape,
                                          int64_t dim);
// Inverse: `rows` is [shape[dim] (any length), prod(other dims)] — the sequence extent may
// differ from shape[dim] (a gathered block); returns the tensor of `shape` with
// shape[dim] replaced by the row count.
template <typename T>
std::vector<T> move_sequence_dim_from_front(std::span<const T> rows, std::span<const int64_t> shape,
                                            int64_t dim);

}  // namespace sparsecp
