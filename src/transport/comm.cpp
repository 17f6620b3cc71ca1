#include "sparsecp/transport/comm.hpp"

#include <mutex>

#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

// Objects a transport may still touch. Allocated once and never destroyed (not even
// at exit: a static destructor would free them while MPI may still run), but
// reachable, so leak checkers do not report them.
struct Graveyard {
  std::mutex mutex;
  std::vector<std::shared_ptr<void>> objects;
};

Graveyard& graveyard() {
  static Graveyard* const instance = new Graveyard;
  return *instance;
}

}  // namespace

namespace detail {

void keep_forever(std::shared_ptr<void> object) noexcept {
  Graveyard& kept = graveyard();
  const std::lock_guard<std::mutex> lock(kept.mutex);
  kept.objects.push_back(std::move(object));  // std::bad_alloc here terminates: see the header
}

}  // namespace detail

int64_t kept_until_exit_count() noexcept {
  Graveyard& kept = graveyard();
  const std::lock_guard<std::mutex> lock(kept.mutex);
  return static_cast<int64_t>(kept.objects.size());
}

void Work::wait() {
  if (failure_) std::rethrow_exception(failure_);
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, !consumed_, "Communication work cannot be consumed twice");
  consumed_ = true;
  if (!pending_) return;
  try {
    pending_->wait();
  } catch (...) {
    // Keep the Pending: the transport may still use its requests and the buffers.
    failure_ = std::current_exception();
    throw;
  }
  pending_.reset();
}

bool Work::test() {
  if (failure_) std::rethrow_exception(failure_);
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, !consumed_, "Communication work cannot be consumed twice");
  if (!pending_) return true;
  try {
    return pending_->test();
  } catch (...) {
    failure_ = std::current_exception();
    throw;
  }
}

bool Work::settle() noexcept {
  if (pending_ && !failure_) {
    try {
      pending_->wait();
      pending_.reset();
    } catch (...) {
      failure_ = std::current_exception();
    }
  }
  if (failure_ && pending_) keep_until_exit(std::move(pending_));
  return failure_ == nullptr;
}

}  // namespace sparsecp
