// sparsecp strategies: token round-robin (SGLang).
//
// Source: SGLang's NSA prefill context parallelism, `--nsa-prefill-cp-mode
// round-robin-split` (python/sglang/srt/server_args.py and the NSA attention backend):
// global token i is handled by rank i mod cp. Balance is near perfect (neighbouring
// rows cost almost the same) but every row is its own fragment and (cp - 1) / cp of
// all rows leave their owner. Unit: one row.
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategy "round-robin".
std::vector<std::unique_ptr<const Strategy>> make_round_robin_strategies();

}  // namespace sparsecp
