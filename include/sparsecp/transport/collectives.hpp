// sparsecp: small collectives over any Communicator, built on its all_reduce.
//
// For the few integers a job's ranks share outside an exchange (a seed, per-rank
// figures for a report). Each is one all_reduce of a vector sized by the caller, so it
// is a collective like any other: every rank calls it, in the same order, with the same
// sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sparsecp/error.hpp"
#include "sparsecp/transport/comm.hpp"

namespace sparsecp {

// The values `root` holds, on every rank (a one-hot sum).
std::vector<int64_t> broadcast(Communicator& comm, std::vector<int64_t> values, int64_t root);

// Every rank's `mine` on every rank, rank-major (a sum of one-hot slots). Every rank must
// pass the same number of values.
std::vector<int64_t> gather(Communicator& comm, const std::vector<int64_t>& mine);

// Runs `step` on every rank; a failure on any rank becomes an Error on every rank (the
// failing rank rethrows its own message, the others say "<what>: another rank failed")
// instead of leaving the others in the next collective. `before_vote` runs between the
// step and the vote (e.g. a barrier that sleeps while slower ranks finish).
template <typename Step, typename BeforeVote>
void on_every_rank(Communicator& comm, const char* what, Step&& step, BeforeVote&& before_vote) {
  std::string error;
  bool failed_here = false;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
    failed_here = true;
  }
  before_vote();
  std::vector<int64_t> failed = {failed_here ? 1 : 0};
  comm.all_reduce(failed, ReduceOp::kSum);
  if (failed_here) throw Error(error);
  SPARSECP_CHECK(failed[0] == 0, what, ": another rank failed");
}

}  // namespace sparsecp
