// A Communicator test double for failure tests, in one process and without MPI.
//
// It plays one rank (`rank` of `size`) of a group whose other ranks pass exactly the
// same control values: all_reduce(kMin/kMax) returns the values unchanged (kSum
// multiplies by size; `on_all_reduce` can stand in for a peer that differs), and all_to_all_counts
// returns `arriving` (the counts the peers send here; a test sets it to the route's output_splits).
// all_to_all_rows records the buffers it was handed and returns a Work whose Pending either
// delivers (fills the receive buffer with `fill`) or fails like a broken transport (`fail`: wait()
// and test() throw TransportError). A failing Pending counts its destructions, so a test can tell
// whether anything released it, and `write_late()` writes into every receive buffer the
// way a transport that still holds it would: under ASan that is a use-after-free report
// if the buffer had been released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/transport/comm.hpp"

namespace sparsecp::test_support {

class FaultCommunicator final : public Communicator {
 public:
  FaultCommunicator(int64_t rank, int64_t size) : rank_(rank), size_(size) {
    arriving.assign(static_cast<size_t>(size), 0);
  }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }

  Work all_to_all_rows(std::span<const std::byte> send, std::span<const int64_t> send_counts,
                       std::span<std::byte> receive, std::span<const int64_t> receive_counts,
                       int64_t row_bytes) override {
    (void)send_counts;
    (void)receive_counts;
    (void)row_bytes;
    sends.push_back(send);
    receives.push_back(receive);
    if (fail) return Work(std::make_unique<FailingPending>());
    return Work(std::make_unique<DeliveringPending>(receive, fill));
  }

  void all_reduce(std::span<int64_t> values, ReduceOp op) override {
    if (op == ReduceOp::kSum) {
      for (int64_t& value : values) value *= size_;
    }
    if (on_all_reduce) on_all_reduce(values);
  }

  std::vector<int64_t> all_to_all_counts(std::span<const int64_t> counts) override {
    (void)counts;
    return arriving;
  }

  // What a transport that still owns the receive buffers would do.
  void write_late() const {
    for (const std::span<std::byte> receive : receives) {
      if (!receive.empty()) std::memset(receive.data(), 0x5A, receive.size());
    }
  }

  // Destructions of failing Pendings so far (in this process).
  static int64_t& failing_pendings_destroyed() {
    static int64_t count = 0;
    return count;
  }

  // What the other ranks contribute to a reduction (default: the same values).
  std::function<void(std::span<int64_t>)> on_all_reduce;
  bool fail = false;              // all_to_all_rows returns a failing Work
  std::byte fill{0};              // what a delivering Work writes into receive buffers
  std::vector<int64_t> arriving;  // all_to_all_counts' answer
  std::vector<std::span<const std::byte>> sends;
  std::vector<std::span<std::byte>> receives;

 private:
  class FailingPending final : public Work::Pending {
   public:
    ~FailingPending() override { ++failing_pendings_destroyed(); }
    void wait() override { SPARSECP_FAIL_AS(ErrorKind::kTransport, "injected transport failure"); }
    bool test() override { SPARSECP_FAIL_AS(ErrorKind::kTransport, "injected transport failure"); }
  };

  class DeliveringPending final : public Work::Pending {
   public:
    DeliveringPending(std::span<std::byte> receive, std::byte fill)
        : receive_(receive), fill_(fill) {}
    void wait() override {
      if (!receive_.empty()) std::memset(receive_.data(), static_cast<int>(fill_), receive_.size());
    }
    bool test() override { return true; }

   private:
    std::span<std::byte> receive_;
    std::byte fill_;
  };

  int64_t rank_;
  int64_t size_;
};

}  // namespace sparsecp::test_support
