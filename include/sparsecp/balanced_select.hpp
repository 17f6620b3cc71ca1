// sparsecp: plan and run in one call — hyper_parallel's entry points that take document
// lengths and a strategy.
//
// The layers below stay apart: planning (plan.hpp, strategy.hpp) turns lengths into
// routes, transport (exchange.hpp) moves rows along a route it is given. This header
// is the thin facade over both that hyper_parallel's signatures need: each call plans
// this rank's route *inside* the launch (transport's RouteRequest), so that a rank whose
// planning fails raises on every rank instead of leaving its peers in a collective, and
// every rank first agrees on the planning inputs (agreement.hpp's fingerprint of the
// lengths, CP size, ratio, strategy and every parameter).
//
// To plan ahead of the step instead (at data-preparation time, or once for many layers),
// build the route with Plan::route / make_route and call transport's
// launch_indexer_inputs(inputs, route, comm) directly.
#pragma once

#include <cstdint>
#include <span>

#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/exchange.hpp"

namespace sparsecp {

// The fingerprint of hyper_parallel's planning inputs: lengths, CP size, ratio, mode, and
// the block size and hybrid threshold as given (unset: omitted).
PlanningFingerprint planning_fingerprint(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio, const PlanOptions& options);
// Any registered strategy: its name and every StrategyParams field (named in a mismatch
// message: block, zigzag_min_length, target_imbalance, ...). Real values are shown in
// millionths and compared bit for bit.
PlanningFingerprint planning_fingerprint(std::span<const int64_t> lengths, int64_t cp,
                                         int64_t ratio, const Strategy& strategy,
                                         const StrategyParams& params);

// Seed `launch_indexer_inputs(query_residual, weights, embeddings, lengths, ratio, mode,
// group, block_size, zigzag_min_length)`: this rank's route is indexer_route(lengths,
// comm.size(), comm.rank(), ratio, options) (zigzag's fast path builds only this rank's
// tasks). Input checks and texts: transport's launch_indexer_inputs. Collective.
IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs,
                                           std::span<const int64_t> lengths, int64_t ratio,
                                           const PlanOptions& options, Communicator& comm);

// Any registered strategy (strategy.hpp: the seed modes, spill, auto, the peers) with
// its parameters: this rank's route is strategy.route(lengths, comm.size(), comm.rank(),
// ratio, params). Collective.
IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs,
                                           std::span<const int64_t> lengths, int64_t ratio,
                                           const Strategy& strategy, const StrategyParams& params,
                                           Communicator& comm);

// Seed `balanced_indexer_select`: launch (above), then transport's select_and_return:
// the top-k of this rank's own rows, [local tokens, topk] (the seed returns [1, local,
// topk]). Input errors use the synchronous path's seed texts ("... must have matching
// batch/token axes and device"). Collective.
SelectedKeys balanced_select(const IndexerInputs& inputs, const Selector& selector,
                             std::span<const int64_t> lengths, int64_t ratio,
                             const PlanOptions& options, Communicator& comm);
// The same with any registered strategy.
SelectedKeys balanced_select(const IndexerInputs& inputs, const Selector& selector,
                             std::span<const int64_t> lengths, int64_t ratio,
                             const Strategy& strategy, const StrategyParams& params,
                             Communicator& comm);

}  // namespace sparsecp
