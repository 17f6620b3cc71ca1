#include "sparsecp/planning/spill.hpp"

#include <algorithm>
#include <cmath>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/lower_bound.hpp"
#include "sparsecp/planning/node_map.hpp"

namespace sparsecp {

namespace {

// A shed tail (or what is left of it) on its way to a receiver.
struct Piece {
  int64_t document;
  int64_t start;
  int64_t end;
  int64_t owner;
};

// Largest n in [0, end - start] with cost(start, start + n) <= room: the cost is
// increasing in n.
int64_t rows_fitting(const CostModel& model, int64_t ratio, int64_t start, int64_t end,
                     double room) {
  if (!(room >= 0)) return 0;
  int64_t low = 0;
  int64_t high = end - start;
  if (model.range(start, end, ratio) <= room) return high;
  while (low < high) {
    const int64_t middle = low + (high - low + 1) / 2;
    if (model.range(start, start + middle, ratio) <= room) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

// One spill plan in the making: the five steps of spill.hpp, one method each, over
// shared state (the result so far, each rank's tasks and row count).
class SpillPlanner {
 public:
  SpillPlanner(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
               const SpillOptions& options)
      : cp_(cp),
        ratio_(ratio),
        model_(options.cost),
        bound_(options.max_received_fragments),
        per_node_(options.ranks_per_node) {
    int64_t total_rows = 0;
    for (const int64_t length : lengths) {
      total_rows += length;
      longest_ = std::max(longest_, length);
    }
    row_cap_ = worker_row_cap(total_rows, cp);  // the seed's 2 x local, saturating
    ranks_ = contiguous_pieces(lengths, cp);
    tasks_.resize(static_cast<size_t>(cp));
    rows_.assign(static_cast<size_t>(cp), total_rows / cp);
    result_.rows_shed.assign(static_cast<size_t>(cp), 0);
    result_.rows_received.assign(static_cast<size_t>(cp), 0);
    result_.received_fragments.assign(static_cast<size_t>(cp), 0);
    result_.owner_load = options.owner_load;
    result_.owner_load.resize(static_cast<size_t>(cp), 0.0);  // empty: zeros
  }

  // Step 1: every rank keeps its own contiguous rows; their loads.
  void keep_contiguous() {
    result_.load_before.assign(static_cast<size_t>(cp_), 0);
    double total_load = 0;
    for (int64_t r = 0; r < cp_; ++r) {
      for (const Task& piece : ranks_[static_cast<size_t>(r)]) {
        result_.load_before[static_cast<size_t>(r)] += model_.range(piece.start, piece.end, ratio_);
      }
      result_.load_before[static_cast<size_t>(r)] += owner_load_of(r);
      total_load += result_.load_before[static_cast<size_t>(r)];
    }
    result_.mean_load = total_load / static_cast<double>(cp_);
  }

  // Step 2: the target load T = max(target * mean, the costliest single row); with owner
  // loads, the row on the rank with the least owner load, and at least the largest owner
  // load (0 and 0 without one: the same T).
  void choose_target(double target_imbalance) {
    const auto [least, most] =
        std::minmax_element(result_.owner_load.begin(), result_.owner_load.end());
    result_.target_load =
        std::max({target_imbalance * result_.mean_load, *least + costliest_row(), *most});
  }

  // Step 3: each rank above T sheds its heaviest rows (document tails), the fewest that
  // carry its excess; it keeps the rest.
  void shed_excess() {
    result_.load_after = result_.load_before;
    for (int64_t r = 0; r < cp_; ++r) {
      const auto& pieces = ranks_[static_cast<size_t>(r)];
      double load = 0;  // load_before, less what the node exported
      for (const Task& piece : pieces) load += model_.range(piece.start, piece.end, ratio_);
      const Shed shed = heaviest_rows(pieces, ratio_, model_, load + owner_load_of(r) - target());
      double kept = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const Task& piece = pieces[i];
        if (shed.cut[i] > piece.start) {
          tasks_[static_cast<size_t>(r)].push_back({piece.document, piece.start, shed.cut[i]});
        }
        if (shed.cut[i] < piece.end) shed_.push_back({piece.document, shed.cut[i], piece.end, r});
        kept += model_.range(piece.start, shed.cut[i], ratio_);
      }
      result_.rows_shed[static_cast<size_t>(r)] += shed.rows;
      rows_[static_cast<size_t>(r)] -= shed.rows;
      result_.load_after[static_cast<size_t>(r)] = kept + owner_load_of(r);
    }
  }

  // Step 4: the shed tails, in packed order, fill the ranks that started below T in rank
  // order, each up to its deficit ("next fit": a tail is split only where a receiver is
  // full), within the row cap and the fragment bound. Returns what no receiver took.
  std::vector<Piece> fill_receivers() {
    if (per_node_ > 0) return fill_by_node();
    std::vector<int64_t> receivers;
    for (int64_t r = 0; r < cp_; ++r) {
      if (result_.load_before[static_cast<size_t>(r)] < target()) receivers.push_back(r);
    }
    return next_fit(shed_, receivers);
  }

  // Topology step (before step 3): each node above per_node * T exports its heaviest
  // rows, the fewest that carry its excess; its ranks keep the rest.
  void export_node_excess() {
    if (per_node_ == 0) return;
    for (int64_t node = 0; node < cp_ / per_node_; ++node) {
      std::vector<Task> pieces;
      std::vector<std::pair<int64_t, size_t>> where;  // (rank, index in ranks_[rank])
      double load = 0;
      for (int64_t r = node * per_node_; r < (node + 1) * per_node_; ++r) {
        const auto& own = ranks_[static_cast<size_t>(r)];
        for (size_t i = 0; i < own.size(); ++i) {
          pieces.push_back(own[i]);
          where.emplace_back(r, i);
        }
        load += result_.load_before[static_cast<size_t>(r)];
      }
      const Shed shed =
          heaviest_rows(pieces, ratio_, model_, load - static_cast<double>(per_node_) * target());
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (shed.cut[i] >= pieces[i].end) continue;
        const auto [rank, index] = where[i];
        exported_.push_back({pieces[i].document, shed.cut[i], pieces[i].end, rank});
        ranks_[static_cast<size_t>(rank)][index].end = shed.cut[i];
        result_.rows_shed[static_cast<size_t>(rank)] += pieces[i].end - shed.cut[i];
        rows_[static_cast<size_t>(rank)] -= pieces[i].end - shed.cut[i];
      }
      result_.cross_node_bound += shed.rows;
    }
  }

 private:
  // Step 4 with a node map: each node's shed tails fill its own ranks below T; then
  // the exported tails fill the ranks below T on the nodes that export nothing.
  std::vector<Piece> fill_by_node() {
    std::vector<Piece> leftover;
    std::vector<bool> exporting(static_cast<size_t>(cp_ / per_node_), false);
    for (const Piece& piece : exported_)
      exporting[static_cast<size_t>(piece.owner / per_node_)] = true;
    for (int64_t node = 0; node < cp_ / per_node_; ++node) {
      std::vector<Piece> own;
      for (const Piece& piece : shed_) {
        if (piece.owner / per_node_ == node) own.push_back(piece);
      }
      const auto rest = next_fit(own, receivers_below_target(node, node + 1, exporting, false));
      leftover.insert(leftover.end(), rest.begin(), rest.end());
    }
    const auto rest =
        next_fit(exported_, receivers_below_target(0, cp_ / per_node_, exporting, true));
    leftover.insert(leftover.end(), rest.begin(), rest.end());
    return leftover;
  }

  // Ranks below T on nodes [first, last) (only the non-exporting ones when asked).
  std::vector<int64_t> receivers_below_target(int64_t first, int64_t last,
                                              const std::vector<bool>& exporting,
                                              bool importers_only) const {
    std::vector<int64_t> receivers;
    for (int64_t r = first * per_node_; r < last * per_node_; ++r) {
      if (importers_only && exporting[static_cast<size_t>(r / per_node_)]) continue;
      if (result_.load_after[static_cast<size_t>(r)] < target()) receivers.push_back(r);
    }
    return receivers;
  }

  // Next fit of `pieces`, in order, over `receivers`, in order, each up to its deficit,
  // within the row cap and the fragment bound. Returns what no receiver took.
  std::vector<Piece> next_fit(std::span<const Piece> pieces, std::span<const int64_t> receivers) {
    std::vector<Piece> leftover;
    size_t current = 0;
    for (Piece piece : pieces) {
      while (piece.start < piece.end && current < receivers.size()) {
        const int64_t rank = receivers[current];
        const size_t q = static_cast<size_t>(rank);
        int64_t count = 0;
        if (bound_ == 0 || result_.received_fragments[q] < bound_) {
          count = std::min(rows_fitting(model_, ratio_, piece.start, piece.end,
                                        target() - result_.load_after[q]),
                           row_cap_ - rows_[q]);
        }
        if (count > 0) {
          place(piece, rank, count);
          piece.start += count;
        }
        if (piece.start < piece.end) ++current;  // this receiver is full
      }
      if (piece.start < piece.end) leftover.push_back(piece);
    }
    return leftover;
  }

 public:
  // Step 5: the rest. Raise the level one costliest row at a time and fill the ranks in
  // ascending load order (first fit, never the piece's owner), so that leftovers spread
  // instead of landing on one rank; what still remains goes a piece at a time to the
  // least-loaded rank other than its owner with row room.
  void place_leftovers(std::vector<Piece> leftover) {
    result_.leftover_pieces = static_cast<int64_t>(leftover.size());
    const double step = std::max(costliest_row(), 1e-300);
    double level = target();
    for (int round = 0; round < 4 && !leftover.empty(); ++round) {
      level += step;
      // With a node map, the sender's node first at each level.
      if (per_node_ > 0) leftover = fill_to_level(std::move(leftover), level, true);
      leftover = fill_to_level(std::move(leftover), level, false);
    }
    for (Piece piece : leftover) {
      while (piece.start < piece.end) {
        const int64_t rank = least_loaded_with_room(piece.owner);
        if (rank == piece.owner) {  // taken back: not shed, and not received either
          const size_t o = static_cast<size_t>(rank);
          result_.rows_shed[o] -= piece.end - piece.start;
          result_.rows_received[o] -= piece.end - piece.start;
          --result_.received_fragments[o];
        }
        const int64_t room = rank == piece.owner ? piece.end - piece.start
                                                 : row_cap_ - rows_[static_cast<size_t>(rank)];
        const int64_t count = std::min(piece.end - piece.start, room);
        place(piece, rank, count);
        piece.start += count;
      }
    }
  }

  SpillPlan finish() && {
    for (const int64_t shed : result_.rows_shed) result_.rows_moved += shed;
    result_.target_met = true;
    for (const double load : result_.load_after) {
      result_.target_met = result_.target_met && load <= target();
    }
    if (bound_ > 0) {
      for (const int64_t received : result_.received_fragments) {
        result_.fragment_bound_met = result_.fragment_bound_met && received <= bound_;
      }
    }
    result_.plan = TaskPlan::from_ranks(std::move(tasks_));
    return std::move(result_);
  }

 private:
  double target() const { return result_.target_load; }
  double owner_load_of(int64_t rank) const { return result_.owner_load[static_cast<size_t>(rank)]; }
  double costliest_row() const { return model_.row(visible_keys(longest_ - 1, ratio_)); }

  void place(const Piece& piece, int64_t rank, int64_t count) {
    const size_t q = static_cast<size_t>(rank);
    tasks_[q].push_back({piece.document, piece.start, piece.start + count});
    result_.load_after[q] += model_.range(piece.start, piece.start + count, ratio_);
    rows_[q] += count;
    result_.rows_received[q] += count;
    ++result_.received_fragments[q];
  }

  // One first-fit pass of the leftovers up to `level`, ranks in ascending load order
  // (only those on the piece owner's node when `same_node`).
  std::vector<Piece> fill_to_level(std::vector<Piece> leftover, double level, bool same_node) {
    std::vector<int64_t> order(static_cast<size_t>(cp_));
    for (int64_t r = 0; r < cp_; ++r) order[static_cast<size_t>(r)] = r;
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return result_.load_after[static_cast<size_t>(x)] <
             result_.load_after[static_cast<size_t>(y)];
    });
    std::vector<Piece> remaining;
    for (Piece piece : leftover) {
      for (const int64_t rank : order) {
        const size_t q = static_cast<size_t>(rank);
        if (rank == piece.owner || piece.start == piece.end) continue;
        if (same_node && rank / per_node_ != piece.owner / per_node_) continue;
        if (bound_ > 0 && result_.received_fragments[q] >= bound_) continue;
        const int64_t count = std::min(
            rows_fitting(model_, ratio_, piece.start, piece.end, level - result_.load_after[q]),
            row_cap_ - rows_[q]);
        if (count <= 0) continue;
        place(piece, rank, count);
        piece.start += count;
      }
      if (piece.start < piece.end) remaining.push_back(piece);
    }
    return remaining;
  }

