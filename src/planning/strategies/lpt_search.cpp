#include "sparsecp/planning/strategies/lpt_search.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "packed_sequence.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp {

namespace {

// sum_{p < n} min(p + 1, window)
double window_prefix(int64_t n, int64_t window) {
  const double rows = static_cast<double>(n);
  const double w = static_cast<double>(window);
  if (n <= window) return rows * (rows + 1) / 2;
  return w * (w + 1) / 2 + (rows - w) * w;
}

// sum_{p < n} min(topk, floor((p + 1) / ratio)): rows before m = topk * ratio - 1 see
// fewer than topk keys.
double topk_prefix(int64_t n, int64_t ratio, int64_t topk) {
  const int64_t m = topk > (INT64_MAX / ratio) ? INT64_MAX : topk * ratio - 1;
  if (n <= m) return static_cast<double>(work_prefix(n, ratio));
  return static_cast<double>(work_prefix(m, ratio)) +
         static_cast<double>(topk) * static_cast<double>(n - m);
}

}  // namespace

double magi_row_cost(int64_t start, int64_t end, int64_t ratio, int64_t window, int64_t topk) {
  return (window_prefix(end, window) - window_prefix(start, window)) +
         (topk_prefix(end, ratio, topk) - topk_prefix(start, ratio, topk)) +
         static_cast<double>(range_work(start, end, ratio)) +
         0.25 * static_cast<double>(end - start);
}

namespace {

// The lexicographic objective: max load, then max rows, then total fragments.
using Objective = std::tuple<double, int64_t, int64_t>;

// The largest value over ranks other than `a` and `b`, from a top-3 list.
template <typename T>
struct Top3 {
  std::array<std::pair<T, int64_t>, 3> top{};
  int64_t size = 0;

  void rebuild(const std::vector<T>& values) {
    size = 0;
    for (int64_t r = 0; r < static_cast<int64_t>(values.size()); ++r) {
      std::pair<T, int64_t> item{values[static_cast<size_t>(r)], r};
      int64_t i = std::min<int64_t>(size, 2);
      if (size == 3 && !(item.first > top[2].first)) continue;
      if (size < 3) ++size;
      top[static_cast<size_t>(i)] = item;
      while (i > 0 && top[static_cast<size_t>(i)].first > top[static_cast<size_t>(i - 1)].first) {
        std::swap(top[static_cast<size_t>(i)], top[static_cast<size_t>(i - 1)]);
        --i;
      }
    }
  }
  T max_except(int64_t a, int64_t b) const {
    for (int64_t i = 0; i < size; ++i) {
      if (top[static_cast<size_t>(i)].second != a && top[static_cast<size_t>(i)].second != b) {
        return top[static_cast<size_t>(i)].first;
      }
    }
    return T{};
  }
  T max() const { return size > 0 ? top[0].first : T{}; }
  int64_t argmax() const { return size > 0 ? top[0].second : 0; }
};

class Solver {
 public:
  Solver(const strategies::PackedSequence& sequence, int64_t cp, int64_t ratio,
         const StrategyParams& params)
      : cp_(cp) {
    const int64_t total = sequence.total();
    const int64_t align = params.lpt_align;
    const int64_t count = strategies::ceil_div(total, align);
    begin_.resize(static_cast<size_t>(count + 1));
    cost_.resize(static_cast<size_t>(count));
    pieces_.resize(static_cast<size_t>(count));
    joint_.assign(static_cast<size_t>(count + 1), 0);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t begin = k * align;
      const int64_t end = begin + std::min(align, total - begin);
      begin_[static_cast<size_t>(k)] = begin;
      double cost = 0;
      int64_t pieces = 0;
      sequence.for_each_piece(begin, end, [&](int64_t, int64_t s, int64_t e) {
        cost += params.lpt_cost == RowCost::kMagi
                    ? magi_row_cost(s, e, ratio, params.window, params.topk)
                    : static_cast<double>(range_work(s, e, ratio));
        ++pieces;
      });
      cost_[static_cast<size_t>(k)] = cost;
      pieces_[static_cast<size_t>(k)] = pieces;
      // Fragment k joins fragment k - 1 when their boundary lies inside a document.
      if (k > 0) {
        const int64_t d = sequence.document_of(begin);
        joint_[static_cast<size_t>(k)] = sequence.start(d) != begin ? 1 : 0;
      }
    }
    begin_[static_cast<size_t>(count)] = total;
    const double cap = std::ceil(params.lpt_row_cap * static_cast<double>(total / cp));
    // A cap beyond 2^63 rows (lpt_row_cap is only bounded below) saturates: converting
    // such a double to int64 is undefined.
    cap_ = cap < 0x1p63 ? static_cast<int64_t>(cap) : std::numeric_limits<int64_t>::max();
    rank_.assign(static_cast<size_t>(count), 0);
    load_.assign(static_cast<size_t>(cp), 0.0);
    rows_.assign(static_cast<size_t>(cp), 0);
    fragments_.assign(static_cast<size_t>(cp), 0);
    members_.resize(static_cast<size_t>(cp));
  }

