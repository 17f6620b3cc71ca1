#include "sparsecp/transport/collectives.hpp"

#include <algorithm>

namespace sparsecp {

std::vector<int64_t> broadcast(Communicator& comm, std::vector<int64_t> values, int64_t root) {
  if (comm.rank() != root) std::fill(values.begin(), values.end(), 0);
  comm.all_reduce(values, ReduceOp::kSum);
  return values;
}

std::vector<int64_t> gather(Communicator& comm, const std::vector<int64_t>& mine) {
  const size_t width = mine.size();
  std::vector<int64_t> all(static_cast<size_t>(comm.size()) * width, 0);
  std::copy(mine.begin(), mine.end(),
            all.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(comm.rank()) * width));
  comm.all_reduce(all, ReduceOp::kSum);
  return all;
}

}  // namespace sparsecp
