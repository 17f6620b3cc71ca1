#include "sparsecp/planning/strategies/seed_modes.hpp"

#include "packed_sequence.hpp"

namespace sparsecp {

int64_t hybrid_threshold(const StrategyParams& params, int64_t total_rows, int64_t cp) {
  return params.zigzag_min_length.value_or(total_rows / cp);
}

namespace {

// Hybrid places two kinds of indivisible units: the zigzag chunk pair of a long
// document (fixed to its rank) and the pooled blocks of everything else.
int64_t hybrid_largest_unit(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                            int64_t block, int64_t min_length) {
  int64_t largest = 0;
  for (const int64_t length : lengths) {
    const int64_t chunk = length / (2 * cp);
    const int64_t remainder = length % (2 * cp);
    int64_t pooled = length;
    if (length >= min_length && chunk > 0) {
      for (int64_t rank = 0; rank < cp; ++rank) {
        int64_t pair = 0;
        for (const int64_t slot : {rank, 2 * cp - 1 - rank}) {
          const int64_t start = remainder + slot * chunk;
          pair += range_work(start, start + chunk, ratio);
        }
        largest = std::max(largest, pair);
      }
      pooled = remainder;
    }
    if (pooled > 0) {
      const int64_t one[] = {pooled};
      largest = std::max(largest, strategies::largest_block_work(one, block, ratio));
    }
  }
  return largest;
}

class SeedMode final : public Strategy {
 public:
  explicit SeedMode(Mode mode) : mode_(mode) {}

  std::string_view name() const override { return mode_name(mode_); }
  std::string_view source() const override {
    return "seed indexer_balance.py indexer_task_plan (sparsecp::plan_tasks)";
  }
  std::string_view summary() const override {
    switch (mode_) {
      case Mode::kNone:
        return "contiguous shards, nothing moves (Llama-3 style)";
      case Mode::kZigzag:
        return "per-document zigzag chunk pairs, remainders pooled";
      case Mode::kGreedy:
        return "document blocks, heaviest first to the least-loaded rank";
      case Mode::kHybrid:
        return "zigzag for long documents, greedy blocks for the rest";
    }
    return "";
  }
  std::string_view unit() const override {
    switch (mode_) {
      case Mode::kNone:
        return "shard";
      case Mode::kZigzag:
        return "row";
      default:
        return "block";
    }
  }
  int listing_order() const override { return static_cast<int>(mode_); }

  StrategyPlan plan(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    PlanOptions options{.mode = mode_};
    if (mode_ == Mode::kGreedy || mode_ == Mode::kHybrid) options.block_size = params.block_size;
    if (mode_ == Mode::kHybrid) {
      // The default threshold needs the total; lengths are not validated yet (plan_tasks
      // does that, with the seed's texts), so the sum must not overflow on its own.
      int64_t total = 0;
      bool summed = true;
      for (const int64_t length : lengths) {
        summed = summed && !__builtin_add_overflow(total, length, &total);
      }
      if (cp > 0 && summed) options.zigzag_min_length = hybrid_threshold(params, total, cp);
    }
    StrategyPlan result;
    result.plan = plan_tasks(lengths, cp, ratio, options);
    result.padding_rows.assign(static_cast<size_t>(cp), 0);
    switch (mode_) {
      case Mode::kNone: {
        const strategies::PackedSequence sequence(lengths);
        const int64_t local = sequence.total() / cp;
        for (int64_t rank = 0; rank < cp; ++rank) {
          result.largest_unit_work = std::max(
              result.largest_unit_work, sequence.work(rank * local, (rank + 1) * local, ratio));
        }
        break;
      }
      case Mode::kZigzag:
        result.largest_unit_work = strategies::largest_row_work(lengths, ratio);
        break;
      case Mode::kGreedy:
        result.largest_unit_work =
            strategies::largest_block_work(lengths, params.block_size, ratio);
        break;
      case Mode::kHybrid:
        result.largest_unit_work =
            hybrid_largest_unit(lengths, cp, ratio, params.block_size, *options.zigzag_min_length);
        break;
    }
    return result;
  }

 private:
  Mode mode_;
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_seed_modes_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  for (const Mode mode : {Mode::kNone, Mode::kZigzag, Mode::kGreedy, Mode::kHybrid}) {
    made.push_back(std::make_unique<SeedMode>(mode));
  }
  return made;
}

}  // namespace sparsecp