  int64_t fragments() const { return count(); }

  void place_lpt() {
    std::vector<int64_t> order(static_cast<size_t>(count()));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return cost(a) > cost(b); });
    for (const int64_t k : order) {
      int64_t best = -1;
      for (int64_t r = 0; r < cp_; ++r) {
        if (rows(r) + length(k) > cap_) continue;
        if (best < 0 || load(r) < load(best)) best = r;
      }
      if (best < 0) {  // nothing fits under the cap: the emptiest rank takes it
        best = 0;
        for (int64_t r = 1; r < cp_; ++r) {
          if (std::tie(rows_[static_cast<size_t>(r)], load_[static_cast<size_t>(r)]) <
              std::tie(rows_[static_cast<size_t>(best)], load_[static_cast<size_t>(best)])) {
            best = r;
          }
        }
      }
      rank_[static_cast<size_t>(k)] = best;
      load_[static_cast<size_t>(best)] += cost(k);
      rows_[static_cast<size_t>(best)] += length(k);
      members_[static_cast<size_t>(best)].insert({cost(k), k});
    }
    for (int64_t k = 0; k < count(); ++k) {
      const int64_t r = rank_[static_cast<size_t>(k)];
      fragments_[static_cast<size_t>(r)] += pieces_[static_cast<size_t>(k)];
      if (joins(k) && rank_[static_cast<size_t>(k - 1)] == r) --fragments_[static_cast<size_t>(r)];
    }
    total_fragments_ = std::accumulate(fragments_.begin(), fragments_.end(), int64_t{0});
  }

  void search(int64_t steps) {
    for (int64_t step = 0; step < steps; ++step) {
      if (!improve_bottleneck() && !improve_fragments()) break;
    }
  }

  std::vector<std::vector<Task>> tasks(const strategies::PackedSequence& sequence) const {
    std::vector<std::vector<Task>> ranks(static_cast<size_t>(cp_));
    for (int64_t k = 0; k < count(); ++k) {
      sequence.append_tasks(begin_[static_cast<size_t>(k)], begin_[static_cast<size_t>(k + 1)],
                            ranks[static_cast<size_t>(rank_[static_cast<size_t>(k)])]);
    }
    return ranks;
  }

 private:
  struct Candidate {
    Objective objective;
    int64_t unit = -1;
    int64_t target = -1;
    int64_t partner = -1;  // swap partner on `target`, or -1 for a move
  };

  int64_t count() const { return static_cast<int64_t>(cost_.size()); }
  double cost(int64_t k) const { return cost_[static_cast<size_t>(k)]; }
  int64_t length(int64_t k) const {
    return begin_[static_cast<size_t>(k + 1)] - begin_[static_cast<size_t>(k)];
  }
  double load(int64_t r) const { return load_[static_cast<size_t>(r)]; }
  int64_t rows(int64_t r) const { return rows_[static_cast<size_t>(r)]; }
  bool joins(int64_t k) const {
    return k > 0 && k < count() && joint_[static_cast<size_t>(k)] != 0;
  }
  bool on(int64_t k, int64_t r) const {
    return k >= 0 && k < count() && rank_[static_cast<size_t>(k)] == r;
  }

  // Change of the total fragment count when unit k moves from its rank to `to`.
  int64_t move_fragment_delta(int64_t k, int64_t to) const {
    const int64_t from = rank_[static_cast<size_t>(k)];
    const int64_t pieces = pieces_[static_cast<size_t>(k)];
    const int64_t lost = pieces - (joins(k) && on(k - 1, from)) - (joins(k + 1) && on(k + 1, from));
    const int64_t gained = pieces - (joins(k) && on(k - 1, to)) - (joins(k + 1) && on(k + 1, to));
    return gained - lost;
  }

  int64_t swap_fragment_delta(int64_t u, int64_t v) {
    const int64_t a = rank_[static_cast<size_t>(u)];
    const int64_t b = rank_[static_cast<size_t>(v)];
    const int64_t first = move_fragment_delta(u, b);
    rank_[static_cast<size_t>(u)] = b;
    const int64_t second = move_fragment_delta(v, a);
    rank_[static_cast<size_t>(u)] = a;
    return first + second;
  }

  Objective current() const { return {load_top_.max(), rows_top_.max(), total_fragments_}; }

  // The objective after rank a's load/rows change by (-dl, -dr) and rank b's by (+dl, +dr).
  Objective after(int64_t a, int64_t b, double dl, int64_t dr, int64_t dfrag) const {
    const double max_load = std::max({load(a) - dl, load(b) + dl, load_top_.max_except(a, b)});
    const int64_t max_rows = std::max({rows(a) - dr, rows(b) + dr, rows_top_.max_except(a, b)});
    return {max_load, max_rows, total_fragments_ + dfrag};
  }

  void consider_move(int64_t u, int64_t b, Candidate& best) const {
    const int64_t a = rank_[static_cast<size_t>(u)];
    if (a == b || rows(b) + length(u) > cap_) return;
    const Objective o = after(a, b, cost(u), length(u), move_fragment_delta(u, b));
    if (o < best.objective) best = {o, u, b, -1};
  }

  void consider_swap(int64_t u, int64_t v, Candidate& best) {
    const int64_t a = rank_[static_cast<size_t>(u)];
    const int64_t b = rank_[static_cast<size_t>(v)];
    if (a == b) return;
    const int64_t dr = length(u) - length(v);
    if (rows(b) + dr > std::max(cap_, rows(b)) || rows(a) - dr > std::max(cap_, rows(a))) return;
    const Objective o = after(a, b, cost(u) - cost(v), dr, swap_fragment_delta(u, v));
    if (o < best.objective) best = {o, u, b, v};
  }

  void refresh_tops() {
    load_top_.rebuild(load_);
    rows_top_.rebuild(rows_);
  }

  void move(int64_t u, int64_t b) {
    const int64_t a = rank_[static_cast<size_t>(u)];
    total_fragments_ += move_fragment_delta(u, b);
    members_[static_cast<size_t>(a)].erase({cost(u), u});
    members_[static_cast<size_t>(b)].insert({cost(u), u});
    load_[static_cast<size_t>(a)] -= cost(u);
    load_[static_cast<size_t>(b)] += cost(u);
    rows_[static_cast<size_t>(a)] -= length(u);
    rows_[static_cast<size_t>(b)] += length(u);
    rank_[static_cast<size_t>(u)] = b;
  }

  void apply(const Candidate& c) {
    const int64_t a = rank_[static_cast<size_t>(c.unit)];
    move(c.unit, c.target);
    if (c.partner >= 0) move(c.partner, a);
    refresh_tops();
  }

  // One step on the busiest rank (by load, and by rows): the best move or swap.
  bool improve_bottleneck() {
    refresh_tops();
    Candidate best{current()};
    const int64_t busiest = load_top_.argmax();
    const int64_t fullest = rows_top_.argmax();
    const int64_t sources[] = {busiest, fullest};
    for (size_t s = 0; s < (busiest == fullest ? 1u : 2u); ++s) {
      const int64_t source = sources[s];
      const auto units = members_[static_cast<size_t>(source)];  // copy: stable while scanning
      for (const auto& [unit_cost, u] : units) {
        for (int64_t b = 0; b < cp_; ++b) {
          if (b == source) continue;
          consider_move(u, b, best);
          // The swap partner v that evens the two loads best has cost(v) near
          // cost(u) - (load(source) - load(b)) / 2; try its neighbours in b's order.
          const auto& others = members_[static_cast<size_t>(b)];
          const double ideal = unit_cost - (load(source) - load(b)) / 2;
          auto it = others.lower_bound({ideal, -1});
          for (int i = 0; i < 2 && it != others.end(); ++i, ++it)
            consider_swap(u, it->second, best);
          it = others.lower_bound({ideal, -1});
          if (it != others.begin()) consider_swap(u, std::prev(it)->second, best);
        }
      }
    }
    if (best.unit < 0) return false;
    apply(best);
    return true;
  }

  // One pass joining fragments to a packed neighbour's rank; true if anything changed.
  bool improve_fragments() {
    refresh_tops();
    bool changed = false;
    for (int64_t k = 0; k < count(); ++k) {
      for (const int64_t neighbour : {k - 1, k + 1}) {
        if (neighbour < 0 || neighbour >= count() || !joins(std::max(k, neighbour))) continue;
        const int64_t b = rank_[static_cast<size_t>(neighbour)];
        if (b == rank_[static_cast<size_t>(k)]) continue;
        Candidate best{current()};
        consider_move(k, b, best);
        const auto& others = members_[static_cast<size_t>(b)];
        auto it = others.lower_bound({cost(k), -1});
        for (int i = 0; i < 2 && it != others.end(); ++i, ++it) {
          if (it->second != neighbour) consider_swap(k, it->second, best);
        }
        it = others.lower_bound({cost(k), -1});
        if (it != others.begin() && std::prev(it)->second != neighbour) {
          consider_swap(k, std::prev(it)->second, best);
        }
        if (best.unit >= 0) {
          apply(best);
          changed = true;
        }
      }
    }
    return changed;
  }

  int64_t cp_;
  int64_t cap_ = 0;
  std::vector<int64_t> begin_;   // fragment k: packed rows [begin_[k], begin_[k + 1])
  std::vector<double> cost_;     // internal cost of fragment k
  std::vector<int64_t> pieces_;  // documents fragment k touches
  std::vector<char> joint_;      // fragment k continues the document of fragment k - 1
  std::vector<int64_t> rank_;    // where fragment k is placed
  std::vector<double> load_;
  std::vector<int64_t> rows_;
  std::vector<int64_t> fragments_;
  int64_t total_fragments_ = 0;
  std::vector<std::set<std::pair<double, int64_t>>> members_;  // (cost, fragment) per rank
  Top3<double> load_top_;
  Top3<int64_t> rows_top_;
};

