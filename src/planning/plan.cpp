#include "sparsecp/planning/plan.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <tuple>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"

namespace sparsecp {

namespace {

// 128-bit arithmetic for overflow checks of the causal work (a GCC/Clang extension).
__extension__ using Wide = __int128;

// Far beyond any CP group; it bounds the per-rank bookkeeping a hostile input can request.
constexpr int64_t kMaxCp = int64_t{1} << 20;

// Blocks of at most `block` rows over document rows [0, end); written so that a block
// size near 2^63 cannot overflow `start + block`.
void append_blocks(std::vector<Task>& tasks, int64_t document, int64_t end, int64_t block) {
  for (int64_t start = 0; start < end;) {
    const int64_t stop = start + std::min(block, end - start);
    tasks.push_back({document, start, stop});
    start = stop;
  }
}

int64_t task_work(const Task& task, int64_t ratio) {
  return range_work(task.start, task.end, ratio);
}

using Assignments = std::vector<std::vector<Task>>;

// Seed `_zigzag_tasks`: paired chunks r and 2*cp-1-r of every document, then the
// leading remainders pooled in packed order and dealt out `capacity` rows per rank.
Assignments zigzag_tasks(std::span<const int64_t> lengths, int64_t cp) {
  Assignments assignments(static_cast<size_t>(cp));
  std::vector<Task> remainders;
  for (size_t document = 0; document < lengths.size(); ++document) {
    const int64_t chunk = lengths[document] / (2 * cp);
    const int64_t remainder = lengths[document] % (2 * cp);
    const auto doc = static_cast<int64_t>(document);
    if (remainder) remainders.push_back({doc, 0, remainder});
    if (chunk) {
      for (int64_t rank = 0; rank < cp; ++rank) {
        for (const int64_t slot : {rank, 2 * cp - 1 - rank}) {
          const int64_t start = remainder + slot * chunk;
          assignments[static_cast<size_t>(rank)].push_back({doc, start, start + chunk});
        }
      }
    }
  }
  int64_t pooled = 0;
  for (const Task& task : remainders) pooled += task.length();
  const int64_t capacity = pooled / cp;
  int64_t rank = 0;
  int64_t used = 0;
  for (const Task& task : remainders) {
    int64_t start = task.start;
    while (start < task.end) {
      if (used == capacity) {
        ++rank;
        used = 0;
      }
      const int64_t end = std::min(task.end, start + capacity - used);
      assignments[static_cast<size_t>(rank)].push_back({task.document, start, end});
      used += end - start;
      start = end;
    }
  }
  return assignments;
}

// Seed `_assign_greedy_tasks`: tasks in descending work (ties by document, start,
// end) go to the least (work, rows, rank) worker whose rows stay within `capacity`.
void assign_greedy_tasks(Assignments& assignments, std::span<const Task> tasks, int64_t ratio,
                         int64_t capacity) {
  using Worker = std::tuple<int64_t, int64_t, int64_t>;  // (work, rows, rank)
  std::vector<Worker> workers;
  workers.reserve(assignments.size());
  for (size_t rank = 0; rank < assignments.size(); ++rank) {
    int64_t work = 0;
    int64_t rows = 0;
    for (const Task& task : assignments[rank]) {
      work += task_work(task, ratio);
      rows += task.length();
    }
    workers.emplace_back(work, rows, static_cast<int64_t>(rank));
  }
  std::priority_queue<Worker, std::vector<Worker>, std::greater<>> available(std::greater<>{},
                                                                             std::move(workers));
  std::vector<std::pair<int64_t, Task>> ordered;
  ordered.reserve(tasks.size());
  for (const Task& task : tasks) ordered.emplace_back(-task_work(task, ratio), task);
  std::sort(ordered.begin(), ordered.end());

  std::vector<Worker> skipped;
  for (const auto& [negative_work, task] : ordered) {
    skipped.clear();
    bool placed = false;
    Worker chosen;
    while (!available.empty()) {
      chosen = available.top();
      available.pop();
      if (std::get<1>(chosen) + task.length() <= capacity) {
        placed = true;
        break;
      }
      skipped.push_back(chosen);
    }
    SPARSECP_CHECK(placed, "No Indexer worker has capacity for ", task.length(),
                   " query rows (limit: ", capacity, ")");
    const auto [work, rows, rank] = chosen;
    assignments[static_cast<size_t>(rank)].push_back(task);
    available.emplace(work - negative_work, rows + task.length(), rank);
    for (const Worker& worker : skipped) available.push(worker);
  }
}

// Seed `_greedy_tasks`.
Assignments greedy_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t ratio, int64_t block,
                         int64_t total) {
  std::vector<Task> tasks;
  for (size_t document = 0; document < lengths.size(); ++document) {
    append_blocks(tasks, static_cast<int64_t>(document), lengths[document], block);
  }
  Assignments assignments(static_cast<size_t>(cp));
  assign_greedy_tasks(assignments, tasks, ratio, worker_row_cap(total, cp));
  return assignments;
}

// Seed `_hybrid_tasks`: long documents keep zigzag pairs; the rest shares the greedy pool.
Assignments hybrid_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t ratio, int64_t block,
                         int64_t min_length, int64_t total) {
  Assignments assignments(static_cast<size_t>(cp));
  std::vector<Task> pooled;
  for (size_t document = 0; document < lengths.size(); ++document) {
    const int64_t length = lengths[document];
    const int64_t chunk = length / (2 * cp);
    const int64_t remainder = length % (2 * cp);
    const auto doc = static_cast<int64_t>(document);
    int64_t pool_end = length;
    if (length >= min_length && chunk) {
      for (int64_t rank = 0; rank < cp; ++rank) {
        for (const int64_t slot : {rank, 2 * cp - 1 - rank}) {
          const int64_t start = remainder + slot * chunk;
          assignments[static_cast<size_t>(rank)].push_back({doc, start, start + chunk});
        }
      }
      pool_end = remainder;
    }
    append_blocks(pooled, doc, pool_end, block);
  }
  assign_greedy_tasks(assignments, pooled, ratio, worker_row_cap(total, cp));
  return assignments;
}

