// sparsecp: balancing strategies behind one interface, and the registry that names them.
//
// A strategy decides which CP rank runs the Lightning Indexer selection for which query
// rows of a packed batch. Every strategy returns the one result type of planning, a
// Plan (batch_plan.hpp): its task lists, the batch, its figures and bounds, and each
// rank's route for transport; so `simulate` (simulate.hpp) can measure all of them side
// by side and transport runs any of them.
//
// The built-in strategies, in listing order (each file in include/sparsecp/planning/strategies/
// documents its source):
//   none, zigzag, greedy, hybrid   the seed's modes, bit-exact adapters over plan_tasks
//   per-doc-zigzag                 Megatron / TransformerEngine THD per-document zigzag
//   round-robin                    SGLang's token round-robin split
//   snake                          PyTorch's _PTRRLoadBalancer (snake round-robin by cost)
//   lpt-search                     MagiAttention's DSA dispatch-solver idea (LPT + search)
//   wlb                            WLB-LLM per-document sharding (long documents split over
//                                  all ranks, short ones whole, round-robin by cost)
//   spill                          sparsecp's own: owners keep their rows, overloaded ranks
//                                  shed only their heaviest tails (spill.hpp)
//   auto                           sparsecp's own: the candidate with the lowest predicted
//                                  step time (strategies/auto.hpp)
//
// Adding a strategy: implement Strategy::assign (the task lists and layout facts; the
// base class wraps them into a Plan) in one file src/planning/strategies/<stem>.cpp that
// defines
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

#include "sparsecp/planning/batch_plan.hpp"
#include "sparsecp/planning/cost_model.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/row_bytes.hpp"

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
// for it and ignores the rest, so one parameter set can drive a whole sweep. Defaults
// that depend on the batch (unset optionals) are resolved in one place,
// `resolve_seed_options`, for every command and caller.
struct StrategyParams {
  // greedy, hybrid (and auto's seed candidates): rows per pooled block, the seed's
  // indexer_balance_block_size. Unset: the seed's 2048, or the local row count
  // sum(lengths) / cp when the shard is smaller (the seed requires block <= local).
  // Set: used as given, so a block above the local row count is the seed's error.
  std::optional<int64_t> block_size;
  // hybrid: documents of at least this many rows keep their zigzag chunks (the seed's
  // indexer_zigzag_min_length, which has no default there). Unset: the local row count
  // sum(lengths) / cp, i.e. documents at least one shard long keep zigzag pairs.
  std::optional<int64_t> zigzag_min_length;
  // spill: requested max(load) / mean(load) on `cost_model` (>= 1; spill.hpp).
  double target_imbalance = 1.001;
  // spill: > 0 bounds the pieces one rank receives; 0 leaves them unbounded.
  int64_t max_received_fragments = 0;
  // spill: > 0 is the node map (node_map.hpp: this many consecutive ranks per node, a
  // divisor of cp, checked when planning) and spill plans topology-aware
  // (SpillOptions::ranks_per_node); 0: no node map. Other strategies ignore it.
  int64_t ranks_per_node = 0;
  // spill and auto: what one row costs (cost_model.hpp; e.g. `sparsecp calibrate`'s
  // fit). Unset: spill balances the seed's causal pairs; auto predicts with
  // nominal_accelerator_cost_model() (strategies/auto.hpp).
  std::optional<CostModel> cost_model;
  // auto: exchange bandwidth per rank and direction, GB/s (> 0).
  double bandwidth_gbps = 50;
  // auto: bytes of one moved row (its input fields and its top-k ids).
  RowBytes row_bytes;
  // wlb: documents longer than this many rows are split evenly over all ranks; the
  // rest are placed whole. Unset: the local row count sum(lengths) / cp.
  std::optional<int64_t> wlb_split_length;
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
  // spill and auto: per rank, unmovable owner-side load in the cost model's units (the KL
  // loss on each row's owner: spill.hpp's owner_load, `owner_cost`); spill balances
  // selection + this, auto predicts with it. Empty: none; otherwise cp values >= 0.
  std::vector<double> owner_load;
};

