// Private to the kernels: how a kernel spreads independent blocks of work over OpenMP
// threads, and how an exception thrown by one worker reaches the caller.
//
// Why one helper: the selection (select.cpp) and the sparse attention
// (attention/sparse_attention.cpp) both run "one block of rows at a time, as threads free
// up", both must keep exceptions inside the OpenMP region (one that escapes it terminates
// the program), and both report a failed scratch allocation the same way. The attention's
// backward runs its own region (waves of blocks between barriers) but records errors with
// the same WorkerError.
//
// Determinism: neither helper orders or combines results. Which thread runs which block
// depends on scheduling, so a body must write only what its block owns (disjoint output
// rows, the thread's own scratch); a kernel whose results must not depend on the thread
// count combines blocks itself in a fixed order (as the attention's key gradient does).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>

namespace sparsecp::kernel_detail {

// The first exception thrown by any worker of an OpenMP region, kept to rethrow after the
// region ends. Used from inside the region by every thread; thread-safe.
//
//   WorkerError error;
//   #pragma omp parallel
//   { ... if (!error.failed()) try { work(); } catch (...) { error.record(); } ... }
//   error.rethrow("sparse attention");
class WorkerError {
 public:
  // Keeps std::current_exception() if it is the first; marks the region failed. Call it only
  // inside a catch block.
  void record() noexcept;

  // Whether any worker has recorded an exception yet (the others skip their remaining work).
  bool failed() const noexcept;

  // After the region: nothing if no worker failed; else the first exception with its own
  // type and message (a sparsecp::Error keeps its kind, text and place), except that a
  // std::bad_alloc becomes ResourceError("<context> could not allocate its scratch memory").
  void rethrow(const char* context) const;

 private:
  std::exception_ptr first_;
  bool failed_ = false;
};

// Runs body(index, thread) for every index in [0, count) on `threads` OpenMP threads:
// dynamic schedule, one index at a time, `thread` in [0, threads) naming the worker (for
// per-thread scratch). Each worker sets its OpenMP thread count to 1 first, so libraries
// a body calls (oneDNN, OpenMP-threaded BLAS) run single-threaded inside it: a team of one
// thread is not "in parallel" for OpenMP, and oneDNN would otherwise split a product (its
// reduction too) by its own thread count. The setting ends with the region.
// Errors: an exception thrown by a body is recorded in a WorkerError, the indices not yet
// started are skipped, and after the region it is rethrown as WorkerError::rethrow says.
void parallel_blocks(int64_t count, int threads, const char* context,
                     const std::function<void(int64_t index, int thread)>& body);

}  // namespace sparsecp::kernel_detail