// Mode 'none': each rank keeps the document pieces inside its own shard.
Assignments contiguous_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t total) {
  Assignments assignments(static_cast<size_t>(cp));
  const int64_t local = total / cp;
  std::vector<int64_t> starts(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), starts.begin() + 1);
  for (size_t document = 0; document < lengths.size(); ++document) {
    const int64_t begin = starts[document];
    const Task whole{static_cast<int64_t>(document), 0, lengths[document]};
    for_each_owner_piece(whole, starts, local, [&](int64_t owner, int64_t first, int64_t last) {
      assignments[static_cast<size_t>(owner)].push_back(
          {whole.document, first - begin, last - begin});
    });
  }
  return assignments;
}

}  // namespace

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::kNone:
      return "none";
    case Mode::kZigzag:
      return "zigzag";
    case Mode::kGreedy:
      return "greedy";
    case Mode::kHybrid:
      return "hybrid";
  }
  return "unknown";
}

Mode parse_mode(std::string_view name) {
  for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
    if (name == mode_name(mode)) return mode;
  }
  SPARSECP_FAIL("indexer_load_balance must be 'none', 'zigzag', 'greedy' or 'hybrid'");
}

std::optional<int64_t> resolve_block_size(Mode mode, std::optional<int64_t> block_size) {
  const bool pooled = mode == Mode::kGreedy || mode == Mode::kHybrid;
  if (block_size) {
    SPARSECP_CHECK(pooled,
                   "indexer_balance_block_size requires indexer_load_balance='greedy' or 'hybrid'");
    SPARSECP_CHECK(*block_size >= 1, "indexer_balance_block_size must be a positive integer");
  }
  if (!pooled) return std::nullopt;
  return block_size.value_or(kDefaultBlockSize);
}

void validate_hybrid_threshold(Mode mode, std::optional<int64_t> zigzag_min_length) {
  if (mode != Mode::kHybrid) {
    SPARSECP_CHECK(!zigzag_min_length,
                   "indexer_zigzag_min_length requires indexer_load_balance='hybrid'");
  } else {
    SPARSECP_CHECK(zigzag_min_length && *zigzag_min_length >= 1,
                   "indexer_load_balance='hybrid' requires an explicit positive integer "
                   "indexer_zigzag_min_length");
  }
}

