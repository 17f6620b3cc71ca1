// sparsecp: balancing strategies behind one interface, and the registry that names them.
//
// A strategy decides which CP rank runs the Lightning Indexer selection for which query
// rows of a packed batch. Every strategy returns a TaskPlan (plan.hpp), so the generic
// route builder `make_route` (route.hpp) turns any of them into a working route for the
// executor, and `simulate` (simulate.hpp) can measure all of them side by side.
//
// The built-in strategies, in listing order (each file in include/sparsecp/planning/strategies/
// documents its source):
//   none, zigzag, greedy, hybrid   the seed's modes, bit-exact adapters over plan_tasks
//   per-doc-zigzag                 Megatron / TransformerEngine THD per-document zigzag
//   round-robin                    SGLang's token round-robin split
//   snake                          PyTorch's _PTRRLoadBalancer (snake round-robin by cost)
//   lpt-search                     MagiAttention's DSA dispatch-solver idea (LPT + search)
//
// Adding a strategy: one file src/planning/strategies/<stem>.cpp that defines
//   std::vector<std::unique_ptr<const Strategy>> make_<stem>_strategies();
// in namespace sparsecp (plus its documented header under
// include/sparsecp/planning/strategies/), its factory in the registry list of
// src/planning/strategy.cpp, and its source in src/CMakeLists.txt.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsecp/planning/plan.hpp"

namespace sparsecp {

// How lpt-search prices one query row internally (the reported work is always the
// causal-pair work of cost.hpp, so every strategy is compared on the same scale).
enum class RowCost {
  // MagiAttention's DSA per-row cost: min(p + 1, window) + min(topk, vis) + vis + 0.25
  // with vis = floor((p + 1) / ratio) (sliding window, sparse attention, indexer).
  kMagi,
  // The causal indexer work of cost.hpp: vis.
  kCausal,
};

// "magi" or "causal"; parse_row_cost throws Error naming the value otherwise.
std::string_view row_cost_name(RowCost cost);
RowCost parse_row_cost(std::string_view name);

// Parameters of all strategies in one place; each strategy reads only the fields named
// for it and ignores the rest, so one parameter set can drive a whole sweep.
struct StrategyParams {
  // greedy, hybrid: rows per pooled block (the seed's indexer_balance_block_size).
  // Simulations clamp it to the local row count, which the seed requires.
  int64_t block_size = kDefaultBlockSize;
  // hybrid: documents of at least this many rows keep their zigzag chunks (the seed's
  // indexer_zigzag_min_length, which has no default there). Unset: the local row count
  // sum(lengths) / cp, i.e. documents at least one shard long keep zigzag pairs.
  std::optional<int64_t> zigzag_min_length;
  // snake: rows per block of the packed sequence (PyTorch flex_attention's BLOCK_SIZE).
  int64_t snake_block = 128;
  // lpt-search: rows per fragment of the packed sequence (MagiAttention's chunk size).
  int64_t lpt_align = 128;
  // lpt-search: per-rank row cap as a multiple of the local row count (>= 1).
  double lpt_row_cap = 1.0;
  // lpt-search: at most this many improving moves/swaps after LPT.
  int64_t lpt_search_steps = 64;
  // lpt-search: if > 0 and some rank ends with more fragments, fall back to the
  // contiguous plan ('none'), as MagiAttention does with its fragment cap (64).
  int64_t lpt_fragment_cap = 0;
  // lpt-search: its internal per-row cost, and the attention shape that cost uses.
  RowCost lpt_cost = RowCost::kMagi;
  int64_t window = 128;
  int64_t topk = 512;
};

// What a strategy returns.
struct StrategyPlan {
  TaskPlan plan;
  // Per rank: synthetic padding rows the peer's layout adds and computes for nothing
  // (per-doc-zigzag pads every document to a multiple of 2 * cp). Zeros otherwise;
  // always `cp` entries.
  std::vector<int64_t> padding_rows;
  // Causal work of the largest unit the strategy never splits (a block, a fragment, a
  // shard, or a single row for row-granular strategies). No plan at this granularity
  // can have a busiest rank below max(mean work, this).
  int64_t largest_unit_work = 0;
  // Human-readable remark, e.g. "fragment cap exceeded: contiguous fallback".
  std::string note;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // The registry key, e.g. "lpt-search".
  virtual std::string_view name() const = 0;
  // Where the idea comes from (project, file or class), for reports and --help.
  virtual std::string_view source() const = 0;
  // One line: what it does.
  virtual std::string_view summary() const = 0;
  // What "largest indivisible unit" means for this strategy (for reports).
  virtual std::string_view unit() const = 0;
  // Position in listings ('all'): seed modes 0-9, peers 10-49, sparsecp's own 50+.
  virtual int listing_order() const = 0;
  // Plans `lengths` for `cp` ranks at compression `ratio`. Validates like plan_tasks
  // (positive lengths, ratio and cp, sum divisible by cp) and throws Error otherwise.
  // The plan covers every row exactly once (see check_plan_covers).
  virtual StrategyPlan plan(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                            const StrategyParams& params) const = 0;
};

// Every registered strategy, in listing order (then by name). Lives for the program.
std::span<const Strategy* const> all_strategies();

// The strategy called `name`; throws Error "unknown strategy 'x' (known: a, b, ...)".
const Strategy& find_strategy(std::string_view name);

// Parses "all" or a comma-separated list of names into strategies, in the given order,
// without duplicates. Throws Error for an unknown or empty name.
std::vector<const Strategy*> parse_strategy_list(std::string_view list);

}  // namespace sparsecp
