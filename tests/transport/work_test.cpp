// Work (comm.hpp) without MPI: single use, and what happens to an operation that
// fails. A failed operation must report its failure on every later call and must never
// be released (the transport may still use its requests and buffers): rule 3 of
// comm.hpp. Also keep_until_exit() and settle().
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/transport/comm.hpp"
#include "support/raised.hpp"

namespace sparsecp {
namespace {

// A Pending that records what happened to it in counters the test owns.
struct Record {
  int waits = 0;
  int destroyed = 0;
};

class ScriptedPending final : public Work::Pending {
 public:
  ScriptedPending(Record& record, bool fail) : record_(record), fail_(fail) {}
  ~ScriptedPending() override { ++record_.destroyed; }
  void wait() override {
    ++record_.waits;
    if (fail_) SPARSECP_FAIL_AS(ErrorKind::kTransport, "MPI_Waitall failed: injected");
  }
  bool test() override {
    if (fail_) SPARSECP_FAIL_AS(ErrorKind::kTransport, "MPI_Testall failed: injected");
    return true;
  }

 private:
  Record& record_;
  bool fail_;
};

Work scripted(Record& record, bool fail) {
  return Work(std::make_unique<ScriptedPending>(record, fail));
}

using test_support::Raised;
using test_support::raised_by;

TEST(Work, CompletedOperationIsReleasedOnceAndSingleUse) {
  Record record;
  Work work = scripted(record, false);
  EXPECT_TRUE(work.test());
  work.wait();
  EXPECT_EQ(record.waits, 1);
  EXPECT_EQ(record.destroyed, 1);  // released as soon as it completed
  EXPECT_TRUE(work.consumed());
  EXPECT_FALSE(work.failed());
  const Raised second = raised_by([&] { work.wait(); });
  EXPECT_TRUE(second.raised);
  EXPECT_EQ(second.kind, ErrorKind::kMisuse);
  EXPECT_EQ(second.text, "Communication work cannot be consumed twice");
  EXPECT_EQ(raised_by([&] { work.test(); }).kind, ErrorKind::kMisuse);
  EXPECT_TRUE(work.settle());
}

TEST(Work, FailedWaitKeepsTheOperationAndReportsTheFailureOnEveryLaterCall) {
  Record record;
  const int64_t kept_before = kept_until_exit_count();
  {
    Work work = scripted(record, true);
    const Raised first = raised_by([&] { work.wait(); });
    EXPECT_TRUE(first.raised);
    EXPECT_EQ(first.kind, ErrorKind::kTransport);
    EXPECT_EQ(first.text, "MPI_Waitall failed: injected");
    // The operation may still be in flight in the transport: nothing released it.
    EXPECT_EQ(record.destroyed, 0);
    EXPECT_TRUE(work.failed());
    // Every later call reports the same failure (not a misuse, not success).
    for (int call = 0; call < 2; ++call) {
      const Raised again = raised_by([&] { work.wait(); });
      EXPECT_EQ(again.kind, ErrorKind::kTransport);
      EXPECT_EQ(again.text, "MPI_Waitall failed: injected");
      EXPECT_EQ(raised_by([&] { work.test(); }).kind, ErrorKind::kTransport);
    }
    EXPECT_FALSE(work.settle());  // its buffers must not be released either
  }
  // Destroying the Work did not destroy the Pending: it is kept until the process exits.
  EXPECT_EQ(record.destroyed, 0);
  EXPECT_EQ(record.waits, 1);  // and nobody waited on a failed operation again
  EXPECT_EQ(kept_until_exit_count(), kept_before + 1);
}

TEST(Work, DroppedWorkWhoseCompletionFailsIsKept) {
  Record record;
  const int64_t kept_before = kept_until_exit_count();
  { Work dropped = scripted(record, true); }  // the destructor completes it, which fails
  EXPECT_EQ(record.waits, 1);
  EXPECT_EQ(record.destroyed, 0);
  EXPECT_EQ(kept_until_exit_count(), kept_before + 1);

  // The same through move assignment: the overwritten operation is settled first.
  Record overwritten;
  Record replacement;
  Work work = scripted(overwritten, true);
  work = scripted(replacement, false);
  EXPECT_EQ(overwritten.waits, 1);
  EXPECT_EQ(overwritten.destroyed, 0);
  EXPECT_EQ(kept_until_exit_count(), kept_before + 2);
  work.wait();
  EXPECT_EQ(replacement.destroyed, 1);
}

TEST(Work, FailedTestAlsoCountsAsFailure) {
  Record record;
  Work work = scripted(record, true);
  EXPECT_EQ(raised_by([&] { work.test(); }).kind, ErrorKind::kTransport);
  EXPECT_TRUE(work.failed());
  EXPECT_EQ(raised_by([&] { work.wait(); }).text, "MPI_Testall failed: injected");
  EXPECT_EQ(record.waits, 0);
}

TEST(Work, SettleTellsOwnersWhetherTheirBuffersMayBeReleased) {
  Record good;
  Work completed = scripted(good, false);
  EXPECT_TRUE(completed.settle());  // waits and releases
  EXPECT_EQ(good.destroyed, 1);
  EXPECT_TRUE(Work().settle());

  // An owner that keeps its buffers when the transfer failed.
  Record bad;
  auto buffer = std::make_shared<int>(7);
  const std::weak_ptr<int> watch = buffer;
  {
    Work failing = scripted(bad, true);
    if (!failing.settle()) keep_until_exit(std::move(buffer));
  }
  buffer.reset();
  EXPECT_FALSE(watch.expired());  // still alive: the transport may write into it
}

TEST(Work, MovedFromWorkIsSpent) {
  Record record;
  Work work = scripted(record, false);
  Work owner = std::move(work);
  EXPECT_EQ(raised_by([&] { work.wait(); }).kind,  // NOLINT(bugprone-use-after-move)
            ErrorKind::kMisuse);
  owner.wait();
  EXPECT_EQ(record.destroyed, 1);
}

}  // namespace
}  // namespace sparsecp
