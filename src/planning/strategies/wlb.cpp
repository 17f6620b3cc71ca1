#include "sparsecp/planning/strategies/wlb.hpp"

#include <algorithm>
#include <numeric>

#include "packed_sequence.hpp"

namespace sparsecp {
namespace {

class Wlb final : public Strategy {
 public:
  std::string_view name() const override { return "wlb"; }
  std::string_view source() const override {
    return "WLB-LLM (OSDI 2025) per-document CP sharding";
  }
  std::string_view summary() const override {
    return "long documents split in zigzag pairs over all ranks, short ones whole, "
           "round-robin by cost";
  }
  std::string_view unit() const override { return "short document or split chunk"; }
  int listing_order() const override { return 14; }

  std::string describe(std::span<const int64_t> lengths, int64_t cp,
                       const StrategyParams& params) const override {
    return "split length " + std::to_string(split_length(lengths, cp, params)) +
           (params.wlb_split_length ? "" : " (default: the rows per rank)");
  }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    strategies::validate_batch(lengths, cp, ratio);
    validate_strategy_params(params);
    const int64_t split = split_length(lengths, cp, params);
    std::vector<std::vector<Task>> ranks(static_cast<size_t>(cp));
    Assignment result;
    std::vector<int64_t> whole;  // documents placed whole
    for (size_t d = 0; d < lengths.size(); ++d) {
      const int64_t length = lengths[d];
      if (length <= split) {
        whole.push_back(static_cast<int64_t>(d));
        continue;
      }
      const int64_t chunks = 2 * cp;
      const auto boundary = [&](int64_t i) {
        // floor(i * length / chunks) without overflow: length < 2^63 / chunks is not
        // guaranteed, so split the product.
        return (length / chunks) * i + (length % chunks) * i / chunks;
      };
      for (int64_t rank = 0; rank < cp; ++rank) {
        for (const int64_t slot : {rank, chunks - 1 - rank}) {
          const int64_t start = boundary(slot);
          const int64_t end = boundary(slot + 1);
          if (end > start) ranks[static_cast<size_t>(rank)].push_back({int64_t(d), start, end});
          result.largest_unit_work =
              std::max(result.largest_unit_work, range_work(start, end, ratio));
        }
      }
    }
    std::stable_sort(whole.begin(), whole.end(), [&](int64_t a, int64_t b) {
      return work_prefix(lengths[static_cast<size_t>(a)], ratio) >
             work_prefix(lengths[static_cast<size_t>(b)], ratio);
    });
    for (size_t i = 0; i < whole.size(); ++i) {
      const int64_t d = whole[i];
      const int64_t length = lengths[static_cast<size_t>(d)];
      ranks[i % static_cast<size_t>(cp)].push_back({d, 0, length});
      result.largest_unit_work = std::max(result.largest_unit_work, work_prefix(length, ratio));
    }
    result.plan = TaskPlan::from_ranks(std::move(ranks));
    result.padding_rows.assign(static_cast<size_t>(cp), 0);
    return result;
  }

 private:
  static int64_t split_length(std::span<const int64_t> lengths, int64_t cp,
                              const StrategyParams& params) {
    if (params.wlb_split_length) return *params.wlb_split_length;
    strategies::validate_batch(lengths, cp, 1);
    return std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) / cp;
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_wlb_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<Wlb>());
  return made;
}

}  // namespace sparsecp