int64_t local_rows(std::span<const int64_t> lengths, int64_t cp) {
  // The seed's text, then what is wrong with these inputs.
  constexpr const char* kSeedText =
      "Indexer balance needs positive document lengths/ratio and an equal contiguous CP "
      "partition";
  SPARSECP_CHECK(cp >= 1, kSeedText, " (CP size ", cp, " is not positive)");
  SPARSECP_CHECK(!lengths.empty(), kSeedText, " (no document lengths)");
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t length = lengths[i];
    SPARSECP_CHECK(length >= 1, kSeedText, " (document ", i, " has length ", length, ")");
    if (__builtin_add_overflow(total, length, &total)) {
      SPARSECP_FAIL("Indexer balance document lengths sum beyond 64 bits (document of ", length,
                    " tokens)");
    }
  }
  SPARSECP_CHECK(total % cp == 0, kSeedText, " (", total, " tokens do not divide into ", cp,
                 " equal shards)");
  return total / cp;
}

std::optional<int64_t> validate_plan_inputs(std::span<const int64_t> lengths, int64_t cp,
                                            int64_t ratio, Mode mode,
                                            std::optional<int64_t> block_size) {
  SPARSECP_CHECK(ratio >= 1,
                 "Indexer balance needs positive document lengths/ratio and an equal contiguous CP "
                 "partition (ratio ",
                 ratio, " is not positive)");
  const int64_t local = local_rows(lengths, cp);
  Wide work = 0;
  for (const int64_t length : lengths) {
    // W(length) in 128 bits: a 64-bit overflow here must become an error, not a wrong plan.
    const Wide groups = length / ratio;
    work += ratio * (groups * (groups - 1) / 2) + groups * (length % ratio + 1);
  }
  SPARSECP_CHECK(work <= std::numeric_limits<int64_t>::max(),
                 "Indexer balance causal work of the batch exceeds 64 bits (", local * cp,
                 " tokens at ratio ", ratio, ")");
  SPARSECP_CHECK(cp <= kMaxCp, "Indexer balance CP size ", cp, " exceeds the supported maximum ",
                 kMaxCp);
  const std::optional<int64_t> block = resolve_block_size(mode, block_size);
  if (block) {
    SPARSECP_CHECK(*block <= local, "Indexer greedy block size ", *block,
                   " exceeds the local query count ", local);
  }
  return block;
}

int64_t worker_row_cap(int64_t total_rows, int64_t cp) {
  const int64_t local = total_rows / cp;
  return local > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max()
                                                         : 2 * local;
}

TaskPlan TaskPlan::from_ranks(std::vector<std::vector<Task>> ranks) {
  TaskPlan plan;
  plan.offsets_.reserve(ranks.size() + 1);
  plan.offsets_.push_back(0);
  size_t count = 0;
  for (const auto& tasks : ranks) count += tasks.size();
  plan.tasks_.reserve(count);
  for (auto& tasks : ranks) {
    std::sort(tasks.begin(), tasks.end());
    const size_t first = plan.tasks_.size();
    for (const Task& task : tasks) {
      if (plan.tasks_.size() > first && plan.tasks_.back().document == task.document &&
          plan.tasks_.back().end == task.start) {
        plan.tasks_.back().end = task.end;
      } else if (task.length()) {
        plan.tasks_.push_back(task);
      }
    }
    plan.offsets_.push_back(static_cast<int64_t>(plan.tasks_.size()));
  }
  return plan;
}

std::span<const Task> TaskPlan::tasks(int64_t rank) const {
  SPARSECP_CHECK(rank >= 0 && rank < cp(), "Indexer balance rank must be inside its CP group");
  const auto first = static_cast<size_t>(offsets_[static_cast<size_t>(rank)]);
  const auto last = static_cast<size_t>(offsets_[static_cast<size_t>(rank) + 1]);
  return std::span<const Task>(tasks_).subspan(first, last - first);
}

int64_t TaskPlan::rows(int64_t rank) const {
  int64_t rows = 0;
  for (const Task& task : tasks(rank)) rows += task.length();
  return rows;
}

