// sparsecp strategies: LPT plus bounded local search over aligned fragments
// (the idea of MagiAttention's DSA dispatch solver).
//
// Source: MagiAttention (SandAI-org/MagiAttention) dispatch solver for DeepSeek sparse
// attention: the packed sequence is cut into fragments aligned to
// StrategyParams::lpt_align rows (128), fragments are placed longest-processing-time
// first onto the least-loaded rank that has room under a per-rank row cap, and a
// bounded move/swap local search then lowers the objective
//     (max rank load, then max rank rows, then total fragments),
// compared lexicographically. This is a re-implementation of the idea, not a port.
//
// Load is the per-row cost selected by StrategyParams::lpt_cost: MagiAttention's
// `min(p + 1, window) + min(topk, vis) + vis + 0.25` (default) or the causal indexer
// work `vis`; reports always use the causal work of cost.hpp so that strategies are
// compared on one scale.
//
// Details chosen here and kept deterministic:
//   * row cap = ceil(lpt_row_cap * local rows); when no rank has room LPT uses the
//     rank with the fewest rows (ties: least load, lowest rank), so the cap is soft
//     only when the fragments cannot be packed under it;
//   * LPT order: cost descending, ties by packed position; rank choice: least load,
//     ties lowest rank;
//   * search: up to lpt_search_steps improving steps; each step evaluates every move
//     out of the most loaded rank and out of the rank with most rows, and for every
//     other rank the swap partners nearest the ideal cost difference, and applies the
//     best; when that finds nothing, a fragment pass tries to join each fragment to its
//     packed neighbour's rank by a move or a swap of equal-or-better load and rows;
//   * lpt_fragment_cap > 0 reproduces MagiAttention's fallback: when some rank ends with
//     more fragments than the cap, the contiguous plan ('none') is returned instead.
// Unit: one fragment (a fragment may span a document boundary).
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategy "lpt-search".
std::vector<std::unique_ptr<const Strategy>> make_lpt_search_strategies();

// MagiAttention's per-row DSA cost summed over document rows [start, end):
// sum(min(p + 1, window) + min(topk, vis) + vis + 0.25), vis = floor((p + 1) / ratio).
// A multiple of 0.25, exact in a double below 2^51.
double magi_row_cost(int64_t start, int64_t end, int64_t ratio, int64_t window, int64_t topk);

}  // namespace sparsecp
