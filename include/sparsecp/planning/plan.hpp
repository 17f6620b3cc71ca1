// sparsecp: Lightning Indexer task plans — which CP rank selects which query rows.
//
// The packed sequence holds documents of `lengths[d]` tokens back to back and is cut
// into `cp` equal contiguous shards of `local = sum(lengths) / cp` rows; rank r owns
// global rows [r * local, (r + 1) * local). Main attention stays with the owner; a
// plan only moves the *selection* work (Index-Q projection, scoring, top-k).
//
// A plan assigns every row of every document to exactly one rank, as sorted,
// disjoint, merged tasks (document, start, end) in document coordinates. It is pure
// integer code: deterministic, identical on every rank, no communication.
//
// Modes (seed `indexer_task_plan`, file indexer_balance.py; parity is exact,
// including the error texts):
//   none    every rank keeps its own contiguous rows; nothing moves. The baseline
//           every report compares against. (sparsecp extension: the seed has no
//           task plan for 'none' and rejects it in `_validate_task_plan`.)
//   zigzag  each document is cut into 2*cp chunks after a leading remainder of
//           length % (2*cp) rows; rank r takes chunks r and 2*cp-1-r of every
//           document, and the remainders are pooled and dealt out evenly in
//           packed order. Equal row counts on every rank.
//   greedy  documents are cut into blocks of `block_size` rows; blocks go, in
//           descending causal work (ties by document, start, end), to the rank with
//           the least (work, rows, rank) that still has room under the cap of
//           2 * local rows per rank.
//   hybrid  documents of at least `zigzag_min_length` rows that hold a complete
//           zigzag pair keep their zigzag chunks; their remainders and all shorter
//           documents enter the greedy pool, which is placed on top of the zigzag
//           load under the same cap.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparsecp {

enum class Mode { kNone, kZigzag, kGreedy, kHybrid };

// "none", "zigzag", "greedy" or "hybrid".
std::string_view mode_name(Mode mode);

// Parses a mode name. Throws Error with the seed's text
// "indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'" otherwise.
Mode parse_mode(std::string_view name);

// A contiguous query interval [start, end) of one document, in document
// coordinates. Seed: `IndexerTask`. Ordered by (document, start, end).
struct Task {
  int64_t document = 0;
  int64_t start = 0;
  int64_t end = 0;

  constexpr int64_t length() const { return end - start; }
  friend constexpr auto operator<=>(const Task&, const Task&) = default;
};

// The one walk that splits a task at its owners' shards: calls piece(owner, first, last)
// for each run of packed rows [first, last) of `task` that rank `owner` holds, in order,
// where `starts[d]` is document d's first packed row and every rank owns `local` > 0
// consecutive rows (the contiguous layout). Rows moved, routes and cross-node rows are
// all counted through it.
template <typename Piece>
void for_each_owner_piece(const Task& task, std::span<const int64_t> starts, int64_t local,
                          Piece&& piece) {
  const int64_t begin = starts[static_cast<size_t>(task.document)] + task.start;
  const int64_t end = begin + task.length();
  for (int64_t first = begin; first < end;) {
    const int64_t owner = first / local;
    const int64_t last = (owner + 1) * local < end ? (owner + 1) * local : end;
    piece(owner, first, last);
    first = last;
  }
}

// Options of a plan. Unset optionals are "omitted" in the seed's sense.
struct PlanOptions {
  Mode mode = Mode::kNone;
  // Greedy/hybrid: rows per pooled block before merging; default 2048. Setting it
  // for none/zigzag is an error, as in the seed.
  std::optional<int64_t> block_size = std::nullopt;
  // Hybrid only, required there: documents of at least this many rows keep their
  // zigzag chunks. Setting it for any other mode is an error.
  std::optional<int64_t> zigzag_min_length = std::nullopt;
};

// Default greedy/hybrid block size (seed: 2048).
inline constexpr int64_t kDefaultBlockSize = 2048;

// Seed `resolve_indexer_balance_block_size`: the effective block size of greedy and
// hybrid (2048 when omitted), nullopt for none/zigzag. Throws the seed's errors when
// a block size is given for another mode or is not positive.
std::optional<int64_t> resolve_block_size(Mode mode, std::optional<int64_t> block_size);