namespace {

// Tasks the planner of `mode` (not 'none') creates before merging, an upper bound of
// the plan's task count, saturating at kMaxPlanTasks + 1. Inputs are validated.
int64_t planned_tasks(std::span<const int64_t> lengths, int64_t cp, Mode mode,
                      std::optional<int64_t> block, std::optional<int64_t> min_length) {
  Wide tasks = cp;  // the pooled remainders are split at most once per rank
  for (const int64_t length : lengths) {
    const bool pairs = length / (2 * cp) > 0 &&
                       (mode == Mode::kZigzag || (mode == Mode::kHybrid && length >= *min_length));
    if (pairs) tasks += 2 * cp;
    const int64_t pooled = pairs ? length % (2 * cp) : length;
    if (mode == Mode::kZigzag) {
      tasks += pooled > 0 ? 1 : 0;
    } else {
      tasks += pooled / *block + (pooled % *block != 0 ? 1 : 0);
    }
    if (tasks > kMaxPlanTasks) return kMaxPlanTasks + 1;
  }
  return static_cast<int64_t>(tasks);
}

}  // namespace

TaskPlan plan_tasks(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const PlanOptions& options) {
  const std::optional<int64_t> block =
      validate_plan_inputs(lengths, cp, ratio, options.mode, options.block_size);
  validate_hybrid_threshold(options.mode, options.zigzag_min_length);
  if (options.mode != Mode::kNone) {
    const int64_t tasks =
        planned_tasks(lengths, cp, options.mode, block, options.zigzag_min_length);
    SPARSECP_CHECK(
        tasks <= kMaxPlanTasks, "Indexer ", mode_name(options.mode), " plan would hold more than ",
        kMaxPlanTasks, " tasks, the supported maximum",
        options.mode == Mode::kZigzag ? "" : "; use a larger indexer_balance_block_size");
  }
  const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  switch (options.mode) {
    case Mode::kNone:
      return TaskPlan::from_ranks(contiguous_tasks(lengths, cp, total));
    case Mode::kZigzag:
      return TaskPlan::from_ranks(zigzag_tasks(lengths, cp));
    case Mode::kGreedy:
      return TaskPlan::from_ranks(greedy_tasks(lengths, cp, ratio, *block, total));
    case Mode::kHybrid:
      return TaskPlan::from_ranks(
          hybrid_tasks(lengths, cp, ratio, *block, *options.zigzag_min_length, total));
  }
  SPARSECP_FAIL("Indexer task mode must be 'zigzag', 'greedy' or 'hybrid'");
}

void check_plan_covers(const TaskPlan& plan, std::span<const int64_t> lengths) {
  std::vector<Task> all;
  all.reserve(static_cast<size_t>(plan.task_count()));
  for (int64_t rank = 0; rank < plan.cp(); ++rank) {
    for (const Task& task : plan.tasks(rank)) {
      SPARSECP_CHECK(task.document >= 0 && task.document < static_cast<int64_t>(lengths.size()),
                     "plan task of rank ", rank, " names document ", task.document, " of ",
                     lengths.size());
      SPARSECP_CHECK(0 <= task.start && task.start < task.end &&
                         task.end <= lengths[static_cast<size_t>(task.document)],
                     "plan task of rank ", rank, " has rows [", task.start, ", ", task.end,
                     ") outside document ", task.document, " of length ",
                     lengths[static_cast<size_t>(task.document)]);
      all.push_back(task);
    }
  }
  std::sort(all.begin(), all.end());
  size_t next = 0;
  for (size_t document = 0; document < lengths.size(); ++document) {
    int64_t covered = 0;
    while (next < all.size() && all[next].document == static_cast<int64_t>(document)) {
      SPARSECP_CHECK(all[next].start == covered, "plan ",
                     all[next].start < covered ? "repeats" : "misses", " rows of document ",
                     document, " near row ", std::min(covered, all[next].start));
      covered = all[next].end;
      ++next;
    }
    SPARSECP_CHECK(covered == lengths[document], "plan misses rows [", covered, ", ",
                   lengths[document], ") of document ", document);
  }
}

}  // namespace sparsecp
