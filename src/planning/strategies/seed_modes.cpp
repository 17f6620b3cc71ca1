#include "sparsecp/planning/strategies/seed_modes.hpp"

#include "packed_sequence.hpp"

namespace sparsecp {

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
    return "Huawei hyper_parallel indexer_balance.indexer_task_plan (sparsecp::plan_tasks)";
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

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams& params) const override {
    validate_strategy_params(params);
    const PlanOptions options = resolve_seed_options(mode_, lengths, cp, params);
    Assignment result;
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
            strategies::largest_block_work(lengths, *options.block_size, ratio);
        break;
      case Mode::kHybrid:
        result.largest_unit_work = hybrid_largest_unit(lengths, cp, ratio, *options.block_size,
                                                       *options.zigzag_min_length);
        break;
    }
    return result;
  }

  std::string describe(std::span<const int64_t> lengths, int64_t cp,
                       const StrategyParams& params) const override {
    const PlanOptions options = resolve_seed_options(mode_, lengths, cp, params);
    std::string text;
    if (options.block_size) {
      text = "block " + std::to_string(*options.block_size) +
             (params.block_size ? "" : " (default: min(2048, rows per rank))");
    }
    if (options.zigzag_min_length) {
      text += ", zigzag_min_length " + std::to_string(*options.zigzag_min_length) +
              (params.zigzag_min_length ? "" : " (default: the rows per rank)");
    }
    return text;
  }

  IndexerRoute route(std::span<const int64_t> lengths, int64_t cp, int64_t rank, int64_t ratio,
                     const StrategyParams& params) const override {
    validate_strategy_params(params);
    return indexer_route(lengths, cp, rank, ratio,
                         resolve_seed_options(mode_, lengths, cp, params));
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
