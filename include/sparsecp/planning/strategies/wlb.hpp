// sparsecp strategies: WLB-LLM per-document sharding.
//
// Source: WLB-LLM, "Workload-Balanced 4D Parallelism for Large Language Model Training"
// (Wang et al., OSDI 2025), its context-parallel sharding: instead of cutting the packed
// sequence into contiguous shards, long documents are sharded *per document* across all
// CP ranks, so every rank holds an equal, causally balanced part of each, while short
// documents stay whole and are spread over the ranks.
//
// Here, with split length S (StrategyParams::wlb_split_length; default the rows per
// rank, tokens / cp):
//   * a document longer than S is cut into 2 * cp near-equal chunks (boundaries at
//     floor(i * length / (2 cp))) and rank r takes chunks r and 2cp - 1 - r, the
//     symmetric pairing that gives every rank the same causal work of that document;
//   * documents of at most S tokens are placed whole, heaviest (causal work) first,
//     ties to the lower document index, dealt round-robin: the i-th goes to rank
//     i mod cp (the paper's round-robin placement of the leftovers).
// No row cap: a rank may select more than its shard's rows when short documents are
// large. Unit: a whole short document, or one chunk of a split one.
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategy "wlb".
std::vector<std::unique_ptr<const Strategy>> make_wlb_strategies();

}  // namespace sparsecp
