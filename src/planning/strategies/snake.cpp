#include "sparsecp/planning/strategies/snake.hpp"

#include <algorithm>
#include <numeric>

#include "packed_sequence.hpp"
#include "sparsecp/error.hpp"

namespace sparsecp {
namespace {

class Snake final : public Strategy {
 public:
  std::string_view name() const override { return "snake"; }
  std::string_view source() const override {
    return "PyTorch CP _PTRRLoadBalancer.ptrr_scheduling (torch/distributed/tensor/experimental/"
           "_context_parallel/_load_balancer.py)";
  }
  std::string_view summary() const override {
    return "packed blocks sorted by cost, dealt to ranks in snake order";
  }
  std::string_view unit() const override { return "block"; }
  std::string describe(std::span<const int64_t>, int64_t,
                       const StrategyParams& params) const override {
    return "block " + std::to_string(params.snake_block);
  }
  int listing_order() const override { return 12; }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    const int64_t total = strategies::validate_batch(lengths, cp, ratio);
    const int64_t block = params.snake_block;
    validate_strategy_params(params);
    const strategies::PackedSequence sequence(lengths);
    const int64_t blocks = strategies::ceil_div(total, block);
    // Block b holds rows [b * block, end_of(b)); b * block < total, so neither overflows.
    const auto end_of = [&](int64_t b) { return b * block + std::min(block, total - b * block); };
    std::vector<int64_t> work(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) {
      work[static_cast<size_t>(b)] = sequence.work(b * block, end_of(b), ratio);
    }
    std::vector<int64_t> order(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return work[static_cast<size_t>(a)] > work[static_cast<size_t>(b)];
    });
    std::vector<std::vector<Task>> ranks(static_cast<size_t>(cp));
    Assignment result;
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t round = i / cp;
      const int64_t seat = i % cp;
      const int64_t rank = round % 2 == 0 ? seat : cp - 1 - seat;
      const int64_t b = order[static_cast<size_t>(i)];
      sequence.append_tasks(b * block, end_of(b), ranks[static_cast<size_t>(rank)]);
      result.largest_unit_work = std::max(result.largest_unit_work, work[static_cast<size_t>(b)]);
    }
    result.plan = TaskPlan::from_ranks(std::move(ranks));
    result.padding_rows.assign(static_cast<size_t>(cp), 0);
    return result;
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_snake_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<Snake>());
  return made;
}

}  // namespace sparsecp
