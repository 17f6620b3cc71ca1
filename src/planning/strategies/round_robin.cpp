#include "sparsecp/planning/strategies/round_robin.hpp"

#include "packed_sequence.hpp"

namespace sparsecp {
namespace {

class RoundRobin final : public Strategy {
 public:
  std::string_view name() const override { return "round-robin"; }
  std::string_view source() const override {
    return "SGLang NSA prefill CP, nsa_prefill_cp_mode='round-robin-split'";
  }
  std::string_view summary() const override { return "packed token i on rank i mod cp"; }
  std::string_view unit() const override { return "row"; }
  int listing_order() const override { return 11; }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams&) const override {
    const int64_t total = strategies::validate_batch(lengths, cp, ratio);
    std::vector<std::vector<Task>> ranks(static_cast<size_t>(cp));
    for (auto& tasks : ranks) tasks.reserve(static_cast<size_t>(total / cp));
    int64_t row = 0;
    for (size_t d = 0; d < lengths.size(); ++d) {
      if (cp == 1) {
        ranks[0].push_back({int64_t(d), 0, lengths[d]});
        continue;
      }
      for (int64_t p = 0; p < lengths[d]; ++p, ++row) {
        ranks[static_cast<size_t>(row % cp)].push_back({int64_t(d), p, p + 1});
      }
    }
    Assignment result;
    result.plan = TaskPlan::from_ranks(std::move(ranks));
    result.padding_rows.assign(static_cast<size_t>(cp), 0);
    result.largest_unit_work = strategies::largest_row_work(lengths, ratio);
    return result;
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_round_robin_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<RoundRobin>());
  return made;
}

}  // namespace sparsecp
