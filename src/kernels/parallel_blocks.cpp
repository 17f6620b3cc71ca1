// Blocks of work over OpenMP threads (parallel_blocks.hpp).
#include "parallel_blocks.hpp"

#include <omp.h>

#include <new>

#include "sparsecp/error.hpp"

namespace sparsecp::kernel_detail {

void WorkerError::record() noexcept {
#pragma omp critical(sparsecp_worker_error)
  {
    if (!first_) first_ = std::current_exception();
  }
#pragma omp atomic write
  failed_ = true;
}

bool WorkerError::failed() const noexcept {
  bool failed = false;
#pragma omp atomic read
  failed = failed_;
  return failed;
}

void WorkerError::rethrow(const char* context) const {
  if (!first_) return;
  try {
    std::rethrow_exception(first_);
  } catch (const std::bad_alloc&) {
    SPARSECP_FAIL_AS(ErrorKind::kResource, context, " could not allocate its scratch memory");
  }
}

void parallel_blocks(int64_t count, int threads, const char* context,
                     const std::function<void(int64_t index, int thread)>& body) {
  WorkerError error;
#pragma omp parallel num_threads(threads)
  {
    omp_set_num_threads(1);
    const int thread = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) {
      if (error.failed()) continue;
      try {
        body(i, thread);
      } catch (...) {
        error.record();
      }
    }
  }
  error.rethrow(context);
}

}  // namespace sparsecp::kernel_detail