class LptSearch final : public Strategy {
 public:
  std::string_view name() const override { return "lpt-search"; }
  std::string_view source() const override {
    return "MagiAttention DSA dispatch solver (SandAI-org/MagiAttention): LPT + move/swap search";
  }
  std::string_view summary() const override {
    return "aligned fragments, LPT under a row cap, then bounded move/swap search";
  }
  std::string_view unit() const override { return "fragment"; }
  std::string describe(std::span<const int64_t>, int64_t,
                       const StrategyParams& params) const override {
    std::ostringstream text;
    text << "align " << params.lpt_align << ", row cap x" << params.lpt_row_cap << ", "
         << params.lpt_search_steps << " search steps, fragment cap " << params.lpt_fragment_cap
         << ", " << row_cost_name(params.lpt_cost) << " row cost";
    return text.str();
  }
  int listing_order() const override { return 13; }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    strategies::validate_batch(lengths, cp, ratio);
    validate_strategy_params(params);
    const strategies::PackedSequence sequence(lengths);
    Solver solver(sequence, cp, ratio, params);
    solver.place_lpt();
    solver.search(params.lpt_search_steps);
    Assignment result;
    result.plan = TaskPlan::from_ranks(solver.tasks(sequence));
    result.padding_rows.assign(static_cast<size_t>(cp), 0);
    result.largest_unit_work = sequence.largest_chunk_work(params.lpt_align, ratio);
    if (params.lpt_fragment_cap > 0) {
      int64_t most = 0;
      for (int64_t r = 0; r < cp; ++r) {
        most = std::max<int64_t>(most, static_cast<int64_t>(result.plan.tasks(r).size()));
      }
      if (most > params.lpt_fragment_cap) {
        result.plan = plan_tasks(lengths, cp, ratio, PlanOptions{.mode = Mode::kNone});
        result.note = "fragment cap exceeded: contiguous fallback";
      }
    }
    return result;
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_lpt_search_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<LptSearch>());
  return made;
}

}  // namespace sparsecp
