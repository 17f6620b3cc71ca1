// sparsecp strategies: snake round-robin of cost-sorted blocks (PyTorch PTRR).
//
// Source: PyTorch `torch.distributed.tensor.experimental._context_parallel.
// _load_balancer._PTRRLoadBalancer` ("Processing-Time based Round-Robin"): the packed
// sequence is cut into blocks of StrategyParams::snake_block rows (flex_attention's
// BLOCK_SIZE, 128), blocks are sorted by processing time, heaviest first (stable, so
// ties keep packed order), and dealt in rounds of cp: even rounds to ranks 0..cp-1,
// odd rounds to ranks cp-1..0.
//
// Differences, on purpose: a block's processing time here is its causal-pair work
// (PTRR counts the BlockMask's non-empty KV blocks, a block-granular version of the
// same quantity); and where the block count is not a multiple of cp (PTRR raises
// NotImplementedError) the last, partial round is dealt in the same snake direction.
// Blocks may span document boundaries. Unit: one block.
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategy "snake".
std::vector<std::unique_ptr<const Strategy>> make_snake_strategies();

}  // namespace sparsecp
