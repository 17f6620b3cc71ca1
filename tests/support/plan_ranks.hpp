// Test helper: a TaskPlan's tasks as one vector per rank, for comparing plans with ==.
#pragma once

#include <cstdint>
#include <vector>

#include "sparsecp/planning/plan.hpp"

namespace sparsecp::testing {

inline std::vector<std::vector<Task>> ranks_of(const TaskPlan& plan) {
  std::vector<std::vector<Task>> ranks;
  for (int64_t r = 0; r < plan.cp(); ++r) {
    const auto tasks = plan.tasks(r);
    ranks.emplace_back(tasks.begin(), tasks.end());
  }
  return ranks;
}

}  // namespace sparsecp::testing
