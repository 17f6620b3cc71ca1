#include "sparsecp/planning/lower_bound.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "sparsecp/error.hpp"
#include "sparsecp/planning/cost.hpp"

namespace sparsecp {

std::vector<std::vector<Task>> contiguous_pieces(std::span<const int64_t> lengths, int64_t cp) {
  int64_t total = 0;
  for (const int64_t length : lengths) total += length;
  const int64_t local = total / cp;
  std::vector<std::vector<Task>> ranks(static_cast<size_t>(cp));
  int64_t document = 0;
  int64_t document_start = 0;  // global row of the document's first row
  for (int64_t rank = 0; rank < cp; ++rank) {
    const int64_t first = rank * local;
    const int64_t last = first + local;
    while (document < static_cast<int64_t>(lengths.size()) && document_start < last) {
      const int64_t length = lengths[static_cast<size_t>(document)];
      const int64_t begin = std::max(first, document_start);
      const int64_t end = std::min(last, document_start + length);
      if (end > begin) {
        ranks[static_cast<size_t>(rank)].push_back(
            {document, begin - document_start, end - document_start});
      }
      if (document_start + length > last) break;  // continues on the next rank
      document_start += length;
      ++document;
    }
  }
  return ranks;
}

namespace {

void validate(std::span<const int64_t> lengths, int64_t cp, int64_t ratio, const CostModel& model) {
  validate_plan_inputs(lengths, cp, ratio, Mode::kNone, std::nullopt);
  validate_cost_model(model);
}

double largest_row_cost(std::span<const int64_t> lengths, int64_t ratio, const CostModel& model) {
  int64_t longest = 0;
  for (const int64_t length : lengths) longest = std::max(longest, length);
  return model.row(visible_keys(longest - 1, ratio));
}

BalanceBound bound_of(double total, double largest, int64_t cp) {
  BalanceBound bound;
  bound.mean_load = total / static_cast<double>(cp);
  bound.largest_row = largest;
  bound.bound = bound.mean_load > 0 ? std::max(bound.mean_load, largest) / bound.mean_load : 1.0;
  return bound;
}

// First document position whose row sees at least `visible` keys; INT64_MAX (beyond any
// document, callers clamp it) when visible * ratio does not fit in 64 bits.
int64_t first_row_seeing(int64_t visible, int64_t ratio) {
  if (visible <= 0) return 0;
  int64_t position = 0;
  if (__builtin_mul_overflow(visible, ratio, &position)) return INT64_MAX;
  return position - 1;
}

}  // namespace

BalanceBound balance_bound(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                           const CostModel& model) {
  validate(lengths, cp, ratio, model);
  double total = 0;
  for (const int64_t length : lengths) total += model.prefix(length, ratio);
  return bound_of(total, largest_row_cost(lengths, ratio, model), cp);
}

Shed heaviest_rows(std::span<const Task> pieces, int64_t ratio, const CostModel& model,
                   double excess) {
  Shed shed;
  shed.cut.reserve(pieces.size());
  for (const Task& piece : pieces) shed.cut.push_back(piece.end);
  if (!(excess > 0) || pieces.empty()) return shed;

  // Cost of the rows that see at least `visible` keys, and the highest such level.
  const auto cost_from = [&](int64_t visible) {
    double cost = 0;
    for (const Task& piece : pieces) {
      const int64_t begin = std::clamp(first_row_seeing(visible, ratio), piece.start, piece.end);
      cost += model.range(begin, piece.end, ratio);
    }
    return cost;
  };
  int64_t top = 0;
  for (const Task& piece : pieces) {
    if (piece.end > piece.start) top = std::max(top, visible_keys(piece.end - 1, ratio));
  }
  if (cost_from(0) < excess) {  // not enough in the whole rank: shed everything
    for (size_t i = 0; i < pieces.size(); ++i) {
      shed.cut[i] = pieces[i].start;
      shed.rows += pieces[i].length();
    }
    shed.cost = cost_from(0);
    return shed;
  }
  // Largest level v with cost_from(v) >= excess (cost_from never increases with v).
  int64_t low = 0;
  int64_t high = top;
  while (low < high) {
    const int64_t middle = low + (high - low + 1) / 2;
    if (cost_from(middle) >= excess) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  const int64_t level = low;
  const double above = cost_from(level + 1);  // < excess
  const double each = model.row(level);       // > 0, or cost_from(level) == above
  int64_t band_rows = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Task& piece = pieces[i];
    shed.cut[i] = std::clamp(first_row_seeing(level + 1, ratio), piece.start, piece.end);
    shed.rows += piece.end - shed.cut[i];
    band_rows += shed.cut[i] - std::clamp(first_row_seeing(level, ratio), piece.start, piece.end);
  }
  // Fewest band rows k with above + k * each >= excess.
  int64_t take = each > 0 ? static_cast<int64_t>(std::ceil((excess - above) / each)) : band_rows;
  take = std::clamp<int64_t>(take, 0, band_rows);
  while (take > 0 && above + static_cast<double>(take - 1) * each >= excess) --take;
  while (take < band_rows && above + static_cast<double>(take) * each < excess) ++take;
  shed.rows += take;
  shed.cost = above + static_cast<double>(take) * each;
  // Ties: extend tails that already move, then start new ones, in packed order.
  for (const bool extending : {true, false}) {
    for (size_t i = 0; i < pieces.size() && take > 0; ++i) {
      const Task& piece = pieces[i];
      if ((shed.cut[i] < piece.end) != extending) continue;
      const int64_t band_begin = std::clamp(first_row_seeing(level, ratio), piece.start, piece.end);
      const int64_t rows = std::min(take, shed.cut[i] - band_begin);
      shed.cut[i] -= rows;
      take -= rows;
    }
  }
  return shed;
}

RowsMovedBound rows_moved_lower_bound_at(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio, double target_load,
                                         const CostModel& model) {
  validate(lengths, cp, ratio, model);
  SPARSECP_CHECK(!std::isnan(target_load), "target load must be a number");
  RowsMovedBound bound;
  bound.target_load = target_load;
  const auto ranks = contiguous_pieces(lengths, cp);
  double total = 0;
  for (const auto& pieces : ranks) {
    double load = 0;
    for (const Task& piece : pieces) load += model.range(piece.start, piece.end, ratio);
    bound.load.push_back(load);
    total += load;
    const Shed shed = heaviest_rows(pieces, ratio, model, load - target_load);
    bound.rows.push_back(shed.rows);
    bound.total += shed.rows;
    bound.max_per_rank = std::max(bound.max_per_rank, shed.rows);
  }
  bound.mean_load = total / static_cast<double>(cp);
  return bound;
}

RowsMovedBound rows_moved_lower_bound(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                                      double target_imbalance, const CostModel& model) {
  SPARSECP_CHECK(std::isfinite(target_imbalance) && target_imbalance >= 1,
                 "target imbalance must be at least 1, got ", target_imbalance);
  const BalanceBound balance = balance_bound(lengths, cp, ratio, model);
  const double target = std::max(target_imbalance * balance.mean_load, balance.largest_row);
  return rows_moved_lower_bound_at(lengths, cp, ratio, target, model);
}

BalanceBound balance_bound_reference(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                                     const CostModel& model) {
  validate(lengths, cp, ratio, model);
  double total = 0;
  double largest = 0;
  for (const int64_t length : lengths) {
    for (int64_t p = 0; p < length; ++p) {
      const double cost = model.row(visible_keys(p, ratio));
      total += cost;
      largest = std::max(largest, cost);
    }
  }
  return bound_of(total, largest, cp);
}

RowsMovedBound rows_moved_lower_bound_reference(std::span<const int64_t> lengths, int64_t cp,
                                                int64_t ratio, double target_load,
                                                const CostModel& model) {
  validate(lengths, cp, ratio, model);
  RowsMovedBound bound;
  bound.target_load = target_load;
  std::vector<double> costs;  // every row's cost in packed order
  for (const int64_t length : lengths) {
    for (int64_t p = 0; p < length; ++p) costs.push_back(model.row(visible_keys(p, ratio)));
  }
  const size_t local = costs.size() / static_cast<size_t>(cp);
  double total = 0;
  for (int64_t rank = 0; rank < cp; ++rank) {
    std::vector<double> mine(costs.begin() + static_cast<std::ptrdiff_t>(rank * local),
                             costs.begin() + static_cast<std::ptrdiff_t>((rank + 1) * local));
    double load = 0;
    for (const double cost : mine) load += cost;
    total += load;
    bound.load.push_back(load);
    std::sort(mine.begin(), mine.end(), std::greater<>());
    int64_t rows = 0;
    double shed = 0;
    while (shed < load - target_load && rows < static_cast<int64_t>(mine.size())) {
      shed += mine[static_cast<size_t>(rows)];
      ++rows;
    }
    bound.rows.push_back(rows);
    bound.total += rows;
    bound.max_per_rank = std::max(bound.max_per_rank, rows);
  }
  bound.mean_load = total / static_cast<double>(cp);
  return bound;
}

}  // namespace sparsecp