  // The least-loaded rank other than `owner` with row room; the owner itself (taking the
  // piece back, which undoes its shedding) only when no other rank has room — unreachable
  // for valid inputs (the other ranks' room exceeds any owner's shed rows), kept so that
  // coverage never depends on that argument.
  int64_t least_loaded_with_room(int64_t owner) {
    int64_t best = -1;
    for (int64_t r = 0; r < cp_; ++r) {
      if (r == owner || rows_[static_cast<size_t>(r)] >= row_cap_) continue;
      if (best < 0 || result_.load_after[static_cast<size_t>(r)] <
                          result_.load_after[static_cast<size_t>(best)]) {
        best = r;
      }
    }
    if (best >= 0) return best;
    return owner;
  }

  int64_t cp_;
  int64_t ratio_;
  const CostModel& model_;
  int64_t bound_;
  int64_t per_node_;  // ranks per node; 0: no node map
  int64_t longest_ = 0;
  int64_t row_cap_ = 0;
  std::vector<std::vector<Task>> ranks_;  // contiguous pieces per rank
  std::vector<std::vector<Task>> tasks_;  // the plan so far
  std::vector<int64_t> rows_;             // rows each rank selects so far
  std::vector<Piece> shed_;               // shed tails, packed order
  std::vector<Piece> exported_;           // tails leaving their node, packed order
  SpillPlan result_;
};

}  // namespace

