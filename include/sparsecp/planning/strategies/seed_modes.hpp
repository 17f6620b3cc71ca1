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
//           greedy for the rest. Unit: one pooled block.
// Unset block size and threshold resolve as resolve_seed_options says (strategy.hpp):
// block min(2048, local rows), threshold the local rows (the seed itself has no default
// threshold). Their routes are the seed's `indexer_route` (zigzag's fast path included).
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategies none, zigzag, greedy and hybrid.
std::vector<std::unique_ptr<const Strategy>> make_seed_modes_strategies();

}  // namespace sparsecp
