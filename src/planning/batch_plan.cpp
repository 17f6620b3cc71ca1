#include "sparsecp/planning/batch_plan.hpp"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <optional>
#include <utility>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"

namespace sparsecp {

namespace {

int64_t max_of(const std::vector<int64_t>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

// max / mean of non-negative per-rank loads; 1 without load.
template <typename T>
double imbalance_of(const std::vector<T>& loads) {
  const double total = std::accumulate(loads.begin(), loads.end(), 0.0);
  if (!(total > 0)) return 1.0;
  const double most = static_cast<double>(*std::max_element(loads.begin(), loads.end()));
  return most * static_cast<double>(loads.size()) / total;
}

}  // namespace

RowTraffic row_traffic(const TaskPlan& tasks, std::span<const int64_t> lengths) {
  const int64_t cp = tasks.cp();
  RowTraffic traffic;
  traffic.sent.assign(static_cast<size_t>(cp), 0);
  traffic.received.assign(static_cast<size_t>(cp), 0);
  if (cp <= 0) return traffic;
  std::vector<int64_t> starts(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), starts.begin() + 1);
  const int64_t local = starts.back() / cp;
  if (local <= 0) return traffic;
  for (int64_t worker = 0; worker < cp; ++worker) {
    for (const Task& task : tasks.tasks(worker)) {
      for_each_owner_piece(task, starts, local, [&](int64_t owner, int64_t first, int64_t last) {
        if (owner == worker) return;
        traffic.sent[static_cast<size_t>(owner)] += last - first;
        traffic.received[static_cast<size_t>(worker)] += last - first;
        traffic.moved += last - first;
      });
    }
  }
  return traffic;
}

PlanStats plan_stats(const TaskPlan& tasks, std::span<const int64_t> lengths, int64_t ratio,
                     const CostModel& cost, const RowBytes& row_bytes) {
  const int64_t cp = tasks.cp();
  PlanStats stats;
  stats.rows.assign(static_cast<size_t>(cp), 0);
  stats.work.assign(static_cast<size_t>(cp), 0);
  stats.cost.assign(static_cast<size_t>(cp), 0.0);
  stats.fragments.assign(static_cast<size_t>(cp), 0);
  for (int64_t rank = 0; rank < cp; ++rank) {
    const auto r = static_cast<size_t>(rank);
    for (const Task& task : tasks.tasks(rank)) {
      stats.rows[r] += task.length();
      stats.work[r] += range_work(task.start, task.end, ratio);
      stats.cost[r] += cost.range(task.start, task.end, ratio);
    }
    stats.fragments[r] = static_cast<int64_t>(tasks.tasks(rank).size());
  }
  RowTraffic traffic = row_traffic(tasks, lengths);
  stats.rows_sent = std::move(traffic.sent);
  stats.rows_received = std::move(traffic.received);
  stats.rows_moved = traffic.moved;
  stats.max_rows_moved_per_rank = max_of(stats.rows_sent);
  stats.total_work = std::accumulate(stats.work.begin(), stats.work.end(), int64_t{0});
  stats.imbalance = imbalance_of(stats.work);
  stats.cost_imbalance = imbalance_of(stats.cost);
  stats.bytes_moved = row_bytes.wire_bytes(stats.rows_moved, stats.rows_moved);
  for (int64_t rank = 0; rank < cp; ++rank) {
    const auto r = static_cast<size_t>(rank);
    stats.max_bytes_sent_per_rank =
        std::max(stats.max_bytes_sent_per_rank,
                 row_bytes.wire_bytes(stats.rows_sent[r], stats.rows_received[r]));
  }
  return stats;
}

struct Plan::State {
  TaskPlan tasks;
  std::vector<int64_t> lengths;
  int64_t cp = 0;
  int64_t ratio = 0;
  std::string strategy;
  PlanLayout layout;
  CostModel cost;
  RowBytes row_bytes;

  mutable std::once_flag stats_once, balance_once, moved_once;
  mutable std::optional<PlanStats> stats;
  mutable std::optional<BalanceBound> balance;
  mutable std::optional<RowsMovedBound> moved;
};

Plan::Plan(TaskPlan tasks, std::vector<int64_t> lengths, int64_t cp, int64_t ratio,
           std::string strategy, PlanLayout layout, CostModel cost, RowBytes row_bytes) {
  SPARSECP_CHECK(tasks.cp() == cp, "a plan of ", tasks.cp(), " ranks cannot be a plan for cp ", cp);
  if (layout.padding_rows.empty()) layout.padding_rows.assign(static_cast<size_t>(cp), 0);
  SPARSECP_CHECK(static_cast<int64_t>(layout.padding_rows.size()) == cp, "a plan for cp ", cp,
                 " needs ", cp, " padding-row counts, got ", layout.padding_rows.size());
  auto state = std::make_shared<State>();
  state->tasks = std::move(tasks);
  state->lengths = std::move(lengths);
  state->cp = cp;
  state->ratio = ratio;
  state->strategy = std::move(strategy);
  state->layout = std::move(layout);
  state->cost = std::move(cost);
  state->row_bytes = row_bytes;
  state_ = std::move(state);
}

std::string_view Plan::strategy() const { return state_->strategy; }
int64_t Plan::cp() const { return state_->cp; }
int64_t Plan::ratio() const { return state_->ratio; }
std::span<const int64_t> Plan::lengths() const { return state_->lengths; }
const TaskPlan& Plan::tasks() const { return state_->tasks; }
const std::vector<int64_t>& Plan::padding_rows() const { return state_->layout.padding_rows; }
int64_t Plan::largest_unit_work() const { return state_->layout.largest_unit_work; }
const std::string& Plan::note() const { return state_->layout.note; }
const CostModel& Plan::cost_model() const { return state_->cost; }
const RowBytes& Plan::row_bytes() const { return state_->row_bytes; }

const PlanStats& Plan::stats() const {
  const State& s = *state_;
  std::call_once(s.stats_once,
                 [&] { s.stats = plan_stats(s.tasks, s.lengths, s.ratio, s.cost, s.row_bytes); });
  return *s.stats;
}

const BalanceBound& Plan::balance_bound() const {
  const State& s = *state_;
  std::call_once(s.balance_once,
                 [&] { s.balance = sparsecp::balance_bound(s.lengths, s.cp, s.ratio); });
  return *s.balance;
}

const RowsMovedBound& Plan::rows_moved_bound() const {
  const State& s = *state_;
  std::call_once(s.moved_once, [&] {
    const PlanStats& figures = stats();
    const int64_t busiest = max_of(figures.work);
    s.moved = rows_moved_lower_bound_at(s.lengths, s.cp, s.ratio, static_cast<double>(busiest));
  });
  return *s.moved;
}

double Plan::unit_bound() const {
  const PlanStats& figures = stats();
  if (figures.total_work == 0) return 1.0;
  const double mean = static_cast<double>(figures.total_work) / static_cast<double>(cp());
  return std::max(mean, static_cast<double>(largest_unit_work())) / mean;
}

IndexerRoute Plan::route(int64_t rank) const {
  SPARSECP_CHECK(rank >= 0 && rank < cp(), "Indexer balance rank must be inside its CP group");
  return make_route(state_->tasks, state_->lengths, rank, state_->ratio);
}

}  // namespace sparsecp
