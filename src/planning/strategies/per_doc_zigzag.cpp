#include "sparsecp/planning/strategies/per_doc_zigzag.hpp"

#include "packed_sequence.hpp"

namespace sparsecp {
namespace {

class PerDocumentZigzag final : public Strategy {
 public:
  std::string_view name() const override { return "per-doc-zigzag"; }
  std::string_view source() const override {
    return "Megatron-LM / TransformerEngine THD context parallelism "
           "(get_batch_on_this_cp_rank, thd_get_partitioned_indices)";
  }
  std::string_view summary() const override {
    return "every document padded to 2*cp chunks, chunks r and 2cp-1-r on rank r";
  }
  std::string_view unit() const override { return "row"; }
  int listing_order() const override { return 10; }

  Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                    const StrategyParams&) const override {
    strategies::validate_batch(lengths, cp, ratio);
    std::vector<std::vector<Task>> ranks(static_cast<size_t>(cp));
    Assignment result;
    result.padding_rows.assign(static_cast<size_t>(cp), 0);
    for (size_t d = 0; d < lengths.size(); ++d) {
      const int64_t length = lengths[d];
      const int64_t chunk = strategies::ceil_div(length, 2 * cp);
      for (int64_t rank = 0; rank < cp; ++rank) {
        for (const int64_t slot : {rank, 2 * cp - 1 - rank}) {
          // slot * chunk < length + 2 * cp; written so that nothing exceeds 2^63 - 1.
          const int64_t start = slot <= length / chunk ? std::min(length, slot * chunk) : length;
          const int64_t end = start + std::min(chunk, length - start);
          if (end > start) ranks[static_cast<size_t>(rank)].push_back({int64_t(d), start, end});
          result.padding_rows[static_cast<size_t>(rank)] += chunk - (end - start);
        }
      }
    }
    result.plan = TaskPlan::from_ranks(std::move(ranks));
    result.largest_unit_work = strategies::largest_row_work(lengths, ratio);
    return result;
  }
};

}  // namespace

std::vector<std::unique_ptr<const Strategy>> make_per_doc_zigzag_strategies() {
  std::vector<std::unique_ptr<const Strategy>> made;
  made.push_back(std::make_unique<PerDocumentZigzag>());
  return made;
}

}  // namespace sparsecp
