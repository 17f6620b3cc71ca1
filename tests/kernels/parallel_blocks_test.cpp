// parallel_blocks and WorkerError (src/kernels/parallel_blocks.hpp): every block runs once on a
// thread below the thread count, libraries run single-threaded inside a worker, and a worker's
// exception reaches the caller with its own type and message (a failed allocation as a resource
// error naming the work), whichever thread threw it.
#include "../../src/kernels/parallel_blocks.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <vector>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

using kernel_detail::parallel_blocks;
using kernel_detail::WorkerError;

TEST(ParallelBlocks, WorkerExceptionsKeepTheirOwnTypeAndMessage) {
  // An Error on one block of many, on several threads: the caller sees that Error (its
  // kind, text and place), not a generic allocation message.
  try {
    parallel_blocks(64, 4, "Indexer selection", [](int64_t block, int) {
      if (block == 37) SPARSECP_FAIL("block ", block, " rejected");
    });
    ADD_FAILURE() << "no exception";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "block 37 rejected");
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidInput);
    EXPECT_GT(error.line(), 0);
  }
  // Other exception types pass through unchanged.
  EXPECT_THROW(parallel_blocks(8, 2, "Indexer selection",
                               [](int64_t block, int) {
                                 if (block == 3) throw std::logic_error("three");
                               }),
               std::logic_error);
  // Running out of memory is a resource error naming the work.
  try {
    parallel_blocks(8, 2, "sparse attention", [](int64_t, int) { throw std::bad_alloc(); });
    ADD_FAILURE() << "no exception";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kResource);
    EXPECT_STREQ(error.what(), "sparse attention could not allocate its scratch memory");
  }
}

TEST(ParallelBlocks, EveryBlockRunsOnceWithLibrariesSingleThreaded) {
  for (const int threads : {1, 3}) {
    std::vector<std::atomic<int>> runs(100);
    std::atomic<bool> thread_in_range{true};
    std::atomic<bool> single{true};
    parallel_blocks(100, threads, "Indexer selection", [&](int64_t block, int thread) {
      runs[static_cast<size_t>(block)] += 1;
      if (thread < 0 || thread >= threads) thread_in_range = false;
      if (omp_get_max_threads() != 1) single = false;
    });
    for (const auto& count : runs) EXPECT_EQ(count.load(), 1) << threads << " threads";
    EXPECT_TRUE(thread_in_range.load()) << threads << " threads";
    EXPECT_TRUE(single.load()) << threads << " threads";
  }
  parallel_blocks(0, 2, "Indexer selection", [](int64_t, int) { ADD_FAILURE() << "ran a block"; });
}

TEST(WorkerError, KeepsTheFirstAndNothingWhenNoneFailed) {
  WorkerError none;
  EXPECT_FALSE(none.failed());
  EXPECT_NO_THROW(none.rethrow("sparse attention"));
  WorkerError error;
  for (const char* text : {"first", "second"}) {
    try {
      throw std::runtime_error(text);
    } catch (...) {
      error.record();
    }
  }
  EXPECT_TRUE(error.failed());
  try {
    error.rethrow("sparse attention");
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
}

}  // namespace
}  // namespace sparsecp
