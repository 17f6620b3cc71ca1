// A downstream project: plans the SYSTEM.md example batch through the installed package.
#include <cstdio>
#include <sparsecp/planning/plan.hpp>
#include <sparsecp/planning/route.hpp>
#include <vector>

int main() {
  const std::vector<int64_t> lengths = {5000, 300, 2699, 1};
  const sparsecp::TaskPlan plan =
      sparsecp::plan_tasks(lengths, 4, 4, {.mode = sparsecp::Mode::kZigzag});
  const sparsecp::IndexerRoute route = sparsecp::make_route(plan, lengths, 0, 4);
  std::printf("rank 0 selects %lld rows\n", static_cast<long long>(route.query_count));
  return route.query_count == 2000 ? 0 : 1;
}
