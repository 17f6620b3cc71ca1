// sparsecp: IndexerRoute — how one rank's selection inputs and results move.
//
// A route is the per-rank view of a TaskPlan. It tells rank `rank`
//   * as an owner: which of its local rows go to each peer (`send_rows`, grouped
//     by peer, `input_splits[peer]` rows each) and which rows it keeps
//     (`local_sources`);
//   * as a worker: where each row received from each owner lands in its worker
//     order (`receive_rows`, grouped by owner, `output_splits[owner]` rows each),
//     where kept rows land (`local_targets`), and how many rows it selects in total
//     (`query_count`);
//   * what the selector needs to know about those worker rows (`segments`).
//
// Worker order is the order of the rank's tasks: the rows of task 0, then task 1,
// and so on. Rows a rank keeps are never sent to itself: its own entries of the
// splits are 0 and the local rows are copied directly (local bypass).
//
// Exchanging inputs: the owner sends local rows `send_rows` (split by
// `input_splits`) with one variable all-to-all; the worker receives
// sum(output_splits) rows and scatters them to `receive_rows`. Results travel the
// reverse way: the worker sends its rows `receive_rows` (split by
// `output_splits`), the owner scatters them to `send_rows`.
//
// Seed: `IndexerRoute` and `indexer_route`, file indexer_balance.py. Field names
// and values are identical to the seed's for the same inputs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sparsecp/planning/plan.hpp"
#include "sparsecp/segment.hpp"

namespace sparsecp {

// Segment (segment.hpp): one contiguous piece of one document in worker order.

// Seed `IndexerRoute`. Immutable once built; all row indices are 64-bit.
struct IndexerRoute {
  std::vector<Segment> segments;
  std::vector<int64_t> input_splits;   // rows this owner sends to each peer
  std::vector<int64_t> output_splits;  // rows this worker receives from each owner
  std::vector<int64_t> send_rows;      // local owner rows, grouped by destination
  std::vector<int64_t> receive_rows;   // worker positions, grouped by source owner
  std::vector<int64_t> local_sources;  // local owner rows this rank selects itself
  std::vector<int64_t> local_targets;  // their worker positions
  int64_t query_count = 0;             // rows this rank selects as a worker

  friend bool operator==(const IndexerRoute&, const IndexerRoute&) = default;
};

// Seed `_segments`: the segments of a worker's task list.
std::vector<Segment> make_segments(std::span<const Task> tasks, std::span<const int64_t> lengths,
                                   int64_t ratio);

// Seed `_route_from_tasks`: the route of `rank` under any per-rank task assignment.
// Generic: every strategy that produces a TaskPlan gets a working route from here.
// `lengths` must be the lengths the plan was made for (sum divisible by plan.cp()).
IndexerRoute make_route(const TaskPlan& plan, std::span<const int64_t> lengths, int64_t rank,
                        int64_t ratio);

// Seed `indexer_route(lengths, size, rank, ratio, mode, block_size,
// zigzag_min_length)`: validates, plans and builds this rank's route. Zigzag takes a
// fast path that builds only this rank's tasks and inverts the zigzag placement for
// its own rows, without planning the other ranks (`_zigzag_rank_tasks`,
// `_zigzag_send_ranges`); its result equals make_route(plan_tasks(...)).
IndexerRoute indexer_route(std::span<const int64_t> lengths, int64_t cp, int64_t rank,
                           int64_t ratio, const PlanOptions& options);

// Bytes a rank moves to/from *other* ranks for one balanced selection under `route`:
// input rows of `input_row_bytes` bytes (the sum over dtype groups of the packed row
// sizes) and result rows of `topk` int32 ids. A pure function of the route: the
// prediction that transport's CommStats (comm.hpp) measures against.
struct ExchangeBytes {
  int64_t inputs_sent = 0;
  int64_t inputs_received = 0;
  int64_t results_sent = 0;
  int64_t results_received = 0;
  int64_t sent() const { return inputs_sent + results_sent; }
  int64_t received() const { return inputs_received + results_received; }
};
ExchangeBytes expected_exchange_bytes(const IndexerRoute& route, int64_t input_row_bytes,
                                      int64_t topk);

// The zigzag tasks of one rank only (seed `_zigzag_rank_tasks`); equal to
// plan_tasks(..zigzag..).tasks(rank). Inputs must already be validated.
std::vector<Task> zigzag_rank_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t rank);

}  // namespace sparsecp