// The seed-mode options `mode` runs with under `params` on this batch: the block size
// and hybrid threshold defaults above resolved against the local row count, and only
// the options the seed allows for `mode` set (so plan_tasks never sees a forbidden
// one). Validates the batch first (plan_tasks' checks and texts).
PlanOptions resolve_seed_options(Mode mode, std::span<const int64_t> lengths, int64_t cp,
                                 const StrategyParams& params);

// The seed's errors for options given to a mode that does not take them ("..._block_size
// requires indexer_load_balance='greedy' or 'hybrid'", "indexer_zigzag_min_length
// requires indexer_load_balance='hybrid'"). Strategies ignore unused parameters (one set
// drives a whole sweep); a caller that runs one seed mode on behalf of a user (the CLI's
// --mode) calls this so that a misplaced option is an error, as in the seed.
void check_seed_options_used(Mode mode, const StrategyParams& params);

// Throws Error naming the first invalid field (a non-positive block or threshold,
// target < 1, negative fragments, an invalid cost model, bandwidth <= 0, ...).
// Strategies call it; so can callers that want to fail before planning.
void validate_strategy_params(const StrategyParams& params);

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
  // The plan covers every row exactly once (see check_plan_covers); its figures price
  // rows with params.cost_model (causal pairs when unset) and size them with
  // params.row_bytes.
  Plan plan(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
            const StrategyParams& params) const;
  // The route of `rank` under this strategy (route.hpp): what it sends as an owner and
  // selects as a worker. Default: plan(...).route(rank), which plans every rank. The seed modes
  // return indexer_route(...) instead, identical to the seed's (zigzag takes its fast path that
  // builds only this rank's tasks). Throws Error for a rank outside [0, cp) and for everything
  // plan() rejects.
  virtual IndexerRoute route(std::span<const int64_t> lengths, int64_t cp, int64_t rank,
                             int64_t ratio, const StrategyParams& params) const;
  // The parameters this strategy uses on this batch, resolved and in words, for report
  // headers: e.g. "block 2048 (default), zigzag_min_length 16384 (default: the rows per
  // rank)" for hybrid. Empty when it takes none. Throws like plan() on a bad batch.
  virtual std::string describe(std::span<const int64_t> lengths, int64_t cp,
                               const StrategyParams& params) const;

  // What a strategy decides; plan() wraps it, with the batch, into a Plan.
  struct Assignment {
    TaskPlan plan;
    // Per rank: synthetic padding rows (PlanLayout::padding_rows); empty means zeros.
    std::vector<int64_t> padding_rows;
    int64_t largest_unit_work = 0;  // PlanLayout::largest_unit_work
    std::string note;               // PlanLayout::note
  };
  // The assignment of `plan` (for strategies that choose among other strategies' plans).
  static Assignment assignment_of(const Plan& plan);

 protected:
  // Validates and decides, as plan() documents.
  virtual Assignment assign(std::span<const int64_t> lengths, int64_t cp, int64_t ratio,
                            const StrategyParams& params) const = 0;
};

// "a=61.5 b=0.0412 c=0.0031 ns/row" (" d=44.2" after c when d is not 0), or `fallback` when `model`
// is unset.
std::string describe_cost_model(const std::optional<CostModel>& model, std::string_view fallback);

// Every registered strategy, in listing order (then by name). Lives for the program.
std::span<const Strategy* const> all_strategies();

// The strategy called `name`; throws Error "unknown strategy 'x' (known: a, b, ...)".
const Strategy& find_strategy(std::string_view name);

// Parses "all" or a comma-separated list of names into strategies, in the given order,
// without duplicates. Throws Error for an unknown or empty name.
std::vector<const Strategy*> parse_strategy_list(std::string_view list);

}  // namespace sparsecp