SpillPlan plan_spill(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                     const SpillOptions& options) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  SPARSECP_CHECK(std::isfinite(options.target_imbalance) && options.target_imbalance >= 1,
                 "spill target imbalance must be at least 1, got ", options.target_imbalance);
  SPARSECP_CHECK(options.max_received_fragments >= 0,
                 "spill fragment bound must be non-negative (0 = unbounded), got ",
                 options.max_received_fragments);
  validate_cost_model(options.cost);
  SPARSECP_CHECK(options.ranks_per_node >= 0,
                 "spill ranks per node must be non-negative (0 = no node map), got ",
                 options.ranks_per_node);
  if (options.ranks_per_node > 0) validate_node_map(cp, options.ranks_per_node);
  validate_owner_load(options.owner_load, cp);
  SpillPlanner planner(lengths, cp, ratio, options);
  planner.keep_contiguous();
  planner.choose_target(options.target_imbalance);
  planner.export_node_excess();
  planner.shed_excess();
  planner.place_leftovers(planner.fill_receivers());
  SpillPlan result = std::move(planner).finish();
  if (options.ranks_per_node > 0) {
    result.cross_node_rows = cross_node_rows(result.plan, lengths, options.ranks_per_node);
  }
  return result;
}

std::vector<double> owner_cost(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                               const CostModel& model) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  validate_cost_model(model);
  std::vector<double> cost(static_cast<size_t>(cp), 0.0);
  const auto ranks = contiguous_pieces(lengths, cp);
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const Task& piece : ranks[r]) cost[r] += model.range(piece.start, piece.end, ratio);
  }
  return cost;
}

void validate_owner_load(std::span<const double> owner_load, int64_t cp) {
  SPARSECP_CHECK(owner_load.empty() || static_cast<int64_t>(owner_load.size()) == cp,
                 "spill owner load needs one value per rank (cp ", cp, ") or none, got ",
                 owner_load.size(), " values");
  for (size_t r = 0; r < owner_load.size(); ++r) {
    SPARSECP_CHECK(std::isfinite(owner_load[r]) && owner_load[r] >= 0, "spill owner load of rank ",
                   r, " must be finite and non-negative, got ", owner_load[r]);
    SPARSECP_CHECK(owner_load[r] <= kMaxCostModelCoefficient, "spill owner load of rank ", r,
                   " must be at most ", kMaxCostModelCoefficient,
                   " (so that no rank's load overflows), got ", owner_load[r]);
  }
}

}  // namespace sparsecp