// Seed `validate_indexer_hybrid_threshold`: hybrid requires an explicit positive
// threshold; every other mode forbids one.
void validate_hybrid_threshold(Mode mode, std::optional<int64_t> zigzag_min_length);

// Seed `_validate_task_plan`: positive lengths, ratio and cp; sum(lengths) divisible
// by cp; block size at most the local row count. Returns the resolved block size.
// Also rejects batches whose totals or causal work do not fit in 64 bits.
// Unlike the seed, mode 'none' is accepted (see the header comment).
std::optional<int64_t> validate_plan_inputs(std::span<const int64_t> lengths, int64_t cp,
                                            int64_t ratio, Mode mode,
                                            std::optional<int64_t> block_size);

// The local row count sum(lengths) / cp after the seed's structural checks (cp >= 1,
// at least one document, every length >= 1, a sum that fits 64 bits and divides by cp),
// with the seed's text otherwise. Unlike validate_plan_inputs it needs no ratio and does
// not bound the causal work.
int64_t local_rows(std::span<const int64_t> lengths, int64_t cp);

// The seed's per-worker row cap of greedy and hybrid: 2 * local rows with
// local = total_rows / cp, saturating at INT64_MAX for shards above 2^62 rows (where
// 2 * local does not fit; no rank can be handed more rows than that anyway). Every
// planner that promises the seed's cap (greedy, hybrid, spill) uses this one
// definition. Needs total_rows >= 0 and cp >= 1 (validate_plan_inputs guarantees both).
int64_t worker_row_cap(int64_t total_rows, int64_t cp);

// An immutable per-rank task assignment. Tasks of each rank are sorted by
// (document, start, end), disjoint, and adjacent tasks of one document are merged.
// Any strategy that produces such lists can build one (see `TaskPlan::from_ranks`)
// and reuse the generic route builder in route.hpp.
class TaskPlan {
 public:
  TaskPlan() = default;

  // Builds a plan from per-rank task lists; sorts and merges each rank's tasks and
  // drops empty ones (seed `_merge_tasks`). Does not check coverage: see
  // `check_plan_covers`.
  static TaskPlan from_ranks(std::vector<std::vector<Task>> ranks);

  int64_t cp() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  std::span<const Task> tasks(int64_t rank) const;
  // Query rows assigned to `rank` (seed: `IndexerRoute.query_count`).
  int64_t rows(int64_t rank) const;
  // Total task count over all ranks.
  int64_t task_count() const { return static_cast<int64_t>(tasks_.size()); }

 private:
  std::vector<Task> tasks_;       // all ranks' tasks, rank-major
  std::vector<int64_t> offsets_;  // tasks of rank r: [offsets_[r], offsets_[r + 1])
};

// The most tasks plan_tasks builds (2^24, about 16.8 million: some hundreds of MB of
// bookkeeping). A plan that would hold more — greedy with a tiny block over billions
// of tokens, zigzag over very many long documents at a large CP — is rejected with an
// Error naming the count instead of exhausting memory. Not in the seed.
inline constexpr int64_t kMaxPlanTasks = int64_t{1} << 24;

// Seed `indexer_task_plan(lengths, size, ratio, mode, block_size, zigzag_min_length)`.
// Validation order and texts follow the seed; see the mode descriptions above. One limit
// the seed does not have: a plan may build at most kMaxPlanTasks tasks before merging
// (blocks, zigzag chunks and remainders, counted from the lengths before anything is
// allocated); beyond it, e.g. greedy blocks of 1 row on a 4-billion-token batch, it throws.
TaskPlan plan_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const PlanOptions& options);

// Throws Error unless `plan` assigns every row of every document to exactly one
// rank. Used by tests and by strategies that build plans themselves.
void check_plan_covers(const TaskPlan& plan, std::span<const int64_t> lengths);

// Figures of a plan (rows, work, cost, moved rows and bytes): plan_stats and Plan::stats
// in batch_plan.hpp.

}  // namespace sparsecp
