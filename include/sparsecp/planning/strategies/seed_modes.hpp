// sparsecp strategies: the seed's four modes as strategies.
//
// Source: the seed module indexer_balance.py (`indexer_task_plan`), implemented by
// plan_tasks in plan.hpp. These adapters call plan_tasks unchanged, so their plans are
// bit-exact with the seed; they only add what a report needs:
//   none    contiguous ownership (Llama-3 style CP sharding); nothing moves. Its unit is
//           the whole shard, so its lower bound is its own imbalance.
//   zigzag  per-document zigzag without padding (remainders pooled). Unit: one row
//           (cut points fall on arbitrary rows).
//   greedy  pooled blocks of StrategyParams::block_size rows, heaviest first onto the
//           least-loaded rank under a 2 x local row cap. Unit: one block.
//   hybrid  zigzag for documents of at least StrategyParams::zigzag_min_length rows,
//           greedy for the rest. The seed has no default threshold; unset here means
//           the local row count (documents at least one shard long keep zigzag
//           pairs). Unit: one pooled block.
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategies none, zigzag, greedy and hybrid.
std::vector<std::unique_ptr<const Strategy>> make_seed_modes_strategies();

// The hybrid threshold a strategy run uses: the explicit one, else the local rows.
int64_t hybrid_threshold(const StrategyParams& params, int64_t total_rows, int64_t cp);

}  // namespace sparsecp
