// Invariants of task plans and of the routes every rank builds from them, shared by the
// fuzz targets fuzz_plan and fuzz_strategies. A broken invariant aborts (libFuzzer
// reports it as a crash) with the condition's text.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>
#include <vector>

#include "fuzz_input.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"

namespace sparsecp::fuzz {

// Tasks of every rank are sorted, disjoint and merged (from_ranks' promise).
inline void check_sorted_disjoint(const TaskPlan& plan) {
  for (int64_t rank = 0; rank < plan.cp(); ++rank) {
    const auto mine = plan.tasks(rank);
    for (size_t i = 1; i < mine.size(); ++i) {
      EXPECT(mine[i - 1] < mine[i]);
      EXPECT(mine[i - 1].document != mine[i].document || mine[i - 1].end < mine[i].start);
    }
  }
}

// Global row of each worker position of a rank with `tasks`.
inline std::vector<int64_t> worker_rows(std::span<const Task> tasks,
                                        std::span<const int64_t> boundaries) {
  std::vector<int64_t> rows;
  for (const Task& task : tasks) {
    for (int64_t p = task.start; p < task.end; ++p) rows.push_back(boundaries[task.document] + p);
  }
  return rows;
}

// Builds every rank's route with make_route and checks them against the plan and
// against each other, as if all ranks ran: each route's own invariants (no rows to
// itself, local rows land where the plan says, one segment per task with the right first
// key and end position), and for every pair of ranks the i-th row r sends to q is the
// global row q expects in its i-th receive slot from r. Returns the routes.
inline std::vector<IndexerRoute> check_routes_agree(const TaskPlan& plan,
                                                    std::span<const int64_t> lengths,
                                                    int64_t ratio) {
  const int64_t cp = plan.cp();
  std::vector<int64_t> boundaries(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), boundaries.begin() + 1);
  const int64_t local = boundaries.back() / cp;
  std::vector<int64_t> keys(lengths.size(), 0);  // first bank key of each document
  for (size_t d = 1; d < lengths.size(); ++d) keys[d] = keys[d - 1] + lengths[d - 1] / ratio;
  std::vector<IndexerRoute> routes;
  std::vector<std::vector<int64_t>> rows;
  for (int64_t rank = 0; rank < cp; ++rank) {
    routes.push_back(make_route(plan, lengths, rank, ratio));
    rows.push_back(worker_rows(plan.tasks(rank), boundaries));
    const IndexerRoute& route = routes.back();
    EXPECT(route.query_count == plan.rows(rank));
    EXPECT(static_cast<int64_t>(route.input_splits.size()) == cp &&
           static_cast<int64_t>(route.output_splits.size()) == cp);
    EXPECT(route.input_splits[rank] == 0 && route.output_splits[rank] == 0);
    EXPECT(route.local_sources.size() == route.local_targets.size());
    EXPECT(static_cast<int64_t>(route.send_rows.size() + route.local_sources.size()) == local);
    EXPECT(static_cast<int64_t>(route.receive_rows.size() + route.local_targets.size()) ==
           route.query_count);
    for (size_t k = 0; k < route.local_sources.size(); ++k) {
      EXPECT(rows.back()[route.local_targets[k]] == rank * local + route.local_sources[k]);
    }
    const auto tasks = plan.tasks(rank);
    EXPECT(route.segments.size() == tasks.size());
    int64_t next = 0;
    for (size_t i = 0; i < route.segments.size(); ++i) {
      const Segment& s = route.segments[i];
      const Task& task = tasks[i];
      EXPECT(s.q_begin == next && s.q_end - s.q_begin == task.length());
      EXPECT(s.key_begin == keys[task.document]);
      EXPECT(s.key_end >= s.key_begin && s.residual >= 0 && s.residual < ratio);
      EXPECT((s.key_end - s.key_begin) * ratio + s.residual == task.end);
      next = s.q_end;
    }
    EXPECT(next == route.query_count);
  }
  for (int64_t q = 0; q < cp; ++q) {
    int64_t receive_offset = 0;
    for (int64_t r = 0; r < cp; ++r) {
      const IndexerRoute& sender = routes[r];
      const IndexerRoute& receiver = routes[q];
      EXPECT(sender.input_splits[q] == receiver.output_splits[r]);
      int64_t send_offset = 0;
      for (int64_t p = 0; p < q; ++p) send_offset += sender.input_splits[p];
      for (int64_t i = 0; i < receiver.output_splits[r]; ++i) {
        const int64_t position = receiver.receive_rows[receive_offset + i];
        EXPECT(position >= 0 && position < receiver.query_count);
        EXPECT(rows[q][position] == r * local + sender.send_rows[send_offset + i]);
      }
      receive_offset += receiver.output_splits[r];
    }
  }
  return routes;
}

}  // namespace sparsecp::fuzz
